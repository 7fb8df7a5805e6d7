//! The port proxy from the attacker's side: a hostile service inside a sandbox
//! (`probe/port_spy.py`) and a real headless Chromium opening it the way a person would,
//! on the preview origin and on the API origin. The service must learn neither the API key
//! nor any sandbox token, its service worker must fail to register, and the cookies it sets
//! must not reach other paths or hosts. Also the HTTP-level rules: link exchange, cookie
//! scope, sandbox tokens refused everywhere else.
//!
//! Needs Debian's `chromium` package for the browser cases (they skip, loudly, without it).

mod common;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::TestServer;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SPY_SERVICE: &str = include_str!("probe/port_spy.py");
const SPY_PORT: u16 = 8000;
const SPY_LOG: &str = "/tmp/spy.log";

/// A `base` sandbox running the spy on port 8000.
async fn spy_sandbox(s: &TestServer) -> String {
    common::ensure_template("base");
    let id = s.create_id(json!({"template": "base"})).await;
    s.put_file(&id, "/srv/port_spy.py", "0644", SPY_SERVICE.into())
        .await;
    s.start_background(
        &id,
        json!(["python3", "/srv/port_spy.py", SPY_PORT.to_string(), SPY_LOG]),
    )
    .await;
    s.wait_for_port(&id, SPY_PORT).await;
    id
}

/// Every request the spy recorded, as one text (what it could have kept).
async fn spy_log(s: &TestServer, id: &str) -> String {
    s.sh(id, &format!("cat {SPY_LOG}")).await.0
}

/// `POST /v1/sandboxes/{id}/port-tokens`.
async fn port_token(s: &TestServer, id: &str, body: Value) -> (u16, Value) {
    s.request(
        Method::POST,
        &format!("/v1/sandboxes/{id}/port-tokens"),
        Some(body),
    )
    .await
}

/// A browser link to the spy.
async fn link(s: &TestServer, id: &str) -> (String, String) {
    let (status, v) = port_token(s, id, json!({"port": SPY_PORT})).await;
    assert_eq!(status, 201, "{v}");
    (
        v["url"].as_str().expect("url").to_string(),
        v["token"].as_str().expect("token").to_string(),
    )
}

/// A listener of the test on 127.0.0.1 (outside every sandbox) that records the head of
/// every request it gets and answers an empty 200.
struct Probe {
    port: u16,
    heads: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Probe {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind probe");
        let port = listener.local_addr().expect("addr").port();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    seen.lock()
                        .expect("probe lock")
                        .push(String::from_utf8_lossy(&head).to_string());
                    let _ = conn
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        )
                        .await;
                });
            }
        });
        Self { port, heads, task }
    }

    fn seen(&self) -> Vec<String> {
        self.heads.lock().expect("probe lock").clone()
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The Chromium binary, if installed.
fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HUTCH_TEST_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| {
            std::env::var_os("PATH")
                .map(|paths| {
                    std::env::split_paths(&paths)
                        .map(|d| d.join(name))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        })
        .find(|p| p.is_file())
}

/// Open `url` in a fresh headless Chromium profile, let its scripts run, return the DOM.
async fn browse(chromium: &PathBuf, url: &str) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let run = tokio::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=15000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .expect("chromium finished in time")
        .expect("run chromium");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// What the spy's page wrote into `<pre id="result">`.
fn page_findings(dom: &str) -> Value {
    let text = dom
        .split("<pre id=\"result\">")
        .nth(1)
        .and_then(|rest| rest.split("</pre>").next())
        .unwrap_or_else(|| panic!("no result in the page: {dom}"));
    let text = text
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Open the spy in Chromium through `url` and check, from the service's side and the
/// page's, that no credential leaked and the worker and cookies got nowhere. `probe_host`
/// is the host name the page loads the probe under (another path of its host, or the host
/// the API would be on).
async fn attack(s: &TestServer, id: &str, url: &str, token: &str, probe_host: &str) -> Value {
    let Some(chromium) = chromium() else {
        eprintln!(
            "\n!!!! SKIPPED: no chromium binary (apt-get install chromium): the browser attack \
             on the port proxy was NOT tested !!!!\n"
        );
        return Value::Null;
    };
    let probe = Probe::start().await;
    let probe_url = format!("http://{probe_host}:{}/v1/sandboxes", probe.port);
    let url = format!("{url}&probe={}", urlencode(&probe_url));
    let dom = browse(&chromium, &url).await;
    let found = page_findings(&dom);
    let log = spy_log(s, id).await;

    // The service learned nothing: not from the URL, the Referer, cookies or a worker.
    for secret in [s.key.as_str(), token, "hutch_token=hst1", "hst1."] {
        assert!(!log.contains(secret), "the service saw {secret:?}: {log}");
        assert!(
            !found.to_string().contains(secret),
            "the page read {secret:?}: {found}"
        );
    }
    assert!(
        !found["search"]
            .as_str()
            .unwrap_or_default()
            .contains("hutch_token"),
        "{found}"
    );
    assert_eq!(found["referrer"], "", "{found}");
    // The subresource was loaded (so the absence of a Referer above means something).
    assert!(log.contains("\"/sub.txt\""), "{log}");
    assert!(log.contains("\"/pixel.png\""), "{log}");
    assert!(
        !log.contains("\"referer\""),
        "a Referer reached the service: {log}"
    );
    // The worker never registered, and its script never reached the service.
    let sw = found["sw"].as_str().unwrap_or_default();
    assert!(
        sw.starts_with("failed"),
        "the service worker registered: {found}"
    );
    assert!(!log.contains("/sw.js"), "{log}");
    assert!(!log.contains("/stolen"), "{log}");
    // The page reported back what it found (it ran to the end).
    assert!(log.contains("/report?d="), "{log}");

    // The cookies it set for the whole host reached no other path or host.
    let probe_heads = probe.seen();
    assert!(
        !probe_heads.is_empty(),
        "the probe was never loaded: {found}"
    );
    for head in &probe_heads {
        assert!(
            !head.contains("planted"),
            "a sandbox cookie escaped: {head}"
        );
        assert!(!head.contains("hutch_token"), "{head}");
    }
    found
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn a_hostile_page_on_the_preview_origin_learns_no_credential() {
    let s = TestServer::start().await;
    assert!(
        s.preview_url.is_some(),
        "the preview origin is on by default"
    );
    let id = spy_sandbox(&s).await;
    let (url, token) = link(&s, &id).await;
    let preview_port = s
        .preview_url
        .as_deref()
        .and_then(|u| u.rsplit(':').next())
        .expect("preview port");
    assert!(
        url.starts_with(&format!(
            "http://{SPY_PORT}-{id}.localhost:{preview_port}/?hutch_token="
        )),
        "{url}"
    );
    let found = attack(&s, &id, &url, &token, "localhost").await;
    if found.is_null() {
        return;
    }
    let own_origin = format!("http://{SPY_PORT}-{id}.localhost:{preview_port}/?probe=");
    assert!(
        found["href"]
            .as_str()
            .unwrap_or_default()
            .starts_with(&own_origin),
        "the page runs at its own origin, without the token: {found}"
    );
    // On its own origin, `/v1/sandboxes` is the service's own path, not the API.
    assert_eq!(found["api_status"], 200, "{found}");
}

#[tokio::test]
async fn a_hostile_page_on_the_api_origin_learns_no_credential() {
    let s = TestServer::start_with(&["--preview-listen", "off"]).await;
    assert!(s.preview_url.is_none());
    let id = spy_sandbox(&s).await;
    let (url, token) = link(&s, &id).await;
    assert!(
        url.starts_with(&format!(
            "{}/v1/sandboxes/{id}/ports/{SPY_PORT}/?hutch_token=hst1.",
            s.url
        )),
        "{url}"
    );
    let found = attack(&s, &id, &url, &token, "127.0.0.1").await;
    if found.is_null() {
        return;
    }
    // The page shares the API's origin, yet calls the API in vain: no cookie or URL there
    // authenticates an API call.
    assert_eq!(found["api_status"], 401, "{found}");
}
