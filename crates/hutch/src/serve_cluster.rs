//! `hutch serve --cluster …`: the options of cluster mode (`docs/cluster.md`), each also an
//! environment variable, and what they turn into.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use hutch_cluster::{Cluster, ClusterConfig, NodeCapacity, NodeRole};
use hutch_core::store::Store;

/// Options of cluster mode (all unused without `--cluster`).
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// Run as a node of a cluster whose state is in this PostgreSQL database
    /// (`postgres://user:password@host:5432/hutch`); without it the server is one host on
    /// its own SQLite database.
    #[arg(long, env = "HUTCH_CLUSTER")]
    pub cluster: Option<String>,
    /// This node's id in the cluster (default: the host name).
    #[arg(long, env = "HUTCH_NODE_ID")]
    pub node_id: Option<String>,
    /// `host:port` where the other nodes reach this node's API (default: `--listen`, unless
    /// that is a wildcard address or port 0).
    #[arg(long, env = "HUTCH_ADVERTISE")]
    pub advertise: Option<String>,
    /// A file holding the secret every node of the cluster shares (node-to-node calls carry
    /// it); `HUTCH_NODE_SECRET` gives it directly.
    #[arg(long, env = "HUTCH_NODE_SECRET_FILE")]
    pub node_secret_file: Option<PathBuf>,
    /// What this node does: `all` (serves the API and runs sandboxes) or `api` (serves the
    /// API, runs none).
    #[arg(long, env = "HUTCH_NODE_ROLE", default_value = "all", value_parser = ["all", "api"])]
    pub role: String,
    /// Most sandboxes holding processes that placement puts on this node (default: one per
    /// 256 MiB of the host's memory).
    #[arg(long, env = "HUTCH_CAPACITY_SANDBOXES")]
    pub capacity_sandboxes: Option<u64>,
    /// Most memory (MiB) the limits of those sandboxes may add up to (default: the host's).
    #[arg(long, env = "HUTCH_CAPACITY_MEMORY_MIB")]
    pub capacity_memory_mib: Option<u64>,
    /// How often this node heartbeats, in milliseconds.
    #[arg(long, env = "HUTCH_HEARTBEAT_MS", default_value_t = 2000)]
    pub heartbeat_ms: u64,
    /// How long after its last heartbeat a node is declared dead, in milliseconds.
    #[arg(long, env = "HUTCH_LEASE_MS", default_value_t = 10_000)]
    pub lease_ms: u64,
    /// Save hibernated sandboxes in this object store so that any node can wake them
    /// (`s3://BUCKET[/PREFIX]?endpoint=…&region=…`, credentials from `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`; or `file:///PATH` on a filesystem every node mounts).
    #[arg(long, env = "HUTCH_OBJECT_STORE")]
    pub object_store: Option<String>,
    /// PEM certificates to verify the cluster database's certificate with when its URL asks
    /// for TLS (`?sslmode=require`; default: the system's roots).
    #[arg(long, env = "HUTCH_CLUSTER_CA")]
    pub cluster_ca: Option<PathBuf>,
}

fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
}

impl ClusterArgs {
    /// The cluster configuration, when `--cluster` is given.
    pub fn config(&self, listen: std::net::SocketAddr) -> anyhow::Result<Option<ClusterConfig>> {
        let Some(url) = &self.cluster else {
            return Ok(None);
        };
        let node_id = match &self.node_id {
            Some(id) => id.clone(),
            None => host_name().context("--node-id: no host name to default to")?,
        };
        let advertise = match &self.advertise {
            Some(a) => a.clone(),
            None if !listen.ip().is_unspecified() && listen.port() != 0 => listen.to_string(),
            None => bail!(
                "--advertise: give the host:port other nodes reach this node at (--listen {listen} is not one)"
            ),
        };
        let secret = match (&self.node_secret_file, std::env::var("HUTCH_NODE_SECRET")) {
            (Some(path), _) => std::fs::read_to_string(path)
                .with_context(|| format!("--node-secret-file {}", path.display()))?
                .trim()
                .to_string(),
            (None, Ok(s)) => s,
            (None, Err(_)) => bail!(
                "cluster mode needs the node secret: --node-secret-file FILE or HUTCH_NODE_SECRET"
            ),
        };
        let host_mib = hutch_core::config::host_memory_mib();
        let capacity = NodeCapacity {
            sandboxes: self.capacity_sandboxes.unwrap_or((host_mib / 256).max(1)),
            memory_mib: self.capacity_memory_mib.unwrap_or(host_mib),
        };
        let mut cfg = ClusterConfig::new(url.clone(), node_id, advertise, secret, capacity);
        cfg.role = NodeRole::parse(&self.role).expect("clap checked the role");
        cfg.heartbeat = Duration::from_millis(self.heartbeat_ms);
        cfg.lease = Duration::from_millis(self.lease_ms);
        cfg.object_store = self.object_store.clone();
        cfg.database_ca = self.cluster_ca.clone();
        cfg.validate()?;
        Ok(Some(cfg))
    }
}

/// Join the cluster: the node registered, and the store its manager starts on.
pub async fn join(cfg: ClusterConfig) -> anyhow::Result<(Arc<Cluster>, Arc<dyn Store>)> {
    let node = cfg.node_id.clone();
    let cluster = Cluster::join(cfg)
        .await
        .with_context(|| format!("joining the cluster as node {node}"))?;
    let store = Arc::new(hutch_store_postgres::PostgresStore::new(
        cluster.db().clone(),
        cluster.fence().clone(),
    ));
    Ok((cluster, store))
}
