//! Routing: the middleware in front of the API that makes any node answer for every
//! sandbox.
//!
//! - A call that carries the cluster's node token was forwarded by a node: it is served
//!   here, whatever the owner table says (a call is forwarded at most once). The token is
//!   removed from the call before it is served, so no handler (the port proxy's service
//!   inside the sandbox above all) ever sees the secret.
//! - `POST /v1/sandboxes` is placed (`placement.rs`) and served here or forwarded to the
//!   node chosen; when that node fails the create (it cannot be reached, or answers 5xx),
//!   the reservation goes and one other node is tried.
//! - `/v1/sandboxes/{id}` and everything below it go to the sandbox's owner: served here
//!   when this node owns it (or nobody does: the local answer is the 404), forwarded
//!   otherwise. A sandbox whose owner was declared dead is answered here from its row
//!   (`lost`), and `DELETE` of it deletes the row.
//! - A call on a hibernated sandbox of a dead or draining node whose saved state is in the
//!   object store moves it first (`takeover.rs`): placement picks a node, which takes it
//!   over and serves the call.
//! - Everything else is served here (every node reads the same database).
//!
//! A client's bearer key is checked here before a call is forwarded or placed, so a call
//! without a valid key never costs a peer anything; the owner checks it again.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hutch_core::ids::SandboxId;
use hutch_core::model::SandboxState;
use hutch_core::tenant::keys::Permission;
use hutch_server::error::ApiError;
use hutch_server::{AppState, PlacedSandboxId};

use crate::error::ClusterError;
use crate::forward::{forward, Peer, FORWARDED_BY, NODE_TOKEN};
use crate::placement::{self, Demand, TenantCheck};
use crate::takeover::{self, Move, TAKE_OVER};
use crate::Cluster;

/// The header of every answer naming the node that served the call.
pub const SERVED_BY: HeaderName = HeaderName::from_static("x-hutch-node");

/// Memory assumed for a create that names none when its template says none either.
const FALLBACK_MEMORY_MIB: u64 = 512;

/// CPUs assumed likewise.
const FALLBACK_CPUS: f64 = 1.0;

/// The header of a create forwarded by the node that placed it: the id placement chose
/// (and reserved under), which the sandbox is created with.
pub const PLACED_ID: HeaderName = HeaderName::from_static("x-hutch-sandbox-id");

/// The node's other listeners, which serve the calls other nodes forward here for them.
#[derive(Clone, Default)]
pub struct Listeners {
    /// This node's E2B router (`e2b.rs`).
    pub e2b: Option<Router>,
    /// This node's preview origin, without its routing (`preview.rs`).
    pub preview: Option<Router>,
}

/// `app` with cluster routing in front of it; `listeners` serve the E2B and preview calls
/// other nodes forward here.
pub fn layer(app: Router, cluster: Arc<Cluster>, state: AppState, listeners: Listeners) -> Router {
    app.layer(axum::middleware::from_fn_with_state(
        (cluster, state, listeners),
        route,
    ))
}

/// What a call is, for routing.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// Served by whichever node gets it.
    Any,
    /// A create: placed.
    Create,
    /// A call on one sandbox (`exact`: on `/v1/sandboxes/{id}` itself).
    Sandbox { id: String, exact: bool },
}

fn classify(method: &Method, path: &str) -> Target {
    let Some(rest) = path.strip_prefix("/v1/sandboxes") else {
        return Target::Any;
    };
    if rest.is_empty() || rest == "/" {
        return if method == Method::POST {
            Target::Create
        } else {
            Target::Any
        };
    }
    let Some(rest) = rest.strip_prefix('/') else {
        return Target::Any;
    };
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    if !id.starts_with("sbx_") {
        return Target::Any;
    }
    Target::Sandbox {
        id: id.to_string(),
        exact: tail.is_empty(),
    }
}

async fn route(
    State((cluster, state, listeners)): State<(Arc<Cluster>, AppState, Listeners)>,
    mut req: Request,
    next: Next,
) -> Response {
    let mut response = if cluster.is_peer_call(req.headers()) {
        // The secret stops here: nothing past routing needs it, and the port proxy would
        // hand it to the service inside the sandbox.
        req.headers_mut().remove(NODE_TOKEN);
        let placed = req
            .headers_mut()
            .remove(PLACED_ID)
            .and_then(|v| v.to_str().ok()?.parse::<SandboxId>().ok());
        if let Some(id) = placed {
            req.extensions_mut().insert(PlacedSandboxId(id));
        }
        // A call another node forwarded for one of this node's other listeners.
        let e2b = req.headers_mut().remove(crate::e2b::E2B_FORWARD).is_some();
        let preview = req
            .headers_mut()
            .remove(crate::preview::PREVIEW_FORWARD)
            .is_some();
        if e2b || preview {
            let (router, what) = if e2b {
                req.extensions_mut().insert(crate::e2b::ServedForPeer);
                (listeners.e2b, "the E2B API (hutch serve --e2b-listen)")
            } else {
                (
                    listeners.preview,
                    "a preview origin (hutch serve --preview-listen)",
                )
            };
            let Some(router) = router else {
                return ApiError::not_found(format!("this node does not serve {what}"))
                    .into_response();
            };
            let mut response = tower::ServiceExt::oneshot(router, req)
                .await
                .unwrap_or_else(|e| match e {});
            if let Ok(node) = HeaderValue::from_str(cluster.node_id()) {
                response.headers_mut().entry(SERVED_BY).or_insert(node);
            }
            return response;
        }
        let take_over = req
            .headers_mut()
            .remove(TAKE_OVER)
            .and_then(|v| v.to_str().ok()?.parse::<SandboxId>().ok());
        match take_over {
            // The node that placed the move asks this one to take the sandbox first.
            Some(id) => match takeover::take_over_here(&cluster, &state, &id).await {
                Ok(_) => next.run(req).await,
                Err(e) => e.into_response(),
            },
            None => next.run(req).await,
        }
    } else {
        req.headers_mut().remove(NODE_TOKEN);
        req.headers_mut().remove(FORWARDED_BY);
        req.headers_mut().remove(PLACED_ID);
        req.headers_mut().remove(TAKE_OVER);
        let result = match classify(req.method(), req.uri().path()) {
            Target::Any => Ok(next.run(req).await),
            Target::Create => create(&cluster, &state, req, next).await,
            Target::Sandbox { id, exact } => {
                on_sandbox(&cluster, &state, &id, exact, req, next).await
            }
        };
        result.unwrap_or_else(IntoResponse::into_response)
    };
    // The node that served the call (a forwarded answer carries its owner's).
    if let Ok(node) = HeaderValue::from_str(cluster.node_id()) {
        response.headers_mut().entry(SERVED_BY).or_insert(node);
    }
    response
}

/// The bearer key of a call, checked: `Ok(None)` when it has none (the node that serves it
/// answers, a signed file URL for one).
pub(crate) async fn check_key(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<hutch_server::auth::Caller>, ApiError> {
    let Some(secret) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return Ok(None);
    };
    state.authenticate(secret.trim()).await.map(Some)
}

fn unavailable(code: &'static str, message: String) -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        code,
        message,
        details: None,
    }
}

pub(crate) fn cluster_error(e: ClusterError) -> ApiError {
    match e {
        ClusterError::Core(core) => ApiError::from(core),
        e @ ClusterError::NoCapacity(_) => unavailable("no_capacity", e.to_string()),
        e @ (ClusterError::Peer { .. } | ClusterError::PeerHttp { .. }) => {
            ApiError::bad_gateway(e.to_string())
        }
        e if e.is_db_unreachable() => unavailable("store_unavailable", e.to_string()),
        e => ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "internal",
            message: e.to_string(),
            details: None,
        },
    }
}

async fn on_sandbox(
    cluster: &Cluster,
    state: &AppState,
    id: &str,
    exact: bool,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let owner = cluster.owner_of(id).await.map_err(cluster_error)?;
    let Some(owner) = owner else {
        return Ok(next.run(req).await);
    };
    if owner.node == cluster.node_id() {
        return Ok(next.run(req).await);
    }
    // A hibernated sandbox saved in the object store moves to a node that runs it, for any
    // call but a look at the sandbox itself (a DELETE moves it too: its new node deletes
    // it, and its saved state with it).
    let moves = !exact || req.method() == Method::DELETE;
    if (owner.dead || owner.draining) && moves {
        match takeover::place_move(cluster, state, id, req.headers()).await? {
            Move::No => {}
            Move::Here => return Ok(next.run(req).await),
            Move::To(peer, placed) => {
                let mut req = req;
                if let Some(v) = takeover::take_over_header(id) {
                    req.headers_mut().insert(TAKE_OVER, v);
                }
                let answer = forward(&peer, cluster.node_id(), cluster.secret(), req).await;
                takeover::release(cluster, &placed).await;
                cluster.owners().forget(id);
                return answer.map_err(cluster_error);
            }
        }
    }
    if owner.dead {
        if exact && req.method() == Method::DELETE {
            return delete_lost(cluster, state, id, req.headers()).await;
        }
        return Ok(next.run(req).await);
    }
    check_key(state, req.headers()).await?;
    let peer = Peer {
        id: owner.node,
        advertise: owner.advertise,
    };
    let answer = forward(&peer, cluster.node_id(), cluster.secret(), req).await;
    if answer.is_err() {
        // The next call reads the owner's row again.
        cluster.owners().distrust(&peer.id);
    }
    answer.map_err(cluster_error)
}

/// A call on sandbox `id` for one of the node's other listeners (E2B, preview): forwarded
/// with `via` to the live node that runs it (`Ok(Ok(answer))`), or to be served here
/// (`Ok(Err(call))`: this node runs it, nobody does, or its node is dead or draining).
pub(crate) async fn to_owner(
    cluster: &Cluster,
    id: &str,
    mut req: Request,
    via: HeaderName,
) -> Result<Result<Response, Request>, ApiError> {
    let owner = cluster.owner_of(id).await.map_err(cluster_error)?;
    let Some(owner) = owner else {
        return Ok(Err(req));
    };
    if owner.node == cluster.node_id() || owner.dead || owner.draining {
        return Ok(Err(req));
    }
    let peer = Peer {
        id: owner.node,
        advertise: owner.advertise,
    };
    req.headers_mut().insert(via, HeaderValue::from_static("1"));
    let answer = forward(&peer, cluster.node_id(), cluster.secret(), req).await;
    if answer.is_err() {
        cluster.owners().distrust(&peer.id);
    }
    answer.map(Ok).map_err(cluster_error)
}

/// `DELETE /v1/sandboxes/{id}` of a sandbox whose node was declared dead: its row goes (its
/// processes died with the node, or were stopped when it came back).
async fn delete_lost(
    cluster: &Cluster,
    state: &AppState,
    id: &str,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let Some(caller) = check_key(state, headers).await? else {
        return Err(ApiError::unauthorized(
            "missing API key (Authorization: Bearer …)",
        ));
    };
    if !caller.permits(Permission::Manage) {
        return Err(ApiError::forbidden(
            "this key may not delete sandboxes (it lacks the manage permission)",
        ));
    }
    let sandbox: SandboxId = id
        .parse()
        .map_err(|e: hutch_core::ids::MalformedId| ApiError::not_found(e.to_string()))?;
    let record = state
        .manager
        .store()
        .get_sandbox_for(&sandbox, &caller.scope())
        .await
        .map_err(|e| unavailable("store_unavailable", e.to_string()))?
        .filter(|r| caller.selects(&r.metadata));
    let Some(record) = record else {
        return Err(ApiError::not_found(format!("sandbox {id} not found")));
    };
    if record.state != SandboxState::Lost {
        return Err(ApiError::conflict(format!(
            "sandbox {id} is {} on a node that is not answering: try again once the cluster declared the node dead",
            record.state.as_str()
        )));
    }
    cluster.delete_lost(id).await.map_err(cluster_error)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The template name a create's body names (its default when none; without a tag or
/// revision).
fn template_of(state: &AppState, json: &serde_json::Value) -> String {
    json.get("template")
        .and_then(|v| v.as_str())
        .map(|t| t.split([':', '@']).next().unwrap_or(t).to_string())
        .unwrap_or_else(|| state.manager.config().default_template.clone())
}

/// What a create asks for: its `cpus` and `memory_mib`, else its tenant's defaults, else
/// those of its template `name`.
fn demand_of(
    state: &AppState,
    json: &serde_json::Value,
    name: &str,
    tenant_defaults: Option<&hutch_core::tenant::settings::SandboxDefaults>,
) -> Demand {
    let template = state.manager.templates().get(name);
    let memory_mib = json
        .get("memory_mib")
        .and_then(|v| v.as_u64())
        .or_else(|| tenant_defaults.and_then(|d| d.memory_mib))
        .or_else(|| template.as_ref().map(|t| t.defaults.memory_mib))
        .unwrap_or(FALLBACK_MEMORY_MIB);
    let cpus = json
        .get("cpus")
        .and_then(|v| v.as_f64())
        .or_else(|| tenant_defaults.and_then(|d| d.cpus))
        .or_else(|| template.as_ref().map(|t| t.defaults.cpus))
        .unwrap_or(FALLBACK_CPUS);
    Demand { cpus, memory_mib }
}

async fn create(
    cluster: &Cluster,
    state: &AppState,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let Some(caller) = check_key(state, req.headers()).await? else {
        // No key: the local answer is the 401.
        return Ok(next.run(req).await);
    };
    if !caller.permits(Permission::Manage) {
        // The local answer is the 403.
        return Ok(next.run(req).await);
    }
    let (parts, body) = req.into_parts();
    let limit = state.json_body_limit();
    let body = axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError::payload_too_large(format!("the request body is over {limit} bytes"))
    })?;
    let store = state.manager.store();
    let owner = caller.owner();
    let tenant_record = match &owner {
        Some(t) => store.get_tenant(t).await.map_err(ApiError::from)?,
        None => None,
    };
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let template = template_of(state, &json);
    let place = Create {
        caller: &caller,
        tenant: tenant_record.as_ref(),
        template: &template,
        json: &json,
        via: None,
    };
    place_create(cluster, state, place, parts, body, |r| next.run(r)).await
}

/// A create to place: who asks, for what, and how a node it is forwarded to serves it.
pub(crate) struct Create<'a> {
    pub caller: &'a hutch_server::auth::Caller,
    pub tenant: Option<&'a hutch_core::tenant::settings::TenantRecord>,
    /// The template (demand and affinity).
    pub template: &'a str,
    /// The create's body as Hutch's API reads it (`cpus`, `memory_mib`, `snapshot`,
    /// `volumes`: demand and affinity).
    pub json: &'a serde_json::Value,
    /// A header a forwarded create carries (the E2B API's, `e2b.rs`).
    pub via: Option<(HeaderName, HeaderValue)>,
}

/// Place a create and serve it with `here` or on the node chosen (one other node is
/// tried when that one fails it); the reservation is released once it is answered.
pub(crate) async fn place_create<F, Fut>(
    cluster: &Cluster,
    state: &AppState,
    create: Create<'_>,
    mut parts: axum::http::request::Parts,
    body: axum::body::Bytes,
    here: F,
) -> Result<Response, ApiError>
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let store = state.manager.store();
    let owner = create.caller.owner();
    let tenant_record = create.tenant;
    let demand = demand_of(
        state,
        create.json,
        create.template,
        tenant_record.map(|t| &t.settings.defaults),
    );
    let affinity =
        crate::affinity::of_create(cluster, state, create.caller, create.json, create.template)
            .await?;

    let mut next = Some(here);
    let mut exclude: Vec<String> = Vec::new();
    let mut last_error = None;
    for _attempt in 0..2 {
        // A new id per attempt: a node that failed a create may keep its row.
        let sandbox = SandboxId::random();
        let check = owner
            .as_ref()
            .zip(tenant_record.as_ref())
            .map(|(tenant, record)| TenantCheck {
                tenant,
                quotas: &record.settings.quotas,
                store: store.as_ref(),
            });
        let placed = placement::place(
            cluster.db(),
            cluster.config(),
            (demand, &affinity),
            &exclude,
            &sandbox,
            check,
        )
        .await;
        let placed = match placed {
            Ok(p) => p,
            // After a failed attempt, that node's error says more than "no room elsewhere".
            Err(ClusterError::NoCapacity(_)) if last_error.is_some() => break,
            Err(e) => return Err(cluster_error(e)),
        };
        parts.extensions.insert(PlacedSandboxId(sandbox.clone()));
        let mut request = Request::from_parts(parts.clone(), Body::from(body.clone()));
        let answer = if placed.node == cluster.node_id() {
            match next.take() {
                Some(here) => Ok(here(request).await),
                None => Err(ApiError::bad_gateway("this node already failed the create")),
            }
        } else {
            let peer = Peer {
                id: placed.node.clone(),
                advertise: placed.advertise.clone(),
            };
            if let Ok(v) = HeaderValue::from_str(sandbox.as_str()) {
                request.headers_mut().insert(PLACED_ID, v);
            }
            if let Some((name, value)) = &create.via {
                request.headers_mut().insert(name.clone(), value.clone());
            }
            forward(&peer, cluster.node_id(), cluster.secret(), request)
                .await
                .map_err(cluster_error)
        };
        if let Err(e) = placement::release(cluster.db(), &placed).await {
            tracing::warn!(error = %e, "releasing a placement (it expires on its own)");
        }
        match answer {
            Ok(r) if !r.status().is_server_error() => return Ok(r),
            Ok(r) => {
                tracing::warn!(node = %placed.node, status = %r.status(), "a create failed on its node: trying one other");
                last_error = Some(Ok(r));
            }
            Err(e) => {
                tracing::warn!(node = %placed.node, error = %e.message, "a create's node did not answer: trying one other");
                last_error = Some(Err(e));
            }
        }
        exclude.push(placed.node);
    }
    match last_error {
        Some(Ok(r)) => Ok(r),
        Some(Err(e)) => Err(e),
        None => Err(cluster_error(ClusterError::NoCapacity(
            "no node could take it".into(),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_classified_by_path() {
        assert_eq!(classify(&Method::POST, "/v1/sandboxes"), Target::Create);
        assert_eq!(classify(&Method::GET, "/v1/sandboxes"), Target::Any);
        assert_eq!(
            classify(&Method::POST, "/v1/sandboxes/sbx_abc/exec"),
            Target::Sandbox {
                id: "sbx_abc".into(),
                exact: false
            }
        );
        assert_eq!(
            classify(&Method::DELETE, "/v1/sandboxes/sbx_abc"),
            Target::Sandbox {
                id: "sbx_abc".into(),
                exact: true
            }
        );
        assert_eq!(classify(&Method::GET, "/v1/snapshots"), Target::Any);
        assert_eq!(classify(&Method::GET, "/v1/sandboxesx"), Target::Any);
        assert_eq!(classify(&Method::GET, "/v1/sandboxes/other"), Target::Any);
    }
}
