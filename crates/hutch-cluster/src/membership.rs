//! Membership: this node's row in `nodes`, its heartbeat, and what the cluster knows of
//! every node.
//!
//! - **Register.** At start a node upserts its row with a new epoch (`epoch + 1`, its
//!   fencing token for this incarnation) and holds it in its [`NodeFence`]. A node that was
//!   cordoned or draining stays so; any other (a dead one too) becomes `ready`.
//! - **Heartbeat.** Every [`ClusterConfig::heartbeat`] it sets `heartbeat_at = now()` by the
//!   database's clock, guarded by its id and epoch. When that guard matches no row the
//!   cluster declared the node dead (`reaper.rs`) and bumped its epoch: the node is
//!   **fenced**. It then stops what it still runs of the sandboxes marked `lost`, and
//!   registers again (a new epoch), so that no sandbox ever runs on two nodes.
//! - **Losing the database.** A heartbeat that cannot reach the database leaves the node a
//!   member as far as it knows ([`NodeHealth::DatabaseLost`]); it keeps trying every
//!   heartbeat.
//!
//! Node states: `ready` (placed on), `cordoned` (serves its sandboxes, gets no new ones),
//! `draining` (the same, while its sandboxes are hibernated), `dead` (declared by the reaper).

use std::sync::{Arc, Mutex};

use hutch_store_postgres::{Db, NodeFence};
use serde::Serialize;

use crate::config::{ClusterConfig, NodeCapacity};
use crate::error::ClusterError;

/// What this node knows about its own membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeHealth {
    /// Not registered yet.
    Starting,
    /// Registered, heartbeating.
    Member,
    /// The last heartbeat could not reach the database.
    DatabaseLost,
    /// The cluster declared it dead; it is stopping its lost sandboxes and will register
    /// again.
    Fenced,
}

/// A node's state in the cluster (the `nodes.state` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Placed on.
    Ready,
    /// Serves its sandboxes, gets no new ones.
    Cordoned,
    /// Gets no new sandboxes while its own are hibernated.
    Draining,
    /// Declared dead: its lease ran out.
    Dead,
}

impl NodeState {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Cordoned => "cordoned",
            Self::Draining => "draining",
            Self::Dead => "dead",
        }
    }

    /// Parse a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Ready, Self::Cordoned, Self::Draining, Self::Dead]
            .into_iter()
            .find(|st| st.as_str() == s)
    }
}

/// What a node's sandboxes use now (counted from their rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct NodeUse {
    /// Sandboxes holding processes (starting, running, paused), creates placed there and not
    /// finished included.
    pub sandboxes: u64,
    /// The memory limits of those, in MiB.
    pub memory_mib: u64,
    /// Hibernated sandboxes (files only).
    pub hibernated: u64,
}

/// One node as `GET /v1/cluster/nodes` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeView {
    /// Its id.
    pub id: String,
    /// Where nodes reach its API.
    pub advertise: String,
    /// Its state.
    pub state: NodeState,
    /// What it does (`all`, `api`).
    pub role: String,
    /// Its current epoch.
    pub epoch: i64,
    /// What it offers.
    pub capacity: NodeCapacity,
    /// What its sandboxes use.
    pub in_use: NodeUse,
    /// Milliseconds since its last heartbeat, by the database's clock.
    pub heartbeat_age_ms: i64,
    /// Its lease in milliseconds.
    pub lease_ms: i64,
    /// When it last registered (ms since the Unix epoch).
    pub registered_at_ms: i64,
}

/// The states whose sandboxes hold a node's processes and memory.
pub(crate) const ACTIVE_STATES: [&str; 3] = ["starting", "running", "paused"];

/// This node's membership (see the module docs).
pub struct Membership {
    db: Db,
    fence: Arc<NodeFence>,
    cfg: Arc<ClusterConfig>,
    health: Mutex<NodeHealth>,
}

impl Membership {
    /// The membership of the node `cfg` describes, not registered yet.
    pub fn new(db: Db, fence: Arc<NodeFence>, cfg: Arc<ClusterConfig>) -> Self {
        Self {
            db,
            fence,
            cfg,
            health: Mutex::new(NodeHealth::Starting),
        }
    }

    /// What this node knows of its membership.
    pub fn health(&self) -> NodeHealth {
        *self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_health(&self, h: NodeHealth) {
        let mut health = self.health.lock().unwrap_or_else(|p| p.into_inner());
        if *health != h {
            tracing::info!(node = %self.cfg.node_id, from = ?*health, to = ?h, "cluster membership");
            *health = h;
        }
    }

    /// Upsert this node's row with a new epoch and hold it; returns the epoch.
    pub async fn register(&self) -> Result<i64, ClusterError> {
        let client = self.db.client().await?;
        let capacity = serde_json::to_value(self.cfg.capacity).expect("capacity serializes");
        let lease_ms = self.cfg.lease.as_millis() as i64;
        let row = client
            .query_one(
                "INSERT INTO nodes (id, advertise, epoch, state, role, capacity, profile, lease_ms)
                 VALUES ($1, $2, 1, 'ready', $3, $4, $6, $5)
                 ON CONFLICT (id) DO UPDATE SET
                    advertise = EXCLUDED.advertise,
                    epoch = nodes.epoch + 1,
                    state = CASE WHEN nodes.state IN ('cordoned', 'draining') THEN nodes.state
                                 ELSE 'ready' END,
                    role = EXCLUDED.role,
                    capacity = EXCLUDED.capacity,
                    profile = EXCLUDED.profile,
                    lease_ms = EXCLUDED.lease_ms,
                    registered_at = now(),
                    heartbeat_at = now()
                 RETURNING epoch",
                &[
                    &self.cfg.node_id,
                    &self.cfg.advertise,
                    &self.cfg.role.as_str(),
                    &capacity,
                    &lease_ms,
                    &serde_json::json!({ "hutch": env!("CARGO_PKG_VERSION") }),
                ],
            )
            .await?;
        let epoch: i64 = row.get(0);
        // Owner caches reload the nodes (this one's address or liveness may have changed).
        client
            .execute(
                "SELECT pg_notify($1, 'registered')",
                &[&crate::reaper::CHANNEL],
            )
            .await?;
        self.fence.set_epoch(epoch);
        self.set_health(NodeHealth::Member);
        tracing::info!(node = %self.cfg.node_id, epoch, advertise = %self.cfg.advertise, "registered in the cluster");
        Ok(epoch)
    }

    /// Write one heartbeat, with the templates this node holds ready (placement prefers a
    /// node that has the template a create names); returns the node's state (an operator
    /// may have cordoned or drained it). `Fenced` when the cluster declared this node dead (the epoch it holds
    /// is no longer its row's).
    pub async fn heartbeat(&self, templates: &[String]) -> Result<NodeState, ClusterError> {
        let client = self.db.client().await?;
        let epoch = self.fence.epoch();
        let row = client
            .query_opt(
                "UPDATE nodes SET heartbeat_at = now(), templates = $3
                 WHERE id = $1 AND epoch = $2 AND state <> 'dead' RETURNING state",
                &[&self.cfg.node_id, &epoch, &templates],
            )
            .await?;
        let Some(row) = row else {
            return Err(ClusterError::Fenced {
                node: self.cfg.node_id.clone(),
                epoch,
            });
        };
        let state: String = row.get(0);
        Ok(NodeState::parse(&state).unwrap_or(NodeState::Ready))
    }

    /// Every node, by id.
    pub async fn nodes(&self) -> Result<Vec<NodeView>, ClusterError> {
        list_nodes(&self.db, None).await
    }

    /// Set node `id`'s state to `state` (cordon, uncordon, drain); `None` when there is no
    /// such node. A dead node stays dead (it becomes ready by registering again).
    pub async fn set_state(
        &self,
        id: &str,
        state: NodeState,
    ) -> Result<Option<NodeView>, ClusterError> {
        let client = self.db.client().await?;
        let n = client
            .execute(
                "UPDATE nodes SET state = $2 WHERE id = $1 AND state <> 'dead'",
                &[&id, &state.as_str()],
            )
            .await?;
        if n > 0 {
            // Owner caches learn the node is draining (its hibernated sandboxes may move).
            client
                .execute("SELECT pg_notify($1, 'state')", &[&crate::reaper::CHANNEL])
                .await?;
        }
        let mut found = list_nodes(&self.db, Some(id)).await?;
        if n == 0 && found.is_empty() {
            return Ok(None);
        }
        Ok(found.pop())
    }
}

/// The nodes (one, with `only`), with what their sandboxes use counted from the rows.
pub(crate) async fn list_nodes(db: &Db, only: Option<&str>) -> Result<Vec<NodeView>, ClusterError> {
    let client = db.client().await?;
    let active: Vec<&str> = ACTIVE_STATES.to_vec();
    let rows = client
        .query(
            "SELECT n.id, n.advertise, n.state, n.role, n.epoch, n.capacity, n.lease_ms,
                    (extract(epoch FROM (now() - n.heartbeat_at)) * 1000)::bigint,
                    (extract(epoch FROM n.registered_at) * 1000)::bigint,
                    coalesce(s.active, 0), coalesce(s.memory, 0), coalesce(s.hibernated, 0),
                    coalesce(p.placed, 0), coalesce(p.memory, 0)
             FROM nodes n
             LEFT JOIN (
                SELECT node_id,
                       count(*) FILTER (WHERE state = ANY($1)) AS active,
                       sum((record->>'memory_mib')::bigint) FILTER (WHERE state = ANY($1))::bigint AS memory,
                       count(*) FILTER (WHERE state = 'hibernated') AS hibernated
                FROM sandboxes GROUP BY node_id
             ) s ON s.node_id = n.id
             LEFT JOIN (
                SELECT node_id, count(*) AS placed, sum(memory_mib)::bigint AS memory
                FROM placements WHERE expires_at > now() GROUP BY node_id
             ) p ON p.node_id = n.id
             WHERE $2::text IS NULL OR n.id = $2
             ORDER BY n.id",
            &[&active, &only],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let state: String = row.get(2);
            let capacity: serde_json::Value = row.get(5);
            let num = |i: usize| -> u64 {
                let v: i64 = row.get(i);
                v.max(0) as u64
            };
            Ok(NodeView {
                id: row.get(0),
                advertise: row.get(1),
                state: NodeState::parse(&state).unwrap_or(NodeState::Dead),
                role: row.get(3),
                epoch: row.get(4),
                capacity: serde_json::from_value(capacity).unwrap_or(NodeCapacity {
                    sandboxes: 0,
                    memory_mib: 0,
                }),
                lease_ms: row.get(6),
                heartbeat_age_ms: row.get(7),
                registered_at_ms: row.get(8),
                in_use: NodeUse {
                    sandboxes: num(9) + num(12),
                    memory_mib: num(10) + num(13),
                    hibernated: num(11),
                },
            })
        })
        .collect()
}
