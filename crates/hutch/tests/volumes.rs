//! Durable volumes on `ns`: data outlives sandboxes and a server restart, read-only mounts
//! refuse writes, exclusivity and deletion rules, a full volume fails only the write that
//! does not fit, and input errors.

use hutch_testkit::TestServer;
use reqwest::Method;
use serde_json::{json, Value};

async fn with_volume(s: &TestServer, vol: &str, path: &str, read_only: bool) -> (u16, Value) {
    s.request(
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"volumes": [{"volume": vol, "path": path, "read_only": read_only}]})),
    )
    .await
}

async fn kill(s: &TestServer, id: &str) {
    let (st, _) = s
        .request(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(st, 204);
}

fn host_mounted(path: &std::path::Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some(path.to_str().unwrap_or("?")))
}

#[tokio::test]
async fn a_volume_outlives_its_sandboxes_and_the_server() {
    let mut s = TestServer::start().await;
    let vol = s.volume("data", 16).await;
    let (st, a) = with_volume(&s, "data", "/data", false).await; // by name
    assert_eq!(st, 201, "{a}");
    let a = a["id"].as_str().expect("id").to_string();
    let (out, code) = s
        .sh(&a, "echo kept > /data/f && mkdir -p /data/d && chown 1000:1000 /data/d && stat -c '%u %a' /data /data/d && cat /data/f")
        .await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "0 755\n1000 755\nkept\n");
    // On disk the owners are 0-based (idmapped), not the sandbox's host uid range.
    let mnt = s.state_dir.join("volumes").join(&vol).join("mnt");
    assert!(host_mounted(&mnt), "mounted while in use");
    let meta = std::fs::metadata(mnt.join("d")).expect("stat on host");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 1000);
    let (_, v) = s
        .request(Method::GET, &format!("/v1/volumes/{vol}"), None)
        .await;
    assert_eq!(v["attached"][0]["sandbox"], a.as_str(), "{v}");
    assert!(v["used_bytes"].as_u64().is_some(), "{v}");
    kill(&s, &a).await;
    assert!(!host_mounted(&mnt), "unmounted once unused");

    let (st, b) = with_volume(&s, &vol, "/mnt/in/ro", true).await;
    assert_eq!(st, 201, "{b}");
    let b = b["id"].as_str().expect("id").to_string();
    let (out, _) = s
        .sh(
            &b,
            "cat /mnt/in/ro/f 2>&1; (echo x > /mnt/in/ro/g) 2>&1; echo rc=$?; ls -la /mnt/in/ro; grep /mnt/in /proc/self/mountinfo",
        )
        .await;
    assert!(out.starts_with("kept\n"), "{out}");
    assert!(
        out.contains("Read-only file system") && out.contains("rc=1"),
        "{out}"
    );
    kill(&s, &b).await;

    s.stop_server();
    s.spawn_server().await;
    let (st, c) = with_volume(&s, &vol, "/data", false).await;
    assert_eq!(st, 201, "{c}");
    let c = c["id"].as_str().expect("id").to_string();
    assert_eq!(s.sh(&c, "cat /data/f").await.0, "kept\n");
    kill(&s, &c).await;
    let (st, _) = s
        .request(Method::DELETE, &format!("/v1/volumes/{vol}"), None)
        .await;
    assert_eq!(st, 204);
    assert!(
        !s.state_dir.join("volumes").join(&vol).exists(),
        "volume files removed"
    );
}

#[tokio::test]
async fn attachment_rules_and_deletion() {
    let s = TestServer::start().await;
    let vol = s.volume("shared", 8).await;
    let (st, a) = with_volume(&s, &vol, "/data", false).await;
    assert_eq!(st, 201);
    let a = a["id"].as_str().expect("id").to_string();
    for ro in [false, true] {
        let (st, v) = with_volume(&s, &vol, "/data", ro).await;
        assert_eq!(
            st, 409,
            "second attach (read_only={ro}) while attached read-write: {v}"
        );
    }
    let (st, v) = s
        .request(Method::DELETE, &format!("/v1/volumes/{vol}"), None)
        .await;
    assert_eq!(st, 409, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap_or("").contains(&a),
        "{v}"
    );
    kill(&s, &a).await;
    // Read-only to many.
    let mut readers = Vec::new();
    for _ in 0..2 {
        let (st, v) = with_volume(&s, &vol, "/data", true).await;
        assert_eq!(st, 201, "{v}");
        readers.push(v["id"].as_str().expect("id").to_string());
    }
    let (st, _) = with_volume(&s, &vol, "/data", false).await;
    assert_eq!(st, 409, "read-write while attached read-only elsewhere");
    let (_, list) = s.request(Method::GET, "/v1/volumes", None).await;
    assert_eq!(
        list["volumes"][0]["attached"].as_array().map(Vec::len),
        Some(2),
        "{list}"
    );
    for r in &readers {
        kill(&s, r).await;
    }
    let (st, _) = s
        .request(Method::DELETE, &format!("/v1/volumes/{vol}"), None)
        .await;
    assert_eq!(st, 204);
    let (st, _) = s
        .request(Method::GET, &format!("/v1/volumes/{vol}"), None)
        .await;
    assert_eq!(st, 404);
}

#[tokio::test]
async fn a_full_volume_fails_only_the_write_that_does_not_fit() {
    let s = TestServer::start().await;
    let vol = s.volume("small", 8).await;
    let (_, a) = with_volume(&s, &vol, "/data", false).await;
    let a = a["id"].as_str().expect("id").to_string();
    let other = s.create_id(json!({})).await;
    let (out, code) = s
        .sh(
            &a,
            "dd if=/dev/zero of=/data/big bs=1M count=32 2>&1; echo rc=$?",
        )
        .await;
    assert_eq!(code, 0);
    assert!(
        out.contains("No space left on device") && !out.contains("rc=0"),
        "{out}"
    );
    // Everything else still works: the sandbox's own disk, the volume after freeing space,
    // the other sandbox, the server.
    let (out, code) = s
        .sh(&a, "echo fine > /root-file && cat /root-file && rm /data/big && echo again > /data/g && cat /data/g")
        .await;
    assert_eq!((out.as_str(), code), ("fine\nagain\n", 0));
    assert_eq!(s.sh(&other, "echo ok").await.0, "ok\n");
    // Hibernation lets go of the volume's mount; the next exec wakes the sandbox with it.
    let (st, _) = s
        .request(Method::POST, &format!("/v1/sandboxes/{a}/hibernate"), None)
        .await;
    assert_eq!(st, 200);
    let mnt = s.state_dir.join("volumes").join(&vol).join("mnt");
    assert!(!host_mounted(&mnt));
    assert_eq!(s.sh(&a, "cat /data/g").await.0, "again\n");
    assert!(host_mounted(&mnt));
}

#[tokio::test]
async fn volume_input_errors_are_4xx() {
    let s = TestServer::start().await;
    let vol = s.volume("v1", 8).await;
    for (body, want) in [
        (json!({"name": "bad name", "size_mib": 8}), 422),
        (json!({"name": "ok", "size_mib": 0}), 422),
        (json!({"name": "ok", "size_mib": "8"}), 400),
        (json!({"name": "ok"}), 400),
        (json!({"name": "v1", "size_mib": 8}), 409),
    ] {
        let (st, v) = s
            .request(Method::POST, "/v1/volumes", Some(body.clone()))
            .await;
        assert_eq!(st, want, "{body} -> {v}");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    for (mount, want) in [
        (json!({"volume": vol, "path": "/proc/x"}), 422),
        (json!({"volume": vol, "path": "relative"}), 422),
        (json!({"volume": vol, "path": "/a/../b"}), 422),
        (json!({"volume": "vol_missing", "path": "/data"}), 404),
        (json!({"volume": vol, "path": "/data", "extra": true}), 400),
    ] {
        let (st, v) = s
            .request(
                Method::POST,
                "/v1/sandboxes",
                Some(json!({"volumes": [mount.clone()]})),
            )
            .await;
        assert_eq!(st, want, "{mount} -> {v}");
    }
    let (st, _) = s
        .request(Method::DELETE, "/v1/volumes/vol_missing", None)
        .await;
    assert_eq!(st, 404);
}
