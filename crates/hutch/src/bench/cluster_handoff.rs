//! `cluster` (second part): waking a hibernated `ns` sandbox on another node through the
//! object store, next to waking it where it hibernated, in one run on this machine.
//!
//! Two nodes `p` and `q` on a scratch database of their own, saving in a directory object
//! store (`file://`, a temporary directory: the figures are what exporting, uploading,
//! fetching, unpacking and the take-over cost, not a network's). Each round makes a sandbox
//! on `p` with 1 MiB of its own files, then:
//! - **local**: hibernate on `p`, wake on `p` (the wake call's round trip);
//! - **save**: hibernate on `p` again, until `p` reports no save pending;
//! - **other node**: drain `p`, wake through `q` (placement, the take-over, the download
//!   checked against its sha256, the unpack and the start), then `p` is made ready again.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;
use serde_json::{json, Value};

use super::server::BenchServer;
use super::stats::{summarize, Summary};

/// What [`run`] measured.
#[derive(Debug, Clone, Serialize)]
pub struct HandoffBench {
    /// The series.
    pub series: Vec<Summary>,
    /// Wake on another node over wake where it hibernated, p50.
    pub wake_other_node_vs_local_p50: f64,
}

impl HandoffBench {
    /// The report lines.
    pub fn lines(&self) -> Vec<String> {
        let mut out = super::stats::series_lines(&self.series);
        out.push(format!(
            "cluster: wake of a hibernated ns sandbox on another node / where it hibernated = {:.3} at p50",
            self.wake_other_node_vs_local_p50
        ));
        out
    }
}

/// Run `rounds` rounds on the PostgreSQL server of `cluster_db` (see the module docs).
pub async fn run(
    templates_dir: &Path,
    template: &str,
    vm_dir: &Path,
    cluster_db: &str,
    rounds: usize,
) -> anyhow::Result<HandoffBench> {
    let name = format!("hutch_bench_{}_handoff", std::process::id());
    hutch_store_postgres::create_database(cluster_db, &name)
        .await
        .context("making the scratch database")?;
    let result = async {
        let db_url = super::cluster::database_url(cluster_db, &name)?;
        let scratch = tempfile::tempdir()?;
        let secret_file = scratch.path().join("node.secret");
        std::fs::write(&secret_file, hutch_core::ids::random_token(32))?;
        let objects = scratch.path().join("objects");
        std::fs::create_dir(&objects)?;
        let extra: Vec<String> = [
            "--object-store".to_string(),
            format!("file://{}", objects.display()),
            "--heartbeat-ms".into(),
            "300".into(),
            "--lease-ms".into(),
            "3000".into(),
        ]
        .into();
        let setup = super::cluster::NodeSetup {
            templates_dir,
            template,
            vm_dir,
            db_url: &db_url,
            secret_file: &secret_file,
        };
        let p = setup.node("p", 1000, &extra).await?;
        let q = match setup.node("q", 1000, &extra).await {
            Ok(q) => q,
            Err(e) => {
                p.stop();
                return Err(e);
            }
        };
        let r = measure(&p, &q, rounds).await;
        for s in [&p, &q] {
            s.destroy_all().await;
        }
        p.stop();
        q.stop();
        r
    }
    .await;
    if let Err(e) = hutch_store_postgres::drop_database(cluster_db, &name).await {
        eprintln!("cluster: dropping the scratch database {name}: {e}");
    }
    result
}

async fn set_state(via: &BenchServer, node: &str, action: &str) -> anyhow::Result<()> {
    via.post(&format!("/v1/cluster/nodes/{node}/{action}"), Value::Null)
        .await
        .map(drop)
}

async fn pending_saves(via: &BenchServer) -> anyhow::Result<u64> {
    let (url, key, http) = via.endpoint();
    let v: Value = http
        .get(format!("{url}/v1/cluster/nodes"))
        .bearer_auth(key)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    v["pending_saves"].as_u64().context("no pending_saves")
}

async fn ms_of<F: std::future::Future<Output = anyhow::Result<Value>>>(
    f: F,
) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    f.await?;
    Ok(t0.elapsed().as_secs_f64() * 1000.0)
}

async fn measure(p: &BenchServer, q: &BenchServer, rounds: usize) -> anyhow::Result<HandoffBench> {
    let (mut local, mut save, mut other) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        set_state(p, "q", "cordon").await?;
        let id = p.create().await;
        set_state(p, "q", "uncordon").await?;
        let id = id?;
        let wrote = p
            .post(
                &format!("/v1/sandboxes/{id}/exec"),
                json!({"cmd": "head -c 1048576 /dev/urandom > /root/blob && sync"}),
            )
            .await?;
        if wrote["exit_code"] != 0 {
            bail!("writing the sandbox's files: {wrote}");
        }
        let path = |a: &str| format!("/v1/sandboxes/{id}/{a}");
        p.post(&path("hibernate"), Value::Null).await?;
        local.push(ms_of(p.post(&path("wake"), Value::Null)).await?);

        let t0 = Instant::now();
        p.post(&path("hibernate"), Value::Null).await?;
        while pending_saves(p).await? > 0 {
            if t0.elapsed() > Duration::from_secs(60) {
                bail!("the save of {id} did not finish within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        save.push(t0.elapsed().as_secs_f64() * 1000.0);

        set_state(q, "p", "drain").await?;
        let woke = ms_of(q.post(&path("wake"), Value::Null)).await;
        set_state(q, "p", "uncordon").await?;
        other.push(woke?);
        q.kill(&id).await?;
    }
    let series = vec![
        summarize("cluster_wake_where_hibernated_ns", "ms", &local),
        summarize("cluster_hibernate_until_saved_ns", "ms", &save),
        summarize("cluster_wake_on_other_node_ns", "ms", &other),
    ];
    Ok(HandoffBench {
        wake_other_node_vs_local_p50: series[2].p50 / series[0].p50,
        series,
    })
}
