//! `ADD <url> <dest>`: the file a URL names, downloaded by the server as Docker's daemon
//! does, and placed in the build sandbox like a context file.
//!
//! - **When.** Before the step's cache key is made: the key holds the sha256 of what was
//!   downloaded (as Docker's does), so an unchanged file is a cache hit and a changed one
//!   rebuilds from this step. One download per URL per build.
//! - **What it may reach.** `http` and `https` only, at most [`MAX_REDIRECTS`] redirects.
//!   Only when the operator lets builds reach the network (`hutch serve --build-egress
//!   allow`, the default): with `deny` or `none` nothing is downloaded either. A tenant's build never
//!   makes the host connect to its own addresses (loopback, link-local such as a cloud's
//!   metadata service, unspecified, multicast), checked on every address a name resolves to
//!   at the moment of connecting (the client's resolver drops them, so a name that later
//!   resolves elsewhere cannot slip past) and on every address literal, redirects included.
//!   An admin key's build may (like its pulls from the operator's registries).
//! - **How much.** At most [`MAX_BYTES`]; [`READ_TIMEOUT`] between two reads.
//! - **The file.** Mode 0600 unless `--chmod`, owned by root unless `--chown`, its time the
//!   answer's `Last-Modified`; named after the URL's last path segment when the destination
//!   is a directory. Not unpacked, whatever it holds (as in Docker).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::error::BuildError;

/// Most bytes one `ADD <url>` downloads.
pub(crate) const MAX_BYTES: u64 = 1 << 30;
/// Longest wait between two reads of a download.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Most redirects followed.
const MAX_REDIRECTS: usize = 10;

/// What may be downloaded.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FetchPolicy {
    /// The operator lets builds reach the network.
    pub egress: bool,
    /// Refuse the host's own addresses (a tenant's build).
    pub refuse_local: bool,
}

/// A downloaded file.
#[derive(Debug, Clone)]
pub(crate) struct Fetched {
    /// Where it is on the host, until the build ends.
    pub path: PathBuf,
    /// The sha256 of its bytes.
    pub sha256: String,
    /// Its size.
    pub bytes: u64,
    /// The name it gets in a destination directory.
    pub name: String,
    /// Its `Last-Modified`, in seconds since the epoch.
    pub mtime: Option<u64>,
}

/// The downloads of one build, in a directory removed with it.
pub(crate) struct Downloads {
    dir: PathBuf,
    files: Mutex<HashMap<String, Fetched>>,
}

impl std::fmt::Debug for Downloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Downloads").field("dir", &self.dir).finish()
    }
}

impl Drop for Downloads {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A resolver that leaves out the host's own addresses.
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        Box::pin(async move {
            let host = name.as_str().to_string();
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let kept: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| !hutch_image::is_host_local_address(a.ip()))
                .collect();
            if kept.is_empty() {
                return Err(format!(
                    "{host} resolves only to addresses of the server's own host or network \
                     ({}): a tenant's build does not download from there",
                    found
                        .iter()
                        .map(|a| a.ip().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
                .into());
            }
            let addrs: reqwest::dns::Addrs = Box::new(kept.into_iter());
            Ok(addrs)
        })
    }
}

/// Whether `url`'s host is an address literal of the host's own.
fn local_literal(url: &reqwest::Url) -> Option<IpAddr> {
    let ip = match url.host()? {
        url::Host::Ipv4(v4) => IpAddr::V4(v4),
        url::Host::Ipv6(v6) => IpAddr::V6(v6),
        url::Host::Domain(_) => return None,
    };
    hutch_image::is_host_local_address(ip).then_some(ip)
}

/// The file name a URL gives its download: its last path segment.
fn name_of(url: &reqwest::Url) -> Option<String> {
    let last = url.path_segments()?.next_back()?;
    // Percent-decoded as a path is (a `+` stays a `+`, unlike in a query).
    let name = percent_encoding::percent_decode_str(last)
        .decode_utf8()
        .ok()?
        .into_owned();
    (!name.is_empty() && name != "." && name != ".." && !name.contains('/')).then_some(name)
}

impl Downloads {
    /// Downloads of a build in the new directory `dir`.
    pub(crate) fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            files: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Fetched>> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The download of `url` made earlier in this build.
    pub(crate) fn get(&self, url: &str) -> Option<Fetched> {
        self.lock().get(url).cloned()
    }

    /// Download `url` (once per build) under `policy`.
    pub(crate) async fn fetch(
        &self,
        url: &str,
        policy: FetchPolicy,
    ) -> Result<Fetched, BuildError> {
        if let Some(done) = self.get(url) {
            return Ok(done);
        }
        let fail = |why: String| BuildError::StepFailed(format!("ADD {url}: {why}"));
        if !policy.egress {
            return Err(fail(
                "this server keeps builds off the network (hutch serve --build-egress), so nothing is downloaded".into(),
            ));
        }
        let parsed = reqwest::Url::parse(url).map_err(|e| fail(format!("not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(fail("only http and https URLs are downloaded".into()));
        }
        let refuse_local = policy.refuse_local;
        if refuse_local {
            if let Some(ip) = local_literal(&parsed) {
                return Err(fail(format!(
                    "{ip} is an address of the server's own host or network: a tenant's build does not download from there"
                )));
            }
        }
        let redirects = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= MAX_REDIRECTS {
                return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
            }
            if refuse_local {
                if let Some(ip) = local_literal(attempt.url()) {
                    return attempt.error(format!(
                        "redirected to {ip}, an address of the server's own host or network"
                    ));
                }
            }
            attempt.follow()
        });
        let mut client = reqwest::Client::builder()
            .redirect(redirects)
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .user_agent(concat!("hutch/", env!("CARGO_PKG_VERSION")));
        if refuse_local {
            client = client.dns_resolver(Arc::new(PublicOnly));
        }
        let client = client
            .build()
            .map_err(|e| fail(format!("the HTTP client: {e}")))?;
        let response = client
            .get(parsed.clone())
            .send()
            .await
            .map_err(|e| fail(hutch_image::error_chain(&e)))?;
        let status = response.status();
        if !status.is_success() {
            return Err(fail(format!("the server answered {status}")));
        }
        if response.content_length().is_some_and(|n| n > MAX_BYTES) {
            return Err(fail(format!("larger than {} GiB", MAX_BYTES >> 30)));
        }
        let mtime = response
            .headers()
            .get(reqwest::header::LAST_MODIFIED)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs());
        let final_url = response.url().clone();
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(BuildError::io(format!("creating {}", self.dir.display())))?;
        let path = self.dir.join(format!("{}", self.lock().len()));
        let (sha256, bytes) = write_body(response, &path).await.map_err(fail)?;
        let name = name_of(&parsed)
            .or_else(|| name_of(&final_url))
            .unwrap_or_else(|| "index.html".to_string());
        let fetched = Fetched {
            path,
            sha256,
            bytes,
            name,
            mtime,
        };
        self.lock().insert(url.to_string(), fetched.clone());
        Ok(fetched)
    }
}

/// Stream `response`'s body into `path`, hashing it; its sha256 and size.
async fn write_body(response: reqwest::Response, path: &Path) -> Result<(String, u64), String> {
    let mut file = tokio::fs::File::create(path)
        .await
        .map_err(|e| format!("creating {}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| hutch_image::error_chain(&e))?;
        total += chunk.len() as u64;
        if total > MAX_BYTES {
            return Err(format!("larger than {} GiB", MAX_BYTES >> 30));
        }
        hasher.update(&chunk);
        file.write_all(&chunk)
            .await
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    file.flush()
        .await
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok((crate::engine::hex(&hasher.finalize()), total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_download_is_named_after_the_urls_last_segment() {
        let name = |u: &str| name_of(&reqwest::Url::parse(u).expect("url"));
        assert_eq!(
            name("https://x.example/a/tool-1.2.tar.gz").as_deref(),
            Some("tool-1.2.tar.gz")
        );
        assert_eq!(
            name("https://x.example/a/my%20file?x=1").as_deref(),
            Some("my file")
        );
        assert_eq!(
            name("https://x.example/a/g++-13.deb").as_deref(),
            Some("g++-13.deb")
        );
        assert_eq!(name("https://x.example/"), None);
        assert_eq!(name("https://x.example/a/%2F"), None);
    }

    #[test]
    fn address_literals_of_the_host_are_named() {
        let local = |u: &str| local_literal(&reqwest::Url::parse(u).expect("url"));
        assert!(local("http://127.0.0.1:8080/x").is_some());
        assert!(local("http://169.254.169.254/latest/meta-data").is_some());
        assert!(local("http://[::1]/x").is_some());
        assert!(local("http://[::ffff:127.0.0.1]/x").is_some());
        assert!(local("http://10.1.2.3/x").is_none(), "private, not local");
        assert!(local("http://example.com/x").is_none());
    }
}
