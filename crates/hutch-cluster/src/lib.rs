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

pub mod affinity;
pub mod api;
pub mod config;
pub mod e2b;
mod error;
pub mod forward;
pub mod handoff;
pub mod membership;
pub mod owners;
pub mod placement;
pub mod preview;
pub mod reaper;
pub mod routing;
mod takeover;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue};
use hutch_core::Manager;
use hutch_store_postgres::{Db, NodeFence};

pub use self::config::{ClusterConfig, NodeCapacity, NodeRole};
pub use self::error::ClusterError;
use self::forward::NODE_TOKEN;
pub use self::membership::{Membership, NodeHealth, NodeState, NodeView};

/// How often a node removes what sandboxes that moved to other nodes left on it.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

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
    /// Whether it is draining (its hibernated sandboxes may be taken over).
    pub draining: bool,
}

/// This node's part in the cluster.
pub struct Cluster {
    cfg: Arc<ClusterConfig>,
    db: Db,
    fence: Arc<NodeFence>,
    membership: Membership,
    owners: owners::OwnerCache,
    secret: HeaderValue,
    /// A drain pass is running.
    draining: AtomicBool,
}

impl Cluster {
    /// Check `cfg`, connect to the database, bring its schema up to date and register this
    /// node (a new epoch). The store to start the manager on is built from [`Cluster::db`]
    /// and [`Cluster::fence`]; then [`Cluster::run`].
    pub async fn join(cfg: ClusterConfig) -> Result<Arc<Self>, ClusterError> {
        cfg.validate()?;
        let secret = HeaderValue::from_str(&cfg.node_secret)
            .map_err(|_| ClusterError::Config("--node-secret: printable ASCII only".into()))?;
        let tls =
            hutch_store_postgres::DbTls::for_url(&cfg.database_url, cfg.database_ca.as_deref())?;
        let db = Db::connect_with(&cfg.database_url, POOL_SIZE, tls)?;
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
            owners: owners::OwnerCache::default(),
            secret,
            draining: AtomicBool::new(false),
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
        let me = self.clone();
        tokio::spawn(async move { me.owners.keep_in_sync(&me.db, me.cfg.heartbeat).await });
    }

    /// Open the object store of `--object-store`, if there is one, and have `manager` save
    /// hibernated sandboxes there (queued in `<state_dir>/uploads`), those hibernated before
    /// this process and never saved included.
    pub async fn open_object_store(
        &self,
        manager: &Arc<Manager>,
        state_dir: &std::path::Path,
    ) -> Result<(), ClusterError> {
        let Some(url) = &self.cfg.object_store else {
            return Ok(());
        };
        let store = hutch_object_store::open(url, None)
            .map_err(|e| ClusterError::ObjectStore(format!("--object-store: {e}")))?;
        let states = handoff::ObjectStates::open(
            store,
            &state_dir.join("uploads"),
            manager,
            hutch_object_store::RetryPolicy::default(),
        )
        .await?;
        tracing::info!(
            store = states.describe(),
            "hibernated sandboxes are saved for other nodes"
        );
        manager.set_saved_states(states);
        manager.save_unsaved().await;
        Ok(())
    }

    /// The owner cache.
    pub fn owners(&self) -> &owners::OwnerCache {
        &self.owners
    }

    async fn heartbeat_loop(self: Arc<Self>, manager: Arc<Manager>) {
        let mut tick = tokio::time::interval(self.cfg.heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sweep = std::time::Instant::now();
        loop {
            tick.tick().await;
            // Now and then, the files of sandboxes that moved to other nodes go.
            if last_sweep.elapsed() >= SWEEP_EVERY && !self.draining.load(Ordering::Acquire) {
                last_sweep = std::time::Instant::now();
                let manager = manager.clone();
                tokio::spawn(async move { manager.remove_orphans().await });
            }
            let templates = ready_templates(&manager).await;
            match self.membership.heartbeat(&templates).await {
                Ok(state) => {
                    self.membership.set_health(NodeHealth::Member);
                    // In a task of its own: hibernating (and exporting) takes longer than a
                    // heartbeat may wait.
                    if state == NodeState::Draining && !self.draining.swap(true, Ordering::AcqRel) {
                        let (me, manager) = (self.clone(), manager.clone());
                        tokio::spawn(async move {
                            drain_local(&manager).await;
                            // What moved to other nodes leaves this one.
                            manager.remove_orphans().await;
                            me.draining.store(false, Ordering::Release);
                        });
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
                    // Hibernated sandboxes other nodes took over meanwhile leave this one.
                    manager.remove_orphans().await;
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

    /// Who owns sandbox `id` (`None`: no row): from the owner cache, else the database.
    pub async fn owner_of(&self, id: &str) -> Result<Option<Owner>, ClusterError> {
        self.owners.owner_of(&self.db, id).await
    }

    /// Send `payload` on the cluster's channel (every node's owner cache hears it).
    pub(crate) async fn notify(&self, payload: &str) -> Result<(), ClusterError> {
        self.db
            .client()
            .await?
            .execute("SELECT pg_notify($1, $2)", &[&reaper::CHANNEL, &payload])
            .await?;
        Ok(())
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

/// The names of the templates this node holds ready.
async fn ready_templates(manager: &Arc<Manager>) -> Vec<String> {
    let manager = manager.clone();
    tokio::task::spawn_blocking(move || {
        let mut names: Vec<String> = manager
            .templates()
            .list()
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.ready)
            .map(|t| t.name)
            .collect();
        names.sort();
        names
    })
    .await
    .unwrap_or_default()
}

/// Hibernate every running sandbox of this node (it is draining): their memory and files are
/// saved here and their processes stop; with an object store, their states are uploaded
/// too, and any node may take them over.
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
