//! The control plane: E2B's REST API (`spec/openapi.yml`) onto Hutch's manager.
//!
//! | E2B | Hutch |
//! |---|---|
//! | create (`templateID`, `timeout`, `metadata`, `envVars`, network) | create (template or snapshot, TTL, metadata, env, egress policy) |
//! | pause / connect (resume) | hibernate / wake |
//! | `timeout`, `refreshes` | the TTL |
//! | fork | fork (live on `vm`, files on `ns`) |
//! | snapshots | snapshots (a snapshot id is a template in create) |

mod model;
mod network;
mod observe;
mod sandboxes;
mod templates;

use axum::routing::{get, post, put};
use axum::Router;

use crate::E2bState;

pub use observe::sample;
pub use sandboxes::{form_pairs, template_name};
pub use templates::E2bBuilds;

/// The control plane's routes.
pub fn router() -> Router<E2bState> {
    Router::new()
        .route("/health", get(|| async { "Health check successful" }))
        .route(
            "/sandboxes",
            post(sandboxes::create).get(sandboxes::list_v1),
        )
        .route(
            "/v2/sandboxes",
            post(sandboxes::create).get(sandboxes::list_v2),
        )
        .route("/sandboxes/metrics", get(observe::metrics_many))
        .route(
            "/sandboxes/{id}",
            get(sandboxes::get).delete(sandboxes::kill),
        )
        .route("/sandboxes/{id}/pause", post(sandboxes::pause))
        .route("/sandboxes/{id}/resume", post(sandboxes::resume))
        .route("/sandboxes/{id}/connect", post(sandboxes::connect))
        .route("/v2/sandboxes/{id}/connect", post(sandboxes::connect))
        .route("/sandboxes/{id}/timeout", post(sandboxes::set_timeout))
        .route("/sandboxes/{id}/refreshes", post(sandboxes::refresh))
        .route("/sandboxes/{id}/network", put(network::update))
        .route("/sandboxes/{id}/fork", post(sandboxes::fork))
        .route("/sandboxes/{id}/snapshots", post(sandboxes::snapshot))
        .route("/snapshots", get(sandboxes::list_snapshots))
        .route(
            "/templates/{id}",
            axum::routing::delete(sandboxes::delete_template),
        )
        .route("/v3/templates", post(templates::request_build))
        .route(
            "/templates/{id}/files/{hash}",
            get(templates::file_upload_link),
        )
        .route("/template-files/{id}/{hash}", put(templates::upload_files))
        .route(
            "/v2/templates/{id}/builds/{build}",
            post(templates::start_build),
        )
        .route(
            "/templates/{id}/builds/{build}/status",
            get(templates::build_status),
        )
        .route("/templates/aliases/{alias}", get(templates::alias))
        .route("/sandboxes/{id}/metrics", get(observe::metrics))
        .route("/sandboxes/{id}/logs", get(observe::logs_v1))
        .route("/v2/sandboxes/{id}/logs", get(observe::logs_v2))
        .fallback(not_found)
}

async fn not_found(uri: axum::http::Uri) -> crate::error::E2bError {
    crate::error::E2bError::not_found(format!(
        "{} is not part of the E2B API Hutch serves (see docs/e2b.md)",
        uri.path()
    ))
}
