//! Port forwarding against a real server: HTTP and WebSocket proxied to services listening
//! inside sandboxes (busybox `httpd` on `minimal`, a Python service on `base`), the raw TCP
//! tunnel and `hutch port-forward`, and every error a caller can meet.

use std::process::{Command, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use hutch_testkit::{wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const ECHO_SERVICE: &str = include_str!("probe/port_echo.py");

/// Start a program inside the sandbox that outlives the call.
async fn start_background(s: &TestServer, id: &str, cmd: Value) {
    s.start_background(id, cmd).await
}

/// Wait until something answers on `port` through the proxy (not 502).
async fn wait_for_service(s: &TestServer, id: &str, port: u16) {
    s.wait_for_port(id, port).await
}

/// A `minimal` sandbox with busybox httpd serving /srv/www on port 8080.
async fn httpd_sandbox(s: &TestServer) -> String {
    let id = s.create_id(json!({})).await;
    s.put_file(
        &id,
        "/srv/www/file.txt",
        "0644",
        b"hello from inside\n".to_vec(),
    )
    .await;
    start_background(
        s,
        &id,
        json!(["httpd", "-f", "-p", "8080", "-h", "/srv/www"]),
    )
    .await;
    wait_for_service(s, &id, 8080).await;
    id
}

/// A `base` sandbox running the Python echo service on each of `ports` (`v6` ones on ::1).
async fn echo_sandbox(s: &TestServer, ports: &[(u16, bool)]) -> String {
    hutch_testkit::ensure_template("base");
    let id = s.create_id(json!({"template": "base"})).await;
    s.put_file(&id, "/srv/port_echo.py", "0644", ECHO_SERVICE.into())
        .await;
    for &(port, v6) in ports {
        let mut cmd = vec![
            "python3".to_string(),
            "/srv/port_echo.py".into(),
            port.to_string(),
        ];
        if v6 {
            cmd.push("v6".into());
        }
        start_background(s, &id, json!(cmd)).await;
        wait_for_service(s, &id, port).await;
    }
    id
}

fn ws_request(url: &str, key: &str) -> tokio_tungstenite::tungstenite::handshake::client::Request {
    let mut req = url.into_client_request().expect("ws request");
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {key}").parse().expect("header"),
    );
    req
}

/// Open a WebSocket that the server must refuse; its status and JSON body.
async fn ws_refusal(s: &TestServer, path: &str) -> (u16, Value) {
    let url = format!("{}{path}", s.url.replacen("http", "ws", 1));
    match tokio_tungstenite::connect_async(ws_request(&url, &s.key)).await {
        Ok(_) => panic!("{path}: the WebSocket was accepted"),
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let body = resp
                .body()
                .as_deref()
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or(Value::Null);
            (resp.status().as_u16(), body)
        }
        Err(e) => panic!("{path}: {e}"),
    }
}

#[tokio::test]
async fn a_file_is_served_from_busybox_httpd_inside_the_sandbox() {
    let s = TestServer::start().await;
    let id = httpd_sandbox(&s).await;
    let base = format!("{}/v1/sandboxes/{id}/ports/8080", s.url);

    let resp = s
        .http
        .get(format!("{base}/file.txt"))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status().as_u16(), 200);
    let headers = resp.headers().clone();
    assert_eq!(
        headers
            .get("content-type")
            .map(|v| v.to_str().unwrap_or("")),
        Some("text/plain"),
        "{headers:?}"
    );
    assert_eq!(
        headers
            .get("content-length")
            .map(|v| v.to_str().unwrap_or("")),
        Some("18")
    );
    assert_eq!(resp.text().await.expect("body"), "hello from inside\n");

    // Requests at once: each is its own stream on the sandbox's agent connection. (Eight:
    // busybox httpd listens with a backlog of 9, and a full backlog costs a 1 s SYN retry.)
    let requests = (0..8).map(|_| {
        s.http
            .get(format!("{base}/file.txt"))
            .bearer_auth(&s.key)
            .send()
    });
    let all = futures_util::future::join_all(requests).await;
    for resp in all {
        let resp = resp.expect("concurrent get");
        assert_eq!(resp.status().as_u16(), 200);
        assert_eq!(resp.text().await.expect("body"), "hello from inside\n");
    }

    // The service's own statuses pass through untouched (not Hutch's JSON errors).
    let resp = s
        .http
        .get(format!("{base}/missing.txt"))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status().as_u16(), 404);
    assert_eq!(
        resp.headers().get("via").map(|v| v.to_str().unwrap_or("")),
        Some("1.1 hutch"),
        "answers from the service are marked"
    );
    let body = resp.text().await.expect("body");
    assert!(!body.contains("\"error\""), "{body}");

    // Every proxied request's connection inside the sandbox is closed once it is answered
    // (none left ESTABLISHED, state 01, on port 8080 = 0x1F90).
    let closed = wait_until(Duration::from_secs(10), async || {
        let (tcp, _) = s.sh(&id, "cat /proc/net/tcp /proc/net/tcp6").await;
        let open = tcp
            .lines()
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[3] == "01" && (f[1].ends_with(":1F90") || f[2].ends_with(":1F90"))
            })
            .count();
        (open == 0).then_some(())
    })
    .await;
    assert!(
        closed.is_some(),
        "proxied connections left open inside the sandbox"
    );

    // The bare form redirects to the trailing slash, keeping the query.
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let resp = no_redirects
        .get(format!("{base}?x=1"))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status().as_u16(), 308);
    assert_eq!(
        resp.headers()
            .get("location")
            .map(|v| v.to_str().unwrap_or("")),
        Some(format!("/v1/sandboxes/{id}/ports/8080/?x=1").as_str())
    );
}

#[tokio::test]
async fn bodies_stream_both_ways_and_the_api_key_never_reaches_the_sandbox() {
    let s = TestServer::start().await;
    let id = echo_sandbox(&s, &[(8081, false), (8086, true)]).await;
    let base = format!("{}/v1/sandboxes/{id}/ports/8081", s.url);

    // A 3 MiB POST body comes back byte for byte.
    let data: Vec<u8> = (0..3u32 << 20).map(|i| (i % 253) as u8).collect();
    let resp = s
        .http
        .post(format!("{base}/echo?x=1"))
        .bearer_auth(&s.key)
        .header("content-type", "application/x-test")
        .body(data.clone())
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.headers().get("x-echo-method").map(|v| v.as_bytes()),
        Some(&b"POST"[..])
    );
    assert_eq!(
        resp.headers().get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/x-test"[..])
    );
    let back = resp.bytes().await.expect("body");
    assert!(
        back[..] == data[..],
        "echoed body differs ({} bytes)",
        back.len()
    );

    // What the service sees: method, path and query, its own headers; no Hutch key.
    let resp = s
        .http
        .request(Method::PUT, format!("{base}/some/path?a=1&b=two"))
        .bearer_auth(&s.key)
        .header("x-app-header", "kept")
        .header("cookie", "app=1; hutch_token=should-not-pass")
        .body("abc")
        .send()
        .await
        .expect("put");
    assert_eq!(resp.status().as_u16(), 200);
    let seen: Value = resp.json().await.expect("json");
    assert_eq!(seen["method"], "PUT");
    assert_eq!(seen["path"], "/some/path?a=1&b=two");
    assert_eq!(seen["body_len"], 3);
    let headers = &seen["headers"];
    assert_eq!(headers["x-app-header"], "kept");
    assert_eq!(headers["cookie"], "app=1", "{headers}");
    assert_eq!(headers["host"], "localhost:8081");
    assert_eq!(
        headers["x-forwarded-prefix"],
        format!("/v1/sandboxes/{id}/ports/8081")
    );
    assert_eq!(headers["x-forwarded-proto"], "http");
    assert_eq!(headers["via"], "1.1 hutch");
    assert_eq!(headers["x-forwarded-for"], "127.0.0.1");
    assert!(headers["x-forwarded-host"].is_string(), "{headers}");
    assert!(headers.get("authorization").is_none(), "{headers}");
    assert!(!seen.to_string().contains(&s.key), "the key leaked: {seen}");

    // The key in the query is refused (browsers use sandbox tokens: `ports_browser.rs`),
    // and no API route takes it from there either.
    for url in [
        format!("{base}/page?q=1&hutch_token={}", s.key),
        format!("{}/v1/sandboxes?hutch_token={}", s.url, s.key),
    ] {
        let resp = reqwest::Client::new().get(&url).send().await.expect("get");
        assert_eq!(resp.status().as_u16(), 401, "{url}");
        assert!(resp.headers().get("set-cookie").is_none());
    }

    // A service listening on IPv6 loopback only is reached too.
    let resp = s
        .http
        .get(format!("{}/v1/sandboxes/{id}/ports/8086/v6", s.url))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status().as_u16(), 200);
    let seen: Value = resp.json().await.expect("json");
    assert_eq!(seen["path"], "/v6");
}

#[tokio::test]
async fn websockets_are_proxied_to_the_sandbox() {
    let s = TestServer::start().await;
    let id = echo_sandbox(&s, &[(8082, false)]).await;
    let url = format!(
        "{}/v1/sandboxes/{id}/ports/8082/ws",
        s.url.replacen("http", "ws", 1)
    );
    let (mut ws, resp) = tokio_tungstenite::connect_async(ws_request(&url, &s.key))
        .await
        .expect("websocket through the proxy");
    assert_eq!(resp.status().as_u16(), 101);

    ws.send(Message::Text("hello sandbox".into()))
        .await
        .expect("send");
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
    ws.send(Message::Binary(big.clone().into()))
        .await
        .expect("send");
    let mut got_text = false;
    let mut got_binary = false;
    while !(got_text && got_binary) {
        let msg = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("echo in time")
            .expect("open")
            .expect("message");
        match msg {
            Message::Text(t) => {
                assert_eq!(t.as_str(), "hello sandbox");
                got_text = true;
            }
            Message::Binary(b) => {
                assert!(b[..] == big[..], "binary echo differs ({} bytes)", b.len());
                got_binary = true;
            }
            _ => {}
        }
    }
    ws.close(None).await.expect("close");
}

#[tokio::test]
async fn the_raw_tunnel_and_hutch_port_forward_carry_bytes_both_ways() {
    let s = TestServer::start().await;
    let id = httpd_sandbox(&s).await;

    // The WebSocket tunnel: raw HTTP/1.0 bytes in, the service's raw answer out.
    let url = format!(
        "{}/v1/sandboxes/{id}/tunnel/8080",
        s.url.replacen("http", "ws", 1)
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(ws_request(&url, &s.key))
        .await
        .expect("tunnel");
    ws.send(Message::Binary(
        b"GET /file.txt HTTP/1.0\r\nHost: x\r\n\r\n".to_vec().into(),
    ))
    .await
    .expect("send");
    ws.send(Message::Text(json!({"type": "eof"}).to_string().into()))
        .await
        .expect("eof");
    let mut raw = Vec::new();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("answer in time");
        match msg {
            Some(Ok(Message::Binary(b))) => raw.extend_from_slice(&b),
            Some(Ok(Message::Close(_))) | None => break,
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!(
                "tunnel failed: {e}; so far: {:?}",
                String::from_utf8_lossy(&raw)
            ),
        }
    }
    let raw = String::from_utf8_lossy(&raw);
    assert!(raw.starts_with("HTTP/1.1 200 OK\r\n"), "{raw}");
    assert!(raw.ends_with("hello from inside\n"), "{raw}");

    // `hutch port-forward ID 8080 0 --json`: a local port any TCP client can use.
    let mut child = Command::new(hutch_testkit::hutch_bin())
        .args(["port-forward", &id, "8080", "0", "--json"])
        .env("HUTCH_URL", &s.url)
        .env("HUTCH_API_KEY", &s.key)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn port-forward");
    let stdout = tokio::process::ChildStdout::from_std(child.stdout.take().expect("stdout"))
        .expect("async stdout");
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("port-forward printed in time")
        .expect("read")
        .expect("a line");
    let info: Value = serde_json::from_str(&first).expect("json line");
    assert_eq!(info["sandbox"], id.as_str());
    assert_eq!(info["port"], 8080);
    let local = info["local_port"].as_u64().expect("local_port") as u16;
    assert_ne!(local, 0);
    for _ in 0..2 {
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", local))
            .await
            .expect("connect to the forwarded port");
        conn.write_all(b"GET /file.txt HTTP/1.0\r\n\r\n")
            .await
            .expect("write");
        conn.shutdown().await.expect("half-close");
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(20), conn.read_to_string(&mut answer))
            .await
            .expect("answer in time")
            .expect("read");
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("hello from inside\n"), "{answer}");
    }
    // Stop the forwarder this test started (by its pid).
    let _ = child.kill();
    let _ = child.wait();

    // Forwarding to a port where nothing listens: each local connection is closed, and the
    // forwarder keeps serving.
    let mut child = Command::new(hutch_testkit::hutch_bin())
        .args(["port-forward", &id, "9", "0", "--json"])
        .env("HUTCH_URL", &s.url)
        .env("HUTCH_API_KEY", &s.key)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn port-forward");
    let stdout = tokio::process::ChildStdout::from_std(child.stdout.take().expect("stdout"))
        .expect("async stdout");
    let first = tokio::time::timeout(
        Duration::from_secs(20),
        BufReader::new(stdout).lines().next_line(),
    )
    .await
    .expect("port-forward printed in time")
    .expect("read")
    .expect("a line");
    let info: Value = serde_json::from_str(&first).expect("json line");
    let local = info["local_port"].as_u64().expect("local_port") as u16;
    for _ in 0..2 {
        let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", local))
            .await
            .expect("connect to the forwarded port");
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut got))
            .await
            .expect("closed in time");
        assert!(got.is_empty(), "{read:?} {got:?}");
    }
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "the forwarder exited"
    );
    let _ = child.kill();
    let _ = child.wait();

    // An unknown sandbox fails at once, before listening.
    let out = Command::new(hutch_testkit::hutch_bin())
        .args(["port-forward", "sbx_nope", "8080", "0", "--json"])
        .env("HUTCH_URL", &s.url)
        .env("HUTCH_API_KEY", &s.key)
        .output()
        .expect("run port-forward");
    assert_eq!(out.status.code(), Some(1));
    let err: Value = serde_json::from_slice(&out.stdout).expect("json error");
    assert_eq!(err["error"]["code"], "not_found", "{err}");
}

#[tokio::test]
async fn errors_are_json_with_the_right_status() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let get = |path: String, key: Option<String>| {
        let http = s.http.clone();
        let url = format!("{}{path}", s.url);
        async move {
            let mut req = http.get(url);
            if let Some(k) = key {
                req = req.bearer_auth(k);
            }
            let resp = req.send().await.expect("request");
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            (status, body)
        }
    };
    let key = Some(s.key.clone());

    // The routes are in the served OpenAPI document.
    let (status, doc) = s.request(Method::GET, "/v1/openapi.json", None).await;
    assert_eq!(status, 200);
    for p in [
        "/v1/sandboxes/{id}/ports/{port}",
        "/v1/sandboxes/{id}/ports/{port}/{path}",
        "/v1/sandboxes/{id}/tunnel/{port}",
        "/v1/sandboxes/{id}/port-tokens",
    ] {
        assert!(doc["paths"][p].is_object(), "openapi lacks {p}");
    }

    // Nothing listening.
    let (status, body) = get(format!("/v1/sandboxes/{id}/ports/9/x"), key.clone()).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"]["code"], "connection_refused");
    let resp = s
        .http
        .get(format!("{}/v1/sandboxes/{id}/ports/9/", s.url))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("get");
    assert!(
        resp.headers().get("via").is_none(),
        "Hutch's own errors are not marked"
    );
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("port 9"), "{message}");
    let (status, body) = ws_refusal(&s, &format!("/v1/sandboxes/{id}/tunnel/9")).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"]["code"], "connection_refused");

    // Something that is not HTTP.
    start_background(
        &s,
        &id,
        json!(["sh", "-c", "echo not-http | nc -l -p 7000"]),
    )
    .await;
    let not_http = wait_until(Duration::from_secs(20), async || {
        let (status, body) = get(format!("/v1/sandboxes/{id}/ports/7000/"), key.clone()).await;
        (body["error"]["code"] != "connection_refused").then_some((status, body))
    })
    .await;
    let (status, body) = not_http.expect("nc came up");
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"]["code"], "bad_gateway", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("port 7000"), "{message}");

    // No key, a wrong key.
    let (status, body) = get(format!("/v1/sandboxes/{id}/ports/9/"), None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "unauthorized");
    let (status, _) = get(
        format!("/v1/sandboxes/{id}/ports/9/"),
        Some("hk_wrong".into()),
    )
    .await;
    assert_eq!(status, 401);

    // Unknown sandbox.
    let (status, body) = get("/v1/sandboxes/sbx_nope/ports/8080/".into(), key.clone()).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");

    // Ports out of range.
    for bad in ["0", "65536", "http"] {
        let expected = format!("port must be a number from 1 to 65535, got {bad:?}");
        let (status, body) = get(format!("/v1/sandboxes/{id}/ports/{bad}/"), key.clone()).await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["message"], expected);
        let (status, body) = ws_refusal(&s, &format!("/v1/sandboxes/{id}/tunnel/{bad}")).await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["error"]["message"], expected);
    }

    // A paused sandbox answers 409 like every other call.
    let (status, _) = s
        .request(Method::POST, &format!("/v1/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(status, 200);
    let (status, body) = get(format!("/v1/sandboxes/{id}/ports/8080/"), key.clone()).await;
    assert_eq!(status, 409, "{body}");
    let (status, _) = s
        .request(Method::POST, &format!("/v1/sandboxes/{id}/resume"), None)
        .await;
    assert_eq!(status, 200);

    // A hibernated sandbox is woken by the proxy, like exec.
    let (status, v) = s
        .request(Method::POST, &format!("/v1/sandboxes/{id}/hibernate"), None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["state"], "hibernated");
    let (status, body) = get(format!("/v1/sandboxes/{id}/ports/8080/"), key.clone()).await;
    assert_eq!(status, 502, "woken, and still nothing listens: {body}");
    let (_, v) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(v["state"], "running", "{v}");
}

#[tokio::test]
async fn an_open_tunnel_keeps_an_idle_sandbox_from_hibernating() {
    let s = TestServer::start_with(&["--reaper-interval-ms", "100"]).await;
    let id = s
        .create_id(json!({"persistent": true, "idle_hibernate_seconds": 1}))
        .await;
    s.put_file(&id, "/srv/www/file.txt", "0644", b"x".to_vec())
        .await;
    start_background(
        &s,
        &id,
        json!(["httpd", "-f", "-p", "8080", "-h", "/srv/www"]),
    )
    .await;
    wait_for_service(&s, &id, 8080).await;
    let state = async || {
        let (_, v) = s
            .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        v["state"].as_str().unwrap_or_default().to_string()
    };

    // A tunnel that carries nothing still counts as a client.
    let url = format!(
        "{}/v1/sandboxes/{id}/tunnel/8080",
        s.url.replacen("http", "ws", 1)
    );
    let (ws, _) = tokio_tungstenite::connect_async(ws_request(&url, &s.key))
        .await
        .expect("tunnel");
    for _ in 0..25 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(state().await, "running", "hibernated under an open tunnel");
    }
    drop(ws);
    let hibernated = wait_until(Duration::from_secs(15), async || {
        (state().await == "hibernated").then_some(())
    })
    .await;
    assert!(
        hibernated.is_some(),
        "idle after the tunnel closed, yet not hibernated"
    );
}
