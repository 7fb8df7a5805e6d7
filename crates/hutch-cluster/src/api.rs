//! The cluster's own API: `GET /v1/cluster/nodes` and `POST
//! /v1/cluster/nodes/{id}/{cordon,uncordon,drain}`, for admin keys only (they describe and
//! change the whole cluster). Any node answers: they read and write the shared database.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use hutch_core::tenant::keys::Permission;
use hutch_server::error::ApiError;
use hutch_server::AppState;
use serde::Serialize;

use crate::membership::{NodeState, NodeView};
use crate::{Cluster, NodeHealth};

type ApiState = (Arc<Cluster>, AppState);

/// The routes, to merge into the API's router.
pub fn router(cluster: Arc<Cluster>, state: AppState) -> Router {
    Router::new()
        .route("/v1/cluster/nodes", get(list))
        .route("/v1/cluster/nodes/{id}/{action}", post(change))
        .with_state((cluster, state))
}

/// `GET /v1/cluster/nodes`.
#[derive(Debug, Serialize)]
struct NodeList {
    /// The node that answered.
    this_node: String,
    /// What it knows of its own membership.
    this_node_health: NodeHealth,
    /// Every node.
    nodes: Vec<NodeView>,
    /// How this node found sandboxes' owners since it started.
    owner_lookups: OwnerLookups,
    /// Hibernated sandboxes of this node whose saved state is not in the object store yet
    /// (they wake only here until it is).
    pending_saves: usize,
}

/// Owner lookups of the node that answered: from its cache, or from the database.
#[derive(Debug, Serialize)]
struct OwnerLookups {
    cached: u64,
    database: u64,
}

async fn require_admin(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let secret = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| ApiError::unauthorized("missing API key (Authorization: Bearer …)"))?;
    let caller = state.authenticate(secret.trim()).await?;
    if !caller.permits(Permission::Admin) {
        return Err(ApiError::forbidden(
            "the cluster's nodes are for admin keys only",
        ));
    }
    Ok(())
}

fn db_error(e: crate::ClusterError) -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        code: "store_unavailable",
        message: e.to_string(),
        details: None,
    }
}

async fn list(
    State((cluster, state)): State<ApiState>,
    headers: HeaderMap,
) -> Result<Json<NodeList>, ApiError> {
    require_admin(&state, &headers).await?;
    let nodes = cluster.membership().nodes().await.map_err(db_error)?;
    Ok(Json(NodeList {
        this_node: cluster.node_id().to_string(),
        this_node_health: cluster.membership().health(),
        nodes,
        owner_lookups: {
            let (cached, database) = cluster.owners().counts();
            OwnerLookups { cached, database }
        },
        pending_saves: state.manager.pending_saves(),
    }))
}

async fn change(
    State((cluster, state)): State<ApiState>,
    Path((id, action)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<NodeView>, ApiError> {
    require_admin(&state, &headers).await?;
    let to = match action.as_str() {
        "cordon" => NodeState::Cordoned,
        "uncordon" => NodeState::Ready,
        "drain" => NodeState::Draining,
        other => {
            return Err(ApiError::not_found(format!(
                "no node action {other:?} (cordon, uncordon or drain)"
            )))
        }
    };
    match cluster
        .membership()
        .set_state(&id, to)
        .await
        .map_err(db_error)?
    {
        Some(view) => Ok(Json(view)),
        None => Err(ApiError::not_found(format!("node {id} not found"))),
    }
}
