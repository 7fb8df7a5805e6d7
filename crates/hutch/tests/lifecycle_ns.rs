//! Lifecycle on the `ns` backend: pause/resume, hibernate/wake (also across a restart and
//! when idle), named snapshots, disk forks and explore, and their input errors.
//!
//! `cargo test --release -p hutch --test lifecycle_ns -- --ignored --nocapture` measures
//! pause/resume and hibernate/wake latency (p50 of 20).

use std::time::{Duration, Instant};

use hutch_testkit::{wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

fn message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or("")
}

async fn post(s: &TestServer, path: &str, body: Value) -> (u16, Value) {
    s.request(Method::POST, path, Some(body)).await
}

/// Call a lifecycle action (`pause`, `resume`, `hibernate`, `wake`) and expect 200.
async fn act(s: &TestServer, id: &str, action: &str) -> Value {
    let (status, v) = s
        .request(Method::POST, &format!("/v1/sandboxes/{id}/{action}"), None)
        .await;
    assert_eq!(status, 200, "{action}: {v}");
    v
}

async fn state_of(s: &TestServer, id: &str) -> String {
    let (_, v) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    v["state"].as_str().unwrap_or("").to_string()
}

async fn cpu_ns(s: &TestServer, id: &str) -> u64 {
    let (status, v) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}/usage"), None)
        .await;
    assert_eq!(status, 200, "{v}");
    v["usage"]["cpu_usage_ns"].as_u64().expect("cpu_usage_ns")
}

/// Start `cmd` in the background (it outlives this request).
async fn background(s: &TestServer, id: &str, cmd: &str) {
    let resp = s
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec/stream", s.url))
        .bearer_auth(&s.key)
        .json(&json!({ "cmd": cmd, "background": true }))
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.status(), 200);
    drop(resp);
}

/// Ids of every sandbox the server knows.
async fn sandbox_ids(s: &TestServer) -> Vec<String> {
    let (_, v) = s.request(Method::GET, "/v1/sandboxes", None).await;
    v["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .filter_map(|s| s["id"].as_str().map(String::from))
        .collect()
}

fn mounts_of(s: &TestServer, id: &str) -> Vec<String> {
    s.mounts_under_state()
        .into_iter()
        .filter(|m| m.contains(id))
        .collect()
}

fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

#[tokio::test]
async fn a_paused_sandbox_uses_no_cpu_and_refuses_calls_until_resumed() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    background(&s, &id, "while :; do :; done").await;
    let c0 = cpu_ns(&s, &id).await;
    let busy = wait_until(Duration::from_secs(10), async || {
        (cpu_ns(&s, &id).await > c0 + 100_000_000).then_some(())
    })
    .await;
    assert!(busy.is_some(), "the busy loop never ran");

    let v = act(&s, &id, "pause").await;
    assert_eq!(v["state"], "paused", "{v}");
    let before = cpu_ns(&s, &id).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let after = cpu_ns(&s, &id).await;
    assert!(
        after - before < 5_000_000,
        "a paused sandbox used {} ms of CPU in 1 s",
        (after - before) / 1_000_000
    );

    // Everything but resume, kill, get and list is refused with a clear 409.
    let (status, v) = post(
        &s,
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"cmd": ["true"]}),
    )
    .await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "conflict");
    assert!(
        message(&v).contains("paused") && message(&v).contains("resume"),
        "{v}"
    );
    let (status, _) = s
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=/etc/passwd"),
            None,
        )
        .await;
    assert_eq!(status, 409);
    for (path, body) in [
        ("hibernate", Value::Null),
        ("pause", Value::Null),
        ("wake", Value::Null),
        ("snapshots", json!({"name": "x"})),
        ("fork", json!({"count": 1})),
    ] {
        let (status, v) = post(&s, &format!("/v1/sandboxes/{id}/{path}"), body).await;
        assert_eq!(status, 409, "{path}: {v}");
        assert!(message(&v).contains("paused"), "{path}: {v}");
    }
    assert_eq!(state_of(&s, &id).await, "paused");
    let (_, listed) = s
        .request(Method::GET, "/v1/sandboxes?state=paused", None)
        .await;
    assert_eq!(listed["sandboxes"][0]["id"], id.as_str());

    let v = act(&s, &id, "resume").await;
    assert_eq!(v["state"], "running");
    let resumed = cpu_ns(&s, &id).await;
    let grew = wait_until(Duration::from_secs(5), async || {
        (cpu_ns(&s, &id).await > resumed + 100_000_000).then_some(())
    })
    .await;
    assert!(
        grew.is_some(),
        "the busy loop did not run again after resume"
    );
    assert_eq!(s.sh(&id, "echo back").await.0, "back\n");
    let (status, v) = post(&s, &format!("/v1/sandboxes/{id}/resume"), Value::Null).await;
    assert_eq!(status, 409, "resume of a running sandbox: {v}");

    // A paused sandbox can be killed, and nothing of it is left.
    act(&s, &id, "pause").await;
    assert_eq!(s.kill(&id).await, 204);
    assert!(mounts_of(&s, &id).is_empty());
    assert!(!s.state_dir.join("sandboxes").join(&id).exists());
}

#[tokio::test]
async fn hibernate_stops_every_process_and_the_next_exec_wakes_it_with_its_files() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    s.put_file(
        &id,
        "/root/kept.txt",
        "0600",
        b"kept across hibernation".to_vec(),
    )
    .await;
    background(&s, &id, "sleep 9999").await;
    let pid = s.init_pid(&id).expect("init pid");

    let v = act(&s, &id, "hibernate").await;
    assert_eq!(v["state"], "hibernated", "{v}");
    assert!(!process_alive(pid), "the init {pid} survived hibernation");
    assert!(mounts_of(&s, &id).is_empty(), "{:?}", mounts_of(&s, &id));
    assert!(
        s.init_pid(&id).is_none(),
        "the sandbox's cgroup still has processes"
    );
    assert!(!std::path::Path::new(&format!("/sys/fs/cgroup/pids/hutch/{id}")).exists());
    let (_, usage) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}/usage"), None)
        .await;
    assert!(usage["usage"].is_null(), "{usage}");
    let (status, v) = post(&s, &format!("/v1/sandboxes/{id}/hibernate"), Value::Null).await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(
        state_of(&s, &id).await,
        "hibernated",
        "get must not wake it"
    );

    // Any exec wakes it: the files are there, the processes are not (documented on ns).
    let (out, code) = s.sh(&id, "cat /root/kept.txt; echo; ps -o args").await;
    assert_eq!(code, 0);
    assert!(out.starts_with("kept across hibernation\n"), "{out}");
    assert!(!out.contains("sleep 9999"), "a process survived: {out}");
    assert_eq!(state_of(&s, &id).await, "running");
    let new_pid = s.init_pid(&id).expect("init pid after wake");
    assert_ne!(new_pid, pid);

    // File calls wake it too; an explicit wake reports how long it took.
    act(&s, &id, "hibernate").await;
    let r = s
        .http
        .get(format!(
            "{}/v1/sandboxes/{id}/files?path=/root/kept.txt",
            s.url
        ))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("read");
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.expect("text"), "kept across hibernation");
    act(&s, &id, "hibernate").await;
    let v = act(&s, &id, "wake").await;
    assert_eq!(v["state"], "running");
    assert!(v["woke_in_ms"].as_u64().is_some(), "{v}");
    let (status, v) = post(&s, &format!("/v1/sandboxes/{id}/wake"), Value::Null).await;
    assert_eq!(status, 409, "wake of a running sandbox: {v}");

    // Killing a hibernated sandbox removes its kept files too.
    act(&s, &id, "hibernate").await;
    assert_eq!(s.kill(&id).await, 204);
    assert!(!s.state_dir.join("sandboxes").join(&id).exists());
}

#[tokio::test]
async fn hibernated_and_paused_sandboxes_keep_their_state_over_a_server_restart() {
    let mut s = TestServer::start().await;
    let id = s.create_id(json!({"persistent": true})).await;
    s.sh(&id, "echo before-restart > /root/note").await;
    act(&s, &id, "hibernate").await;
    let paused = s.create_id(json!({"persistent": true})).await;
    act(&s, &paused, "pause").await;
    s.stop_server();
    s.spawn_server().await;
    assert_eq!(state_of(&s, &paused).await, "paused");
    act(&s, &paused, "resume").await;
    assert_eq!(s.sh(&paused, "echo alive").await.0, "alive\n");
    let (status, v) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(v["state"], "hibernated", "{v}");
    assert!(v.get("error").is_none(), "{v}");
    assert_eq!(s.sh(&id, "cat /root/note").await.0, "before-restart\n");
    assert_eq!(state_of(&s, &id).await, "running");
}

#[tokio::test]
async fn idle_sandboxes_hibernate_by_themselves() {
    let s = TestServer::start_with(&["--reaper-interval-ms", "100"]).await;
    let id = s
        .create_id(json!({"persistent": true, "idle_hibernate_seconds": 1}))
        .await;
    s.sh(&id, "echo idle > /root/f").await;
    let hibernated = wait_until(Duration::from_secs(15), async || {
        (state_of(&s, &id).await == "hibernated").then_some(())
    })
    .await;
    assert!(hibernated.is_some(), "an idle sandbox was not hibernated");
    assert_eq!(s.sh(&id, "cat /root/f").await.0, "idle\n");
    // A connected client keeps it up, even when its command uses no CPU.
    let resp = s
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec/stream", s.url))
        .bearer_auth(&s.key)
        .json(&json!({"cmd": "sleep 3; echo done"}))
        .send()
        .await
        .expect("stream");
    let body = tokio::spawn(resp.text());
    for _ in 0..25 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            state_of(&s, &id).await,
            "running",
            "hibernated under a client"
        );
    }
    let body = body.await.expect("join").expect("body");
    assert!(
        body.contains("done") && body.contains("event: exit"),
        "{body}"
    );
    // Turned off with PATCH: it stays running.
    let (status, v) = s
        .request(
            Method::PATCH,
            &format!("/v1/sandboxes/{id}"),
            Some(json!({"idle_hibernate_seconds": 0})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert!(v.get("idle_hibernate_seconds").is_none(), "{v}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(state_of(&s, &id).await, "running");
}

#[tokio::test]
async fn a_snapshot_restored_twice_gives_two_independent_sandboxes() {
    let s = TestServer::start().await;
    let src = s.create_id(json!({"env": {"FROM_SOURCE": "yes"}})).await;
    let v = s
        .exec(
            &src,
            json!({"cmd": "echo mine > /home/user/mine", "user": "user"}),
        )
        .await;
    assert_eq!(v["exit_code"], 0, "{v}");
    s.sh(
        &src,
        "echo root-file > /root/r; rm /etc/group; mkdir -p /opt/deep/er && echo d > /opt/deep/er/f",
    )
    .await;

    let (status, snap) = post(
        &s,
        &format!("/v1/sandboxes/{src}/snapshots"),
        json!({"name": "base-state"}),
    )
    .await;
    assert_eq!(status, 201, "{snap}");
    let snap_id = snap["id"].as_str().expect("id").to_string();
    assert!(snap_id.starts_with("snap_"), "{snap}");
    assert_eq!(snap["name"], "base-state");
    assert_eq!(snap["sandbox_id"], src.as_str());
    assert_eq!(snap["kind"], "filesystem");
    assert_eq!(snap["template"], "minimal");
    assert!(snap["size_bytes"].as_u64().unwrap_or(0) > 0, "{snap}");
    assert!(snap["created_at"].is_string());
    let (_, list) = s.request(Method::GET, "/v1/snapshots", None).await;
    assert_eq!(list["snapshots"][0]["id"], snap_id.as_str(), "{list}");
    // The source keeps running and its later writes are not in the snapshot.
    s.sh(&src, "echo later > /root/later").await;

    let a = s.create(json!({"snapshot": snap_id})).await;
    assert_eq!(a["snapshot"], snap_id.as_str(), "{a}");
    let a = a["id"].as_str().expect("id").to_string();
    let b = s.create_id(json!({"snapshot": snap_id})).await;
    for id in [&a, &b] {
        let (out, code) = s
            .sh(
                id,
                "cat /home/user/mine /root/r /opt/deep/er/f; stat -c %u:%g /home/user/mine; \
                 [ -e /etc/group ] && echo group-back; [ -e /root/later ] && echo later; \
                 echo $FROM_SOURCE; hostname",
            )
            .await;
        assert_eq!(code, 0, "{out}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[..6],
            [
                "mine",
                "root-file",
                "d",
                "1000:1000",
                "yes",
                id.replace('_', "-").as_str()
            ],
            "{out}"
        );
    }
    // Writes in one are invisible in the other, and in the source.
    s.sh(
        &a,
        "echo only-a > /root/only-a; echo changed > /home/user/mine",
    )
    .await;
    let (out, _) = s.sh(&b, "ls /root; cat /home/user/mine").await;
    assert!(!out.contains("only-a"), "{out}");
    assert!(out.ends_with("mine\n"), "{out}");
    let (out, _) = s.sh(&src, "ls /root").await;
    assert!(!out.contains("only-a"), "{out}");

    // In use: deleting it is refused; once its sandboxes are gone it goes.
    let (status, v) = s
        .request(Method::DELETE, &format!("/v1/snapshots/{snap_id}"), None)
        .await;
    assert_eq!(status, 409, "{v}");
    assert!(message(&v).contains(&a) && message(&v).contains(&b), "{v}");
    let (_, one) = s
        .request(Method::GET, &format!("/v1/snapshots/{snap_id}"), None)
        .await;
    assert_eq!(one["used_by"].as_array().map(Vec::len), Some(2), "{one}");
    assert_eq!(s.kill(&a).await, 204);
    assert_eq!(s.kill(&b).await, 204);
    let (status, _) = s
        .request(Method::DELETE, &format!("/v1/snapshots/{snap_id}"), None)
        .await;
    assert_eq!(status, 204);
    assert!(!s.state_dir.join("snapshots").join(&snap_id).exists());
    let (_, list) = s.request(Method::GET, "/v1/snapshots", None).await;
    assert_eq!(list["snapshots"].as_array().map(Vec::len), Some(0));

    // Unknown snapshots are 404 everywhere.
    for (m, p) in [
        (Method::GET, format!("/v1/snapshots/{snap_id}")),
        (Method::DELETE, format!("/v1/snapshots/{snap_id}")),
        (Method::GET, "/v1/snapshots/snap_nosuchsnapshot".to_string()),
        (Method::DELETE, "/v1/snapshots/../../etc".to_string()),
    ] {
        let (status, v) = s.request(m.clone(), &p, None).await;
        assert_eq!(status, 404, "{m} {p}: {v}");
    }
    for bad in [snap_id.as_str(), "snap_nosuchsnapshot", "not-a-snapshot"] {
        let (status, v) = post(&s, "/v1/sandboxes", json!({"snapshot": bad})).await;
        assert_eq!(status, 404, "{bad}: {v}");
        assert!(message(&v).contains("snapshot"), "{v}");
    }
}

#[tokio::test]
async fn a_snapshot_of_a_sandbox_made_from_a_snapshot_carries_both() {
    let s = TestServer::start().await;
    let first = s.create_id(json!({})).await;
    s.sh(&first, "echo one > /root/one; echo gone > /root/gone")
        .await;
    let (_, snap1) = post(
        &s,
        &format!("/v1/sandboxes/{first}/snapshots"),
        json!({"name": "one"}),
    )
    .await;
    let second = s.create_id(json!({"snapshot": snap1["id"]})).await;
    s.sh(&second, "echo two > /root/two; rm /root/gone").await;
    // Snapshots of hibernated sandboxes work without waking them.
    act(&s, &second, "hibernate").await;
    let (status, snap2) = post(
        &s,
        &format!("/v1/sandboxes/{second}/snapshots"),
        json!({"name": "two"}),
    )
    .await;
    assert_eq!(status, 201, "{snap2}");
    assert_eq!(state_of(&s, &second).await, "hibernated");
    let third = s.create_id(json!({"snapshot": snap2["id"]})).await;
    let (out, _) = s.sh(&third, "ls /root").await;
    assert_eq!(out, "one\ntwo\n");
    // The second snapshot stands alone: the first can go once its own sandbox does.
    assert_eq!(s.kill(&second).await, 204);
    let (status, v) = s
        .request(
            Method::DELETE,
            &format!("/v1/snapshots/{}", snap1["id"].as_str().unwrap_or("")),
            None,
        )
        .await;
    assert_eq!(status, 204, "{v}");
    assert_eq!(s.sh(&third, "cat /root/one").await.0, "one\n");
}

#[tokio::test]
async fn a_disk_fork_carries_files_but_not_processes() {
    let s = TestServer::start().await;
    let parent = s.create_id(json!({"metadata": {"team": "x"}})).await;
    s.sh(&parent, "echo from-parent > /root/f").await;
    background(&s, &parent, "sleep 7777").await;

    let (status, v) = post(
        &s,
        &format!("/v1/sandboxes/{parent}/fork"),
        json!({"count": 2, "mode": "disk"}),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let children: Vec<Value> = v["sandboxes"].as_array().expect("sandboxes").clone();
    assert_eq!(children.len(), 2);
    let ids: Vec<String> = children
        .iter()
        .map(|c| c["id"].as_str().expect("id").to_string())
        .collect();
    assert_ne!(ids[0], ids[1]);
    for c in &children {
        assert_eq!(c["forked_from"], parent.as_str(), "{c}");
        assert_eq!(c["state"], "running");
        assert_eq!(c["metadata"]["team"], "x");
    }
    let mut hostnames = Vec::new();
    for id in &ids {
        let (out, _) = s.sh(id, "cat /root/f; ps -o args; hostname").await;
        assert!(out.starts_with("from-parent\n"), "{out}");
        assert!(!out.contains("sleep 7777"), "a process was forked: {out}");
        hostnames.push(out.lines().last().unwrap_or("").to_string());
    }
    assert_ne!(hostnames[0], hostnames[1]);
    // The parent kept running, with its process.
    let (out, _) = s.sh(&parent, "ps -o args").await;
    assert!(out.contains("sleep 7777"), "{out}");
    // Children are independent of each other and of the parent.
    s.sh(&ids[0], "echo child0 > /root/c0").await;
    assert!(!s.sh(&ids[1], "ls /root").await.0.contains("c0"));
    assert!(!s.sh(&parent, "ls /root").await.0.contains("c0"));
    // The fork's snapshot is not listed, and goes with the last child.
    let (_, list) = s.request(Method::GET, "/v1/snapshots", None).await;
    assert_eq!(
        list["snapshots"].as_array().map(Vec::len),
        Some(0),
        "{list}"
    );
    for id in &ids {
        assert_eq!(s.kill(id).await, 204);
    }
    let left: Vec<_> = std::fs::read_dir(s.state_dir.join("snapshots"))
        .expect("snapshots dir")
        .collect();
    assert!(left.is_empty(), "fork snapshot left behind: {left:?}");
}

#[tokio::test]
async fn explore_keeps_the_one_passing_command_and_destroys_the_rest() {
    let s = TestServer::start().await;
    let parent = s.create_id(json!({})).await;
    s.sh(&parent, "echo marker > /root/marker").await;
    let (status, v) = post(
        &s,
        &format!("/v1/sandboxes/{parent}/explore"),
        json!({
            "commands": ["exit 3", "cat /root/marker && echo pass", "false", "sleep 30"],
            "timeout_seconds": 3,
            "keep": "winner"
        }),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let winner = &v["winner"];
    assert_eq!(winner["index"], 1, "{v}");
    assert_eq!(winner["exit_code"], 0);
    assert_eq!(winner["score"], 1.0);
    assert_eq!(winner["stdout"], "marker\npass\n");
    let outcomes = v["outcomes"].as_array().expect("outcomes");
    assert_eq!(outcomes.len(), 4);
    let codes: Vec<i64> = outcomes
        .iter()
        .map(|o| o["exit_code"].as_i64().unwrap_or(-1))
        .collect();
    assert_eq!(codes, [3, 0, 1, 124]);
    assert_eq!(outcomes[3]["timed_out"], true);
    let scores: Vec<f64> = outcomes
        .iter()
        .map(|o| o["score"].as_f64().unwrap_or(-1.0))
        .collect();
    assert_eq!(scores, [0.0, 1.0, 0.0, 0.0]);
    // Exactly one new sandbox besides the parent: the winner, which works.
    let winner_id = winner["sandbox_id"].as_str().expect("id").to_string();
    let mut ids = sandbox_ids(&s).await;
    ids.sort();
    let mut expected = vec![parent.clone(), winner_id.clone()];
    expected.sort();
    assert_eq!(ids, expected);
    assert_eq!(s.sh(&winner_id, "cat /root/marker").await.0, "marker\n");

    // With a score regex the best number wins; ties go to the lowest index.
    let (status, v) = post(
        &s,
        &format!("/v1/sandboxes/{parent}/explore"),
        json!({
            "commands": ["echo score=0.2", "echo score=0.9", "echo score=0.9", "echo none"],
            "score_regex": "score=([0-9.]+)"
        }),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["winner"]["index"], 1, "{v}");
    assert_eq!(v["winner"]["score"], 0.9);
    assert_eq!(sandbox_ids(&s).await.len(), 3);
}

#[tokio::test]
async fn bad_lifecycle_input_is_422_with_a_clear_message() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let seventeen: Vec<String> = (0..17).map(|i| format!("echo {i}")).collect();
    for (path, body, needle) in [
        (
            "fork",
            json!({"count": 0}),
            "count must be between 1 and 16, got 0",
        ),
        (
            "fork",
            json!({"count": 17}),
            "count must be between 1 and 16, got 17",
        ),
        (
            "fork",
            json!({"count": 2, "mode": "live"}),
            "live fork needs the vm backend",
        ),
        (
            "explore",
            json!({"commands": seventeen}),
            "commands must hold between 1 and 16 commands, got 17",
        ),
        ("explore", json!({"commands": []}), "got 0"),
        (
            "explore",
            json!({"commands": ["true", " "]}),
            "commands[1] is empty",
        ),
        (
            "explore",
            json!({"commands": ["true"], "score_regex": "score=[0-9]+"}),
            "capture group",
        ),
        (
            "explore",
            json!({"commands": ["true"], "score_regex": "("}),
            "score_regex is not valid",
        ),
        (
            "explore",
            json!({"commands": ["true"], "keep": "all"}),
            "keep must be \"winner\"",
        ),
        (
            "explore",
            json!({"commands": ["true"], "timeout_seconds": -1}),
            "timeout_seconds",
        ),
        ("snapshots", json!({"name": "a b"}), "snapshot name"),
    ] {
        let (status, v) = post(&s, &format!("/v1/sandboxes/{id}/{path}"), body.clone()).await;
        assert_eq!(status, 422, "{path} {body}: {v}");
        assert!(message(&v).contains(needle), "{path} {body}: {v}");
    }
    let (status, v) = post(
        &s,
        &format!("/v1/sandboxes/{id}/fork"),
        json!({"count": "x"}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    let (status, v) = post(
        &s,
        "/v1/sandboxes",
        json!({"idle_hibernate_seconds": 999_999_999}),
    )
    .await;
    assert_eq!(status, 422, "{v}");
    for action in ["pause", "resume", "hibernate", "wake", "fork"] {
        let (status, v) = post(
            &s,
            &format!("/v1/sandboxes/sbx_nosuchsandbox/{action}"),
            json!({}),
        )
        .await;
        assert_eq!(status, 404, "{action}: {v}");
    }
    // Nothing was created by any of these.
    assert_eq!(sandbox_ids(&s).await, [id]);
    let (_, list) = s.request(Method::GET, "/v1/snapshots", None).await;
    assert_eq!(list["snapshots"].as_array().map(Vec::len), Some(0));
}

#[tokio::test]
async fn openapi_documents_the_lifecycle_routes() {
    let s = TestServer::start().await;
    let (_, doc) = s.request(Method::GET, "/v1/openapi.json", None).await;
    for p in [
        "/v1/sandboxes/{id}/pause",
        "/v1/sandboxes/{id}/resume",
        "/v1/sandboxes/{id}/hibernate",
        "/v1/sandboxes/{id}/wake",
        "/v1/sandboxes/{id}/snapshots",
        "/v1/sandboxes/{id}/fork",
        "/v1/sandboxes/{id}/explore",
        "/v1/snapshots",
        "/v1/snapshots/{id}",
    ] {
        assert!(doc["paths"][p].is_object(), "openapi lacks {p}");
    }
    for schema in [
        "Snapshot",
        "ForkRequest",
        "ExploreRequest",
        "ExploreResult",
        "WokenSandbox",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "openapi lacks {schema}"
        );
    }
}

fn hutch(s: &TestServer, args: &[&str]) -> (i32, String, String) {
    let o = std::process::Command::new(hutch_testkit::hutch_bin())
        .args(args)
        .env("HUTCH_URL", &s.url)
        .env("HUTCH_STATE_DIR", &s.state_dir)
        .env_remove("HUTCH_API_KEY")
        .output()
        .expect("run hutch");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_cli_drives_pause_hibernate_snapshots_fork_and_explore() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    s.sh(&id, "echo cli > /root/f").await;
    for (verb, state) in [
        ("pause", "paused"),
        ("resume", "running"),
        ("hibernate", "hibernated"),
    ] {
        let (code, out, err) = hutch(&s, &[verb, &id]);
        assert_eq!(code, 0, "{verb}: {err}");
        assert_eq!(out, format!("{id} {state}\n"));
    }
    let (code, out, err) = hutch(&s, &["wake", &id]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with(&format!("{id} running (woke in ")), "{out}");
    let (code, _, err) = hutch(&s, &["wake", &id]);
    assert_eq!(code, 1);
    assert!(err.contains("conflict (409)"), "{err}");

    let (code, snap, err) = hutch(&s, &["snapshot", &id, "--name", "cli-snap"]);
    assert_eq!(code, 0, "{err}");
    let snap = snap.trim().to_string();
    assert!(snap.starts_with("snap_"), "{snap}");
    let (_, ls, _) = hutch(&s, &["snapshot", "ls"]);
    assert!(
        ls.contains(&snap) && ls.contains("cli-snap") && ls.contains("filesystem"),
        "{ls}"
    );
    let (_, ls, _) = hutch(&s, &["--json", "snapshot", "ls"]);
    let v: Value = serde_json::from_str(&ls).expect("json");
    assert_eq!(v["snapshots"][0]["id"], snap.as_str());
    let (code, from_snap, err) = hutch(&s, &["create", "--snapshot", &snap]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(s.sh(from_snap.trim(), "cat /root/f").await.0, "cli\n");
    assert_eq!(s.kill(from_snap.trim()).await, 204);

    let (code, out, err) = hutch(&s, &["fork", &id, "--count", "2"]);
    assert_eq!(code, 0, "{err}");
    let children: Vec<&str> = out.lines().collect();
    assert_eq!(children.len(), 2, "{out}");
    assert_eq!(s.sh(children[1], "cat /root/f").await.0, "cli\n");
    let (code, _, err) = hutch(&s, &["fork", &id, "--count", "2", "--mode", "live"]);
    assert_eq!(code, 1);
    assert!(err.contains("live fork needs the vm backend"), "{err}");

    let (code, out, err) = hutch(
        &s,
        &[
            "explore",
            &id,
            "--timeout",
            "10",
            "--",
            "false",
            ":::",
            "test",
            "-f",
            "/root/f",
            ":::",
            "exit",
            "2",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("winner: #1 in sbx_"), "{out}");
    assert!(
        out.contains("(destroyed)") && out.contains("test -f /root/f"),
        "{out}"
    );

    let (code, out, err) = hutch(&s, &["snapshot", "rm", &snap]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), snap);
    let (code, _, err) = hutch(&s, &["snapshot", "rm", &snap]);
    assert_eq!(code, 1);
    assert!(err.contains("not_found (404)"), "{err}");
}

fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::test]
#[ignore = "benchmark: run with --ignored --nocapture (release build)"]
async fn bench_pause_resume_hibernate_wake() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    s.sh(&id, "echo x > /root/x").await;
    let (mut pause, mut resume, mut hibernate, mut wake, mut reported, mut transparent) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1000.0;
    for _ in 0..20 {
        let t = Instant::now();
        act(&s, &id, "pause").await;
        pause.push(ms(t));
        let t = Instant::now();
        act(&s, &id, "resume").await;
        resume.push(ms(t));
        let t = Instant::now();
        act(&s, &id, "hibernate").await;
        hibernate.push(ms(t));
        let t = Instant::now();
        let v = act(&s, &id, "wake").await;
        wake.push(ms(t));
        reported.push(v["woke_in_ms"].as_f64().unwrap_or(f64::NAN));
        act(&s, &id, "hibernate").await;
        let t = Instant::now();
        assert_eq!(s.sh(&id, "cat /root/x").await.0, "x\n");
        transparent.push(ms(t));
    }
    println!(
        "ns lifecycle p50 of 20 (ms, HTTP round trip): pause {:.2}, resume {:.2}, hibernate {:.2}, \
         wake {:.2} (woke_in_ms {:.0}), exec on a hibernated sandbox {:.2}",
        p50(pause),
        p50(resume),
        p50(hibernate),
        p50(wake),
        p50(reported),
        p50(transparent)
    );

    // Snapshots and forks of a sandbox holding 1000 small files (about 4 MB).
    s.sh(
        &id,
        "mkdir -p /root/tree && i=0; while [ $i -lt 1000 ]; do head -c 4096 /dev/urandom > /root/tree/f$i; i=$((i+1)); done",
    )
    .await;
    let (mut snap, mut restore, mut fork1, mut fork8) = (vec![], vec![], vec![], vec![]);
    for _ in 0..10 {
        let t = Instant::now();
        let (status, v) = post(
            &s,
            &format!("/v1/sandboxes/{id}/snapshots"),
            json!({"name": "b"}),
        )
        .await;
        assert_eq!(status, 201, "{v}");
        snap.push(ms(t));
        let t = Instant::now();
        let child = s.create_id(json!({"snapshot": v["id"]})).await;
        restore.push(ms(t));
        s.kill(&child).await;
        s.request(
            Method::DELETE,
            &format!("/v1/snapshots/{}", v["id"].as_str().unwrap_or("")),
            None,
        )
        .await;
        for (n, out) in [(1, &mut fork1), (8, &mut fork8)] {
            let t = Instant::now();
            let (status, v) =
                post(&s, &format!("/v1/sandboxes/{id}/fork"), json!({"count": n})).await;
            assert_eq!(status, 201, "{v}");
            out.push(ms(t));
            for c in v["sandboxes"].as_array().into_iter().flatten() {
                s.kill(c["id"].as_str().unwrap_or("")).await;
            }
        }
    }
    println!(
        "ns snapshots p50 of 10 (ms, 1000 files / 4 MB written): snapshot {:.1}, create from it {:.1}, \
         fork of 1 {:.1}, fork of 8 {:.1}",
        p50(snap),
        p50(restore),
        p50(fork1),
        p50(fork8)
    );
}
