//! Hibernated sandboxes between hosts: saved in a real S3 server of the test's own (moto),
//! taken over and woken by another node when theirs drains or dies, checked against the
//! sha256 the saving node recorded (a tampered object is refused), pending while the
//! store is down and saved once it is back.

use std::time::Duration;

use hutch_object_store::{ObjectStore, S3Credentials, S3ObjectStore};
use hutch_testkit::S3Server;
use reqwest::Method;
use serde_json::{json, Value};

use crate::{eventually, TestCluster};

const BUCKET: &str = "hutch-handoff";

/// A cluster of three whose nodes save hibernated sandboxes in `s3`'s bucket.
async fn cluster_on(s3: &S3Server) -> TestCluster {
    s3.create_bucket(BUCKET);
    let url = s3.url(BUCKET);
    TestCluster::start_with(
        &[3, 3, 3],
        &["--object-store", &url],
        &[
            ("AWS_ACCESS_KEY_ID", "hutch-test-key"),
            ("AWS_SECRET_ACCESS_KEY", "hutch-test-secret"),
        ],
    )
    .await
}

/// The test's own client of the bucket.
fn bucket(s3: &S3Server) -> S3ObjectStore {
    S3ObjectStore::from_url(
        &s3.url(BUCKET),
        Some(S3Credentials::new("hutch-test-key", "hutch-test-secret")),
        Default::default(),
    )
    .expect("the bucket")
}

/// The saved state the database records for sandbox `id` (`null` when none).
fn saved_state(c: &TestCluster, id: &str) -> Value {
    let v = c.pg.psql(
        "hutch",
        &format!("SELECT coalesce(record->'saved_state', 'null') FROM sandboxes WHERE id = '{id}'"),
    );
    serde_json::from_str(v.trim()).unwrap_or(Value::Null)
}

/// How many host-wide uid slot claims (`/run/hutch/uid-slots/<N>`, each naming its
/// server's state directory) belong to the server of `state_dir`.
fn uid_slot_claims_of(state_dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir("/run/hutch/uid-slots") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read_to_string(e.path())
                .is_ok_and(|owner| std::path::Path::new(owner.trim()) == state_dir)
        })
        .count()
}

async fn wait_saved(c: &TestCluster, id: &str) -> Value {
    eventually(&format!("{id}'s saved state recorded"), async || {
        !saved_state(c, id).is_null()
    })
    .await;
    saved_state(c, id)
}

/// Files of every kind a layer carries, and a deletion of a template file (a whiteout).
const WRITE: &str = "mkdir -p /root/work && echo precious > /root/work/f \
    && ln /root/work/f /root/work/hard && ln -s /root/work/f /root/work/soft \
    && chmod 4750 /root/work/f && rm /linuxrc && sync";
const CHECK: &str = "cat /root/work/f; cat /root/work/soft; stat -c '%h %a' /root/work/hard; \
    test -e /linuxrc && echo linuxrc-back || echo linuxrc-gone";
const EXPECTED: &str = "precious\nprecious\n2 4750\nlinuxrc-gone\n";

#[tokio::test]
async fn a_drained_nodes_hibernated_sandbox_wakes_on_another_node_from_the_object_store() {
    let Some(s3) = S3Server::start() else { return };
    let c = cluster_on(&s3).await;
    let moved = c.create_on("n1").await;
    let tampered = c.create_on("n1").await;
    for id in [&moved, &tampered] {
        c.nodes[0].sh_ok(id, WRITE).await;
        assert_eq!(c.nodes[0].sh_ok(id, CHECK).await, EXPECTED);
        c.nodes[0].act(id, "hibernate").await;
    }
    let saved = wait_saved(&c, &moved).await;
    let key = saved["key"].as_str().expect("a key").to_string();
    assert!(
        key.starts_with(&format!("hibernations/{moved}/")),
        "{saved}"
    );
    // The object is the bytes the node hashed.
    let store = bucket(&s3);
    let head = store.head(&key).await.expect("head").expect("the object");
    assert_eq!(
        head.sha256,
        saved["sha256"].as_str().expect("a string"),
        "{saved}"
    );
    assert_eq!(head.bytes, saved["bytes"].as_u64().expect("a number"));

    // Whoever can write the bucket replaces the other one's state (metadata and all).
    let bad_saved = wait_saved(&c, &tampered).await;
    let bad_key = bad_saved["key"].as_str().expect("a string").to_string();
    let forged = c.nodes[0].state_dir.join("forged.tar");
    std::fs::write(&forged, b"not the sandbox's files").expect("a test file");
    store.put_file(&bad_key, &forged).await.expect("overwrite");
    std::fs::remove_file(&forged).expect("a test file");

    let (status, v) = c.nodes[1]
        .post("/v1/cluster/nodes/n1/drain", Value::Null)
        .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (200, Some("draining")),
        "{v}"
    );

    // Through n3: the sandbox moves off n1 and wakes with every file as it was.
    assert_eq!(c.nodes[2].sh_ok(&moved, CHECK).await, EXPECTED);
    let owner = c.owner(&moved);
    assert_ne!(owner, "n1", "it woke on the draining node");
    assert_eq!(c.nodes[2].state(&moved).await, "running");
    // Running again, its saved state is stale: dropped from the record and the bucket.
    assert!(saved_state(&c, &moved).is_null());
    eventually("the stale object deleted", async || {
        store.head(&key).await.expect("head").is_none()
    })
    .await;

    // The forged object does not match the recorded sha256: refused, the sandbox stays
    // hibernated (and may be woken once its real state is back), nothing started.
    let (status, v) = c.nodes[2]
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{tampered}/exec"),
            Some(json!({"cmd": "cat /root/work/f"})),
        )
        .await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "saved_state_unavailable", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&bad_key), "{v}");
    assert!(message.to_lowercase().contains("sha256"), "{v}");
    assert_eq!(c.nodes[1].state(&tampered).await, "hibernated");
    let new_owner = c.owner(&tampered);
    assert_ne!(new_owner, "n1");
    let holder = &c.nodes[TestCluster::index(&new_owner)];
    assert_eq!(
        holder.init_pid(&tampered),
        None,
        "no process started for it"
    );

    // n1 lets go of both (they are other nodes' now): their files there go, and so do
    // the host-wide claims on their uid slots (the nodes they moved to claimed their own).
    for id in [&moved, &tampered] {
        let dirs = ["sandboxes", "layers"].map(|d| c.nodes[0].state_dir.join(d).join(id));
        eventually("n1 removed a moved sandbox's files", async || {
            dirs.iter().all(|d| !d.exists())
        })
        .await;
    }
    let n1_dir = std::fs::canonicalize(&c.nodes[0].state_dir).expect("n1's state dir");
    eventually(
        "n1 released the uid slots of the sandboxes that moved",
        async || uid_slot_claims_of(&n1_dir) == 0,
    )
    .await;
    // A DELETE of the moved sandbox through any node deletes it.
    assert_eq!(c.nodes[1].kill(&moved).await, 204);
    assert_eq!(c.nodes[0].state(&moved).await, "");
}

#[tokio::test]
async fn a_save_waits_for_the_store_and_a_dead_nodes_saved_sandbox_wakes_elsewhere() {
    let Some(mut s3) = S3Server::start() else {
        return;
    };
    let mut c = cluster_on(&s3).await;
    let saved_later = c.create_on("n2").await;
    let running = c.create_on("n2").await;
    c.nodes[1].sh_ok(&saved_later, WRITE).await;
    c.nodes[1].sh_ok(&running, "echo mine > /root/g").await;

    // The store is down: the hibernation succeeds, its save waits.
    s3.stop();
    c.nodes[1].act(&saved_later, "hibernate").await;
    eventually("n2 reports a pending save", async || {
        c.node_list(1).await["pending_saves"] == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(saved_state(&c, &saved_later).is_null());

    // Back (empty: moto keeps nothing): the queued upload goes up on its next attempt.
    s3.start_again();
    s3.create_bucket(BUCKET);
    let saved = wait_saved(&c, &saved_later).await;
    assert_eq!(c.node_list(1).await["pending_saves"], 0);
    let head = bucket(&s3)
        .head(saved["key"].as_str().expect("a string"))
        .await
        .expect("head")
        .expect("the object");
    assert_eq!(head.sha256, saved["sha256"].as_str().expect("a string"));

    // n2 dies: its running sandbox is lost, its saved one stays hibernated and wakes on
    // another node with its files.
    c.nodes[1].kill_server();
    eventually("n2 declared dead", async || {
        c.node(0, "n2").await["state"] == "dead"
    })
    .await;
    assert_eq!(c.nodes[0].state(&running).await, "lost");
    assert_eq!(c.nodes[0].state(&saved_later).await, "hibernated");
    assert_eq!(c.nodes[0].sh_ok(&saved_later, CHECK).await, EXPECTED);
    let owner = c.owner(&saved_later);
    assert!(owner == "n1" || owner == "n3", "woke on {owner}");
    let holder = TestCluster::index(&owner);
    let init = c.nodes[holder].init_pid(&saved_later).expect("it runs");

    // n2 comes back: it stops its lost sandbox and removes the files of the one that moved,
    // which keeps running where it went.
    c.nodes[1].spawn_server().await;
    let left = c.nodes[1].state_dir.join("sandboxes").join(&saved_later);
    eventually("n2 removed the moved sandbox's files", async || {
        !left.exists()
    })
    .await;
    assert_eq!(c.nodes[holder].init_pid(&saved_later), Some(init));
    assert_eq!(
        c.nodes[0].sh_ok(&saved_later, "cat /root/work/f").await,
        "precious\n"
    );
    assert_eq!(c.nodes[0].kill(&running).await, 204);
}
