//! Lifecycle through the API's edges on the `ns` backend: input errors of the lifecycle
//! routes, their OpenAPI entries, and the CLI driving them. The behaviour itself (pause/resume,
//! hibernate/wake, snapshots, forks, explore) is one table run on both backends:
//! `tests/lifecycle_table/`.
//!
//! `cargo test --release -p hutch --test lifecycle_ns -- --ignored --nocapture` measures
//! pause/resume and hibernate/wake latency (p50 of 20).

use std::time::Instant;

use hutch_testkit::TestServer;
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
    assert_eq!(s.sandbox_ids().await, [id]);
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
