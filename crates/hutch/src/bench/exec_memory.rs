//! Server memory under concurrent large execs: the server's RSS before (its baseline in the
//! same run) and at its peak while N collected execs each write 16 MiB of stdout, next to
//! the output budget the server reports (`hutch_exec_output_budget_bytes`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;

use super::server::BenchServer;

/// Bytes of stdout each exec writes.
const OUTPUT: usize = 16 << 20;
/// Execs per sandbox (below the default per-sandbox cap of 32).
const PER_SANDBOX: usize = 25;

/// What [`run`] measured.
#[derive(Debug, Clone, Serialize)]
pub struct ExecMemory {
    /// Concurrent execs.
    pub execs: usize,
    /// Execs answered 200 with all 16 MiB.
    pub completed: usize,
    /// Execs refused with 429.
    pub refused: usize,
    /// Server RSS before the execs (the baseline), MiB.
    pub rss_before_mib: f64,
    /// Highest server RSS while they ran, MiB.
    pub rss_peak_mib: f64,
    /// The server's output budget, MiB.
    pub budget_mib: f64,
    /// Most output the server held at once by its own accounting, MiB.
    pub held_peak_mib: f64,
    /// Wall time of the whole batch, seconds.
    pub wall_s: f64,
}

impl ExecMemory {
    /// The report line.
    pub fn line(&self) -> String {
        format!(
            "{} concurrent 16 MiB execs: server RSS {:.0} MiB before (baseline), peak {:.0} MiB \
             (+{:.0} MiB; output budget {:.0} MiB, held at most {:.0} MiB); {} complete, {} \
             refused (429), {:.1} s",
            self.execs,
            self.rss_before_mib,
            self.rss_peak_mib,
            self.rss_peak_mib - self.rss_before_mib,
            self.budget_mib,
            self.held_peak_mib,
            self.completed,
            self.refused,
            self.wall_s
        )
    }
}

fn rss_kib(pid: u32) -> u64 {
    hutch_core::config::proc_kib(
        std::path::Path::new(&format!("/proc/{pid}/status")),
        "VmRSS",
    )
    .unwrap_or(0)
}

/// Run `execs` concurrent execs of 16 MiB each over enough sandboxes, sampling the server's
/// RSS every 20 ms.
pub async fn run(srv: &BenchServer, execs: usize) -> anyhow::Result<ExecMemory> {
    let mut ids = Vec::new();
    for _ in 0..execs.div_ceil(PER_SANDBOX) {
        let id = srv.create().await?;
        srv.exec_true(&id).await?;
        ids.push(id);
    }
    let pid = srv.pid();
    let before = rss_kib(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(Ordering::Relaxed) {
                peak = rss_kib(pid).max(peak);
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    };
    let (url, key, http) = srv.endpoint();
    let script = format!("yes abcdefghijklmno | head -c {OUTPUT}");
    let t0 = Instant::now();
    let runs = (0..execs).map(|i| {
        let req = http
            .post(format!("{url}/v1/sandboxes/{}/exec", ids[i % ids.len()]))
            .bearer_auth(key)
            .json(&json!({"cmd": script, "timeout_seconds": 600}));
        async move {
            let resp = req.send().await?;
            let status = resp.status().as_u16();
            let v: serde_json::Value = resp.json().await?;
            let full = v["stdout"].as_str().map(str::len) == Some(OUTPUT);
            Ok::<_, anyhow::Error>((status, full))
        }
    });
    let results = futures_util::future::join_all(runs).await;
    let wall_s = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let peak = sampler.join().unwrap_or(0);
    let mut completed = 0;
    let mut refused = 0;
    for r in results {
        match r? {
            (200, true) => completed += 1,
            (429, _) => refused += 1,
            (status, _) => anyhow::bail!("an exec came back {status} without its 16 MiB"),
        }
    }
    let budget = srv.metric("hutch_exec_output_budget_bytes").await?;
    let held = srv.metric("hutch_exec_output_buffered_peak_bytes").await?;
    for id in ids {
        srv.kill(&id).await?;
    }
    let mib = |kib: u64| kib as f64 / 1024.0;
    Ok(ExecMemory {
        execs,
        completed,
        refused,
        rss_before_mib: mib(before),
        rss_peak_mib: mib(peak.max(before)),
        budget_mib: budget / 1048576.0,
        held_peak_mib: held / 1048576.0,
        wall_s,
    })
}
