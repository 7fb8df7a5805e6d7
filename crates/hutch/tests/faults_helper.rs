//! Jail helper faults (issue 23, item 6), injected from the outside: the `ns` jail helper
//! (`hutch __jail-spawn`, a child of the server) is killed or stopped while a create is in
//! flight. A killed one gives a clear error, never an empty message or a 500; a stopped one
//! is killed at the host-command deadline (`--host-command-timeout-seconds`) and the create
//! answers 504 `host_timeout` naming the step. Either way nothing the step made is left: no
//! mount, no sandbox directory, no disk-pool subvolume, nothing listed.

use std::time::{Duration, Instant};

use hutch_testkit::TestServer;
use serde_json::{json, Value};

/// The server's child running the jail helper, if one runs now.
fn jail_helper_of(server: u32) -> Option<i32> {
    let tasks = std::fs::read_dir(format!("/proc/{server}/task")).ok()?;
    for task in tasks.flatten() {
        let Ok(children) = std::fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains("__jail-spawn") {
                return Some(pid);
            }
        }
    }
    None
}

/// What a create answers when `signal` hits its jail helper, and the helper's pid (a create
/// that finished before the helper was caught is deleted and tried again).
async fn create_hitting_the_helper(s: &TestServer, signal: i32) -> (u16, Value, i32) {
    for _ in 0..50 {
        let (url, key) = (s.url.clone(), s.key.clone());
        let create = tokio::spawn(async move {
            let resp = reqwest::Client::new()
                .post(format!("{url}/v1/sandboxes"))
                .bearer_auth(key)
                .json(&json!({"isolation": "ns"}))
                .send()
                .await
                .expect("the server answers");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        });
        let server = s.server_pid();
        let caught = tokio::task::spawn_blocking(move || {
            let until = Instant::now() + Duration::from_secs(10);
            while Instant::now() < until {
                if let Some(pid) = jail_helper_of(server) {
                    // SAFETY: signalling the server's helper child by its pid, just read.
                    unsafe { libc::kill(pid, signal) };
                    return Some(pid);
                }
            }
            None
        });
        let answer = tokio::time::timeout(Duration::from_secs(60), create)
            .await
            .expect("the create answered within 60 s")
            .expect("create task");
        let caught = caught.await.expect("watcher");
        match (caught, answer) {
            (_, (201, v)) => {
                let id = v["id"].as_str().expect("id");
                assert_eq!(s.kill(id).await, 204);
            }
            (Some(pid), (status, v)) => return (status, v, pid),
            (None, (status, v)) => panic!("a create failed without a fault: {status} {v}"),
        }
    }
    panic!("the jail helper was never caught in flight");
}

/// Nothing of a failed create is left on the host or in the API.
async fn assert_nothing_left(s: &TestServer) {
    let sandbox_mounts: Vec<String> = s
        .mounts_under_state()
        .into_iter()
        .filter(|m| m.contains("/sandboxes/") || m.contains("sbx_"))
        .collect();
    assert_eq!(sandbox_mounts, Vec::<String>::new(), "mounts left");
    for dir in ["sandboxes", "layers"] {
        let left: Vec<String> = std::fs::read_dir(s.state_dir.join(dir))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("sbx_"))
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(left, Vec::<String>::new(), "{dir} left");
    }
    assert!(
        s.sandbox_ids().await.is_empty(),
        "listed: {:?}",
        s.sandbox_ids().await
    );
}

#[tokio::test]
async fn a_killed_jail_helper_fails_the_create_with_its_cause_and_leaves_nothing() {
    let s = TestServer::start().await;
    // The disk pool is made by the first create.
    let warm = s.create_id(json!({"isolation": "ns"})).await;
    assert_eq!(s.kill(&warm).await, 204);
    let (status, v, pid) = create_hitting_the_helper(&s, libc::SIGKILL).await;
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "sandbox_failed", "{v}");
    assert!(
        message.contains("jail helper") && message.contains("SIGKILL"),
        "helper {pid}: {message}"
    );
    assert_nothing_left(&s).await;
    // The next create works.
    let id = s.create_id(json!({"isolation": "ns"})).await;
    assert_eq!(s.sh_ok(&id, "echo ok").await, "ok\n");
}

#[tokio::test]
async fn a_stopped_jail_helper_is_killed_at_the_deadline_and_the_create_is_504() {
    let s = TestServer::start_with(&["--host-command-timeout-seconds", "3"]).await;
    let warm = s.create_id(json!({"isolation": "ns"})).await;
    assert_eq!(s.kill(&warm).await, 204);
    let t0 = Instant::now();
    let (status, v, pid) = create_hitting_the_helper(&s, libc::SIGSTOP).await;
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(status, 504, "{v}");
    assert_eq!(v["error"]["code"], "host_timeout", "{v}");
    assert!(
        message.contains("jail helper") && message.contains("within 3 s"),
        "{message}"
    );
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
    // The stopped helper is gone, not left stopped.
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(state.is_empty(), "helper {pid} is still there: {state}");
    assert_nothing_left(&s).await;
    let id = s.create_id(json!({"isolation": "ns"})).await;
    assert_eq!(s.sh_ok(&id, "echo ok").await, "ok\n");
}
