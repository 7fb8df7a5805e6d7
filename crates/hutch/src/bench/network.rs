//! The networking series, measured in a private network namespace made for the benchmark
//! (only `lo`, no way out), so sandboxes with networking on cannot send a packet off the
//! machine: create-to-first-exec with networking off and on (same namespace, same run) and
//! the latency of a live policy update.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use serde_json::json;

use super::baselines::Skipped;
use super::server::BenchServer;
use super::stats::{summarize, Summary};

/// Series measured here.
pub struct NetSeries {
    /// The summaries.
    pub series: Vec<Summary>,
    /// Series that could not run, and why.
    pub skipped: Vec<Skipped>,
}

/// Run the series on a thread moved into a new, empty network namespace.
pub fn run(templates_dir: &Path, template: &str, vm_dir: &Path, n: usize) -> NetSeries {
    let (dir, tpl, vm) = (
        templates_dir.to_path_buf(),
        template.to_string(),
        vm_dir.to_path_buf(),
    );
    let outcome = std::thread::spawn(move || -> anyhow::Result<Vec<Summary>> {
        // SAFETY: unshare with CLONE_NEWNET only moves this thread.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            anyhow::bail!("unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
        }
        let up = std::process::Command::new("ip")
            .args(["link", "set", "lo", "up"])
            .status()
            .context("ip link set lo up")?;
        anyhow::ensure!(up.success(), "ip link set lo up failed");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(measure(&dir, &tpl, &vm, n))
    })
    .join();
    match outcome {
        Ok(Ok(series)) => NetSeries {
            series,
            skipped: vec![],
        },
        Ok(Err(e)) => NetSeries {
            series: vec![],
            skipped: vec![Skipped {
                name: "network".into(),
                reason: format!("{e:#}"),
            }],
        },
        Err(_) => NetSeries {
            series: vec![],
            skipped: vec![Skipped {
                name: "network".into(),
                reason: "the network series panicked".into(),
            }],
        },
    }
}

async fn create_to_first_exec(srv: &BenchServer) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let id = srv.create().await?;
    srv.exec_true(&id).await?;
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    srv.kill(&id).await?;
    Ok(ms)
}

async fn measure(
    templates_dir: &Path,
    template: &str,
    vm_dir: &Path,
    n: usize,
) -> anyhow::Result<Vec<Summary>> {
    eprintln!("network: create-to-first-exec ×{n} with networking off and on, interleaved…");
    let off = BenchServer::start(templates_dir, template, vm_dir, false, 0).await?;
    let on = match BenchServer::start(templates_dir, template, vm_dir, true, 0).await {
        Ok(s) => s,
        Err(e) => {
            off.stop();
            return Err(e);
        }
    };
    let result = async {
        // Alternate the two servers so drift in the machine's load hits both alike.
        let (mut off_ms, mut on_ms) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            off_ms.push(create_to_first_exec(&off).await?);
            on_ms.push(create_to_first_exec(&on).await?);
        }
        let id = on.create().await?;
        on.exec_true(&id).await?;
        let mut put_ms = Vec::with_capacity(n);
        for i in 0..n {
            let body = if i % 2 == 0 {
                json!({"egress": "deny", "allow": ["pypi.org", "*.github.com", "10.9.0.0/16"]})
            } else {
                json!({"egress": "allow", "deny": ["192.0.2.0/24"]})
            };
            let t0 = Instant::now();
            on.put(&format!("/v1/sandboxes/{id}/network"), body).await?;
            put_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        }
        on.kill(&id).await?;
        Ok::<_, anyhow::Error>((off_ms, on_ms, put_ms))
    }
    .await;
    if result.is_err() {
        off.destroy_all().await;
        on.destroy_all().await;
    }
    off.stop();
    on.stop();
    let (off_ms, on_ms, put_ms) = result?;
    Ok(vec![
        summarize("ns_create_to_first_exec_net_off", "ms", &off_ms),
        summarize("ns_create_to_first_exec_net_on", "ms", &on_ms),
        summarize("net_policy_update", "ms", &put_ms),
    ])
}
