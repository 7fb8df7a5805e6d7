//! The E2B-compatible API (`hutch-e2b`) in cluster mode: any node's E2B listener answers
//! for every sandbox, as its Hutch API does (`routing.rs`).
//!
//! - A create (`POST /sandboxes`) is placed like Hutch's: by its template's demand and
//!   affinity, within the tenant's quotas; served here or on the node chosen.
//! - A call on one sandbox — its envd and code-interpreter data plane (`E2b-Sandbox-Id` or
//!   a `<port>-<id>.<domain>` host), a signed file URL of it, its port proxy, or a
//!   control-plane call on `/sandboxes/{id}…` — goes to the node that runs it.
//! - Everything else (listings, templates) is answered here.
//!
//! A call is forwarded to the owner's Hutch API address (the one it advertises) with the
//! node token and [`E2B_FORWARD`]; the owner's routing hands such a call to its own E2B
//! router, which serves it as if it had come to its E2B listener. A sandbox of a dead or
//! draining node is answered here (it is not moved through the E2B API; a call through
//! Hutch's API moves it).

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use hutch_core::tenant::keys::Permission;
use hutch_e2b::{ClusterRoute, RouteTarget, ServeHere};
use hutch_server::AppState;

use crate::forward::{FORWARDED_BY, NODE_TOKEN};
use crate::routing::{place_create, to_owner, Create, PLACED_ID};
use crate::takeover::TAKE_OVER;
use crate::Cluster;

/// The header of a call forwarded to a node for its E2B router.
pub const E2B_FORWARD: HeaderName = HeaderName::from_static("x-hutch-e2b");

/// Marks a call a peer forwarded here for the E2B router: served here, never routed again.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServedForPeer;

/// The cluster's routing of the E2B API.
pub struct E2bRouting {
    cluster: Arc<Cluster>,
    state: AppState,
}

impl E2bRouting {
    /// Routing over `cluster`, with this node's API state.
    pub fn new(cluster: Arc<Cluster>, state: AppState) -> Arc<Self> {
        Arc::new(Self { cluster, state })
    }
}

impl ClusterRoute for E2bRouting {
    fn route(
        &self,
        target: RouteTarget,
        mut request: Request,
        here: ServeHere,
    ) -> BoxFuture<'static, Response> {
        let (cluster, state) = (self.cluster.clone(), self.state.clone());
        Box::pin(async move {
            if request.extensions().get::<ServedForPeer>().is_some() {
                return here(request).await;
            }
            // A client's copies of the nodes' own headers mean nothing.
            for name in [NODE_TOKEN, FORWARDED_BY, PLACED_ID, TAKE_OVER, E2B_FORWARD] {
                request.headers_mut().remove(name);
            }
            let answer = match target {
                RouteTarget::Any => return here(request).await,
                RouteTarget::Sandbox(id) => on_sandbox(&cluster, id.as_str(), request, here).await,
                RouteTarget::Create => create(&cluster, &state, request, here).await,
            };
            answer.unwrap_or_else(|e| hutch_e2b::error::E2bError::Hutch(e).into_response())
        })
    }
}

fn via() -> Option<(HeaderName, HeaderValue)> {
    Some((E2B_FORWARD, HeaderValue::from_static("1")))
}

async fn on_sandbox(
    cluster: &Cluster,
    id: &str,
    request: Request,
    here: ServeHere,
) -> Result<Response, hutch_server::error::ApiError> {
    match to_owner(cluster, id, request, E2B_FORWARD).await? {
        Ok(answer) => Ok(answer),
        Err(request) => Ok(here(request).await),
    }
}

async fn create(
    cluster: &Cluster,
    state: &AppState,
    request: Request,
    here: ServeHere,
) -> Result<Response, hutch_server::error::ApiError> {
    // Without a key that may create, the local answer (401, 403) is the right one.
    let Some(key) = hutch_e2b::api_key(request.headers()).map(str::to_owned) else {
        return Ok(here(request).await);
    };
    let Ok(caller) = state.caller(&key, request.headers()).await else {
        return Ok(here(request).await);
    };
    if !caller.permits(Permission::Manage) {
        return Ok(here(request).await);
    }
    let (parts, body) = request.into_parts();
    let limit = state.json_body_limit();
    let body = axum::body::to_bytes(body, limit).await.map_err(|_| {
        hutch_server::error::ApiError::payload_too_large(format!(
            "the request body is over {limit} bytes"
        ))
    })?;
    let asked: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let template_id = asked
        .get("templateID")
        .and_then(|v| v.as_str())
        .unwrap_or("base");
    // What Hutch's API would read from the same create: its template (or snapshot) and
    // volumes, for the demand and the affinity.
    let mut json = serde_json::json!({});
    let template = if template_id.starts_with("snap_") {
        json["snapshot"] = template_id.into();
        state.manager.config().default_template.clone()
    } else {
        hutch_e2b::template_name(template_id).to_string()
    };
    json["template"] = template.clone().into();
    if let Some(mounts) = asked.get("volumeMounts").and_then(|v| v.as_array()) {
        let volumes: Vec<serde_json::Value> = mounts
            .iter()
            .filter_map(|m| m.get("name"))
            .map(|name| serde_json::json!({"volume": name}))
            .collect();
        json["volumes"] = volumes.into();
    }
    let tenant = match caller.owner() {
        Some(t) => state
            .manager
            .store()
            .get_tenant(&t)
            .await
            .map_err(hutch_server::error::ApiError::from)?,
        None => None,
    };
    let place = Create {
        caller: &caller,
        tenant: tenant.as_ref(),
        template: &template,
        json: &json,
        via: via(),
    };
    place_create(cluster, state, place, parts, body, here).await
}
