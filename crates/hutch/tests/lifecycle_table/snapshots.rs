//! Named snapshots: two sandboxes made from one are independent of each other and of the
//! source; a snapshot in use cannot be deleted; a snapshot of a sandbox made from a snapshot
//! (hibernated, not woken) carries both. Where snapshots hold memory they carry processes and
//! tmpfs files too, and a sandbox made from one maps the snapshot's memory copy-on-write.

use hutch_testkit::TestServer;
use reqwest::Method;
use serde_json::json;

use crate::{message, randomness, Backend};

pub async fn a_snapshot_restored_twice_gives_two_independent_sandboxes(isolation: &str) {
    let b = Backend::of(isolation);
    let s = TestServer::start().await;
    let src = s
        .create_id(b.create(json!({"env": {"FROM_SOURCE": "yes"}})))
        .await;
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
    if b.memory_snapshots {
        s.sh_ok(
            &src,
            "echo mem > /dev/shm/m; setsid sleep 1000 > /dev/null 2>&1 < /dev/null &",
        )
        .await;
    }

    let (status, snap) = s
        .post(
            &format!("/v1/sandboxes/{src}/snapshots"),
            json!({"name": "base-state"}),
        )
        .await;
    assert_eq!(status, 201, "{snap}");
    let snap_id = snap["id"].as_str().expect("id").to_string();
    assert!(snap_id.starts_with("snap_"), "{snap}");
    assert_eq!(snap["name"], "base-state");
    assert_eq!(snap["sandbox_id"], src.as_str());
    assert_eq!(snap["kind"], b.snapshot_kind(), "{snap}");
    assert_eq!(snap["template"], "minimal");
    assert!(snap["size_bytes"].as_u64().unwrap_or(0) > 0, "{snap}");
    assert!(snap["created_at"].is_string());
    let (_, list) = s.request(Method::GET, "/v1/snapshots", None).await;
    assert_eq!(list["snapshots"][0]["id"], snap_id.as_str(), "{list}");
    // The source keeps running and its later writes are not in the snapshot.
    s.sh(&src, "echo later > /root/later").await;
    assert_eq!(s.sh_ok(&src, "echo after").await, "after\n");

    let a = s.create(json!({"snapshot": snap_id})).await;
    assert_eq!(a["snapshot"], snap_id.as_str(), "{a}");
    assert_eq!(a["isolation"], b.isolation, "{a}");
    let a = a["id"].as_str().expect("id").to_string();
    let b_id = s.create_id(json!({"snapshot": snap_id})).await;
    let src_random = randomness(&s, &src).await;
    let mut seen_random = Vec::new();
    for id in [&a, &b_id] {
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
        if b.memory_snapshots {
            // Its memory and processes came along too.
            let out = s
                .sh_ok(id, "cat /dev/shm/m; ps | grep -c '[s]leep 1000'")
                .await;
            assert_eq!(out, "mem\n1\n", "{id}");
        }
        let random = randomness(&s, id).await;
        assert_ne!(random, src_random, "{id} shares the source's random state");
        seen_random.push(random);
    }
    assert_ne!(
        seen_random[0], seen_random[1],
        "restored siblings share random state"
    );
    // Where a snapshot holds memory, a sandbox's RAM is the snapshot's shared memory file,
    // mapped copy-on-write, and its size is the snapshot's.
    let shared = b.memory_snapshots.then(|| {
        let shared =
            std::fs::read_to_string(s.state_dir.join("snapshots").join(&snap_id).join("shared"))
                .expect("the snapshot's memory was shared");
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", s.qemu_pid(&a).expect("QEMU")))
            .expect("cmdline");
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            cmdline.contains(&format!("mem-path={}/memory,share=off", shared.trim())),
            "{cmdline}"
        );
        shared.trim().to_string()
    });
    if b.memory_snapshots {
        // It was captured (RAM copied out of QEMU), not saved as a migration stream.
        let metrics = s.metrics_text().await;
        assert!(
            metrics.contains("hutch_vm_memory_snapshots_total{method=\"captured\"} 1")
                && metrics.contains("hutch_vm_memory_snapshots_total{method=\"stream\"} 0"),
            "{metrics}"
        );
        let (st, v) = s
            .post(
                "/v1/sandboxes",
                json!({"snapshot": snap_id, "memory_mib": 512}),
            )
            .await;
        assert_eq!(st, 422, "a memory snapshot keeps its size: {v}");
    }
    // Writes in one are invisible in the other, and in the source.
    s.sh(
        &a,
        "echo only-a > /root/only-a; echo changed > /home/user/mine",
    )
    .await;
    let (out, _) = s.sh(&b_id, "ls /root; cat /home/user/mine").await;
    assert!(!out.contains("only-a"), "{out}");
    assert!(out.ends_with("mine\n"), "{out}");
    let (out, _) = s.sh(&src, "ls /root").await;
    assert!(!out.contains("only-a"), "{out}");

    // In use: deleting it is refused; once its sandboxes are gone it goes.
    let (status, v) = s
        .request(Method::DELETE, &format!("/v1/snapshots/{snap_id}"), None)
        .await;
    assert_eq!(status, 409, "{v}");
    assert!(
        message(&v).contains(&a) && message(&v).contains(&b_id),
        "{v}"
    );
    let (_, one) = s
        .request(Method::GET, &format!("/v1/snapshots/{snap_id}"), None)
        .await;
    assert_eq!(one["used_by"].as_array().map(Vec::len), Some(2), "{one}");
    assert_eq!(s.kill(&a).await, 204);
    assert_eq!(s.kill(&b_id).await, 204);
    let (status, _) = s
        .request(Method::DELETE, &format!("/v1/snapshots/{snap_id}"), None)
        .await;
    assert_eq!(status, 204);
    assert!(!s.state_dir.join("snapshots").join(&snap_id).exists());
    if let Some(shared) = shared {
        assert!(
            !std::path::Path::new(&shared).exists(),
            "the shared memory goes with the snapshot"
        );
    }
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
        let (status, v) = s.post("/v1/sandboxes", json!({"snapshot": bad})).await;
        assert_eq!(status, 404, "{bad}: {v}");
        assert!(message(&v).contains("snapshot"), "{v}");
    }
}

pub async fn a_snapshot_of_a_sandbox_made_from_a_snapshot_carries_both(isolation: &str) {
    let b = Backend::of(isolation);
    let s = TestServer::start().await;
    let first = s.create_id(b.create(json!({}))).await;
    s.sh(&first, "echo one > /root/one; echo gone > /root/gone")
        .await;
    let (_, snap1) = s
        .post(
            &format!("/v1/sandboxes/{first}/snapshots"),
            json!({"name": "one"}),
        )
        .await;
    let second = s.create_id(json!({"snapshot": snap1["id"]})).await;
    s.sh(&second, "echo two > /root/two; rm /root/gone").await;
    // Snapshots of hibernated sandboxes work without waking them.
    s.act(&second, "hibernate").await;
    let (status, snap2) = s
        .post(
            &format!("/v1/sandboxes/{second}/snapshots"),
            json!({"name": "two"}),
        )
        .await;
    assert_eq!(status, 201, "{snap2}");
    assert_eq!(s.state(&second).await, "hibernated");
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
