//! The WebSocket PTY: a real terminal, input echoed, resize seen by the program.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use hutch_testkit::{both_backends, on, TestServer};
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

async fn read_until(
    ws: &mut (impl StreamExt<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin),
    needle: &str,
    seen: &mut String,
) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !seen.contains(needle) {
        let msg = tokio::time::timeout_at(deadline, ws.next()).await;
        match msg {
            Ok(Some(Ok(Message::Binary(b)))) => seen.push_str(&String::from_utf8_lossy(&b)),
            Ok(Some(Ok(Message::Text(t)))) => seen.push_str(t.as_str()),
            Ok(Some(Ok(_))) => {}
            _ => return false,
        }
    }
    true
}

both_backends!(pty_echoes_input_and_follows_resizes);

async fn pty_echoes_input_and_follows_resizes(isolation: &str) {
    let s = TestServer::start().await;
    let id = s.create_id(on(isolation, json!({}))).await;
    let url = format!(
        "{}/v1/sandboxes/{id}/pty?cols=100&rows=30",
        s.url.replacen("http", "ws", 1)
    );
    let mut req = url.into_client_request().expect("request");
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", s.key).parse().expect("header"),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .expect("connect");
    let mut seen = String::new();

    ws.send(Message::Binary(b"tty; stty size\n".to_vec().into()))
        .await
        .expect("send");
    assert!(
        read_until(&mut ws, "30 100", &mut seen).await,
        "no size in: {seen}"
    );
    assert!(seen.contains("/dev/pts/"), "not a terminal: {seen}");

    ws.send(Message::Text(
        json!({"type": "resize", "cols": 132, "rows": 40})
            .to_string()
            .into(),
    ))
    .await
    .expect("resize");
    ws.send(Message::Binary(b"stty size\n".to_vec().into()))
        .await
        .expect("send");
    assert!(
        read_until(&mut ws, "40 132", &mut seen).await,
        "resize not seen: {seen}"
    );

    ws.send(Message::Binary(b"echo mark-$((40+2))\n".to_vec().into()))
        .await
        .expect("send");
    assert!(read_until(&mut ws, "mark-42", &mut seen).await, "{seen}");

    ws.send(Message::Binary(b"exit 7\n".to_vec().into()))
        .await
        .expect("send");
    assert!(
        read_until(&mut ws, "\"exit_code\":7", &mut seen).await,
        "no exit: {seen}"
    );
}

#[tokio::test]
async fn pty_needs_auth_and_a_known_sandbox() {
    let s = TestServer::start().await;
    let url = format!(
        "{}/v1/sandboxes/sbx_nope/pty",
        s.url.replacen("http", "ws", 1)
    );
    let err = tokio_tungstenite::connect_async(url.clone()).await;
    assert!(err.is_err(), "connected without a key");
    let mut req = url.into_client_request().expect("request");
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", s.key).parse().expect("header"),
    );
    match tokio_tungstenite::connect_async(req).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 404),
        other => panic!("expected a 404, got {:?}", other.map(|_| ())),
    }
}

/// A terminal whose process cannot start (a relative or missing cwd, an unknown user) is an
/// ordinary JSON error before the upgrade, never a 101 and then an error frame; a plain GET
/// without the upgrade headers is a JSON 4xx too.
#[tokio::test]
async fn a_terminal_that_cannot_start_is_an_http_error_before_the_upgrade() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let base = format!("{}/v1/sandboxes/{id}/pty", s.url.replacen("http", "ws", 1));
    for (query, status, words) in [
        ("cwd=", 400, "absolute"),
        ("cwd=/no/such/dir", 404, "/no/such/dir"),
        ("user=nobody-at-all", 400, "nobody-at-all"),
    ] {
        let mut req = format!("{base}?{query}")
            .into_client_request()
            .expect("request");
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {}", s.key).parse().expect("header"),
        );
        match tokio_tungstenite::connect_async(req).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                assert_eq!(resp.status(), status, "{query}");
                let body = resp.body().as_deref().unwrap_or_default();
                let v: serde_json::Value = serde_json::from_slice(body).expect("a JSON error");
                let message = v["error"]["message"].as_str().unwrap_or("");
                assert!(message.contains(words), "{query}: {v}");
            }
            other => panic!(
                "{query}: expected an HTTP error, got {:?}",
                other.map(|_| ())
            ),
        }
    }
    // The terminal still opens with good parameters.
    let mut req = format!("{base}?cwd=/tmp")
        .into_client_request()
        .expect("request");
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", s.key).parse().expect("header"),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .expect("connect");
    ws.send(Message::Binary("pwd\n".into()))
        .await
        .expect("send");
    let mut seen = String::new();
    assert!(read_until(&mut ws, "/tmp", &mut seen).await, "{seen}");
    // No upgrade headers at all: a JSON 400, like every other error.
    for path in [
        format!("/v1/sandboxes/{id}/pty"),
        format!("/v1/sandboxes/{id}/tunnel/8080"),
    ] {
        let resp = s
            .http
            .get(format!("{}{path}", s.url))
            .bearer_auth(&s.key)
            .send()
            .await
            .expect("get");
        assert_eq!(resp.status(), 400, "{path}");
        let v: serde_json::Value = resp.json().await.expect("a JSON error");
        assert_eq!(v["error"]["code"], "bad_request", "{path}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("WebSocket"),
            "{path}: {v}"
        );
    }
}
