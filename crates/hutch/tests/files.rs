//! Files: read, write, list, stat, mkdir, move, remove; large files; paths stay inside.

use hutch_testkit::{both_backends, on, TestServer};
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

/// GET a file's bytes through the API, reading at most `cap` bytes of the answer (an
/// endless one is cut here, so the test ends either way): status, bytes, whether it was cut.
async fn get_file_capped(s: &TestServer, id: &str, path: &str, cap: usize) -> (u16, Vec<u8>, bool) {
    let mut resp = s
        .http
        .get(format!("{}/v1/sandboxes/{id}/files?path={path}", s.url))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("get");
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.expect("body") {
        body.extend_from_slice(&chunk);
        if body.len() > cap {
            return (status, body, true);
        }
    }
    (status, body, false)
}

#[tokio::test]
async fn generated_files_are_read_whole_when_small_and_refused_when_endless() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    // The workload leaves a link to an endless file where a client fetches its results.
    let (_, code) = s.sh(&id, "ln -s /proc/self/pagemap /tmp/result").await;
    assert_eq!(code, 0);
    for path in ["/proc/self/pagemap", "/tmp/result"] {
        let (status, body, cut) = get_file_capped(&s, &id, path, 4 << 20).await;
        assert!(!cut, "{path}: more than 4 MiB streamed, status {status}");
        assert_eq!(status, 400, "{path}: {}", String::from_utf8_lossy(&body));
        let v: serde_json::Value = serde_json::from_slice(&body).expect("a JSON error");
        assert_eq!(v["error"]["code"], "bad_request", "{v}");
        assert_eq!(
            v["error"]["message"],
            format!(
                "read {path}: files on procfs are generated as they are read, and the files API \
                 reads at most 1048576 bytes (1 MiB) of one; this one is longer: read it with \
                 exec (e.g. `head -c`)"
            ),
            "{v}"
        );
    }
    // Small generated files still come back whole: the same bytes as `cat` inside (the
    // clock rate of each CPU moves between two reads, so its lines are left out).
    let steady = |text: &str| -> String {
        text.lines()
            .filter(|l| !l.starts_with("cpu MHz"))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let (status, body, cut) = get_file_capped(&s, &id, "/proc/cpuinfo", 4 << 20).await;
    assert_eq!((status, cut), (200, false));
    let got = String::from_utf8(body).expect("utf-8");
    let (want, _) = s.sh(&id, "cat /proc/cpuinfo").await;
    assert!(got.contains("processor"), "{got}");
    assert!(got.ends_with('\n'), "cut short: {got}");
    assert_eq!(steady(&got), steady(&want));
    let (status, body, _) = get_file_capped(&s, &id, "/proc/sys/kernel/ostype", 4 << 20).await;
    assert_eq!((status, body.as_slice()), (200, &b"Linux\n"[..]));
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
