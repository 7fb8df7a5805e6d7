//! `ADD <url>` in a Dockerfile built through the API: the file is downloaded from an HTTP
//! server of the test's own (on loopback, which an admin key's build may reach), placed
//! with mode 0600 and its `Last-Modified` time, checked with `--checksum`, and cached by
//! its content; a tenant's build is refused the server's own addresses before any request
//! is made.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hutch_testkit::TestServer;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An HTTP/1.0 server on loopback answering every GET with `body` (changeable) and a fixed
/// `Last-Modified`; counts the requests it got.
struct FileServer {
    port: u16,
    body: Arc<Mutex<Vec<u8>>>,
    hits: Arc<AtomicUsize>,
}

impl FileServer {
    async fn start(body: &[u8]) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let body = Arc::new(Mutex::new(body.to_vec()));
        let hits = Arc::new(AtomicUsize::new(0));
        let (b, h) = (body.clone(), hits.clone());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (b, h) = (b.clone(), h.clone());
                tokio::spawn(async move {
                    let mut request = [0u8; 4096];
                    let _ = conn.read(&mut request).await;
                    h.fetch_add(1, Ordering::SeqCst);
                    let body = b.lock().expect("body").clone();
                    let head = format!(
                        "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\
                         Last-Modified: Sun, 09 Sep 2001 01:46:40 GMT\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(head.as_bytes()).await;
                    let _ = conn.write_all(&body).await;
                });
            }
        });
        Self { port, body, hits }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }
}

/// Build `name` from `dockerfile` with `key`; the build's final view.
async fn build_as(s: &TestServer, key: &str, name: &str, dockerfile: &str) -> Value {
    s.build_dockerfile_as(key, name, dockerfile).await
}

#[tokio::test]
async fn add_downloads_a_url_places_it_and_caches_it_by_its_content() {
    let s = TestServer::start().await;
    let files = FileServer::start(b"version one\n").await;
    let name = format!("add-url-{}", std::process::id());
    let dockerfile = format!(
        "FROM minimal\nADD {} /opt/\nADD {} /etc/pinned.txt\nRUN cat /opt/notes.txt\n",
        files.url("dir/notes.txt"),
        files.url("pinned"),
    );
    let first = build_as(&s, &s.key, &name, &dockerfile).await;
    assert_eq!(first["status"], "succeeded", "{first}");
    assert_eq!(files.hits.load(Ordering::SeqCst), 2);
    let id = s.create_id(serde_json::json!({"template": name})).await;
    let out = s
        .sh_ok(
            &id,
            "cat /opt/notes.txt /etc/pinned.txt; stat -c '%a %u %Y' /opt/notes.txt /etc/pinned.txt",
        )
        .await;
    assert_eq!(
        out,
        "version one\nversion one\n600 0 1000000000\n600 0 1000000000\n"
    );

    // Unchanged: downloaded again (to know), then every step a cache hit.
    let again = build_as(&s, &s.key, &name, &dockerfile).await;
    assert_eq!(again["status"], "succeeded", "{again}");
    assert_eq!(files.hits.load(Ordering::SeqCst), 4);
    let log = s.build_log(&s.key, &name, &again).await;
    assert_eq!(log.matches("CACHED").count(), 3, "{log}");

    // Changed: the ADD steps run again, and the sandbox sees the new file.
    *files.body.lock().expect("body") = b"version two\n".to_vec();
    let changed = build_as(&s, &s.key, &name, &dockerfile).await;
    assert_eq!(changed["status"], "succeeded", "{changed}");
    let log = s.build_log(&s.key, &name, &changed).await;
    assert_eq!(log.matches("CACHED").count(), 0, "{log}");
    let id = s.create_id(serde_json::json!({"template": name})).await;
    assert_eq!(s.sh_ok(&id, "cat /opt/notes.txt").await, "version two\n");

    // --checksum: a download that does not match fails the build, naming both.
    let pinned = format!(
        "FROM minimal\nADD --checksum=sha256:{} {} /x\n",
        "0".repeat(64),
        files.url("pinned")
    );
    let refused = build_as(&s, &s.key, &format!("{name}-sum"), &pinned).await;
    assert_eq!(refused["status"], "failed", "{refused}");
    let error = refused["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("--checksum") && error.contains(&"0".repeat(64)),
        "{refused}"
    );
}

#[tokio::test]
async fn a_tenants_add_never_makes_the_server_connect_to_its_own_addresses() {
    let s = TestServer::start().await;
    let files = FileServer::start(b"secret of the host\n").await;
    let key = s.tenant_key("acme", "full").await;
    for (n, url) in [
        files.url("x"),
        format!("http://localhost:{}/x", files.port),
        "http://169.254.169.254/latest/meta-data/".to_string(),
    ]
    .iter()
    .enumerate()
    {
        let name = format!("tenant-add-{n}-{}", std::process::id());
        let b = build_as(&s, &key, &name, &format!("FROM minimal\nADD {url} /x\n")).await;
        assert_eq!(b["status"], "failed", "{url}: {b}");
        let error = b["error"].as_str().unwrap_or_default();
        assert!(error.contains("own host or network"), "{url}: {b}");
    }
    assert_eq!(
        files.hits.load(Ordering::SeqCst),
        0,
        "no request reached the host's server"
    );
}
