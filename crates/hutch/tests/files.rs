//! Files: read, write, list, stat, mkdir, move, remove; large files; paths stay inside.

#[macro_use]
mod common;

use common::{on, TestServer};
use reqwest::Method;
use serde_json::json;
use sha2::{Digest, Sha256};

#[tokio::test]
async fn a_100_mib_file_round_trips_intact() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({"memory_mib": 512})).await;
    let mut data = vec![0u8; 100 << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let want = Sha256::digest(&data);
    s.put_file(&id, "/root/big.bin", "0600", data).await;
    let (out, _) = s.sh(&id, "wc -c < /root/big.bin").await;
    assert_eq!(out.trim(), (100u64 << 20).to_string());
    let resp = s
        .http
        .get(format!(
            "{}/v1/sandboxes/{id}/files?path=/root/big.bin",
            s.url
        ))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status(), 200);
    let got = resp.bytes().await.expect("bytes");
    assert_eq!(got.len(), 100 << 20);
    assert_eq!(Sha256::digest(&got), want, "content changed in transit");
}

both_backends!(
    file_operations_behave_as_documented,
    dot_dot_paths_stay_inside_the_sandbox
);

async fn file_operations_behave_as_documented(isolation: &str) {
    let s = TestServer::start().await;
    let id = s.create_id(on(isolation, json!({}))).await;
    let base = format!("/v1/sandboxes/{id}/files");
    s.put_file(
        &id,
        "/work/a/b/hello.sh",
        "0755",
        b"#!/bin/sh\necho hi\n".to_vec(),
    )
    .await;
    let v = s.exec(&id, json!({"cmd": ["/work/a/b/hello.sh"]})).await;
    assert_eq!(
        v["stdout"], "hi\n",
        "mode 0755 must make it executable: {v}"
    );

    let (st, stat) = s
        .request(
            Method::GET,
            &format!("{base}/stat?path=/work/a/b/hello.sh"),
            None,
        )
        .await;
    assert_eq!(st, 200);
    assert_eq!(stat["type"], "file");
    assert_eq!(stat["size"], 18);
    assert_eq!(stat["mode"], 0o755);

    let (st, list) = s
        .request(
            Method::GET,
            &format!("{base}/list?path=/work&depth=3"),
            None,
        )
        .await;
    assert_eq!(st, 200);
    let paths: Vec<&str> = list["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["path"].as_str())
        .collect();
    assert_eq!(
        paths,
        ["/work/a", "/work/a/b", "/work/a/b/hello.sh"],
        "{list}"
    );
    let (_, shallow) = s
        .request(
            Method::GET,
            &format!("{base}/list?path=/work&depth=1"),
            None,
        )
        .await;
    assert_eq!(shallow["entries"].as_array().map(Vec::len), Some(1));

    let (st, _) = s
        .request(
            Method::POST,
            &format!("{base}/mkdir"),
            Some(json!({"path": "/work/new/deep"})),
        )
        .await;
    assert_eq!(st, 204);
    let (st, _) = s
        .request(
            Method::POST,
            &format!("{base}/move"),
            Some(json!({"from": "/work/a/b/hello.sh", "to": "/work/new/moved.sh"})),
        )
        .await;
    assert_eq!(st, 204);
    let (st, _) = s
        .request(
            Method::GET,
            &format!("{base}/stat?path=/work/a/b/hello.sh"),
            None,
        )
        .await;
    assert_eq!(st, 404);

    let (st, v) = s
        .request(Method::DELETE, &format!("{base}?path=/work/new"), None)
        .await;
    assert_eq!(st, 409, "non-empty dir without recursive: {v}");
    let (st, _) = s
        .request(
            Method::DELETE,
            &format!("{base}?path=/work/new&recursive=true"),
            None,
        )
        .await;
    assert_eq!(st, 204);
    let (st, _) = s
        .request(Method::GET, &format!("{base}/stat?path=/work/new"), None)
        .await;
    assert_eq!(st, 404);

    let (st, v) = s
        .request(Method::GET, &format!("{base}?path=/nope"), None)
        .await;
    assert_eq!(st, 404, "{v}");
    let (st, v) = s
        .request(Method::GET, &format!("{base}?path=/etc"), None)
        .await;
    assert_eq!(st, 400, "reading a directory: {v}");
    let (st, v) = s
        .request(Method::GET, &format!("{base}?path=etc/passwd"), None)
        .await;
    assert_eq!(st, 400, "relative path: {v}");
}

async fn dot_dot_paths_stay_inside_the_sandbox(isolation: &str) {
    let s = TestServer::start().await;
    let id = s.create_id(on(isolation, json!({}))).await;
    let marker = format!("hutch-escape-{}", std::process::id());
    s.put_file(
        &id,
        &format!("/../../../../tmp/{marker}"),
        "0644",
        b"x".to_vec(),
    )
    .await;
    assert!(
        !std::path::Path::new("/tmp").join(&marker).exists(),
        "a write with .. escaped to the host"
    );
    let (out, _) = s.sh(&id, &format!("cat /tmp/{marker}")).await;
    assert_eq!(out, "x", "the write should land in the sandbox's own /tmp");
    // Reading the host's files through .. gives the sandbox's files instead.
    let resp = s
        .http
        .get(format!(
            "{}/v1/sandboxes/{id}/files?path=/../../../etc/hostname",
            s.url
        ))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("get");
    let body = resp.text().await.expect("text");
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    assert_ne!(body.trim(), host.trim(), "read the host's /etc/hostname");
}
