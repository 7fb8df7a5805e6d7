//! Failures: a killed node is declared dead within its lease and its sandboxes lost; a node
//! that was cut off comes back fenced, stops what it ran and registers again (nothing runs
//! twice); a database restart declares nobody dead.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::{eventually, TestCluster, HEARTBEAT_MS, LEASE_MS};

async fn node_state(c: &TestCluster, via: usize, id: &str) -> String {
    c.node(via, id).await["state"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

#[tokio::test]
async fn a_killed_node_is_declared_dead_its_sandboxes_are_lost_and_creates_avoid_it() {
    let mut c = TestCluster::start(&[3, 3, 3]).await;
    let kept = c.create_on("n2").await;
    let deleted = c.create_on("n2").await;
    let init = c.nodes[1].init_pid(&kept).expect("its init runs");
    c.nodes[1].sh_ok(&kept, "echo precious > /tmp/f").await;
    // n3 learns the owner once and answers the next calls from its owner cache.
    let lookups = async |c: &TestCluster| c.node_list(2).await["owner_lookups"].clone();
    let before = lookups(&c).await;
    for _ in 0..5 {
        c.nodes[2].sh_ok(&kept, "true").await;
    }
    let after = lookups(&c).await;
    let delta = |k: &str| after[k].as_u64().expect("count") - before[k].as_u64().expect("count");
    assert!(
        delta("cached") >= 4 && delta("database") <= 1,
        "{before} → {after}"
    );

    let killed_at = Instant::now();
    c.nodes[1].kill_server();
    eventually("n2 declared dead", async || {
        node_state(&c, 0, "n2").await == "dead"
    })
    .await;
    let noticed = killed_at.elapsed();
    // The lease runs from the node's last heartbeat, which was up to one heartbeat before
    // the kill.
    assert!(
        noticed >= Duration::from_millis(LEASE_MS - HEARTBEAT_MS),
        "declared dead before its lease ran out: {noticed:?}"
    );
    eprintln!("n2 declared dead {noticed:?} after kill -9 (lease {LEASE_MS} ms)");

    // Its sandboxes are lost, seen from any node; a call on one is refused plainly.
    assert_eq!(c.nodes[2].state(&kept).await, "lost");
    let (status, v) = c.nodes[0]
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{kept}/exec"),
            Some(json!({"cmd": "true"})),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("declared dead"),
        "{v}"
    );

    // New creates avoid the dead node.
    for _ in 0..4 {
        let id = c.nodes[2].create_id(json!({})).await;
        assert_ne!(c.owner(&id), "n2");
    }
    // A lost sandbox can be deleted through any node while its node is dead.
    assert_eq!(c.nodes[2].kill(&deleted).await, 204);
    assert_eq!(c.nodes[0].state(&deleted).await, "");

    // n2 comes back: a new epoch, ready, and what it still ran of its lost sandboxes stopped
    // (the deleted one's too: nothing names it any more).
    let epoch_before = c.node(0, "n2").await["epoch"].as_i64().expect("epoch");
    c.nodes[1].spawn_server().await;
    let n2 = c.node(0, "n2").await;
    assert_eq!(n2["state"], "ready", "{n2}");
    assert!(n2["epoch"].as_i64().expect("epoch") > epoch_before, "{n2}");
    eventually("the lost sandbox's init stopped", async || {
        !std::path::Path::new(&format!("/proc/{init}")).exists()
    })
    .await;
    assert_eq!(
        c.nodes[0].state(&kept).await,
        "lost",
        "a lost sandbox never runs again"
    );
    assert_eq!(c.nodes[0].kill(&kept).await, 204);
}

#[tokio::test]
async fn a_node_cut_off_past_its_lease_comes_back_fenced_stops_its_sandboxes_and_registers_again() {
    let c = TestCluster::start(&[3, 3, 3]).await;
    let id = c.create_on("n3").await;
    let init = c.nodes[2].init_pid(&id).expect("its init runs");
    let epoch_before = c.node(0, "n3").await["epoch"].as_i64().expect("epoch");

    // Frozen (as if cut off): no heartbeat, but its sandbox keeps running meanwhile.
    let pid = c.nodes[2].server_pid() as i32;
    // SAFETY: signalling the server process this test started, by its pid.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    eventually("n3 declared dead", async || {
        node_state(&c, 0, "n3").await == "dead"
    })
    .await;
    assert_eq!(c.nodes[1].state(&id).await, "lost");
    assert!(std::path::Path::new(&format!("/proc/{init}")).exists());

    // Back: its next heartbeat finds its epoch gone, it stops the lost sandbox and registers
    // with a new epoch. The sandbox never runs again, on any node.
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    eventually("the lost sandbox's init stopped", async || {
        !std::path::Path::new(&format!("/proc/{init}")).exists()
    })
    .await;
    eventually("n3 registered again", async || {
        node_state(&c, 0, "n3").await == "ready"
    })
    .await;
    let n3 = c.node(1, "n3").await;
    assert!(
        n3["epoch"].as_i64().expect("epoch") > epoch_before + 1,
        "{n3}"
    );
    assert_eq!(c.nodes[0].state(&id).await, "lost");
    let (status, _) = c.nodes[0]
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": "true"})),
        )
        .await;
    assert_eq!(status, 409);
    // And it takes new sandboxes again.
    let again = c.create_on("n3").await;
    let v = c.nodes[0].exec(&again, json!({"cmd": "echo ok"})).await;
    assert_eq!(v["stdout"], "ok\n");
    assert_eq!(c.nodes[0].kill(&id).await, 204);
}

#[tokio::test]
async fn a_database_restart_declares_no_node_dead() {
    let mut c = TestCluster::start(&[2, 2, 2]).await;
    let ids = [
        c.create_on("n1").await,
        c.create_on("n2").await,
        c.create_on("n3").await,
    ];
    let epochs: Vec<i64> = c.node_list(0).await["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["epoch"].as_i64().expect("epoch"))
        .collect();
    c.pg.restart();
    // Longer than a lease after the restart: every heartbeat in the table was older than
    // the lease when the database came back.
    tokio::time::sleep(Duration::from_millis(LEASE_MS * 2)).await;
    let list = c.node_list(1).await;
    for n in list["nodes"].as_array().expect("nodes") {
        assert_eq!(n["state"], "ready", "{list}");
    }
    let after: Vec<i64> = list["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["epoch"].as_i64().expect("epoch"))
        .collect();
    assert_eq!(after, epochs, "no node was fenced");
    for id in &ids {
        let v = c.nodes[0].exec(id, json!({"cmd": "echo alive"})).await;
        assert_eq!(v["stdout"], "alive\n", "{v}");
    }
}

#[tokio::test]
async fn a_node_that_loses_the_database_keeps_serving_its_sandboxes_and_places_nothing() {
    let mut c = TestCluster::start(&[2, 2]).await;
    let id = c.create_on("n1").await;
    c.nodes[0].sh_ok(&id, "echo kept > /root/f").await;
    // The key and the sandbox are known to n1 from the calls above.
    c.pg.stop();
    // Past the key cache's 5 s (and many heartbeats): every answer below comes from what
    // n1 saw before the database went.
    tokio::time::sleep(Duration::from_secs(6)).await;
    for i in 0..3 {
        let v = c.nodes[0]
            .exec(
                &id,
                json!({"cmd": format!("cat /root/f; echo {i} >> /root/log")}),
            )
            .await;
        assert_eq!(
            v["stdout"], "kept\n",
            "exec {i} on the owner while the database is down: {v}"
        );
    }
    let (status, v) = c.nodes[0]
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files?path=/root/log"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    // New sandboxes need the database: refused, clearly.
    let (status, v) = c.nodes[0].post("/v1/sandboxes", json!({})).await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "store_unavailable", "{v}");
    // The database comes back: everything works again, and nothing was lost.
    c.pg.start_again();
    eventually("a create works again", async || {
        c.nodes[0].post("/v1/sandboxes", json!({})).await.0 == 201
    })
    .await;
    assert_eq!(c.nodes[1].sh_ok(&id, "cat /root/log").await, "0\n1\n2\n");
}
