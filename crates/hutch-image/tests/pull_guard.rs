//! A tenant's pull never makes the host connect to its own addresses, whatever the
//! registry says: here a registry of the test's own (at 10.213.7.2, in a network namespace
//! the test made, so nothing leaves the machine) answers every request with a bearer
//! challenge whose token realm is a loopback service of the test's. A tenant's pull is
//! refused naming that address and the service sees no request; the same pull with the
//! guard off (an operator's) does reach it, so the test would notice a guard that lets it
//! through.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hutch_image::{pull, BlobStore, ImageError, PullOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A network namespace of the test's own with loopback up and 10.213.7.2 on it; deleted
/// when dropped.
struct Netns(String);

impl Netns {
    fn new() -> Self {
        let name = format!("hzg{:08x}", std::process::id() ^ 0x5a5a_0000);
        let ip = |args: &[&str]| {
            let ok = Command::new("ip")
                .args(args)
                .status()
                .expect("run ip")
                .success();
            assert!(ok, "ip {args:?}");
        };
        ip(&["netns", "add", &name]);
        let ns = Self(name);
        ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
        ip(&["-n", &ns.0, "addr", "add", "10.213.7.2/32", "dev", "lo"]);
        ns
    }

    /// Run `f` on a thread inside the namespace (threads it starts stay there too).
    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.0);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("open the namespace");
            // SAFETY: setns on an open namespace descriptor; it changes this thread only.
            let rc =
                unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns");
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Answer every request on `listener` with `reply`, counting them.
async fn answer(listener: tokio::net::TcpListener, reply: String, hits: Arc<AtomicUsize>) {
    while let Ok((mut conn, _)) = listener.accept().await {
        let (reply, hits) = (reply.clone(), hits.clone());
        tokio::spawn(async move {
            let mut buf = [0u8; 8192];
            let _ = conn.read(&mut buf).await;
            hits.fetch_add(1, Ordering::SeqCst);
            let _ = conn.write_all(reply.as_bytes()).await;
        });
    }
}

/// Pull from the challenging registry with `refuse_local_addresses`; the result and how
/// many requests the loopback token service got.
fn pull_once(refuse_local_addresses: bool) -> (Result<(), ImageError>, usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let token_hits = Arc::new(AtomicUsize::new(0));
    let (registry, token_port) = runtime.block_on(async {
        let token = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let token_port = token.local_addr().expect("addr").port();
        let body = r#"{"token":"t"}"#;
        tokio::spawn(answer(
            token,
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
            token_hits.clone(),
        ));
        let registry = tokio::net::TcpListener::bind("10.213.7.2:0").await.expect("bind");
        let port = registry.local_addr().expect("addr").port();
        tokio::spawn(answer(
            registry,
            format!(
                "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer realm=\"http://127.0.0.1:{token_port}/token\",service=\"reg\",scope=\"repository:app:pull\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            ),
            Arc::new(AtomicUsize::new(0)),
        ));
        (format!("10.213.7.2:{port}"), token_port)
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let store = BlobStore::open(dir.path().join("blobs")).expect("store");
    let options = PullOptions {
        insecure_registries: vec![registry.clone()],
        ignore_docker_config: true,
        refuse_local_addresses,
        ..PullOptions::default()
    };
    let result = pull(&format!("{registry}/app:1"), &store, &options, &mut |_| {}).map(|_| ());
    let _ = token_port;
    (result, token_hits.load(Ordering::SeqCst))
}

#[test]
fn a_tenants_pull_never_fetches_a_token_realm_on_the_hosts_own_addresses() {
    let ns = Netns::new();
    let (guarded, guarded_hits) = ns.run(|| pull_once(true));
    let err = guarded.expect_err("the realm is refused");
    assert!(
        matches!(err, ImageError::RegistryNotAllowed { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("127.0.0.1"), "{err}");
    assert_eq!(guarded_hits, 0, "the loopback service got a request: {err}");

    // An operator's pull is not guarded: the same challenge reaches the service.
    let (_, open_hits) = ns.run(|| pull_once(false));
    assert!(open_hits >= 1, "the unguarded pull fetched the realm");
}
