//! Cluster mode: many hosts, one Hutch, on a PostgreSQL database they share
//! (`docs/cluster.md`).
//!
//! - `membership.rs`: each node's row, its epoch (fencing token) and heartbeat; what a
//!   fenced node does.
//! - `reaper.rs`: the holder of an advisory lock declares nodes whose lease ran out dead.
//! - `placement.rs`: which node a create runs on, with its reservation, in one
//!   transaction.
//! - `routing.rs` and `forward.rs`: any node answers for every sandbox, forwarding to the
//!   owner with the node credential.
//! - `api.rs`: `GET /v1/cluster/nodes` and the cordon, uncordon and drain of a node.
//!
//! The state store itself is `hutch-store-postgres`'s `PostgresStore`, the second
//! implementation of `hutch_core::store::Store`; single-node mode (SQLite) never touches
//! this crate.

pub mod api;
pub mod config;
mod error;
pub mod forward;
pub mod membership;
pub mod placement;
pub mod reaper;
pub mod routing;

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue};
use hutch_core::Manager;
use hutch_store_postgres::{Db, NodeFence};

pub use self::config::{ClusterConfig, NodeCapacity, NodeRole};
pub use self::error::ClusterError;
use self::forward::NODE_TOKEN;
pub use self::membership::{Membership, NodeHealth, NodeState, NodeView};

/// Connections the node keeps to the cluster database.
const POOL_SIZE: usize = 32;

/// The owner of a sandbox, as routing needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The node's id.
    pub node: String,
    /// Its API address.
    pub advertise: String,
    /// Whether it was declared dead.
    pub dead: bool,
}

/// This node's part in the cluster.
pub struct Cluster {
    cfg: Arc<ClusterConfig>,
    db: Db,
    fence: Arc<NodeFence>,
    membership: Membership,
    secret: HeaderValue,
}

impl Cluster {
    /// Check `cfg`, connect to the database, bring its schema up to date and register this
    /// node (a new epoch). The store to start the manager on is built from [`Cluster::db`]
    /// and [`Cluster::fence`]; then [`Cluster::run`].
    pub async fn join(cfg: ClusterConfig) -> Result<Arc<Self>, ClusterError> {
        cfg.validate()?;
        let secret = HeaderValue::from_str(&cfg.node_secret)
            .map_err(|_| ClusterError::Config("--node-secret: printable ASCII only".into()))?;
        let db = Db::connect(&cfg.database_url, POOL_SIZE)?;
        let version = db.migrate().await?;
        tracing::info!(version, "cluster database schema");
        let fence = Arc::new(NodeFence::new(cfg.node_id.clone()));
        let cfg = Arc::new(cfg);
        let membership = Membership::new(db.clone(), fence.clone(), cfg.clone());
        membership.register().await?;
        Ok(Arc::new(Self {
            cfg,
            db,
            fence,
            membership,
            secret,
        }))
    }

    /// The configuration.
    pub fn config(&self) -> &ClusterConfig {
        &self.cfg
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.cfg.node_id
    }

    /// The database pool.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The fence every node-side write of the store is guarded by.
    pub fn fence(&self) -> &Arc<NodeFence> {
        &self.fence
    }

    /// This node's membership.
    pub fn membership(&self) -> &Membership {
        &self.membership
    }

    /// The node credential, as sent on forwarded calls.
    pub(crate) fn secret(&self) -> &HeaderValue {
        &self.secret
    }

    /// Whether a call carries the node credential (compared in constant time).
    pub(crate) fn is_peer_call(&self, headers: &HeaderMap) -> bool {
        let Some(got) = headers.get(NODE_TOKEN) else {
            return false;
        };
        let (a, b) = (got.as_bytes(), self.secret.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    /// Start the heartbeat and the reaper, with `manager` serving this node's sandboxes.
    pub fn run(self: &Arc<Self>, manager: Arc<Manager>) {
        let me = self.clone();
        tokio::spawn(async move { me.heartbeat_loop(manager).await });
        let me = self.clone();
        tokio::spawn(async move { me.reaper_loop().await });
    }

    async fn heartbeat_loop(self: Arc<Self>, manager: Arc<Manager>) {
        let mut tick = tokio::time::interval(self.cfg.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.membership.heartbeat().await {
                Ok(state) => {
                    self.membership.set_health(NodeHealth::Member);
                    if state == NodeState::Draining {
                        drain_local(&manager).await;
                    }
                }
                Err(ClusterError::Fenced { node, epoch }) => {
                    tracing::error!(node, epoch, "this node was declared dead: stopping its lost sandboxes, then registering again");
                    self.membership.set_health(NodeHealth::Fenced);
                    match manager.stop_lost_sandboxes().await {
                        Ok(n) => tracing::warn!(
                            stopped = n,
                            "stopped the sandboxes the cluster declared lost"
                        ),
                        Err(e) => {
                            tracing::error!(error = %e, "listing lost sandboxes (trying again at the next heartbeat)");
                            continue;
                        }
                    }
                    if let Err(e) = self.membership.register().await {
                        tracing::error!(error = %e, "registering again");
                    }
                }
                Err(e) => {
                    self.membership.set_health(NodeHealth::DatabaseLost);
                    tracing::warn!(error = %e, "heartbeat");
                }
            }
        }
    }

    async fn reaper_loop(self: Arc<Self>) {
        let mut reaper = reaper::Reaper::new(self.db.clone(), self.cfg.lease);
        let mut tick = tokio::time::interval(self.cfg.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = reaper.tick().await {
                tracing::warn!(error = %e, "reaper (the lock is given up)");
            }
        }
    }

    /// Who owns sandbox `id` (`None`: no row).
    pub async fn owner_of(&self, id: &str) -> Result<Option<Owner>, ClusterError> {
        let client = self.db.client().await?;
        let row = client
            .query_opt(
                "SELECT s.node_id, n.advertise, n.state = 'dead'
                 FROM sandboxes s JOIN nodes n ON n.id = s.node_id WHERE s.id = $1",
                &[&id],
            )
            .await?;
        Ok(row.map(|r| Owner {
            node: r.get(0),
            advertise: r.get(1),
            dead: r.get(2),
        }))
    }

    /// Delete the row of lost sandbox `id` whose node was declared dead.
    pub async fn delete_lost(&self, id: &str) -> Result<bool, ClusterError> {
        let client = self.db.client().await?;
        let n = client
            .execute(
                "DELETE FROM sandboxes WHERE id = $1 AND state = 'lost'
                   AND node_id IN (SELECT id FROM nodes WHERE state = 'dead')",
                &[&id],
            )
            .await?;
        Ok(n > 0)
    }
}

/// Hibernate every running sandbox of this node (it is draining): their memory and files are
/// saved here and their processes stop.
async fn drain_local(manager: &Arc<Manager>) {
    let records = match manager.store().all_sandboxes().await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "draining: listing this node's sandboxes");
            return;
        }
    };
    for r in records
        .into_iter()
        .filter(|r| r.state == hutch_core::model::SandboxState::Running)
    {
        match manager.hibernate(&r.id).await {
            Ok(_) => tracing::info!(id = %r.id, "draining: hibernated"),
            Err(e) => tracing::warn!(id = %r.id, error = %e, "draining: hibernating"),
        }
    }
}
