//! The `vm` series: create-to-first-exec of sandboxes restored from the template's snapshot
//! on demand, and claimed from a warm pool (a second server with `--vm-warm 1`, each create
//! made once the pool refilled), with a read-write volume attached (interleaved with the
//! plain creates; its kill includes the guest's flush), a cold boot of the same guest for
//! comparison, warm exec round trips, and the PSS of idle
//! vm sandboxes running side by side from one template (their RAM is one memory file mapped
//! copy-on-write, so most of it is shared).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{json, Value};

use super::density;
use super::server::BenchServer;
use super::stats::{summarize, Summary};

/// Guest RAM of every benchmarked vm sandbox (the density target is for 256 MiB guests).
const MEMORY_MIB: u64 = 256;

/// What the vm series measured.
pub struct VmResults {
    /// Timed series.
    pub series: Vec<Summary>,
    /// Figures that are not series (cold boot, density).
    pub figures: Value,
}

async fn create_vm(srv: &BenchServer) -> anyhow::Result<String> {
    create_vm_with(srv, json!([])).await
}

async fn create_vm_with(srv: &BenchServer, volumes: Value) -> anyhow::Result<String> {
    let v = srv
        .post(
            "/v1/sandboxes",
            json!({"template": srv.template(), "isolation": "vm", "memory_mib": MEMORY_MIB,
                   "ttl_seconds": 600, "volumes": volumes}),
        )
        .await?;
    v["id"].as_str().map(String::from).context("no id")
}

/// A cold boot of the guest the template's sandboxes restore from: QEMU start to the
/// agent's first answer, on a fresh overlay of the bake's disk (no snapshot).
async fn cold_boot(vm_dir: &Path) -> anyhow::Result<f64> {
    let took = hutch_core::host::vm_cold_boot(vm_dir, MEMORY_MIB as u32).await?;
    Ok(took.as_secs_f64() * 1000.0)
}

/// Run the vm series: `n` sequential creates, then `idle` sandboxes at once for density.
pub async fn run(
    srv: &BenchServer,
    warm: &BenchServer,
    vm_dir: &Path,
    n: usize,
    idle: usize,
    execs: usize,
) -> anyhow::Result<VmResults> {
    eprintln!("vm: first create (bakes the template snapshot if needed)…");
    let t0 = Instant::now();
    let first = create_vm(srv).await?;
    srv.exec_true(&first).await?;
    let first_ms = t0.elapsed().as_secs_f64() * 1000.0;
    srv.kill(&first).await?;

    eprintln!("vm: create-to-first-exec ×{n}, and with a read-write volume (interleaved)…");
    let volume = srv
        .post(
            "/v1/volumes",
            json!({"name": format!("bench-{}", std::process::id()), "size_mib": 64}),
        )
        .await?;
    let volume = volume["id"].as_str().context("no volume id")?.to_string();
    let mounts = json!([{"volume": volume, "path": "/data"}]);
    let (mut c2e, mut create_only, mut kill_ms) = (Vec::new(), Vec::new(), Vec::new());
    let (mut with_volume, mut kill_with_volume) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t0 = Instant::now();
        let id = create_vm(srv).await?;
        let t1 = t0.elapsed();
        srv.exec_true(&id).await?;
        c2e.push(t0.elapsed().as_secs_f64() * 1000.0);
        create_only.push(t1.as_secs_f64() * 1000.0);
        let t0 = Instant::now();
        srv.kill(&id).await?;
        kill_ms.push(t0.elapsed().as_secs_f64() * 1000.0);

        let t0 = Instant::now();
        let id = create_vm_with(srv, mounts.clone()).await?;
        srv.exec_true(&id).await?;
        with_volume.push(t0.elapsed().as_secs_f64() * 1000.0);
        let t0 = Instant::now();
        srv.kill(&id).await?;
        kill_with_volume.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    srv.delete(&format!("/v1/volumes/{volume}")).await?;

    eprintln!("vm: create-to-first-exec from the warm pool ×{n}…");
    let first = create_vm(warm).await?;
    warm.kill(&first).await?;
    let mut from_pool = Vec::new();
    for _ in 0..n {
        // Steady state: the pool was refilled since the last create.
        warm.wait_warm_guest(Duration::from_secs(60), warm.template())
            .await?;
        let t0 = Instant::now();
        let id = create_vm(warm).await?;
        warm.exec_true(&id).await?;
        from_pool.push(t0.elapsed().as_secs_f64() * 1000.0);
        warm.kill(&id).await?;
    }

    eprintln!("vm: warm exec round trips ×{execs}…");
    let id = create_vm(srv).await?;
    let mut rt = Vec::new();
    for _ in 0..execs {
        let t = Instant::now();
        srv.exec_true(&id).await?;
        rt.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    srv.kill(&id).await?;

    eprintln!("vm: cold boot for comparison…");
    let cold_ms = cold_boot(vm_dir).await?;

    eprintln!("vm: density, {idle} idle vm sandboxes…");
    let avail_before = density::mem_available_kib();
    let mut ids = Vec::new();
    for _ in 0..idle {
        let id = create_vm(srv).await?;
        srv.exec_true(&id).await?;
        ids.push(id);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pss: Vec<f64> = ids
        .iter()
        .map(|id| density::sandbox_pss_kib(id) as f64 / 1024.0)
        .collect();
    let growth_mib = avail_before.saturating_sub(density::mem_available_kib()) as f64 / 1024.0;
    for id in ids.drain(..) {
        srv.kill(&id).await?;
    }
    let pss_summary = summarize("vm_idle_pss", "MiB", &pss);
    Ok(VmResults {
        series: vec![
            summarize("vm_create_to_first_exec", "ms", &c2e),
            summarize("vm_create_to_first_exec_warm_pool", "ms", &from_pool),
            summarize("vm_create_to_first_exec_with_volume", "ms", &with_volume),
            summarize("vm_create", "ms", &create_only),
            summarize("vm_kill", "ms", &kill_ms),
            summarize("vm_kill_with_volume", "ms", &kill_with_volume),
            summarize("vm_exec_round_trip_warm", "ms", &rt),
        ],
        figures: json!({
            "guest_memory_mib": MEMORY_MIB,
            "first_create_ms": first_ms,
            "cold_boot_ms": cold_ms,
            "idle_sandboxes": idle,
            "pss_mib_p50": pss_summary.p50,
            "pss_mib_max": pss_summary.max,
            "host_growth_mib": growth_mib,
        }),
    })
}
