//! Reconciliation after a crash (issue 23, item 5): the server aborts at a named point of a
//! create or a fork (the test hook `HUTCH_TEST_CRASH_AT`, `hutch-core/src/crash_points.rs`:
//! what `kill -9` leaves), and a new server on the same state directory must leave no
//! process in the sandbox's cgroups, no cgroup, no sandbox directory, and list nothing it
//! cannot use. Each case first checks the crash did leave a live process behind, so it
//! fails where nothing reconciles.

use std::time::Duration;

use hutch_testkit::{
    assert_no_processes_or_cgroups, both_backends, cgroups_of, on, processes_of, skip_without_vm,
    wait_until, TestServer,
};
use reqwest::Method;
use serde_json::{json, Value};

/// The sandbox directories in the server's state.
fn sandbox_dirs(s: &TestServer) -> Vec<String> {
    std::fs::read_dir(s.state_dir.join("sandboxes"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Restart the server so that it aborts at `point`; `POST path` with `body` (none when
/// null), which must get no answer (the server died on the way); reap it. Returns the sandbox directories made
/// meanwhile.
async fn crash_at(s: &mut TestServer, point: &str, path: &str, body: Value) -> Vec<String> {
    let before = sandbox_dirs(s);
    s.crash_during(point, Method::POST, path, body).await;
    sandbox_dirs(s)
        .into_iter()
        .filter(|d| !before.contains(d))
        .collect()
}

/// After the restart: nothing of `ids` is left on the host, and the API lists none of them.
async fn assert_gone(s: &TestServer, point: &str, ids: &[String]) {
    for id in ids {
        assert_no_processes_or_cgroups(id, point);
        assert!(
            !s.state_dir.join("sandboxes").join(id).exists(),
            "{point}: {id}'s directory is left"
        );
        assert!(
            !s.state_dir.join("vm-records").join(id).exists(),
            "{point}: {id}'s vm records are left"
        );
        let (status, _) = s
            .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        assert_eq!(status, 404, "{point}: {id} is still known");
    }
    assert!(
        s.mounts_under_state()
            .iter()
            .all(|m| !ids.iter().any(|id| m.contains(id.as_str()))),
        "{point}: mounts left: {:?}",
        s.mounts_under_state()
    );
}

/// The value of `hutch_reconciled_total{kind}`.
async fn reconciled(s: &TestServer, kind: &str) -> u64 {
    let prefix = format!("hutch_reconciled_total{{kind=\"{kind}\"}} ");
    s.metrics_text()
        .await
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no {prefix} in /metrics"))
}

async fn a_server_killed_in_the_middle_of_a_create_leaves_no_process_or_cgroup(isolation: &str) {
    let mut s = TestServer::start().await;
    let points: &[&str] = match isolation {
        // QEMU restored, its guest not yet identified; then QEMU handed over, not recorded.
        "vm" => &["vm.restore.qemu_running", "create.backend_started"],
        _ => &["create.backend_started"],
    };
    for point in points {
        let made = crash_at(&mut s, point, "/v1/sandboxes", on(isolation, json!({}))).await;
        assert_eq!(made.len(), 1, "{point}: sandbox directories made: {made:?}");
        let id = &made[0];
        assert!(
            !processes_of(id).is_empty(),
            "{point}: the crash left no process of {id} to reconcile"
        );
        s.spawn_server().await;
        assert_gone(&s, point, &made).await;
        assert!(
            s.sandbox_ids().await.is_empty(),
            "{point}: listed after the restart"
        );
        assert_eq!(reconciled(&s, "interrupted_create").await, 1, "{point}");
    }
    // The server still makes sandboxes.
    let id = s.create_id(on(isolation, json!({}))).await;
    assert_eq!(s.sh_ok(&id, "echo ok").await, "ok\n");
}

both_backends!(a_server_killed_in_the_middle_of_a_create_leaves_no_process_or_cgroup);

async fn a_server_killed_in_the_middle_of_a_fork_leaves_no_child(isolation: &str) {
    let mut s = TestServer::start().await;
    let mode = if isolation == "vm" { "live" } else { "disk" };
    let parent = s
        .create_id(on(isolation, json!({"persistent": true})))
        .await;
    s.sh_ok(&parent, "echo kept > /root/parent-file").await;
    // One child running and not recorded; then every child running, no answer sent.
    for (point, kind) in [
        ("fork.child_started", "interrupted_create"),
        ("fork.children_created", "fork_child"),
    ] {
        let path = format!("/v1/sandboxes/{parent}/fork");
        let made = crash_at(&mut s, point, &path, json!({"count": 2, "mode": mode})).await;
        assert!(!made.is_empty(), "{point}: no child was made");
        assert!(
            made.iter().any(|id| !processes_of(id).is_empty()),
            "{point}: the crash left no child running to reconcile: {made:?}"
        );
        s.spawn_server().await;
        assert_gone(&s, point, &made).await;
        assert_eq!(s.sandbox_ids().await, vec![parent.clone()], "{point}");
        assert!(
            reconciled(&s, kind).await >= 1,
            "{point}: nothing counted as {kind}"
        );
        // The fork's hidden snapshot went with its children.
        let snapshots = wait_until(Duration::from_secs(10), async || {
            let left: Vec<_> = std::fs::read_dir(s.state_dir.join("snapshots"))
                .map(|d| d.flatten().map(|e| e.file_name()).collect())
                .unwrap_or_default();
            left.is_empty().then_some(())
        })
        .await;
        assert!(snapshots.is_some(), "{point}: the fork's snapshot is left");
        assert_eq!(s.state(&parent).await, "running", "{point}");
        assert_eq!(
            s.sh_ok(&parent, "cat /root/parent-file").await,
            "kept\n",
            "{point}"
        );
    }
    // A fork on the restarted server works and answers.
    let children = s.fork(&parent, 1, mode).await;
    assert_eq!(
        s.sh_ok(&children[0], "cat /root/parent-file").await,
        "kept\n"
    );
}

both_backends!(a_server_killed_in_the_middle_of_a_fork_leaves_no_child);

#[tokio::test]
async fn a_server_killed_in_the_middle_of_a_volume_create_leaves_no_image() {
    let mut s = TestServer::start().await;
    let before = std::fs::read_dir(s.state_dir.join("volumes"))
        .map(|d| d.count())
        .unwrap_or(0);
    crash_at(
        &mut s,
        "volume.image_made",
        "/v1/volumes",
        json!({"name": "cut", "size_mib": 16}),
    )
    .await;
    let dir = s.state_dir.join("volumes");
    let volumes = || std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    assert_eq!(volumes(), before + 1, "the crash left no image to sweep");
    s.spawn_server().await;
    assert_eq!(volumes(), before, "the orphaned image is left");
    assert_eq!(reconciled(&s, "orphan_volume").await, 1);
    let (_, v) = s.request(Method::GET, "/v1/volumes", None).await;
    assert_eq!(v["volumes"], json!([]), "{v}");
    // The name is free again.
    s.volume("cut", 16).await;
}

#[tokio::test]
async fn a_server_killed_in_the_middle_of_a_vm_wake_leaves_no_qemu_and_the_sandbox_wakes() {
    if skip_without_vm(module_path!()) {
        return;
    }
    let mut s = TestServer::start().await;
    let id = s
        .create_id(json!({"isolation": "vm", "persistent": true}))
        .await;
    s.sh_ok(&id, "echo in-memory > /dev/shm/m").await;
    s.act(&id, "hibernate").await;
    assert_eq!(
        processes_of(&id),
        Vec::<i32>::new(),
        "hibernated with a process"
    );
    let point = "vm.restore.qemu_running";
    crash_at(
        &mut s,
        point,
        &format!("/v1/sandboxes/{id}/wake"),
        Value::Null,
    )
    .await;
    assert!(
        !processes_of(&id).is_empty(),
        "the crash left no QEMU of the wake to reconcile"
    );
    s.spawn_server().await;
    // The wake's QEMU is gone; the sandbox is hibernated with its memory, and wakes.
    assert_eq!(
        processes_of(&id),
        Vec::<i32>::new(),
        "the wake's QEMU is left"
    );
    assert_eq!(s.state(&id).await, "hibernated");
    assert_eq!(s.sh_ok(&id, "cat /dev/shm/m").await, "in-memory\n");
    assert_eq!(s.state(&id).await, "running");
}

/// Reconciliation runs while the server serves too (`--reconcile-interval-seconds`): a
/// sandbox whose record is gone (here deleted behind the server's back, as a crash between
/// a delete's record and its teardown leaves it) is killed and removed without a restart,
/// and a bystander is left alone.
#[tokio::test]
async fn a_running_server_removes_what_no_record_owns_without_a_restart() {
    let s = TestServer::start_with(&["--reconcile-interval-seconds", "1"]).await;
    let kept = s.create_id(json!({"persistent": true})).await;
    let orphan = s.create_id(json!({"persistent": true})).await;
    s.sh_ok(&kept, "echo kept > /root/f").await;
    assert!(
        !processes_of(&orphan).is_empty(),
        "the sandbox runs nothing"
    );
    let db = rusqlite::Connection::open(s.state_dir.join("state.db")).expect("open the database");
    db.busy_timeout(Duration::from_secs(10))
        .expect("busy timeout");
    let deleted = db
        .execute("DELETE FROM sandboxes WHERE id = ?1", [&orphan])
        .expect("delete the record");
    assert_eq!(deleted, 1);
    drop(db);
    let removed = wait_until(Duration::from_secs(30), async || {
        (processes_of(&orphan).is_empty()
            && cgroups_of(&orphan).is_empty()
            && !s.state_dir.join("sandboxes").join(&orphan).exists())
        .then_some(())
    })
    .await;
    assert!(removed.is_some(), "the orphan is still on the host");
    assert_gone(&s, "periodic", std::slice::from_ref(&orphan)).await;
    assert!(reconciled(&s, "orphan").await >= 1);
    assert_eq!(s.sh_ok(&kept, "cat /root/f").await, "kept\n");
}
