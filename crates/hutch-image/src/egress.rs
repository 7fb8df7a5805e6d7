//! The egress guard of a tenant's pull: a forward proxy on the pull's own loopback port
//! through which the registry client makes **every** connection — the registry, the token
//! realm its `WWW-Authenticate` names, and wherever a redirect sends a blob download. Each
//! connection's name is resolved here, at connect time, and the addresses the pull may not
//! reach ([`crate::is_local`]: loopback, link-local such as cloud metadata, unspecified,
//! multicast) are refused before anything is sent. So the one check made before the pull
//! cannot be slipped past by a name that resolves elsewhere a moment later (DNS
//! rebinding), by a realm or redirect aimed at the server's own host, or by an address
//! literal in either.
//!
//! `oci-client` takes a proxy URL but no resolver or HTTP client of ours, so the guard is
//! a proxy. HTTPS goes through `CONNECT host:port` (TLS stays end to end: the client checks
//! the certificate against the name); plain HTTP (registries the operator or the request
//! marks insecure) is sent in absolute form and forwarded with `Connection: close`, one
//! request per connection.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Longest request head the guard reads.
const MAX_HEAD: usize = 16 << 10;

/// A running guard; it stops when dropped.
pub(crate) struct EgressGuard {
    addr: SocketAddr,
    /// Why the last refused connection was refused.
    refused: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EgressGuard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EgressGuard {
    /// Start a guard on `127.0.0.1:0` (on the current runtime).
    pub(crate) async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let refused: Arc<Mutex<Option<String>>> = Arc::default();
        let seen = refused.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    if let Err(why) = serve(client).await {
                        *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
                    }
                });
            }
        });
        Ok(Self {
            addr,
            refused,
            task,
        })
    }

    /// The proxy URL to give the client.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Why a connection was refused, if one was.
    pub(crate) fn refusal(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// One client connection: a `CONNECT` tunnel or one plain HTTP request. `Err`: a
/// refused destination, why (the client gets 403).
async fn serve(mut client: TcpStream) -> Result<(), String> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    let end = loop {
        let n = match client.read(&mut buf).await {
            Ok(0) | Err(_) => return Ok(()),
            Ok(n) => n,
        };
        head.extend_from_slice(&buf[..n]);
        if let Some(at) = find(&head, b"\r\n\r\n") {
            break at + 4;
        }
        if head.len() > MAX_HEAD {
            let _ = client.write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
            return Ok(());
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let rest = head[end..].to_vec();
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut parts = first.split(' ');
    let (method, target, version) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or("HTTP/1.1"),
    );
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_authority(target, 443);
        let mut upstream = match connect(&host, port).await {
            Ok(s) => s,
            Err(why) => return refuse(client, why).await,
        };
        if client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await
            .is_err()
        {
            return Ok(());
        }
        if !rest.is_empty() && upstream.write_all(&rest).await.is_err() {
            return Ok(());
        }
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        return Ok(());
    }
    // Plain HTTP in absolute form: `GET http://host:port/path HTTP/1.1`.
    let Some(after) = target.strip_prefix("http://") else {
        let _ = client
            .write_all(
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .await;
        return Ok(());
    };
    let (authority, path) = match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, "/"),
    };
    let (host, port) = split_authority(authority, 80);
    let mut upstream = match connect(&host, port).await {
        Ok(s) => s,
        Err(why) => return refuse(client, why).await,
    };
    let mut forwarded = format!("{method} {path} {version}\r\n");
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim();
        if [
            "connection",
            "proxy-connection",
            "keep-alive",
            "proxy-authorization",
        ]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h))
        {
            continue;
        }
        forwarded.push_str(line);
        forwarded.push_str("\r\n");
    }
    forwarded.push_str("Connection: close\r\n\r\n");
    if upstream.write_all(forwarded.as_bytes()).await.is_err()
        || (!rest.is_empty() && upstream.write_all(&rest).await.is_err())
    {
        return Ok(());
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    Ok(())
}

/// Answer 403 for a refused destination (reported to the pull), 502 for an unreachable
/// one.
async fn refuse(mut client: TcpStream, not: NotConnected) -> Result<(), String> {
    let (status, why, report) = match not {
        NotConnected::Refused(why) => ("403 Forbidden", why, true),
        NotConnected::Unreachable(why) => ("502 Bad Gateway", why, false),
    };
    let body = format!("Hutch's pull guard: {why}\n");
    let _ = client
        .write_all(
            format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await;
    if report {
        Err(why)
    } else {
        Ok(())
    }
}

/// Why a destination was not connected to.
#[derive(Debug)]
enum NotConnected {
    /// An address the pull may not reach (reported to the pull).
    Refused(String),
    /// It could not be reached (the client sees a 502 and says so itself).
    Unreachable(String),
}

/// Resolve `host` now and connect to the first address the pull may reach; refused when
/// any address is one it may not (a name that also points home is not used at all).
async fn connect(host: &str, port: u16) -> Result<TcpStream, NotConnected> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addresses: Vec<SocketAddr> = match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| NotConnected::Unreachable(format!("{host} does not resolve: {e}")))?
            .collect(),
    };
    if let Some(a) = addresses.iter().find(|a| crate::registry::is_local(a.ip())) {
        return Err(NotConnected::Refused(format!(
            "{host}:{port} is at {}, an address of the server's own host or network (loopback, \
             link-local, unspecified or multicast)",
            a.ip()
        )));
    }
    let mut last = String::from("no address");
    for a in &addresses {
        match TcpStream::connect(a).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e.to_string(),
        }
    }
    Err(NotConnected::Unreachable(format!(
        "{host}:{port} could not be reached: {last}"
    )))
}

/// `host:port` (or `[v6]:port`) → host and port (`default` when none).
fn split_authority(authority: &str, default: u16) -> (String, u16) {
    match authority.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => {
            (host.to_owned(), port.parse().unwrap_or(default))
        }
        _ => (authority.to_owned(), default),
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split_with_defaults() {
        assert_eq!(split_authority("r.test:5000", 443), ("r.test".into(), 5000));
        assert_eq!(split_authority("r.test", 443), ("r.test".into(), 443));
        assert_eq!(split_authority("[::1]:8080", 80), ("[::1]".into(), 8080));
        assert_eq!(split_authority("[::1]", 80), ("[::1]".into(), 80));
    }

    #[tokio::test]
    async fn local_destinations_are_refused_before_any_connection() {
        for (host, shown) in [
            ("127.0.0.1", "127.0.0.1"),
            ("169.254.169.254", "169.254.169.254"),
            ("localhost", "localhost"),
            ("[::1]", "::1"),
        ] {
            match connect(host, 80).await {
                Err(NotConnected::Refused(why)) => assert!(why.contains(shown), "{why}"),
                other => panic!("{host}: {other:?}"),
            }
        }
    }
}
