//! API keys from the attacker's side: a client holding a read-only, exec, selector-limited,
//! expired or revoked key tries what the key must not do. Scopes refuse with 403, a
//! revoked or expired key is 401 at once (the key cache does not keep it alive) and what it
//! held open (a terminal, an exec stream, an event stream) is closed; a key is shown once,
//! stored hashed, and its last use is written in batches, not on every request.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hutch_testkit::{wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// A key made with `body` and its record (`POST /v1/keys`, answered with the secret).
async fn make_key(s: &TestServer, body: Value) -> (String, Value) {
    if let Some(t) = body["tenant"].as_str() {
        if s.request(Method::GET, &format!("/v1/tenants/{t}"), None)
            .await
            .0
            == 404
        {
            s.tenant(t, json!({})).await;
        }
    }
    let (status, v) = s.request(Method::POST, "/v1/keys", Some(body)).await;
    assert_eq!(status, 201, "{v}");
    (v["secret"].as_str().expect("secret").to_string(), v)
}

/// Open a terminal in `id` with `key`.
async fn open_pty(
    s: &TestServer,
    key: &str,
    id: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    let url = format!("{}/v1/sandboxes/{id}/pty", s.url.replacen("http", "ws", 1));
    let mut req = url.into_client_request().expect("request");
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {key}").parse().expect("header"),
    );
    tokio_tungstenite::connect_async(req)
        .await
        .expect("a terminal opens")
        .0
}

#[tokio::test]
async fn scopes_limit_what_a_key_may_do_and_keys_only_narrow() {
    let s = TestServer::start().await;
    let full = s.tenant_key("acme", "full").await;
    let exec = s.tenant_key("acme", "exec").await;
    let read = s.tenant_key("acme", "read-only").await;
    let (status, v) = s
        .request_as(&full, Method::POST, "/v1/sandboxes", Some(json!({})))
        .await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    let run = json!({"cmd": ["true"]});
    let file = format!("/v1/sandboxes/{id}/files?path=/tmp/x");
    // What each key gets; 2xx means allowed.
    let cases: Vec<(Method, String, Option<Value>, [u16; 3])> = vec![
        // [full, exec, read-only]
        (
            Method::GET,
            format!("/v1/sandboxes/{id}"),
            None,
            [200, 200, 200],
        ),
        (Method::GET, "/v1/sandboxes".into(), None, [200, 200, 200]),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            Some(run.clone()),
            [200, 200, 403],
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/files/mkdir"),
            Some(json!({"path": "/tmp/d"})),
            [204, 204, 403],
        ),
        (
            Method::GET,
            format!("/v1/sandboxes/{id}/pty"),
            None,
            [400, 400, 403],
        ),
        (
            Method::GET,
            format!("/v1/sandboxes/{id}/ports/8080/"),
            None,
            [502, 502, 403],
        ),
        (
            Method::POST,
            "/v1/sandboxes".into(),
            Some(json!({})),
            [201, 403, 403],
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/snapshots"),
            None,
            [201, 403, 403],
        ),
        (
            Method::POST,
            "/v1/volumes".into(),
            Some(json!({"name": "v", "size_mib": 8})),
            [201, 403, 403],
        ),
        (Method::GET, "/v1/keys".into(), None, [200, 403, 403]),
        (
            Method::POST,
            "/v1/keys".into(),
            Some(json!({"scope": "read-only"})),
            [201, 403, 403],
        ),
        (Method::GET, "/v1/tenants".into(), None, [403, 403, 403]),
    ];
    for (method, path, body, want) in cases {
        for (key, name, want) in [
            (&full, "full", want[0]),
            (&exec, "exec", want[1]),
            (&read, "read-only", want[2]),
        ] {
            let (status, v) = s.request_as(key, method.clone(), &path, body.clone()).await;
            assert_eq!(status, want, "{name} key: {method} {path}: {v}");
            if want == 403 {
                assert_eq!(v["error"]["code"], "forbidden", "{v}");
            }
        }
    }
    // A file write is exec's; a read is read-only's too.
    let put = |key: &str| {
        s.http
            .put(format!("{}{file}", s.url))
            .bearer_auth(key.to_string())
            .body("x")
            .send()
    };
    assert_eq!(put(&exec).await.expect("put").status(), 204);
    assert_eq!(put(&read).await.expect("put").status(), 403);
    let (status, _) = s.request_as(&read, Method::GET, &file, None).await;
    assert_eq!(status, 200);
    // Deleting is for full keys.
    for key in [&exec, &read] {
        let (status, v) = s
            .request_as(key, Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await;
        assert_eq!(status, 403, "{v}");
    }
    // A full key makes no admin key and no key of another tenant.
    for body in [
        json!({"scope": "admin"}),
        json!({"tenant": "other", "scope": "read-only"}),
    ] {
        let (status, v) = s
            .request_as(&full, Method::POST, "/v1/keys", Some(body.clone()))
            .await;
        assert_eq!(status, 403, "{body}: {v}");
    }
    assert_eq!(s.kill(&id).await, 204);
}

#[tokio::test]
async fn a_revoked_key_is_refused_at_once_and_what_it_holds_open_is_closed() {
    let s = TestServer::start().await;
    let (key, record) = make_key(&s, json!({"tenant": "acme", "scope": "full"})).await;
    let key_id = record["id"].as_str().expect("id").to_string();
    let (status, v) = s
        .request_as(&key, Method::POST, "/v1/sandboxes", Some(json!({})))
        .await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    // Used once, so the server has it in its key cache.
    assert_eq!(
        s.request_as(&key, Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await
            .0,
        200
    );
    let mut pty = open_pty(&s, &key, &id).await;
    let stream = s
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec/stream", s.url))
        .bearer_auth(&key)
        .json(&json!({"cmd": "echo started; sleep 60"}))
        .send()
        .await
        .expect("exec stream");
    assert_eq!(stream.status(), 200);
    let mut stream = stream.bytes_stream();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the stream starts");
    assert!(first.is_some_and(|c| c.is_ok()));
    let events = s
        .http
        .get(format!("{}/v1/events", s.url))
        .bearer_auth(&key)
        .send()
        .await
        .expect("events");
    assert_eq!(events.status(), 200);
    let mut events = events.bytes_stream();

    let t0 = Instant::now();
    let (status, v) = s
        .request(Method::DELETE, &format!("/v1/keys/{key_id}"), None)
        .await;
    assert_eq!(status, 204, "{v}");
    // At once: not after the cache's few seconds.
    let (status, v) = s
        .request_as(&key, Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 401, "{v}");
    assert!(t0.elapsed() < Duration::from_secs(2));
    // The terminal closes.
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match pty.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the revoked key's terminal is still open");
    // So does the exec stream (its `sleep 60` would hold it a minute) and the event stream.
    for (what, s) in [("exec stream", &mut stream), ("event stream", &mut events)] {
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match s.next().await {
                    None | Some(Err(_)) => return,
                    Some(Ok(_)) => {}
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "the revoked key's {what} is still open");
    }
    // The sandbox itself is the tenant's, untouched.
    assert_eq!(s.state(&id).await, "running");
    // Revoking again is 404, like an unknown key.
    let (status, _) = s
        .request(Method::DELETE, &format!("/v1/keys/{key_id}"), None)
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn an_expired_key_is_401_and_its_stream_ends_when_it_expires() {
    let s = TestServer::start().await;
    let (key, record) = make_key(
        &s,
        json!({"tenant": "acme", "scope": "full", "expires_in_seconds": 3}),
    )
    .await;
    assert!(record["expires_at"].as_str().is_some(), "{record}");
    let (status, v) = s.request_as(&key, Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(status, 200, "{v}");
    let events = s
        .http
        .get(format!("{}/v1/events", s.url))
        .bearer_auth(&key)
        .send()
        .await
        .expect("events");
    let mut events = events.bytes_stream();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match events.next().await {
                None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "an expired key's stream is still open");
    let (status, v) = s.request_as(&key, Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(status, 401, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("expired"), "{v}");
    // No key outlives its maker: a key made by a key that expires, expires with it.
    let (maker, _) = make_key(
        &s,
        json!({"tenant": "acme", "scope": "full", "expires_in_seconds": 600}),
    )
    .await;
    let (status, v) = s
        .request_as(
            &maker,
            Method::POST,
            "/v1/keys",
            Some(json!({"scope": "exec"})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    assert!(
        v["expires_at"].as_str().is_some(),
        "inherits the expiry: {v}"
    );
    let (status, v) = s
        .request_as(
            &maker,
            Method::POST,
            "/v1/keys",
            Some(json!({"scope": "exec", "expires_in_seconds": 6000})),
        )
        .await;
    assert_eq!(status, 403, "{v}");
}

#[tokio::test]
async fn e2b_format_keys_work_like_any_key() {
    let s = TestServer::start().await;
    let (key, v) = make_key(
        &s,
        json!({"tenant": "acme", "scope": "full", "format": "e2b"}),
    )
    .await;
    let hex = key.strip_prefix("e2b_").expect("e2b_ prefix");
    assert!(
        (32..=40).contains(&hex.len())
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{key} does not match ^e2b_[0-9a-f]+$"
    );
    assert_eq!(v["prefix"], format!("{}…", &key[..8]));
    let (status, v) = s
        .request_as(&key, Method::POST, "/v1/sandboxes", Some(json!({})))
        .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["metadata"]["tenant_id"], "acme");
    let id = v["id"].as_str().expect("id");
    let (status, v) = s
        .request_as(
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": ["echo", "hi"]})),
        )
        .await;
    assert_eq!((status, v["stdout"].as_str()), (200, Some("hi\n")), "{v}");
}

#[tokio::test]
async fn a_selector_key_reaches_only_the_sandboxes_it_selects() {
    let s = TestServer::start().await;
    let full = s.tenant_key("acme", "full").await;
    let (ml, _) = make_key(
        &s,
        json!({"tenant": "acme", "scope": "full", "selector": {"team": "ml"}}),
    )
    .await;
    let (status, web) = s
        .request_as(
            &full,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"metadata": {"team": "web"}})),
        )
        .await;
    assert_eq!(status, 201, "{web}");
    let web = web["id"].as_str().expect("id").to_string();
    let (status, mine) = s
        .request_as(&ml, Method::POST, "/v1/sandboxes", Some(json!({})))
        .await;
    assert_eq!(status, 201, "{mine}");
    assert_eq!(
        mine["metadata"]["team"], "ml",
        "the selector is its metadata"
    );
    let mine = mine["id"].as_str().expect("id").to_string();
    for (method, path, body) in [
        (Method::GET, format!("/v1/sandboxes/{web}"), None),
        (
            Method::POST,
            format!("/v1/sandboxes/{web}/exec"),
            Some(json!({"cmd": ["true"]})),
        ),
        (Method::DELETE, format!("/v1/sandboxes/{web}"), None),
    ] {
        let (status, v) = s.request_as(&ml, method.clone(), &path, body).await;
        assert_eq!(status, 404, "{method} {path}: {v}");
        assert_eq!(
            v["error"]["message"],
            format!("sandbox {web} does not exist"),
            "as unknown"
        );
    }
    let listed = |v: &Value| -> Vec<String> {
        v["sandboxes"]
            .as_array()
            .expect("sandboxes")
            .iter()
            .filter_map(|x| x["id"].as_str().map(String::from))
            .collect()
    };
    let (_, v) = s.request_as(&ml, Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(listed(&v), std::slice::from_ref(&mine));
    let (_, v) = s
        .request_as(&ml, Method::GET, "/v1/sandboxes?metadata.team=web", None)
        .await;
    assert!(listed(&v).is_empty(), "{v}");
    // It cannot make, or move its own sandbox to, another team's.
    let (status, v) = s
        .request_as(
            &ml,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"metadata": {"team": "web"}})),
        )
        .await;
    assert_eq!(status, 403, "{v}");
    let (status, v) = s
        .request_as(
            &ml,
            Method::PATCH,
            &format!("/v1/sandboxes/{mine}"),
            Some(json!({"metadata": {"team": "web"}})),
        )
        .await;
    assert_eq!(status, 403, "{v}");
    // Nor a key without its selector.
    let (status, v) = s
        .request_as(
            &ml,
            Method::POST,
            "/v1/keys",
            Some(json!({"selector": {"team": "web"}})),
        )
        .await;
    assert_eq!(status, 403, "{v}");
    // The full key sees both.
    let (_, v) = s
        .request_as(&full, Method::GET, "/v1/sandboxes", None)
        .await;
    assert_eq!(listed(&v).len(), 2);
}

#[tokio::test]
async fn a_key_is_shown_once_stored_hashed_and_its_last_use_written_in_batches() {
    let s = TestServer::start().await;
    let (key, record) = make_key(&s, json!({"tenant": "acme", "name": "ci"})).await;
    let key_id = record["id"].as_str().expect("id").to_string();
    assert_eq!(record["scope"], "full", "the default scope");
    assert!(record["last_used_at"].is_null(), "{record}");
    let (status, v) = s
        .request(Method::GET, &format!("/v1/keys/{key_id}"), None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(v.get("secret").is_none(), "shown only once: {v}");
    let (_, list) = s.request(Method::GET, "/v1/keys", None).await;
    assert!(!list.to_string().contains(&key), "never listed");
    // The database holds its SHA-256, never the key.
    let db = std::fs::read(s.state_dir.join("state.db")).expect("state.db");
    let wal = std::fs::read(s.state_dir.join("state.db-wal")).unwrap_or_default();
    let needle = key.as_bytes();
    for bytes in [&db, &wal] {
        assert!(
            !bytes.windows(needle.len()).any(|w| w == needle),
            "the key is in the database in clear"
        );
    }
    let written = || {
        let conn = rusqlite_open(&s);
        conn.query_row(
            "SELECT last_used_ms FROM api_keys WHERE id = ?1",
            [&key_id],
            |r| r.get::<_, Option<i64>>(0),
        )
        .expect("row")
    };
    // A request's use is not in the database right after it: at most a batch that
    // happened to run between the request and the read could have written it.
    let mut written_with_request = 0;
    for _ in 0..5 {
        let before = hutch_core::time::now_ms();
        let (status, _) = s.request_as(&key, Method::GET, "/v1/sandboxes", None).await;
        assert_eq!(status, 200);
        if written().is_some_and(|at| at >= before) {
            written_with_request += 1;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        written_with_request < 5,
        "every use was written with its request"
    );
    // The API shows the last use at once (kept in memory) ...
    let (_, v) = s
        .request(Method::GET, &format!("/v1/keys/{key_id}"), None)
        .await;
    assert!(v["last_used_at"].as_str().is_some(), "{v}");
    // ... and the database gets it with a batch.
    let stored = wait_until(Duration::from_secs(15), async || written()).await;
    assert!(stored.is_some(), "the batch never wrote the key's last use");
}

/// The test server's state database, opened beside the server (WAL takes a second reader).
fn rusqlite_open(s: &TestServer) -> rusqlite::Connection {
    rusqlite::Connection::open(s.state_dir.join("state.db")).expect("state.db")
}
