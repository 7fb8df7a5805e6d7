//! `cluster`: what cluster mode costs a call (issue 22's benchmark), in one run on this
//! machine, against a PostgreSQL server the operator names (`--cluster-db`; a scratch
//! database is made on it and dropped after):
//!
//! - a warm exec round trip on a single-node server (SQLite), on a cluster node that owns
//!   the sandbox (PostgreSQL store), and through a second node that forwards it to the owner
//!   (the hop), requests rotating so the machine's noise falls on all alike;
//! - a create and delete likewise: single node, placed on the node asked, and placed from a
//!   node with no room onto the other (forwarded).
//!
//! Both nodes run on this machine, so the hop is loopback: the figures are what routing,
//! placement and the shared store add, not a network's latency.

use std::net::TcpListener;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

use super::server::BenchServer;
use super::stats::{summarize, Summary};

/// What [`run`] measured.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterBench {
    /// The series.
    pub series: Vec<Summary>,
    /// Exec on the owning cluster node over exec on a single-node server, p50.
    pub exec_owner_vs_single_p50: f64,
    /// Exec through a non-owner over exec on the owner, p50 (what one hop adds).
    pub exec_forwarded_vs_owner_p50: f64,
    /// Create + delete placed on the node asked over a single-node server's, p50.
    pub create_local_vs_single_p50: f64,
    /// Create + delete forwarded to the other node over placed locally, p50.
    pub create_forwarded_vs_local_p50: f64,
}

impl ClusterBench {
    /// The report lines.
    pub fn lines(&self) -> Vec<String> {
        let mut out = super::stats::series_lines(&self.series);
        out.push(format!(
            "cluster: exec on the owner node / single node = {:.3}, through another node / on the owner = {:.3} at p50",
            self.exec_owner_vs_single_p50, self.exec_forwarded_vs_owner_p50
        ));
        out.push(format!(
            "cluster: create+delete placed here / single node = {:.3}, forwarded / placed here = {:.3} at p50",
            self.create_local_vs_single_p50, self.create_forwarded_vs_local_p50
        ));
        out
    }
}

fn free_addr() -> anyhow::Result<String> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.to_string())
}

/// The URL of database `name` on the server of `url` (a `postgres://` URL).
pub(super) fn database_url(url: &str, name: &str) -> anyhow::Result<String> {
    let mut u = url::Url::parse(url).context("--cluster-db must be a postgres:// URL")?;
    u.set_path(&format!("/{name}"));
    Ok(u.to_string())
}

/// What every node of a bench cluster shares: templates, database and node secret.
pub(super) struct NodeSetup<'a> {
    pub templates_dir: &'a Path,
    pub template: &'a str,
    pub vm_dir: &'a Path,
    pub db_url: &'a str,
    pub secret_file: &'a Path,
}

impl NodeSetup<'_> {
    /// Node `id` with room for `capacity` sandboxes, with the flags `extra` too.
    pub(super) async fn node(
        &self,
        id: &str,
        capacity: u64,
        extra: &[String],
    ) -> anyhow::Result<BenchServer> {
        let addr = free_addr()?;
        let mut flags: Vec<String> = vec![
            "--cluster".into(),
            self.db_url.into(),
            "--node-id".into(),
            id.into(),
            "--advertise".into(),
            addr.clone(),
            "--node-secret-file".into(),
            self.secret_file.display().to_string(),
            "--capacity-sandboxes".into(),
            capacity.to_string(),
            "--preview-listen".into(),
            "off".into(),
        ];
        flags.extend(extra.iter().cloned());
        BenchServer::start_with(
            self.templates_dir,
            self.template,
            self.vm_dir,
            false,
            0,
            &addr,
            &flags,
        )
        .await
    }
}

/// Time `f`, in milliseconds.
async fn timed<F: std::future::Future<Output = anyhow::Result<()>>>(f: F) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    f.await?;
    Ok(t0.elapsed().as_secs_f64() * 1000.0)
}

/// Run the series: `execs` exec round trips and `creates` create+delete per path.
pub async fn run(
    templates_dir: &Path,
    template: &str,
    vm_dir: &Path,
    cluster_db: &str,
    execs: usize,
    creates: usize,
) -> anyhow::Result<ClusterBench> {
    let name = format!("hutch_bench_{}", std::process::id());
    hutch_store_postgres::create_database(cluster_db, &name)
        .await
        .context("making the scratch database")?;
    let result = async {
        let db_url = database_url(cluster_db, &name)?;
        let secret_dir = tempfile::tempdir()?;
        let secret_file = secret_dir.path().join("node.secret");
        std::fs::write(&secret_file, hutch_core::ids::random_token(32))?;
        let single = BenchServer::start(templates_dir, template, vm_dir, false, 0).await?;
        let setup = NodeSetup {
            templates_dir,
            template,
            vm_dir,
            db_url: &db_url,
            secret_file: &secret_file,
        };
        let owner = setup.node("a", 1000, &[]).await;
        let owner = match owner {
            Ok(n) => n,
            Err(e) => {
                single.stop();
                return Err(e);
            }
        };
        // `b` has no room: every create through it is placed on `a`.
        let other = setup.node("b", 0, &[]).await;
        let other = match other {
            Ok(n) => n,
            Err(e) => {
                single.stop();
                owner.stop();
                return Err(e);
            }
        };
        let r = measure(&single, &owner, &other, execs, creates).await;
        for s in [&single, &owner, &other] {
            s.destroy_all().await;
        }
        single.stop();
        owner.stop();
        other.stop();
        r
    }
    .await;
    if let Err(e) = hutch_store_postgres::drop_database(cluster_db, &name).await {
        eprintln!("cluster: dropping the scratch database {name}: {e}");
    }
    result
}

async fn measure(
    single: &BenchServer,
    owner: &BenchServer,
    other: &BenchServer,
    execs: usize,
    creates: usize,
) -> anyhow::Result<ClusterBench> {
    let on_single = single.create().await?;
    let on_owner = owner.create().await?;
    // Warm every path once (connections, the owner cache).
    single.exec_true(&on_single).await?;
    owner.exec_true(&on_owner).await?;
    other.exec_true(&on_owner).await?;
    let (mut s, mut o, mut f) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..execs {
        s.push(timed(single.exec_true(&on_single)).await?);
        o.push(timed(owner.exec_true(&on_owner)).await?);
        f.push(timed(other.exec_true(&on_owner)).await?);
    }
    let (mut cs, mut co, mut cf) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..creates {
        cs.push(timed(async { single.kill(&single.create().await?).await }).await?);
        co.push(timed(async { owner.kill(&owner.create().await?).await }).await?);
        cf.push(timed(async { other.kill(&other.create().await?).await }).await?);
    }
    let series = vec![
        summarize("cluster_exec_single_node", "ms", &s),
        summarize("cluster_exec_owner_node", "ms", &o),
        summarize("cluster_exec_forwarded", "ms", &f),
        summarize("cluster_create_delete_single_node", "ms", &cs),
        summarize("cluster_create_delete_placed_here", "ms", &co),
        summarize("cluster_create_delete_forwarded", "ms", &cf),
    ];
    let p50 = |i: usize| series[i].p50;
    Ok(ClusterBench {
        exec_owner_vs_single_p50: p50(1) / p50(0),
        exec_forwarded_vs_owner_p50: p50(2) / p50(1),
        create_local_vs_single_p50: p50(4) / p50(3),
        create_forwarded_vs_local_p50: p50(5) / p50(4),
        series,
    })
}
