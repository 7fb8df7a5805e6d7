//! Routing: every call on a sandbox works through a node that does not own it (exec, the
//! exec stream, files, the PTY WebSocket, the port proxy, lifecycle, delete), and a forged
//! node token buys nothing.

use futures_util::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::TestCluster;

/// A cluster of three where the sandbox lives on `n1` (the only node with room) and calls
/// go through `n2` and `n3`.
async fn sandbox_on_n1() -> (TestCluster, String) {
    let c = TestCluster::start(&[4, 0, 0]).await;
    let id = c.nodes[2].create_id(json!({})).await;
    assert_eq!(c.owner(&id), "n1");
    (c, id)
}

#[tokio::test]
async fn exec_stream_files_and_lifecycle_work_through_a_node_that_does_not_own_the_sandbox() {
    let (c, id) = sandbox_on_n1().await;
    let n2 = &c.nodes[1];
    let n3 = &c.nodes[2];

    let v = n2
        .exec(&id, json!({"cmd": "echo hi from $(hostname); exit 3"}))
        .await;
    assert_eq!(v["exit_code"], 3, "{v}");
    assert!(
        v["stdout"].as_str().unwrap_or("").starts_with("hi from"),
        "{v}"
    );

    // The answer says which node served it.
    let resp = n2
        .http
        .get(format!("{}/v1/sandboxes/{id}", n2.url))
        .bearer_auth(&n2.key)
        .send()
        .await
        .expect("get");
    assert_eq!(resp.headers()["x-hutch-node"], "n1");

    // The event stream arrives in order through the hop.
    let resp = n3
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec/stream", n3.url))
        .bearer_auth(&n3.key)
        .json(&json!({"cmd": "echo one; sleep 0.2; echo two >&2; exit 5"}))
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    while let Some(chunk) = body.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
    }
    let events: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(events, ["start", "stdout", "stderr", "exit"], "{text}");
    assert!(text.contains("\"exit_code\":5"), "{text}");

    // Files: a 3 MiB upload through n3, read back through n2 byte for byte.
    let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    n3.put_file(&id, "/tmp/blob.bin", "0644", data.clone())
        .await;
    let got = n2
        .http
        .get(format!(
            "{}/v1/sandboxes/{id}/files?path=/tmp/blob.bin",
            n2.url
        ))
        .bearer_auth(&n2.key)
        .send()
        .await
        .expect("download")
        .bytes()
        .await
        .expect("bytes");
    assert_eq!(got.len(), data.len());
    assert!(
        got.as_ref() == data.as_slice(),
        "the file came back changed"
    );

    // Lifecycle through the hop.
    assert_eq!(n2.act(&id, "pause").await["state"], "paused");
    assert_eq!(n3.act(&id, "resume").await["state"], "running");

    // Delete through n3: the row goes and n1 no longer runs it.
    assert_eq!(n3.kill(&id).await, 204);
    assert_eq!(
        c.pg.psql(
            "hutch",
            &format!("SELECT count(*) FROM sandboxes WHERE id = '{id}'")
        ),
        "0"
    );
    let (status, _) = n2
        .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_terminal_and_the_port_proxy_work_through_a_node_that_does_not_own_the_sandbox() {
    let (c, id) = sandbox_on_n1().await;
    let n2 = &c.nodes[1];
    let url = format!(
        "{}/v1/sandboxes/{id}/pty?cols=90&rows=20",
        n2.url.replacen("http", "ws", 1)
    );
    let mut req = url.into_client_request().expect("request");
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", n2.key).parse().expect("header"),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .expect("connect");
    ws.send(Message::Binary(
        b"stty size; echo mark-$((40+2))\n".to_vec().into(),
    ))
    .await
    .expect("send");
    let mut seen = String::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !seen.contains("mark-42") && std::time::Instant::now() < deadline {
        let msg = tokio::time::timeout(std::time::Duration::from_secs(10), ws.next())
            .await
            .expect("pty output in time")
            .expect("open")
            .expect("message");
        if let Message::Binary(b) = msg {
            seen.push_str(&String::from_utf8_lossy(&b));
        }
    }
    assert!(seen.contains("20 90"), "{seen}");
    assert!(seen.contains("mark-42"), "{seen}");
    drop(ws);

    // busybox httpd in the sandbox, reached through n3's port proxy.
    let n3 = &c.nodes[2];
    n3.put_file(&id, "/srv/www/file.txt", "0644", b"served on n1\n".to_vec())
        .await;
    n3.start_background(&id, json!(["httpd", "-f", "-p", "8080", "-h", "/srv/www"]))
        .await;
    n3.wait_for_port(&id, 8080).await;
    let body = n3
        .http
        .get(format!("{}/v1/sandboxes/{id}/ports/8080/file.txt", n3.url))
        .bearer_auth(&n3.key)
        .send()
        .await
        .expect("proxy")
        .text()
        .await
        .expect("text");
    assert_eq!(body, "served on n1\n");

    // The node secret that carried the hop stops at the owner: the service never sees it
    // (a CGI script prints the request's headers as httpd passes them on).
    let script = b"#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n'\nenv\n";
    n3.put_file(&id, "/srv/www/cgi-bin/env", "0755", script.to_vec())
        .await;
    let env = n3
        .http
        .get(format!(
            "{}/v1/sandboxes/{id}/ports/8080/cgi-bin/env",
            n3.url
        ))
        .bearer_auth(&n3.key)
        .send()
        .await
        .expect("proxy")
        .text()
        .await
        .expect("text");
    assert!(env.contains("REQUEST_METHOD=GET"), "{env}");
    assert!(
        !env.contains(crate::NODE_SECRET),
        "the service inside the sandbox saw the node secret: {env}"
    );
}

#[tokio::test]
async fn a_call_with_a_forged_node_token_is_routed_like_any_other_and_a_bad_key_never_leaves_the_node(
) {
    let (c, id) = sandbox_on_n1().await;
    let n2 = &c.nodes[1];
    // A client that sends a node token of its own is not taken for a node: its call is
    // routed to the owner (and served there), not answered by n2 from its own state.
    let resp = n2
        .http
        .get(format!("{}/v1/sandboxes/{id}", n2.url))
        .bearer_auth(&n2.key)
        .header("x-hutch-node-token", "guessed-0123456789abcdef")
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-hutch-node"], "n1");
    // A wrong key is refused by the node it reached.
    let resp = n2
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec", n2.url))
        .bearer_auth("hk_not_a_key")
        .json(&json!({"cmd": "true"}))
        .send()
        .await
        .expect("exec");
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["x-hutch-node"], "n2");
}

#[tokio::test]
async fn the_preview_origin_of_a_node_that_does_not_own_the_sandbox_serves_it() {
    let c = TestCluster::start_with(&[4, 0, 0], &["--preview-listen", "127.0.0.1:0"], &[]).await;
    let (n1, n2) = (&c.nodes[0], &c.nodes[1]);
    let id = n2.create_id(json!({})).await;
    assert_eq!(c.owner(&id), "n1");
    n1.put_file(
        &id,
        "/srv/index.html",
        "0644",
        b"served through n2\n".to_vec(),
    )
    .await;
    n1.start_background(&id, json!(["httpd", "-f", "-p", "8080", "-h", "/srv"]))
        .await;
    n1.wait_for_port(&id, 8080).await;
    // A link made through n2 (by n1, which owns the sandbox), opened on n2's preview origin.
    let (status, v) = n2
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/port-tokens"),
            Some(json!({"port": 8080})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    let link = v["token"].as_str().expect("token").to_string();
    let preview = n2.preview_url.clone().expect("n2's preview origin");
    let addr: std::net::SocketAddr = preview
        .trim_start_matches("http://")
        .parse()
        .expect("address");
    let host = format!("8080-{id}.localhost");
    let browser = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .resolve(&host, addr)
        .build()
        .expect("client");
    let origin = format!("http://{host}:{}", addr.port());
    let resp = browser
        .get(format!("{origin}/index.html?hutch_token={link}"))
        .send()
        .await
        .expect("open the link");
    assert_eq!(
        resp.status().as_u16(),
        303,
        "the link is exchanged for a session"
    );
    assert_eq!(resp.headers()["x-hutch-node"], "n1");
    let cookie = resp.headers()["set-cookie"]
        .to_str()
        .expect("ascii")
        .split(';')
        .next()
        .expect("a cookie")
        .to_string();
    let resp = browser
        .get(format!("{origin}/index.html"))
        .header("cookie", &cookie)
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.text().await.expect("body"), "served through n2\n");
    // Without a credential it is refused as on a single server.
    let resp = browser
        .get(format!("{origin}/index.html"))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status().as_u16(), 401);
}
