//! Forks and explore: a disk fork carries files but not processes (where forks carry memory,
//! as on vm, it carries them too); a live fork (where the backend has one) carries memory,
//! processes and the firmware's region, and children are independent; explore runs each
//! command in a child of its own and keeps only the winner.

use hutch_testkit::TestServer;
use reqwest::Method;
use serde_json::{json, Value};

use crate::{message, Backend};

/// The firmware's region of guest memory (written at boot, not part of the guest's RAM).
const FIRMWARE: &str = "dd if=/dev/mem bs=65536 skip=15 count=1 2>/dev/null | md5sum";

pub async fn a_disk_fork_carries_files_and_processes_only_where_forks_carry_memory(
    isolation: &str,
) {
    let b = Backend::of(isolation);
    let s = TestServer::start().await;
    let parent = s
        .create_id(b.create(json!({"metadata": {"team": "x"}})))
        .await;
    s.sh(&parent, "echo from-parent > /root/f").await;
    s.start_background(&parent, json!("sleep 7777")).await;

    let (status, v) = s
        .post(
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
        assert_eq!(c["isolation"], b.isolation, "{c}");
    }
    let mut hostnames = Vec::new();
    for id in &ids {
        let (out, _) = s.sh(id, "cat /root/f; ps -o args; hostname").await;
        assert!(out.starts_with("from-parent\n"), "{out}");
        assert_eq!(
            out.contains("sleep 7777"),
            b.forks_carry_memory,
            "a process was forked exactly where forks carry memory: {out}"
        );
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

    if !b.live_fork {
        let (status, v) = s
            .post(
                &format!("/v1/sandboxes/{parent}/fork"),
                json!({"count": 2, "mode": "live"}),
            )
            .await;
        assert_eq!(status, 422, "{v}");
        assert!(
            message(&v).contains("live fork needs the vm backend"),
            "{v}"
        );
        return;
    }
    // Live fork: two children with the parent's memory; their disks are their own.
    s.sh_ok(&parent, "echo mem > /dev/shm/m").await;
    let kids = s.fork(&parent, 2, "live").await;
    assert_eq!(kids.len(), 2);
    s.sh_ok(&kids[0], "echo only-here > /root/k").await;
    for k in &kids {
        assert_eq!(s.sh_ok(k, "cat /dev/shm/m").await, "mem\n");
        let (out, _) = s.sh(k, "ps -o args").await;
        assert!(
            out.contains("sleep 7777"),
            "a live fork carries processes: {out}"
        );
    }
    let out = s
        .sh_ok(&kids[1], "cat /root/k 2>/dev/null || echo none")
        .await;
    assert_eq!(out, "none\n");
    // The firmware's region came along too.
    let parent_firmware = s.sh_ok(&parent, FIRMWARE).await;
    assert_ne!(
        parent_firmware,
        s.sh_ok(&parent, "head -c 65536 /dev/zero | md5sum").await
    );
    assert_eq!(s.sh_ok(&kids[0], FIRMWARE).await, parent_firmware);
    // A child's own fork: its RAM maps the fork's memory file, not the bake's.
    s.sh_ok(&kids[0], "echo grand >> /dev/shm/m").await;
    let grandchild = s.fork(&kids[0], 1, "live").await;
    assert_eq!(
        s.sh_ok(&grandchild[0], "cat /dev/shm/m").await,
        "mem\ngrand\n"
    );
    // All three forks' memory snapshots (the disk fork's, as forks carry memory here, the
    // live fork's and the grandchild's) were captured (RAM copied out of QEMU), not saved as
    // a migration stream.
    let captured = 2 + u32::from(b.forks_carry_memory);
    let metrics = s.metrics_text().await;
    assert!(
        metrics.contains(&format!(
            "hutch_vm_memory_snapshots_total{{method=\"captured\"}} {captured}"
        )) && metrics.contains("hutch_vm_memory_snapshots_total{method=\"stream\"} 0"),
        "{metrics}"
    );
}

pub async fn explore_keeps_the_one_passing_command_and_destroys_the_rest(isolation: &str) {
    let b = Backend::of(isolation);
    let s = TestServer::start().await;
    let parent = s.create_id(b.create(json!({}))).await;
    s.sh(&parent, "echo marker > /root/marker").await;
    let (status, v) = s
        .post(
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
    let mut ids = s.sandbox_ids().await;
    ids.sort();
    let mut expected = vec![parent.clone(), winner_id.clone()];
    expected.sort();
    assert_eq!(ids, expected);
    assert_eq!(s.sh(&winner_id, "cat /root/marker").await.0, "marker\n");

    // With a score regex the best number wins; ties go to the lowest index.
    let (status, v) = s
        .post(
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
    assert_eq!(s.sandbox_ids().await.len(), 3);

    if b.live_fork {
        // Each command runs in a live child: it has the parent's memory.
        s.sh_ok(&parent, "echo mem > /dev/shm/m").await;
        let (st, v) = s
            .post(
                &format!("/v1/sandboxes/{parent}/explore"),
                json!({"commands": ["cat /dev/shm/m; exit 1", "cat /dev/shm/m"], "timeout_seconds": 60}),
            )
            .await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["winner"]["index"], 1, "{v}");
        assert_eq!(v["winner"]["stdout"], "mem\n", "{v}");
    }
}
