//! The `vm` lifecycle series: pause and resume, hibernate and wake, live fork of 1 and of 8
//! children of a 256 MiB guest running a process, and the memory 8 live-fork siblings share
//! versus hold privately (`smaps_rollup` of each child's QEMU).

use std::time::Instant;

use anyhow::Context;
use serde_json::{json, Value};

use super::density::sandbox_kib;
use super::lifecycle::ids_of;
use super::server::BenchServer;
use super::stats::{summarize, Summary};

/// Guest RAM of the parent (the figures are for 256 MiB guests).
const MEMORY_MIB: u64 = 256;

/// What the vm lifecycle series measured.
pub struct VmLifecycle {
    /// Timed series.
    pub series: Vec<Summary>,
    /// Memory of 8 live-fork siblings (MiB per child, medians).
    pub siblings: Value,
}

async fn timed(
    f: impl std::future::Future<Output = anyhow::Result<Value>>,
) -> anyhow::Result<(f64, Value)> {
    let t0 = Instant::now();
    let v = f.await?;
    Ok((t0.elapsed().as_secs_f64() * 1000.0, v))
}

/// Run each series `n` times on one parent.
pub async fn run(srv: &BenchServer, n: usize) -> anyhow::Result<VmLifecycle> {
    let parent = srv
        .post(
            "/v1/sandboxes",
            json!({"template": srv.template(), "isolation": "vm", "memory_mib": MEMORY_MIB, "ttl_seconds": 1800}),
        )
        .await?["id"]
        .as_str()
        .map(String::from)
        .context("no id")?;
    let id = parent.as_str();
    // A running process and some memory of its own, as a real agent task would have.
    srv.post(
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"cmd": "head -c 16777216 /dev/urandom > /dev/shm/state; (while true; do sleep 1; done) >/dev/null 2>&1 &"}),
    )
    .await?;
    let at = |op: &str| format!("/v1/sandboxes/{id}/{op}");
    let (mut pause, mut resume, mut hibernate, mut wake) = (vec![], vec![], vec![], vec![]);
    let (mut fork1, mut fork8) = (vec![], vec![]);
    for _ in 0..n {
        pause.push(timed(srv.post(&at("pause"), json!({}))).await?.0);
        resume.push(timed(srv.post(&at("resume"), json!({}))).await?.0);
        hibernate.push(timed(srv.post(&at("hibernate"), json!({}))).await?.0);
        wake.push(timed(srv.post(&at("wake"), json!({}))).await?.0);
        for (count, samples) in [(1, &mut fork1), (8, &mut fork8)] {
            let (ms, v) =
                timed(srv.post(&at("fork"), json!({"count": count, "mode": "live"}))).await?;
            samples.push(ms);
            for child in ids_of(&v) {
                srv.kill(&child).await?;
            }
        }
    }

    // Memory of 8 siblings, once they settled.
    let v = srv
        .post(&at("fork"), json!({"count": 8, "mode": "live"}))
        .await?;
    let children = ids_of(&v);
    for child in &children {
        srv.exec_true(child).await?;
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let mib = |keys: &[&str]| -> Vec<f64> {
        children
            .iter()
            .map(|c| sandbox_kib(c, keys) as f64 / 1024.0)
            .collect()
    };
    let pss = summarize("vm_fork_sibling_pss", "MiB", &mib(&["Pss"]));
    let shared = summarize(
        "vm_fork_sibling_shared",
        "MiB",
        &mib(&["Shared_Clean", "Shared_Dirty"]),
    );
    let private = summarize(
        "vm_fork_sibling_private",
        "MiB",
        &mib(&["Private_Clean", "Private_Dirty"]),
    );
    for child in &children {
        srv.kill(child).await?;
    }
    srv.kill(id).await?;
    Ok(VmLifecycle {
        series: vec![
            summarize("vm_pause", "ms", &pause),
            summarize("vm_resume", "ms", &resume),
            summarize("vm_hibernate", "ms", &hibernate),
            summarize("vm_wake", "ms", &wake),
            summarize("vm_live_fork_1", "ms", &fork1),
            summarize("vm_live_fork_8", "ms", &fork8),
        ],
        siblings: json!({
            "children": children.len(),
            "guest_memory_mib": MEMORY_MIB,
            "pss_mib_p50": pss.p50,
            "shared_mib_p50": shared.p50,
            "private_mib_p50": private.p50,
        }),
    })
}
