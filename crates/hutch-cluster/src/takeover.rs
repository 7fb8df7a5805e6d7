//! Routing a call to a hibernated sandbox whose node is dead or draining: when its saved
//! state is in the object store, a node placement picks takes it over and the call is
//! served there (the manager's wake then fetches its files: `hutch_core::handoff`).
//!
//! Only a caller that may see the sandbox moves it (its key is checked here, and the
//! record read through its scope); a call without a key, or another tenant's, is answered
//! as before (401, 404, or the owner's answer). The node placement picks is told with the
//! header [`TAKE_OVER`] on the forwarded call, which only a call bearing the node token
//! may carry.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use hutch_core::ids::SandboxId;
use hutch_core::model::SandboxState;
use hutch_server::error::ApiError;
use hutch_server::AppState;

use crate::affinity::Affinity;
use crate::forward::Peer;
use crate::owners::MOVED;
use crate::placement::{self, Demand, Placement};
use crate::Cluster;

/// The header of a forwarded call whose node is to take its sandbox over first.
pub const TAKE_OVER: HeaderName = HeaderName::from_static("x-hutch-take-over");

/// Where a call on a movable sandbox is to be served.
pub(crate) enum Move {
    /// Not a sandbox to move (or not this caller's to move): route it as before.
    No,
    /// Here: this node took it over.
    Here,
    /// On `peer`, which takes it over (its placement is released once the call is done).
    To(Peer, Placement),
}

/// Where to serve a call on sandbox `id`, whose owner is dead or draining.
pub(crate) async fn place_move(
    cluster: &Cluster,
    state: &AppState,
    id: &str,
    headers: &HeaderMap,
) -> Result<Move, ApiError> {
    let Some(caller) = crate::routing::check_key(state, headers).await? else {
        return Ok(Move::No);
    };
    let Ok(sid) = id.parse::<SandboxId>() else {
        return Ok(Move::No);
    };
    let record = state
        .manager
        .store()
        .get_sandbox_for(&sid, &caller.scope())
        .await
        .map_err(ApiError::from)?
        .filter(|r| caller.selects(&r.metadata));
    let Some(record) = record else {
        return Ok(Move::No);
    };
    if record.state != SandboxState::Hibernated || record.saved_state.is_none() {
        return Ok(Move::No);
    }
    let demand = Demand {
        cpus: record.cpus,
        memory_mib: record.memory_mib,
    };
    // Where its template is, preferably (its revision must be there to wake).
    let affinity = Affinity::template(record.template.clone());
    let placed = placement::place(
        cluster.db(),
        cluster.config(),
        (demand, &affinity),
        &[],
        &sid,
        None,
    )
    .await
    .map_err(crate::routing::cluster_error)?;
    if placed.node == cluster.node_id() {
        let moved = take_over_here(cluster, state, &sid).await;
        release(cluster, &placed).await;
        return Ok(if moved? { Move::Here } else { Move::No });
    }
    let peer = Peer {
        id: placed.node.clone(),
        advertise: placed.advertise.clone(),
    };
    Ok(Move::To(peer, placed))
}

/// The header value asking the peer to take `id` over.
pub(crate) fn take_over_header(id: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(id).ok()
}

/// Give back the reservation of a move (it expires on its own if this fails).
pub(crate) async fn release(cluster: &Cluster, placed: &Placement) {
    if let Err(e) = placement::release(cluster.db(), placed).await {
        tracing::warn!(error = %e, "releasing a placement (it expires on its own)");
    }
}

/// Take sandbox `id` over on this node; whether it is this node's now. Every owner cache
/// forgets its old owner.
pub(crate) async fn take_over_here(
    cluster: &Cluster,
    state: &AppState,
    id: &SandboxId,
) -> Result<bool, ApiError> {
    let moved = state.manager.take_over(id).await.map_err(ApiError::from)?;
    if moved {
        cluster.owners().forget(id.as_str());
        if let Err(e) = cluster.notify(&format!("{MOVED}{id}")).await {
            tracing::warn!(id = %id, error = %e, "telling the other nodes a sandbox moved (their caches catch up at the next reload)");
        }
    }
    Ok(moved)
}
