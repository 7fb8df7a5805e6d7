//! The crash matrix (issue 23, item 7): the server aborts at each named point of each
//! multi-step operation — create, snapshot, fork, explore, hibernate, wake, pause, resume,
//! delete (the test hook `HUTCH_TEST_CRASH_AT`, `hutch-core/src/crash_points.rs`: what
//! `kill -9` leaves) — beside bystander sandboxes that run, sleep hibernated and sit paused.
//! After every crash a new server on the same state directory must hold these invariants:
//!
//! - the database passes `PRAGMA integrity_check`;
//! - every sandbox it lists is usable in its state and has its files: a running one runs a
//!   command, a hibernated one wakes, a paused one resumes (none is `failed`: no crash point
//!   here loses what a sandbox kept);
//! - it lists no sandbox a client never got (the children of an unanswered fork);
//! - nothing of a sandbox it does not list is left on the host: no process in its cgroups,
//!   no cgroup, no sandbox directory, no vm record, no mount;
//! - no snapshot directory without its record, nor a hidden snapshot no sandbox uses; no
//!   fork or shared-memory intent left over; no loop device but the disk pool's.
//!
//! Each case first checks that the crash left the operation half done on the host (a frozen
//! cgroup, a process its record does not name, a directory no record names), so that it
//! fails where nothing reconciles.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use hutch_testkit::{
    assert_no_processes_or_cgroups, both_backends, cgroup_frozen, loop_devices_under, on,
    processes_of, TestServer,
};
use reqwest::Method;
use serde_json::{json, Value};

/// What state a case's sandbox is put in before the operation.
#[derive(Clone, Copy, PartialEq)]
enum Before {
    Running,
    Hibernated,
    Paused,
}

/// One crash: the point, the state the target starts in, and the call cut by the crash.
struct Case {
    point: &'static str,
    before: Before,
    method: Method,
    /// The path, with `{id}` for the target.
    path: &'static str,
    /// The body, given the isolation (null: none).
    body: fn(&str) -> Value,
    /// Evidence that the crash left the operation half done, checked before the restart.
    left: Left,
}

/// What the crash must have left behind (see [`Case::left`]).
#[derive(Clone, Copy)]
enum Left {
    /// The target's cgroup frozen (ns) — a vm guest is stopped instead, not seen from here.
    Frozen,
    /// A process in the target's cgroups while its record names none, or names another
    /// state than the host's (it still runs).
    Running,
    /// A sandbox directory no client got (a child, a create).
    NewSandbox,
    /// A snapshot directory (or `.tmp-*`) beyond those there were.
    NewSnapshot,
    /// The target's cgroup thawed while its record says paused (ns).
    Thawed,
    /// The target's record names an init that no longer runs.
    StaleRecord,
}

fn no_body(_: &str) -> Value {
    Value::Null
}

fn create_on(isolation: &str) -> Value {
    on(isolation, json!({}))
}

fn named_snapshot(_: &str) -> Value {
    json!({"name": "cut"})
}

fn two_children(_: &str) -> Value {
    json!({"count": 2, "mode": "disk"})
}

fn explore(_: &str) -> Value {
    json!({"commands": ["cat /root/marker", "exit 1"], "timeout_seconds": 30})
}

fn cases(isolation: &str) -> Vec<Case> {
    let post = |point, before, path, body, left| Case {
        point,
        before,
        method: Method::POST,
        path,
        body,
        left,
    };
    use Before::*;
    let mut cases = vec![
        post(
            "snapshot.frozen",
            Running,
            "/v1/sandboxes/{id}/snapshots",
            named_snapshot,
            Left::Frozen,
        ),
        post(
            "snapshot.written",
            Running,
            "/v1/sandboxes/{id}/snapshots",
            named_snapshot,
            Left::NewSnapshot,
        ),
        post(
            "fork.snapshot_taken",
            Running,
            "/v1/sandboxes/{id}/fork",
            two_children,
            Left::NewSnapshot,
        ),
        post(
            "fork.children_created",
            Running,
            "/v1/sandboxes/{id}/fork",
            two_children,
            Left::NewSandbox,
        ),
        post(
            "explore.commands_run",
            Running,
            "/v1/sandboxes/{id}/explore",
            explore,
            Left::NewSandbox,
        ),
        post(
            "hibernate.recorded",
            Running,
            "/v1/sandboxes/{id}/hibernate",
            no_body,
            Left::Running,
        ),
        post(
            "hibernate.stopped",
            Running,
            "/v1/sandboxes/{id}/hibernate",
            no_body,
            Left::StaleRecord,
        ),
        post(
            "wake.started",
            Hibernated,
            "/v1/sandboxes/{id}/wake",
            no_body,
            Left::Running,
        ),
        post(
            "pause.stopped",
            Running,
            "/v1/sandboxes/{id}/pause",
            no_body,
            Left::Frozen,
        ),
        post(
            "resume.continued",
            Paused,
            "/v1/sandboxes/{id}/resume",
            no_body,
            Left::Thawed,
        ),
        Case {
            point: "delete.record_gone",
            before: Running,
            method: Method::DELETE,
            path: "/v1/sandboxes/{id}",
            body: no_body,
            left: Left::Running,
        },
        post(
            "create.backend_started",
            Running,
            "/v1/sandboxes",
            create_on,
            Left::NewSandbox,
        ),
    ];
    if isolation == "vm" {
        cases.insert(
            6,
            post(
                "vm.hibernate.memory_saved",
                Running,
                "/v1/sandboxes/{id}/hibernate",
                no_body,
                Left::Running,
            ),
        );
    }
    cases
}

/// The entries of `dir` (none when it does not exist).
fn entries(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The sandbox ids the server's state directory has something of.
fn ids_in_state(s: &TestServer) -> BTreeSet<String> {
    let mut ids = entries(&s.state_dir.join("sandboxes"));
    ids.extend(entries(&s.state_dir.join("vm-records")));
    ids.retain(|n| n.starts_with("sbx_"));
    ids
}

/// The records of the server's database, read directly (the server may be down).
fn db_records(s: &TestServer, table: &str) -> Vec<Value> {
    let db = rusqlite::Connection::open_with_flags(
        s.state_dir.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("open the state database");
    let mut q = db
        .prepare(&format!("SELECT record FROM {table}"))
        .expect("query");
    let rows = q
        .query_map([], |row| row.get::<_, String>(0))
        .expect("rows")
        .map(|r| serde_json::from_str(&r.expect("row")).expect("a JSON record"))
        .collect();
    rows
}

fn integrity(s: &TestServer) -> String {
    let db = rusqlite::Connection::open_with_flags(
        s.state_dir.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("open the state database");
    db.query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("integrity_check")
}

/// The bystanders and targets so far: each sandbox's marker file content, by id; and every
/// sandbox id ever seen in the state directory.
#[derive(Default)]
struct World {
    markers: BTreeMap<String, String>,
    seen: BTreeSet<String>,
}

impl World {
    /// A new sandbox with its marker, put in state `before`.
    async fn sandbox(&mut self, s: &TestServer, isolation: &str, before: Before) -> String {
        let id = s
            .create_id(on(isolation, json!({"persistent": true})))
            .await;
        let marker = format!("kept by {id}");
        s.sh_ok(&id, &format!("echo '{marker}' > /root/marker; sync"))
            .await;
        match before {
            Before::Running => {}
            Before::Hibernated => {
                s.act(&id, "hibernate").await;
            }
            Before::Paused => {
                s.act(&id, "pause").await;
            }
        }
        self.markers.insert(id.clone(), marker);
        self.seen.insert(id.clone());
        id
    }
}

/// Restart the server so that it aborts at `case.point`; make the case's call on `target`,
/// which must get no answer (the server died on the way); reap the server.
async fn crash(s: &mut TestServer, isolation: &str, case: &Case, target: &str) {
    let path = case.path.replace("{id}", target);
    s.crash_during(
        case.point,
        case.method.clone(),
        &path,
        (case.body)(isolation),
    )
    .await;
}

/// Check, with the server down, that the crash left `case`'s operation half done.
fn assert_left(
    s: &TestServer,
    isolation: &str,
    case: &Case,
    target: &str,
    (ids_before, snapshots_before): (&BTreeSet<String>, &BTreeSet<String>),
) {
    let point = case.point;
    match case.left {
        Left::Frozen if isolation == "ns" => {
            assert!(cgroup_frozen(target), "{point}: {target} is not frozen")
        }
        Left::Thawed if isolation == "ns" => {
            assert!(!cgroup_frozen(target), "{point}: {target} is frozen")
        }
        Left::Frozen | Left::Thawed => {}
        Left::StaleRecord => {
            let records = db_records(s, "sandboxes");
            let r = records
                .iter()
                .find(|r| r["id"] == target)
                .expect("the target's record");
            assert!(r["init_pid"].is_number(), "{point}: {r}");
            assert_eq!(processes_of(target), Vec::<i32>::new(), "{point}");
        }
        Left::Running => assert!(
            !processes_of(target).is_empty(),
            "{point}: nothing of {target} runs"
        ),
        Left::NewSandbox => assert!(
            ids_in_state(s).difference(ids_before).next().is_some(),
            "{point}: no new sandbox directory"
        ),
        Left::NewSnapshot => {
            let now = entries(&s.state_dir.join("snapshots"));
            assert!(
                now.difference(snapshots_before).next().is_some(),
                "{point}: no new snapshot directory"
            );
        }
    }
}

/// The invariants of the module's doc, after the crash at `point` and a restart. Leaves
/// every listed sandbox in the state it was found in.
async fn assert_consistent(s: &TestServer, w: &World, point: &str) {
    assert_eq!(integrity(s), "ok", "{point}: the database");
    let listed: BTreeSet<String> = s.sandbox_ids().await.into_iter().collect();
    for id in &listed {
        let Some(marker) = w.markers.get(id) else {
            panic!("{point}: {id} is listed, but no client ever got it");
        };
        let (_, v) = s
            .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        let state = v["state"].as_str().unwrap_or_default().to_string();
        match state.as_str() {
            "running" => {}
            "hibernated" => {}
            "paused" => {
                s.act(id, "resume").await;
            }
            _ => panic!("{point}: {id} is {state}: {v}"),
        }
        // A hibernated one wakes on the call.
        assert_eq!(
            s.sh_ok(id, "cat /root/marker").await.trim(),
            marker,
            "{point}: {id} ({state})"
        );
        match state.as_str() {
            "hibernated" => {
                s.act(id, "hibernate").await;
            }
            "paused" => {
                s.act(id, "pause").await;
            }
            _ => {}
        }
    }
    assert_nothing_else(s, w, &listed, point);
}

/// Nothing of a sandbox the server does not list is left on the host, nor any snapshot,
/// intent or loop device no record needs.
fn assert_nothing_else(s: &TestServer, w: &World, listed: &BTreeSet<String>, point: &str) {
    let mut gone: BTreeSet<String> = w.seen.difference(listed).cloned().collect();
    gone.extend(ids_in_state(s).difference(listed).cloned());
    let mounts = s.mounts_under_state();
    for id in &gone {
        assert_no_processes_or_cgroups(id, point);
        assert!(
            !ids_in_state(s).contains(id),
            "{point}: {id}'s directory is left"
        );
        assert!(
            mounts.iter().all(|m| !m.contains(id.as_str())),
            "{point}: {id}'s mounts are left: {mounts:?}"
        );
    }
    let snapshots = db_records(s, "snapshots");
    let sandboxes = db_records(s, "sandboxes");
    for dir in entries(&s.state_dir.join("snapshots")) {
        assert!(
            snapshots.iter().any(|r| r["id"] == dir.as_str()),
            "{point}: snapshot directory {dir} has no record"
        );
    }
    for snap in snapshots
        .iter()
        .filter(|r| r["hidden"] == true && r["build"] != true)
    {
        assert!(
            sandboxes.iter().any(|r| r["layer"] == snap["id"]),
            "{point}: hidden snapshot {} is kept for no sandbox",
            snap["id"]
        );
    }
    for intents in ["fork-intents", "vm-shared-intents"] {
        assert_eq!(
            entries(&s.state_dir.join(intents)),
            BTreeSet::new(),
            "{point}: {intents}"
        );
    }
    let loops = loop_devices_under(&s.state_dir);
    assert!(loops.len() <= 1, "{point}: loop devices {loops:?}");
}

async fn every_crash_point_leaves_usable_sandboxes_and_nothing_else(isolation: &str) {
    let mut s = TestServer::start().await;
    let mut w = World::default();
    // Bystanders, one in each state, through every crash.
    for before in [Before::Running, Before::Hibernated, Before::Paused] {
        w.sandbox(&s, isolation, before).await;
    }
    for case in cases(isolation) {
        let target = w.sandbox(&s, isolation, case.before).await;
        let before = (ids_in_state(&s), entries(&s.state_dir.join("snapshots")));
        crash(&mut s, isolation, &case, &target).await;
        w.seen.extend(ids_in_state(&s));
        assert_left(&s, isolation, &case, &target, (&before.0, &before.1));
        s.spawn_server().await;
        assert_consistent(&s, &w, case.point).await;
        // The operation works on the restarted server.
        if case.point != "delete.record_gone" && case.point != "create.backend_started" {
            let (status, v) = s
                .request(
                    case.method.clone(),
                    &case.path.replace("{id}", &target),
                    Some((case.body)(isolation)).filter(|b| !b.is_null()),
                )
                .await;
            assert!(
                (200..300).contains(&status) || status == 409,
                "{}: after the restart: {status} {v}",
                case.point
            );
        }
        // Keep the world small: the target goes (its children with it).
        if s.kill(&target).await == 204 {
            w.markers.remove(&target);
        }
        let children: Vec<String> = s
            .sandbox_ids()
            .await
            .into_iter()
            .filter(|id| !w.markers.contains_key(id))
            .collect();
        for child in children {
            s.kill(&child).await;
        }
        let listed = s.sandbox_ids().await.into_iter().collect();
        assert_nothing_else(&s, &w, &listed, case.point);
    }
}

both_backends!(every_crash_point_leaves_usable_sandboxes_and_nothing_else);
