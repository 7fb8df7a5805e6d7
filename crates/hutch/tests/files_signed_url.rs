//! Signed file URLs (`POST …/files/url`), from the holder's and the attacker's side: a read
//! URL returns the bytes and a write URL stores them without the key; the same signature
//! used for another path, sandbox, operation or user, with a changed expiry, after its
//! expiry, or after the sandbox is deleted, is refused.

use std::time::Duration;

use hutch_testkit::{both_backends, on, wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// `POST /v1/sandboxes/{id}/files/url`: `(status, answer)`.
async fn file_url(s: &TestServer, id: &str, body: Value) -> (u16, Value) {
    s.post(&format!("/v1/sandboxes/{id}/files/url"), body).await
}

/// A URL's query with one parameter replaced (or added).
fn with_param(url: &str, key: &str, value: &str) -> String {
    let (base, query) = url.split_once('?').expect("a query");
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    match pairs.iter_mut().find(|(k, _)| k == key) {
        Some(pair) => pair.1 = value.to_string(),
        None => pairs.push((key.to_string(), value.to_string())),
    }
    let query: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{base}?{}", query.join("&"))
}

/// GET without the key: `(status, body as text)`.
async fn get(url: &str) -> (u16, String) {
    let resp = reqwest::get(url).await.expect("get");
    (resp.status().as_u16(), resp.text().await.expect("body"))
}

/// PUT `body` without the key: `(status, answer as text)`.
async fn put(url: &str, body: &'static str) -> (u16, String) {
    let resp = reqwest::Client::new()
        .put(url)
        .body(body)
        .send()
        .await
        .expect("put");
    (resp.status().as_u16(), resp.text().await.expect("body"))
}

fn expires_of(url: &str) -> i64 {
    url.split(['?', '&'])
        .find_map(|p| p.strip_prefix("expires="))
        .expect("expires")
        .parse()
        .expect("a number")
}

#[tokio::test]
async fn a_read_url_returns_the_bytes_and_nothing_else() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let other = s.create_id(json!({})).await;
    s.sh_ok(
        &id,
        "mkdir /w && printf secret-bytes > /w/a.txt && printf other > /w/b.txt",
    )
    .await;
    let plain = format!("{}/v1/sandboxes/{id}/files?path=/w/a.txt", s.url);
    assert_eq!(get(&plain).await.0, 401, "no key and no signature");

    let (status, made) = file_url(&s, &id, json!({"path": "/w/a.txt", "op": "read"})).await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["method"], "GET");
    let url = made["url"].as_str().expect("url").to_string();
    assert!(url.starts_with(&s.url), "{url}");
    let expires = expires_of(&url);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    assert!(
        (now + 290..=now + 310).contains(&expires),
        "default 300 s: {expires}"
    );
    assert!(made["expires_at"]
        .as_str()
        .expect("expires_at")
        .ends_with('Z'));

    let (status, body) = get(&url).await;
    assert_eq!((status, body.as_str()), (200, "secret-bytes"));

    // The same signature for anything else.
    let refused = [
        ("another path", with_param(&url, "path", "/w/b.txt")),
        ("another user", with_param(&url, "user", "root")),
        (
            "a later expiry",
            with_param(&url, "expires", &(expires + 3600).to_string()),
        ),
        (
            "an earlier expiry",
            with_param(&url, "expires", &(expires - 1).to_string()),
        ),
        (
            "another signature",
            with_param(
                &url,
                "signature",
                "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            ),
        ),
        ("another sandbox", url.replace(&id, &other)),
    ];
    for (what, forged) in refused {
        let (status, body) = get(&forged).await;
        assert_eq!(status, 403, "{what}: {body}");
        assert!(body.contains("signature does not match"), "{what}: {body}");
    }
    let (status, body) = put(&url, "overwritten").await;
    assert_eq!(status, 403, "a read URL used to write: {body}");
    assert_eq!(s.sh_ok(&id, "cat /w/a.txt").await, "secret-bytes");
    let no_expiry: String = url
        .split('&')
        .filter(|p| !p.starts_with("expires="))
        .collect::<Vec<_>>()
        .join("&");
    assert_eq!(
        get(&no_expiry).await.0,
        401,
        "a signature without its expiry"
    );
    // Other routes take no signature.
    let delete = reqwest::Client::new()
        .delete(&url)
        .send()
        .await
        .expect("delete");
    assert_eq!(delete.status(), 401);
    assert_eq!(s.sh_ok(&id, "cat /w/a.txt").await, "secret-bytes");

    // Deleted sandbox: the URL finds nothing.
    assert_eq!(s.kill(&id).await, 204);
    let (status, body) = get(&url).await;
    assert_eq!(status, 404, "{body}");
}

both_backends!(a_write_url_stores_the_body_as_its_user);

async fn a_write_url_stores_the_body_as_its_user(isolation: &str) {
    let s = TestServer::start().await;
    let id = s.create_id(on(isolation, json!({}))).await;
    let (status, made) = file_url(
        &s,
        &id,
        json!({"path": "/home/user/up.txt", "op": "write", "user": "user", "expires_in_seconds": 60}),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["method"], "PUT");
    let url = made["url"].as_str().expect("url").to_string();
    assert!(url.contains("user=user"), "{url}");
    let (status, body) = put(&url, "uploaded").await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(
        s.sh_ok(
            &id,
            "cat /home/user/up.txt; echo; stat -c %U /home/user/up.txt"
        )
        .await,
        "uploaded\nuser\n"
    );
    let (status, body) = get(&url).await;
    assert_eq!(status, 403, "a write URL used to read: {body}");
    let (status, body) = put(&with_param(&url, "user", "root"), "as root").await;
    assert_eq!(status, 403, "{body}");

    // As that user: its permissions apply.
    let (status, made) = file_url(
        &s,
        &id,
        json!({"path": "/root/nope.txt", "op": "write", "user": "user"}),
    )
    .await;
    assert_eq!(status, 201);
    let (status, body) = put(made["url"].as_str().expect("url"), "x").await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("permission_denied"), "{body}");
}

#[tokio::test]
async fn an_expired_url_is_refused_naming_its_expiry() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    s.sh_ok(&id, "echo x > /f").await;
    let (status, made) = file_url(
        &s,
        &id,
        json!({"path": "/f", "op": "read", "expires_in_seconds": 1}),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let url = made["url"].as_str().expect("url").to_string();
    let refused = wait_until(Duration::from_secs(10), async || {
        let (status, body) = get(&url).await;
        (status == 403).then_some(body)
    })
    .await
    .expect("refused once expired");
    let answer: Value = serde_json::from_str(&refused).expect("a JSON error");
    let message = answer["error"]["message"].as_str().expect("message");
    let expires_at = made["expires_at"].as_str().expect("expires_at");
    assert!(
        message.contains(&format!("expired at {expires_at}")),
        "{message}"
    );
    assert_eq!(answer["error"]["code"], "forbidden");
}

#[tokio::test]
async fn file_url_requests_are_checked() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    for (body, status) in [
        (
            json!({"path": "/f", "op": "read", "expires_in_seconds": 0}),
            422,
        ),
        (
            json!({"path": "/f", "op": "read", "expires_in_seconds": 604_801}),
            422,
        ),
        (json!({"path": "f", "op": "read"}), 400),
        (json!({"path": "/f", "op": "delete"}), 400),
        (json!({"path": "/f", "op": "read", "user": ""}), 400),
        (json!({"path": "/f", "op": "read", "extra": 1}), 400),
    ] {
        let (got, answer) = file_url(&s, &id, body.clone()).await;
        assert_eq!(got, status, "{body}: {answer}");
    }
    let (status, _) = file_url(
        &s,
        &id,
        json!({"path": "/f", "op": "read", "expires_in_seconds": 604_800}),
    )
    .await;
    assert_eq!(status, 201, "7 days is the longest");
    let (status, _) = s
        .request(
            Method::POST,
            "/v1/sandboxes/sbx_nosuchsandbox0000/files/url",
            Some(json!({"path": "/f", "op": "read"})),
        )
        .await;
    assert_eq!(status, 404);
    let unauthenticated = reqwest::Client::new()
        .post(format!("{}/v1/sandboxes/{id}/files/url", s.url))
        .json(&json!({"path": "/f", "op": "read"}))
        .send()
        .await
        .expect("post");
    assert_eq!(unauthenticated.status(), 401, "making a URL takes the key");
}
