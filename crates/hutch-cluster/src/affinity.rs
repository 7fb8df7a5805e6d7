//! Affinity: which nodes can serve a create at all, and which it prefers.
//!
//! - A create from a snapshot, or with a volume, runs where those files are: it is
//!   **pinned** to the node of the snapshot's (or volume's) row. A snapshot and a volume on
//!   two different nodes cannot be used together (409).
//! - A create prefers the nodes that hold its template ready (each node's heartbeat writes
//!   the names it holds into `nodes.templates`): a template built through the API on one
//!   node is on that node only. When no candidate holds it, placement picks as if there
//!   were no preference, and the chosen node answers the create (with "unknown template"
//!   if it has none).
//! - A move of a hibernated sandbox (`takeover.rs`) prefers the nodes that hold its
//!   template.

use hutch_server::auth::Caller;
use hutch_server::error::ApiError;
use hutch_server::AppState;
use serde_json::Value;

use crate::error::ClusterError;
use crate::Cluster;

/// A node a create must run on, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pinned {
    /// The node.
    pub node: String,
    /// What is there ("snapshot snap_… is on node n2").
    pub why: String,
}

/// What placement must respect and prefers (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Affinity {
    /// The template whose holders are preferred.
    pub template: Option<String>,
    /// The only node that can serve it.
    pub pinned: Option<Pinned>,
}

impl Affinity {
    /// Only a template preference.
    pub fn template(name: impl Into<String>) -> Self {
        Self {
            template: Some(name.into()),
            pinned: None,
        }
    }

    fn pin(&mut self, node: String, why: String) -> Result<(), ApiError> {
        match &self.pinned {
            Some(p) if p.node != node => Err(ApiError::conflict(format!(
                "{} and {why}: a sandbox runs on one node, so they cannot be used together",
                p.why
            ))),
            Some(_) => Ok(()),
            None => {
                self.pinned = Some(Pinned { node, why });
                Ok(())
            }
        }
    }
}

async fn node_of(cluster: &Cluster, table: &str, id: &str) -> Result<Option<String>, ApiError> {
    let client = cluster
        .db()
        .client()
        .await
        .map_err(|e| crate::routing::cluster_error(ClusterError::Db(e)))?;
    let sql = format!("SELECT node_id FROM {table} WHERE id = $1");
    let row = client
        .query_opt(&sql, &[&id])
        .await
        .map_err(|e| crate::routing::cluster_error(ClusterError::from(e)))?;
    Ok(row.map(|r| r.get(0)))
}

/// The affinity of a create with body `body` (its template name already resolved).
/// Snapshots and volumes the caller cannot see are left to the node that serves the create
/// (its answer is the 404).
pub async fn of_create(
    cluster: &Cluster,
    state: &AppState,
    caller: &Caller,
    body: &Value,
    template: &str,
) -> Result<Affinity, ApiError> {
    let mut affinity = Affinity::template(template);
    let scope = caller.scope();
    if let Some(name) = body.get("snapshot").and_then(Value::as_str) {
        if let Ok(id) = state.manager.resolve_snapshot(name, &scope).await {
            if let Some(node) = node_of(cluster, "snapshots", &id).await? {
                let why = format!("snapshot {id} is on node {node}");
                affinity.pin(node, why)?;
            }
        }
    }
    let volumes = body.get("volumes").and_then(Value::as_array);
    for key in volumes
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("volume")?.as_str())
    {
        let found = state.manager.store().find_volume(key, &scope).await;
        if let Ok(Some(volume)) = found {
            let id = volume.id.to_string();
            if let Some(node) = node_of(cluster, "volumes", &id).await? {
                let why = format!("volume {id} is on node {node}");
                affinity.pin(node, why)?;
            }
        }
    }
    Ok(affinity)
}
