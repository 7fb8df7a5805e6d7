//! TTL, persistence, metadata, restart re-adoption, and death of a sandbox's init.

use std::time::Duration;

use hutch_testkit::{wait_until, TestServer};
use reqwest::Method;
use serde_json::json;

#[tokio::test]
async fn ttl_reaps_ephemeral_sandboxes_but_never_persistent_ones() {
    let s = TestServer::start_with(&["--reaper-interval-ms", "100"]).await;
    let short = s.create(json!({"ttl_seconds": 1})).await;
    assert!(short["expires_at"].is_string());
    let short = short["id"].as_str().expect("id").to_string();
    let kept = s
        .create(json!({"ttl_seconds": 1, "persistent": true}))
        .await;
    assert!(kept["expires_at"].is_null(), "{kept}");
    let kept = kept["id"].as_str().expect("id").to_string();
    let gone = wait_until(Duration::from_secs(10), async || {
        let (status, _) = s
            .request(Method::GET, &format!("/v1/sandboxes/{short}"), None)
            .await;
        (status == 404).then_some(())
    })
    .await;
    assert!(gone.is_some(), "expired sandbox was not reaped");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(s.sh(&kept, "echo here").await.0, "here\n");
    assert!(
        !s.state_dir.join("sandboxes").join(&short).exists(),
        "reaped sandbox left files"
    );
}

#[tokio::test]
async fn activity_refreshes_the_ttl() {
    let s = TestServer::start_with(&["--reaper-interval-ms", "100"]).await;
    let id = s.create_id(json!({"ttl_seconds": 2})).await;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(
            s.sh(&id, "echo tick").await.0,
            "tick\n",
            "reaped despite activity"
        );
    }
    let (status, v) = s
        .request(
            Method::PATCH,
            &format!("/v1/sandboxes/{id}"),
            Some(json!({"ttl_seconds": 600, "metadata": {"k": "v"}})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["ttl_seconds"], 600);
    assert_eq!(v["metadata"]["k"], "v");
}

#[tokio::test]
async fn list_filters_by_state_and_metadata() {
    let s = TestServer::start().await;
    s.tenant("acme", json!({})).await;
    s.tenant("other", json!({})).await;
    let a = s
        .create_id(json!({"metadata": {"tenant_id": "acme", "role": "x"}}))
        .await;
    let _b = s
        .create_id(json!({"metadata": {"tenant_id": "other"}}))
        .await;
    let (_, v) = s
        .request(Method::GET, "/v1/sandboxes?metadata.tenant_id=acme", None)
        .await;
    let ids: Vec<&str> = v["sandboxes"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids, [a.as_str()]);
    let (_, v) = s
        .request(Method::GET, "/v1/sandboxes?state=running", None)
        .await;
    assert_eq!(v["sandboxes"].as_array().map(Vec::len), Some(2));
    let (_, v) = s
        .request(Method::GET, "/v1/sandboxes?state=paused", None)
        .await;
    assert_eq!(v["sandboxes"].as_array().map(Vec::len), Some(0));
    let (status, _) = s
        .request(Method::GET, "/v1/sandboxes?state=bogus", None)
        .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn a_restarted_server_readopts_running_sandboxes() {
    let mut s = TestServer::start().await;
    let id = s.create_id(json!({"persistent": true})).await;
    s.sh(&id, "echo remembered > /root/note").await;
    let bg = s
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec/stream", s.url))
        .bearer_auth(&s.key)
        .json(&json!({"cmd": ["sleep", "9999"], "background": true}))
        .send()
        .await
        .expect("stream");
    drop(bg);
    let doomed = s.create_id(json!({"persistent": true})).await;
    let doomed_pid = s.init_pid(&doomed).expect("init pid of doomed");

    s.stop_server();
    // While the server is down one sandbox dies.
    // SAFETY: killing the init of a sandbox this test created, by its pid.
    unsafe { libc::kill(doomed_pid, libc::SIGKILL) };
    // kill() returns before the process is gone: wait until it is dead (a zombie or reaped),
    // so it died while the server was down, as this case means.
    let dead = wait_until(Duration::from_secs(10), async || {
        let stat = std::fs::read_to_string(format!("/proc/{doomed_pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next());
        matches!(state, None | Some("Z") | Some("X")).then_some(())
    })
    .await;
    assert!(dead.is_some(), "the doomed sandbox's init did not die");
    s.spawn_server().await;

    assert_eq!(s.sh(&id, "cat /root/note").await.0, "remembered\n");
    let (ps, _) = s.sh(&id, "ps -o args").await;
    assert!(
        ps.contains("sleep 9999"),
        "background process lost over the restart: {ps}"
    );
    let (status, v) = s
        .request(Method::GET, &format!("/v1/sandboxes/{doomed}"), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(v["state"], "failed", "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap_or("")
            .contains("server was down"),
        "{v}"
    );
}

#[tokio::test]
async fn a_dead_agent_marks_the_sandbox_failed_and_leaks_nothing() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let other = s.create_id(json!({})).await;
    let pid = s.init_pid(&id).expect("init pid");
    // SAFETY: killing the init of a sandbox this test created, by its pid.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let failed = wait_until(Duration::from_secs(10), async || {
        let (_, v) = s
            .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        (v["state"] == "failed").then_some(v)
    })
    .await
    .expect("sandbox marked failed");
    assert!(
        failed["error"].as_str().unwrap_or("").contains("exited"),
        "{failed}"
    );
    let (status, v) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": ["true"]})),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    // Nothing of it is left on the host: no mounts, no cgroup, no process.
    let mounts = s.mounts_under_state();
    assert!(mounts.iter().all(|m| !m.contains(&id)), "{mounts:?}");
    assert!(!std::path::Path::new(&format!("/sys/fs/cgroup/pids/hutch/{id}")).exists());
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}/cmdline")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .unwrap_or_default()
                .is_empty()
    );
    // The other sandbox and the server are unaffected.
    assert_eq!(s.sh(&other, "echo ok").await.0, "ok\n");
    assert_eq!(s.kill(&id).await, 204);
}
