//! [`pull`]: an image from an OCI distribution registry into the [`BlobStore`].
//!
//! The protocol is `oci-client`'s: the `/v2/` challenge, anonymous or credentialed bearer
//! tokens and basic auth, and the blob downloads. Manifests — Docker v2 (schema 2) and OCI
//! manifests, image indexes and Docker manifest lists (the `linux/amd64` entry is taken) —
//! are read by `manifest.rs` with a size bound the client lacks, their digests checked.
//! Around it this module adds what a server pulling untrusted images needs:
//!
//! - a manifest is at most 4 MiB, read as it streams;
//! - every blob (config and layers) streams to a temporary file under the store while its
//!   sha256 is computed, and is renamed to its digest only if it matches; it may not be
//!   larger than its descriptor says nor than the size limit;
//! - blobs already in the store are not downloaded again;
//! - digests are parsed strictly before they name a file;
//! - layer descriptors' `urls` (foreign layers) are dropped, so blobs come only from the
//!   registry named in the reference;
//! - plain HTTP is used only for registries listed in [`PullOptions::insecure_registries`].
//!
//! The client is async; [`pull`] runs it on a private current-thread runtime in a thread of
//! its own, so it can be called from any thread, also one inside another runtime.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use futures_util::StreamExt;
use oci_client::client::{
    linux_amd64_resolver, Certificate, CertificateEncoding, ClientConfig, ClientProtocol,
};
use oci_client::errors::{DigestError, OciDistributionError};
use oci_client::manifest::{
    OciDescriptor, IMAGE_CONFIG_MEDIA_TYPE, IMAGE_DOCKER_CONFIG_MEDIA_TYPE,
};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use crate::auth::{self, Credentials};
use crate::blobs::{BlobStore, Digest};
use crate::config::{self, ImageConfig};
use crate::egress::EgressGuard;
use crate::error::{ImageError, IoContext, Result};
use crate::progress::{PullEvent, Throttle, TransferAction};
use crate::unpack::{Compression, Limits};

/// Largest image config accepted.
const MAX_CONFIG: u64 = 4 << 20;
/// How long connecting to a registry may take (blobs and manifests alike).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a registry may stay silent in the middle of an answer.
const READ_TIMEOUT: Duration = Duration::from_secs(300);

/// How to reach the registry.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Credentials; when absent, those of a Docker `config.json` for the registry, else
    /// anonymous (with an anonymous bearer token where the registry hands them out).
    pub credentials: Option<Credentials>,
    /// The `config.json` to read (default `$DOCKER_CONFIG/config.json` or
    /// `~/.docker/config.json`).
    pub docker_config: Option<PathBuf>,
    /// Registries (`host` or `host:port`) spoken to over plain HTTP.
    pub insecure_registries: Vec<String>,
    /// Never read a Docker `config.json` (a server pulling for its API's callers lends
    /// nobody the host's own credentials).
    pub ignore_docker_config: bool,
    /// `Some`: the only registries (`host` or `host:port`, as a reference names them) that
    /// may be pulled from; checked before anything is resolved or sent.
    pub allowed_registries: Option<Vec<String>>,
    /// Refuse a registry whose name resolves to a loopback, link-local (cloud metadata),
    /// unspecified or multicast address: a pull for a tenant never reaches the host's own
    /// services. Ignored for a registry in `allowed_registries`.
    pub refuse_local_addresses: bool,
    /// PEM files of extra CA certificates to trust (for a private registry's own CA).
    pub ca_certificates: Vec<PathBuf>,
    /// Limits on the image's size (each blob must fit within `max_bytes`).
    pub limits: Limits,
    /// Set: stop at once, even in the middle of a blob's download
    /// ([`ImageError::Cancelled`]; the partial blob is removed).
    pub cancel: Option<Arc<AtomicBool>>,
}

/// How often a download that waits for bytes looks at its cancel flag.
const CANCEL_POLL: Duration = Duration::from_millis(100);

/// One layer of a pulled image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledLayer {
    /// The blob's digest; its file is [`BlobStore::path`].
    pub digest: Digest,
    /// How it is compressed.
    pub compression: Compression,
    /// Its size in bytes (compressed).
    pub size: u64,
    /// The sha256 of its uncompressed tar, from the image config.
    pub diff_id: String,
}

/// A pulled image: its configuration and its layers, bottom first, all in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledImage {
    /// What the template records.
    pub config: ImageConfig,
    /// The layers, bottom first.
    pub layers: Vec<PulledLayer>,
}

/// Pulls `reference` (`host[:port]/repo[:tag][@sha256:…]`; no host means Docker Hub) into
/// `store`. Progress (a line per blob, and each download's bytes) goes to `progress`.
pub fn pull(
    reference: &str,
    store: &BlobStore,
    options: &PullOptions,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<PulledImage> {
    let parsed: Reference =
        reference
            .parse()
            .map_err(|e: oci_client::ParseError| ImageError::InvalidReference {
                reference: reference.to_owned(),
                reason: e.to_string(),
            })?;
    let registry = parsed.registry().to_owned();
    check_registry(&registry, options)?;
    let credentials = match &options.credentials {
        Some(c) => Some(c.clone()),
        None if options.ignore_docker_config => None,
        None => auth::from_docker_config(options.docker_config.as_deref(), &registry)?,
    };
    let mut roots = Vec::new();
    for path in &options.ca_certificates {
        roots.push(Certificate {
            encoding: CertificateEncoding::Pem,
            data: std::fs::read(path).at("reading CA certificate", path)?,
        });
    }
    let job = Job {
        reference: reference.to_owned(),
        parsed,
        registry,
        auth: match credentials {
            Some(c) => RegistryAuth::Basic(c.username, c.password),
            None => RegistryAuth::Anonymous,
        },
        roots,
        insecure: options.insecure_registries.clone(),
        limits: options.limits,
        cancel: options.cancel.clone(),
        // Every connection of a tenant's pull is checked when it is made (`egress.rs`);
        // an operator's allow list is trusted as it is.
        guarded: options.refuse_local_addresses && options.allowed_registries.is_none(),
    };
    let (tx, rx) = mpsc::channel::<PullEvent>();
    std::thread::scope(|scope| {
        let worker = scope.spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| {
                    ImageError::io("starting the registry client", PathBuf::from("-"), e)
                })?;
            runtime.block_on(job.run(store, &tx))
        });
        for event in rx {
            progress(event);
        }
        worker.join().unwrap_or_else(|_| {
            Err(ImageError::Registry {
                registry: String::from("-"),
                reference: reference.to_owned(),
                message: String::from("the registry client panicked"),
            })
        })
    })
}

/// Whether `options` let a pull reach `registry` (`host[:port]`; Docker Hub's is
/// `docker.io`, whatever alias the reference used).
fn check_registry(registry: &str, options: &PullOptions) -> Result<()> {
    let refused = |reason: String| ImageError::RegistryNotAllowed {
        registry: registry.to_owned(),
        reason,
    };
    if let Some(allowed) = &options.allowed_registries {
        let hub = |h: &str| matches!(h, "docker.io" | "index.docker.io" | "registry-1.docker.io");
        if allowed
            .iter()
            .any(|a| a == registry || (hub(a) && hub(registry)))
        {
            return Ok(());
        }
        return Err(refused(format!(
            "the server pulls only from {} (hutch serve --allowed-registry)",
            allowed.join(", ")
        )));
    }
    if !options.refuse_local_addresses {
        return Ok(());
    }
    let (host, port) = split_host_port(registry);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addresses: Vec<std::net::IpAddr> = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
            .map_err(|e| refused(format!("its name does not resolve: {e}")))?
            .map(|a| a.ip())
            .collect(),
    };
    match addresses.into_iter().find(|ip| is_local(*ip)) {
        Some(ip) => Err(refused(format!(
            "it is at {ip}, an address of the server's own host or network (loopback, \
             link-local, unspecified or multicast): only an admin key's build, or one from a \
             registry the operator allows with --allowed-registry, pulls from there"
        ))),
        None => Ok(()),
    }
}

/// `host[:port]` → host and port (443 when none).
fn split_host_port(registry: &str) -> (&str, u16) {
    match registry.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(':') && !port.contains(']') => {
            (host, port.parse().unwrap_or(443))
        }
        _ => (registry, 443),
    }
}

/// Loopback, link-local (169.254/16, fe80::/10: cloud metadata), unspecified, multicast,
/// broadcast, and IPv4 mapped into IPv6 the same way: the addresses a tenant's build never
/// makes the server's host connect to (registries, `ADD <url>`).
pub fn is_local(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.octets()[0] == 0
        }
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_local(std::net::IpAddr::V4(v4)),
            None => {
                v6.is_loopback()
                    || v6.is_unspecified()
                    || v6.is_multicast()
                    || (v6.segments()[0] & 0xffc0) == 0xfe80
            }
        },
    }
}

/// Everything the pull thread needs.
struct Job {
    /// As given.
    reference: String,
    /// Parsed.
    parsed: Reference,
    /// `host[:port]`.
    registry: String,
    /// How to authenticate.
    auth: RegistryAuth,
    /// Extra CA certificates.
    roots: Vec<Certificate>,
    /// Plain-HTTP registries.
    insecure: Vec<String>,
    /// Size bounds.
    limits: Limits,
    /// `PullOptions::cancel`.
    cancel: Option<Arc<AtomicBool>>,
    /// Connect through an [`EgressGuard`].
    guarded: bool,
}

impl Job {
    fn check_cancel(&self) -> Result<()> {
        match &self.cancel {
            Some(c) if c.load(Ordering::Relaxed) => Err(ImageError::Cancelled),
            _ => Ok(()),
        }
    }

    /// Pulls the manifest, the config and every missing layer.
    async fn run(
        self,
        store: &BlobStore,
        progress: &mpsc::Sender<PullEvent>,
    ) -> Result<PulledImage> {
        // rustls needs one process-wide crypto provider; an error means one is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let protocol = if self.insecure.is_empty() {
            ClientProtocol::Https
        } else {
            ClientProtocol::HttpsExcept(self.insecure.clone())
        };
        let guard = match self.guarded {
            true => Some(
                EgressGuard::start()
                    .await
                    .map_err(|e| ImageError::io("starting the pull's egress guard", "", e))?,
            ),
            false => None,
        };
        let proxy = guard.as_ref().map(EgressGuard::url);
        let client = Client::new(ClientConfig {
            protocol,
            extra_root_certificates: self.roots.clone(),
            platform_resolver: Some(Box::new(linux_amd64_resolver)),
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            https_proxy: proxy.clone(),
            http_proxy: proxy.clone(),
            ..ClientConfig::default()
        });
        let http = self.manifest_client(proxy.as_deref())?;
        let pulled = self.pull_with(&client, http, store, progress).await;
        match (pulled, guard.as_ref().and_then(EgressGuard::refusal)) {
            (Err(_), Some(why)) => Err(ImageError::RegistryNotAllowed {
                registry: self.registry.clone(),
                reason: format!(
                    "the pull was to connect to {why}: a tenant's pull never reaches those \
                     (the registry, its token service and its redirects alike); an operator \
                     allows a registry with --allowed-registry"
                ),
            }),
            (pulled, _) => pulled,
        }
    }

    /// The HTTP client manifests are read with (`manifest.rs`): the registry client's
    /// proxy, roots and timeouts.
    fn manifest_client(&self, proxy: Option<&str>) -> Result<reqwest::Client> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .redirect(reqwest::redirect::Policy::limited(5));
        for root in &self.roots {
            let cert = reqwest::Certificate::from_pem(&root.data)
                .map_err(|e| self.registry_message(format!("a CA certificate: {e}")))?;
            builder = builder.add_root_certificate(cert);
        }
        if let Some(proxy) = proxy {
            let proxy = reqwest::Proxy::all(proxy)
                .map_err(|e| self.registry_message(format!("the pull's egress guard: {e}")))?;
            builder = builder.proxy(proxy);
        }
        builder
            .build()
            .map_err(|e| self.registry_message(format!("the manifest client: {}", error_chain(&e))))
    }

    /// The image manifest, read with a bound (`manifest.rs`) after `client` authenticated
    /// (keeping its token for the blobs).
    async fn bounded_manifest(
        &self,
        client: &Client,
        http: reqwest::Client,
    ) -> Result<(oci_client::manifest::OciImageManifest, String)> {
        use base64::Engine as _;
        let token = client
            .auth(
                &self.parsed,
                &self.auth,
                oci_client::RegistryOperation::Pull,
            )
            .await
            .map_err(|e| self.registry_error(e))?;
        let authorization = match (token, &self.auth) {
            (Some(token), _) => Some(format!("Bearer {token}")),
            (None, RegistryAuth::Basic(user, password)) => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
            )),
            (None, _) => None,
        };
        let host = self.parsed.resolve_registry();
        let scheme = if self.insecure.iter().any(|r| r == host) {
            "http"
        } else {
            "https"
        };
        let source = crate::manifest::ManifestSource {
            http,
            base: format!("{scheme}://{host}"),
            repository: self.parsed.repository(),
            authorization,
            registry: &self.registry,
            reference: &self.reference,
        };
        let tag_or_digest = self
            .parsed
            .digest()
            .or(self.parsed.tag())
            .unwrap_or("latest");
        source
            .image_manifest(tag_or_digest, self.parsed.digest())
            .await
    }

    /// The pull itself, with `client` (blobs) and `http` (manifests).
    async fn pull_with(
        &self,
        client: &Client,
        http: reqwest::Client,
        store: &BlobStore,
        progress: &mpsc::Sender<PullEvent>,
    ) -> Result<PulledImage> {
        let (manifest, manifest_digest) = self.bounded_manifest(client, http).await?;
        let _ = progress.send(PullEvent::Line(format!(
            "manifest {manifest_digest} ({} layers)",
            manifest.layers.len()
        )));

        let config_media = manifest.config.media_type.as_str();
        if config_media != IMAGE_CONFIG_MEDIA_TYPE && config_media != IMAGE_DOCKER_CONFIG_MEDIA_TYPE
        {
            return Err(ImageError::UnsupportedMediaType {
                what: "config",
                media_type: config_media.to_owned(),
            });
        }
        let config_digest = Digest::parse(&manifest.config.digest)?;
        let config_size = self.checked_size(&manifest.config, MAX_CONFIG, "config")?;
        let config_path = self
            .fetch(
                client,
                store,
                &manifest.config,
                &config_digest,
                config_size,
                progress,
                "config",
            )
            .await?;
        let bytes = std::fs::read(&config_path).at("reading", &config_path)?;
        let (config, diff_ids) = config::parse(&self.reference, &manifest_digest, &bytes)?;
        if diff_ids.len() != manifest.layers.len() {
            return Err(ImageError::Config {
                reference: self.reference.clone(),
                reason: format!(
                    "it lists {} diff_ids for {} layers",
                    diff_ids.len(),
                    manifest.layers.len()
                ),
            });
        }

        let mut layers = Vec::new();
        let count = manifest.layers.len();
        for (i, (layer, diff_id)) in manifest.layers.iter().zip(diff_ids).enumerate() {
            let compression = Compression::from_media_type(&layer.media_type).ok_or_else(|| {
                ImageError::UnsupportedMediaType {
                    what: "layer",
                    media_type: layer.media_type.clone(),
                }
            })?;
            let digest = Digest::parse(&layer.digest)?;
            Digest::parse(&diff_id)?;
            let size = self.checked_size(layer, self.limits.max_bytes, "layer")?;
            let what = format!("layer {}/{count}", i + 1);
            self.fetch(client, store, layer, &digest, size, progress, &what)
                .await?;
            layers.push(PulledLayer {
                digest,
                compression,
                size,
                diff_id,
            });
        }
        let mut config = config;
        config.blobs = std::iter::once(config_digest.to_string())
            .chain(layers.iter().map(|l| l.digest.to_string()))
            .collect();
        Ok(PulledImage { config, layers })
    }

    /// The descriptor's size, which must be known and within `max`.
    fn checked_size(
        &self,
        descriptor: &OciDescriptor,
        max: u64,
        what: &'static str,
    ) -> Result<u64> {
        u64::try_from(descriptor.size)
            .ok()
            .filter(|size| *size <= max)
            .ok_or_else(|| ImageError::TooLarge {
                what,
                digest: descriptor.digest.clone(),
                limit: max,
            })
    }

    /// Streams one blob into the store unless it is there already; returns its path.
    #[allow(clippy::too_many_arguments)]
    async fn fetch(
        &self,
        client: &Client,
        store: &BlobStore,
        descriptor: &OciDescriptor,
        digest: &Digest,
        size: u64,
        progress: &mpsc::Sender<PullEvent>,
        what: &str,
    ) -> Result<PathBuf> {
        self.check_cancel()?;
        if store.contains(digest) {
            let _ = progress.send(PullEvent::Line(format!(
                "{what} {} already stored",
                digest.short()
            )));
            return Ok(store.path(digest));
        }
        let _ = progress.send(PullEvent::Line(format!(
            "{what} {} downloading {size} bytes",
            digest.short()
        )));
        let mut throttle = Throttle::new(&digest.to_string(), what, TransferAction::Download, size);
        // Only the registry itself serves blobs: no foreign `urls`.
        let descriptor = OciDescriptor {
            urls: None,
            ..descriptor.clone()
        };
        let mut stream = client
            .pull_blob_stream(&self.parsed, &descriptor)
            .await
            .map_err(|e| self.registry_error(e))?;
        let mut writer = store.begin(digest, size)?;
        loop {
            // Dropping the writer on the way out removes the partial file.
            self.check_cancel()?;
            let next = match tokio::time::timeout(CANCEL_POLL, stream.next()).await {
                Ok(next) => next,
                Err(_) => continue,
            };
            let Some(chunk) = next else {
                break;
            };
            let chunk = chunk.map_err(|e| self.stream_error(e, digest))?;
            writer.write(&chunk)?;
            if let Some(report) = throttle.advance(chunk.len() as u64) {
                let _ = progress.send(PullEvent::Transfer(report));
            }
        }
        let path = writer.commit()?;
        if let Some(report) = throttle.finish() {
            let _ = progress.send(PullEvent::Transfer(report));
        }
        Ok(path)
    }

    /// Maps a failed chunk: a digest check of the client, or a transport error.
    fn stream_error(&self, e: std::io::Error, digest: &Digest) -> ImageError {
        if let Some(DigestError::VerificationError { actual, .. }) = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<DigestError>())
        {
            return ImageError::DigestMismatch {
                what: "blob",
                expected: digest.to_string(),
                actual: actual.clone(),
            };
        }
        self.registry_message(format!("reading blob {digest}: {e}"))
    }

    /// Maps the client's error (its authentication, a blob request) into the crate's;
    /// manifests are not read through it (`manifest.rs` reports their errors).
    fn registry_error(&self, e: OciDistributionError) -> ImageError {
        match e {
            OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::AuthenticationFailure(_) => ImageError::Unauthorized {
                registry: self.registry.clone(),
                reference: self.reference.clone(),
            },
            other => self.registry_message(error_chain(&other)),
        }
    }

    /// An [`ImageError::Registry`] with `message`.
    fn registry_message(&self, message: String) -> ImageError {
        ImageError::Registry {
            registry: self.registry.clone(),
            reference: self.reference.clone(),
            message,
        }
    }
}

/// `e` and its sources, `: `-separated (TLS failures hide under a request error), a
/// source whose text the chain already holds left out.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(allowed: Option<&[&str]>, refuse_local: bool) -> PullOptions {
        PullOptions {
            allowed_registries: allowed.map(|a| a.iter().map(|s| s.to_string()).collect()),
            refuse_local_addresses: refuse_local,
            ..PullOptions::default()
        }
    }

    #[test]
    fn a_registry_is_checked_against_the_allow_list_and_local_addresses() {
        let allowed = options(Some(&["registry.test:5000", "docker.io"]), true);
        assert!(check_registry("registry.test:5000", &allowed).is_ok());
        assert!(check_registry("index.docker.io", &allowed).is_ok());
        let refused = check_registry("other.test", &allowed).expect_err("not listed");
        assert!(
            refused.to_string().contains("--allowed-registry"),
            "{refused}"
        );
        // Without a list, a tenant's pull never reaches the host's own addresses.
        let tenant = options(None, true);
        for local in [
            "127.0.0.1:5000",
            "169.254.169.254",
            "[::1]:5000",
            "0.0.0.0",
            "localhost",
        ] {
            let e = check_registry(local, &tenant).expect_err(local);
            assert!(
                matches!(e, ImageError::RegistryNotAllowed { .. }),
                "{local}: {e}"
            );
        }
        assert!(check_registry("192.0.2.10:5000", &tenant).is_ok());
        assert!(check_registry("127.0.0.1:5000", &options(None, false)).is_ok());
        assert_eq!(split_host_port("[::1]:5000"), ("[::1]", 5000));
        assert_eq!(split_host_port("[::1]"), ("[::1]", 443));
        assert_eq!(split_host_port("host"), ("host", 443));
    }
}
