//! What the sandbox's lifecycle does to code contexts (`docs/code-interpreter.md`, "State
//! across the lifecycle"): on `ns` a wake and a fork child start the kernels afresh and say
//! `context_restarted: true`; on `vm` hibernate/wake, a live fork and a memory snapshot keep
//! the kernels' memory, so every child has the parent's variables and diverges on its own.

use hutch_testkit::TestServer;
use serde_json::{json, Value};

async fn sandbox(s: &TestServer, isolation: &str) -> String {
    hutch_testkit::ensure_template("code-interpreter");
    let mut body = json!({"template": "code-interpreter", "isolation": isolation});
    if isolation == "vm" {
        // ipykernel and pandas want more than the default 256 MiB.
        body["memory_mib"] = json!(1024);
    }
    s.create_id(body).await
}

/// Run a cell (JSON answer); 200 expected.
async fn run(s: &TestServer, id: &str, body: Value) -> Value {
    let (status, v) = s.post(&format!("/v1/sandboxes/{id}/code"), body).await;
    assert_eq!(status, 200, "{v}");
    v
}

fn main_text(v: &Value) -> String {
    v["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|r| r["is_main_result"] == true)
        .and_then(|r| r["data"]["text/plain"].as_str())
        .unwrap_or_else(|| panic!("no main result with text/plain: {v}"))
        .to_string()
}

#[tokio::test]
async fn an_ns_wake_restarts_contexts_and_says_so() {
    let s = TestServer::start().await;
    let id = sandbox(&s, "ns").await;
    let (status, ctx) = s
        .post(&format!("/v1/sandboxes/{id}/contexts"), json!({}))
        .await;
    assert_eq!(status, 201, "{ctx}");
    let cid = ctx["id"].as_str().expect("id");
    run(&s, &id, json!({"code": "z = 1", "context_id": cid})).await;
    s.act(&id, "hibernate").await;
    s.act(&id, "wake").await;
    let after = run(
        &s,
        &id,
        json!({"code": "'z' in globals()", "context_id": cid}),
    )
    .await;
    assert_eq!(after["context_restarted"], true, "{after}");
    assert_eq!(main_text(&after), "False", "state is gone on ns");
    let next = run(&s, &id, json!({"code": "1", "context_id": cid})).await;
    assert_eq!(next["context_restarted"], false);
}

#[tokio::test]
async fn an_ns_fork_child_restarts_the_parents_contexts_and_the_parent_keeps_its_own() {
    let s = TestServer::start().await;
    let id = sandbox(&s, "ns").await;
    run(&s, &id, json!({"code": "kept = 'parent'"})).await;
    let children = s.fork(&id, 1, "disk").await;
    let child = run(&s, &children[0], json!({"code": "'kept' in globals()"})).await;
    assert_eq!(child["context_restarted"], true, "{child}");
    assert_eq!(main_text(&child), "False");
    let parent = run(&s, &id, json!({"code": "kept"})).await;
    assert_eq!(main_text(&parent), "'parent'");
    assert_eq!(parent["context_restarted"], false);
}

#[tokio::test]
async fn a_vm_sandbox_keeps_kernel_state_across_hibernate_wake_and_live_forks() {
    if hutch_testkit::skip_without_vm(module_path!()) {
        return;
    }
    let s = TestServer::start().await;
    let id = sandbox(&s, "vm").await;
    run(
        &s,
        &id,
        json!({"code": "import pandas as pd\nframe = pd.DataFrame({'v': [40]})"}),
    )
    .await;
    s.act(&id, "hibernate").await;
    s.act(&id, "wake").await;
    let woken = run(&s, &id, json!({"code": "int(frame.v.sum()) + 2"})).await;
    assert_eq!(main_text(&woken), "42", "{woken}");
    assert_eq!(woken["context_restarted"], false);

    let children = s.fork(&id, 3, "live").await;
    assert_eq!(children.len(), 3);
    for (i, child) in children.iter().enumerate() {
        let code = format!("frame.v[0] += {}\nint(frame.v[0])", i + 1);
        let ran = run(&s, child, json!({"code": code})).await;
        assert_eq!(main_text(&ran), (41 + i).to_string(), "child {i}: {ran}");
        assert_eq!(ran["context_restarted"], false, "{ran}");
    }
    // Each child changed its own copy.
    for (i, child) in children.iter().enumerate() {
        let again = run(&s, child, json!({"code": "int(frame.v[0])"})).await;
        assert_eq!(main_text(&again), (41 + i).to_string(), "child {i}");
    }
    let parent = run(&s, &id, json!({"code": "int(frame.v[0])"})).await;
    assert_eq!(main_text(&parent), "40", "the parent is untouched");

    // A memory snapshot, and a sandbox made from it, keeps the kernel's variables too.
    let (status, snap) = s
        .post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}))
        .await;
    assert_eq!(status, 201, "{snap}");
    assert_eq!(snap["kind"], "memory", "{snap}");
    let restored = s
        .create_id(json!({
            "snapshot": snap["id"],
            "isolation": "vm",
            "memory_mib": 1024,
        }))
        .await;
    let ran = run(&s, &restored, json!({"code": "int(frame.v[0]) + 1"})).await;
    assert_eq!(main_text(&ran), "41", "{ran}");
    assert_eq!(ran["context_restarted"], false, "{ran}");
}
