//! The preview origin (`hutch serve --preview-listen`, `{port}-{sandbox id}.{domain}`) in
//! cluster mode: any node's preview listener answers for every sandbox. A request for a
//! sandbox another live node runs is forwarded to that node's Hutch API address with the
//! node token and [`PREVIEW_FORWARD`] (its `Host` kept), where routing hands it to that
//! node's own preview origin, which checks its link or session as on a single server.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hutch_server::AppState;

use crate::forward::{forward, Peer, FORWARDED_BY, NODE_TOKEN};
use crate::routing::cluster_error;
use crate::Cluster;

/// The header of a preview call forwarded to the node that runs its sandbox.
pub const PREVIEW_FORWARD: HeaderName = HeaderName::from_static("x-hutch-preview");

/// `preview` (this node's preview origin) with cluster routing in front of it.
pub fn layer(preview: Router, cluster: Arc<Cluster>, state: AppState, domain: String) -> Router {
    preview.layer(axum::middleware::from_fn_with_state(
        (cluster, state, domain),
        route,
    ))
}

async fn route(
    State((cluster, _state, domain)): State<(Arc<Cluster>, AppState, String)>,
    mut req: Request,
    next: Next,
) -> Response {
    // A client's copies of the nodes' own headers mean nothing here.
    for name in [NODE_TOKEN, FORWARDED_BY, PREVIEW_FORWARD] {
        req.headers_mut().remove(name);
    }
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().host())
        .unwrap_or_default()
        .to_string();
    let Some((_, id)) = hutch_server::parse_host(&host, &domain) else {
        return next.run(req).await;
    };
    let owner = match cluster.owner_of(id.as_str()).await {
        Ok(o) => o,
        Err(e) => return cluster_error(e).into_response(),
    };
    let Some(owner) = owner else {
        return next.run(req).await;
    };
    if owner.node == cluster.node_id() || owner.dead || owner.draining {
        return next.run(req).await;
    }
    let peer = Peer {
        id: owner.node,
        advertise: owner.advertise,
    };
    req.headers_mut()
        .insert(PREVIEW_FORWARD, HeaderValue::from_static("1"));
    match forward(&peer, cluster.node_id(), cluster.secret(), req).await {
        Ok(r) => r,
        Err(e) => {
            cluster.owners().distrust(&peer.id);
            cluster_error(e).into_response()
        }
    }
}
