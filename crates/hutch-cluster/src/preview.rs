//! The preview origin (`hutch serve --preview-listen`, `{port}-{sandbox id}.{domain}`) in
//! cluster mode: any node's preview listener answers for every sandbox. A request for a
//! sandbox another live node runs is forwarded to that node's Hutch API address with the
//! node token and [`PREVIEW_FORWARD`] (its `Host` kept), where routing hands it to that
//! node's own preview origin, which checks its link or session as on a single server.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderName;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;

use crate::forward::{FORWARDED_BY, NODE_TOKEN};
use crate::routing::to_owner;
use crate::Cluster;

/// The header of a preview call forwarded to the node that runs its sandbox.
pub const PREVIEW_FORWARD: HeaderName = HeaderName::from_static("x-hutch-preview");

/// `preview` (this node's preview origin) with cluster routing in front of it.
pub fn layer(preview: Router, cluster: Arc<Cluster>, domain: String) -> Router {
    preview.layer(axum::middleware::from_fn_with_state(
        (cluster, domain),
        route,
    ))
}

async fn route(
    State((cluster, domain)): State<(Arc<Cluster>, String)>,
    mut req: Request,
    next: Next,
) -> Response {
    // A client's copies of the nodes' own headers mean nothing here.
    for name in [NODE_TOKEN, FORWARDED_BY, PREVIEW_FORWARD] {
        req.headers_mut().remove(name);
    }
    let Some((_, id)) = hutch_server::parse_host(hutch_server::request_host(&req), &domain) else {
        return next.run(req).await;
    };
    match to_owner(&cluster, id.as_str(), req, PREVIEW_FORWARD).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(req)) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}
