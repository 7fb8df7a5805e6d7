//! The port proxy from the attacker's side: a hostile service inside a sandbox
//! (`probe/port_spy.py`) and a real headless Chromium opening it the way a person would,
//! on the preview origin and on the API origin. The service must learn neither the API key
//! nor any sandbox token, its service worker must fail to register, and the cookies it sets
//! must not reach other paths or hosts. Also the HTTP-level rules: link exchange, cookie
//! scope, sandbox tokens refused everywhere else.
//!
//! Needs Debian's `chromium` package for the browser cases (they skip, loudly, without it).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hutch_testkit::TestServer;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SPY_SERVICE: &str = include_str!("probe/port_spy.py");
const SPY_PORT: u16 = 8000;
const SPY_LOG: &str = "/tmp/spy.log";

/// A `base` sandbox running the spy on port 8000.
async fn spy_sandbox(s: &TestServer) -> String {
    hutch_testkit::ensure_template("base");
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

/// The `hutch_token` cookie a response sets.
fn session_cookie(resp: &reqwest::Response) -> String {
    let set = resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("hutch_token="))
        .unwrap_or_else(|| panic!("no session cookie: {:?}", resp.headers()))
        .to_string();
    set.split(';').next().expect("pair").to_string()
}

async fn status_and_body(req: reqwest::RequestBuilder) -> (u16, Value) {
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn links_cookies_and_tokens_are_checked_at_every_door() {
    let s = TestServer::start().await;
    let id = spy_sandbox(&s).await;
    let other = s.create_id(json!({})).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let api = format!("{}/v1/sandboxes/{id}/ports/{SPY_PORT}", s.url);

    // Asking for a link: validated, tenant-checked, 404 for a sandbox that is not there.
    let (status, v) = port_token(&s, &id, json!({"port": 8000, "ttl_seconds": 0})).await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(
        v["error"]["message"],
        "ttl_seconds must be from 1 to 3600, got 0"
    );
    let (status, _) = port_token(&s, &id, json!({"bogus": 1})).await;
    assert_eq!(status, 400);
    let (status, _) = port_token(&s, "sbx_nope", json!({"port": 8000})).await;
    assert_eq!(status, 404);
    let (status, _) =
        status_and_body(http.post(format!("{}/v1/sandboxes/{id}/port-tokens", s.url))).await;
    assert_eq!(status, 401, "asking for a link takes the API key");
    let (url, link) = link(&s, &id).await;
    assert!(url.contains(&link));

    // The API key in a URL is refused, never proxied, and never turned into a cookie.
    let resp = http
        .get(format!("{api}/page?hutch_token={}", s.key))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status().as_u16(), 401);
    assert!(resp.headers().get("set-cookie").is_none());
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"]["code"], "unauthorized", "{body}");

    // A link is answered 303 to the same URL without it, with the session cookie.
    let resp = http
        .get(format!("{api}/page?x=1&hutch_token={link}"))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status().as_u16(), 303);
    assert!(resp.headers().get("via").is_none(), "not proxied");
    assert_eq!(
        resp.headers()["location"],
        format!("/v1/sandboxes/{id}/ports/{SPY_PORT}/page?x=1").as_str()
    );
    let set = resp.headers()["set-cookie"]
        .to_str()
        .expect("ascii")
        .to_string();
    for attr in [
        "HttpOnly",
        "SameSite=Strict",
        &format!("Path=/v1/sandboxes/{id}/ports/{SPY_PORT}/"),
    ] {
        assert!(set.contains(attr), "{set}");
    }
    let session = session_cookie(&resp);
    let session_token = session.trim_start_matches("hutch_token=").to_string();
    assert_ne!(session_token, link);

    // The session works on its port; the answer is cleaned for a browser.
    let resp = http
        .get(format!("{api}/"))
        .header("cookie", format!("app=1; {session}"))
        .header("referer", format!("{api}/?hutch_token={}", s.key))
        .header("origin", format!("http://x/?{link}"))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status().as_u16(), 200);
    let h = resp.headers();
    assert!(h.get("service-worker-allowed").is_none(), "{h:?}");
    assert_eq!(h["referrer-policy"], "no-referrer");
    assert_eq!(h["cross-origin-opener-policy"], "same-origin");
    assert_eq!(h["cross-origin-resource-policy"], "same-origin");
    let cookies: Vec<&str> = h
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    assert_eq!(
        cookies.len(),
        2,
        "the service's own hutch_token is dropped: {cookies:?}"
    );
    for c in &cookies {
        assert!(
            c.contains(&format!("Path=/v1/sandboxes/{id}/ports/{SPY_PORT}/"))
                && !c.contains("Domain"),
            "{c}"
        );
    }

    // A service worker's script is never fetched from the service.
    let (status, body) = status_and_body(
        http.get(format!("{api}/sw.js"))
            .header("cookie", &session)
            .header("service-worker", "script"),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("service workers are refused"),
        "{body}"
    );

    // A token opens only its own sandbox's port, only the way it was meant to be carried.
    let refused = [
        // another port of the same sandbox
        (
            format!("{}/v1/sandboxes/{id}/ports/8001/", s.url),
            session.clone(),
        ),
        // another sandbox
        (
            format!("{}/v1/sandboxes/{other}/ports/{SPY_PORT}/", s.url),
            session.clone(),
        ),
        // a link token offered as the session cookie
        (format!("{api}/"), format!("hutch_token={link}")),
        // a tampered session
        (format!("{api}/"), format!("{session}x")),
        // the API key as the cookie
        (format!("{api}/"), format!("hutch_token={}", s.key)),
    ];
    for (url, cookie) in refused {
        let (status, body) = status_and_body(http.get(&url).header("cookie", &cookie)).await;
        assert_eq!(status, 401, "{url} with {cookie}: {body}");
        assert_eq!(body["error"]["code"], "unauthorized", "{body}");
    }
    // A session token is no link.
    let (status, _) =
        status_and_body(http.get(format!("{api}/?hutch_token={session_token}"))).await;
    assert_eq!(status, 401);
    // No credential at all: 401 JSON.
    let (status, body) = status_and_body(http.get(format!("{api}/"))).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "unauthorized");

    // A sandbox token authenticates no API call, nor does any cookie.
    for token in [&link, &session_token] {
        let (status, body) = status_and_body(
            http.get(format!("{}/v1/sandboxes", s.url))
                .bearer_auth(token),
        )
        .await;
        assert_eq!(status, 401, "{body}");
        let (status, _) = status_and_body(
            http.get(format!("{}/v1/sandboxes/{id}/tunnel/{SPY_PORT}", s.url))
                .bearer_auth(token),
        )
        .await;
        assert_eq!(status, 401);
    }
    let (status, _) = status_and_body(
        http.get(format!("{}/v1/sandboxes", s.url))
            .header("cookie", format!("hutch_token={}", s.key)),
    )
    .await;
    assert_eq!(status, 401);

    // The preview origin takes sandbox tokens only, and only for the host they name.
    let preview = s.preview_url.clone().expect("preview origin");
    let addr: std::net::SocketAddr = preview
        .trim_start_matches("http://")
        .parse()
        .expect("preview address");
    let host = format!("{SPY_PORT}-{id}.localhost");
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .resolve(&host, addr)
        .build()
        .expect("client");
    let origin = format!("http://{host}:{}", addr.port());
    let (status, _) = status_and_body(browser.get(format!("{origin}/")).bearer_auth(&s.key)).await;
    assert_eq!(
        status, 401,
        "the API key opens nothing on the preview origin"
    );
    let (status, _) =
        status_and_body(browser.get(format!("{origin}/?hutch_token={}", s.key))).await;
    assert_eq!(status, 401);
    let resp = browser
        .get(format!("{origin}/page?hutch_token={link}&y=2"))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status().as_u16(), 303);
    assert_eq!(resp.headers()["location"], "/page?y=2");
    let set = resp.headers()["set-cookie"]
        .to_str()
        .expect("ascii")
        .to_string();
    assert!(set.contains("Path=/;") && set.contains("HttpOnly"), "{set}");
    assert!(!set.contains("Domain"), "host-only: {set}");
    let preview_session = session_cookie(&resp);
    let resp = browser
        .get(format!("{origin}/"))
        .header("cookie", &preview_session)
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp
        .headers()
        .get_all("set-cookie")
        .iter()
        .all(|c| !c.to_str().unwrap_or_default().contains("Domain")));
    // The session of one host is refused on another sandbox's host.
    let other_host = format!("{SPY_PORT}-{other}.localhost");
    let client = reqwest::Client::builder()
        .resolve(&other_host, addr)
        .build()
        .expect("client");
    let (status, _) = status_and_body(
        client
            .get(format!("http://{other_host}:{}/", addr.port()))
            .header("cookie", &preview_session),
    )
    .await;
    assert_eq!(status, 401);
    // A host that names no sandbox.
    let (status, body) = status_and_body(http.get(format!("{preview}/"))).await;
    assert_eq!(status, 404, "{body}");

    // A link for every port opens any one of them (and its cookie only that one).
    let (status, v) = port_token(&s, &id, json!({})).await;
    assert_eq!(status, 201, "{v}");
    assert!(v["url"].is_null(), "{v}");
    let any = v["token"].as_str().expect("token");
    let (status, _) = status_and_body(http.get(format!("{api}/?hutch_token={any}"))).await;
    assert_eq!(status, 303);

    // After all of it, the service never saw a credential.
    let log = spy_log(&s, &id).await;
    for secret in [
        s.key.as_str(),
        &link,
        &session_token,
        "hutch_token",
        "hst1.",
    ] {
        assert!(!log.contains(secret), "the service saw {secret:?}: {log}");
    }
    assert!(!log.contains("/sw.js"), "{log}");
}
