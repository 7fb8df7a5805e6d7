//! Health, metrics, OpenAPI, templates, events, and the 404 fallback.

use std::convert::Infallible;

use axum::extract::State;
use axum::http::header;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use futures_util::Stream;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::StreamExt;

use crate::error::{ApiError, ApiResult};
use crate::extract::Caller;
use crate::AppState;

/// The OpenAPI 3 document of this API, checked in at `docs/openapi.json`.
pub const OPENAPI_JSON: &str = include_str!("../../../../docs/openapi.json");

/// `GET /healthz`.
pub async fn healthz() -> impl IntoResponse {
    Json(serde_json::json!({"status": "ok", "version": env!("CARGO_PKG_VERSION")}))
}

/// `GET /metrics` (Prometheus text format).
pub async fn metrics(State(state): State<AppState>) -> ApiResult<impl IntoResponse> {
    let mut text = state.manager.metrics_text(false)?;
    text.push_str(&crate::serve::connections::Connections::render(
        &state.connection_stats(),
    ));
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text))
}

/// `GET /v1/metrics`: every series, per-sandbox ones included (admin keys only: the labels
/// name every tenant's sandboxes).
pub async fn metrics_per_sandbox(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<impl IntoResponse> {
    if !caller.admin {
        return Err(ApiError::from(hutch_core::CoreError::NotFound(
            "per-sandbox metrics are served to admin keys only; /metrics has the server-wide ones"
                .into(),
        )));
    }
    let mut text = state.manager.metrics_text(true)?;
    text.push_str(&crate::serve::connections::Connections::render(
        &state.connection_stats(),
    ));
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text))
}

/// `GET /v1/openapi.json`.
pub async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON)
}

/// `GET /v1/templates`.
pub async fn templates(State(state): State<AppState>) -> ApiResult<impl IntoResponse> {
    let templates = state
        .manager
        .templates()
        .list()
        .map_err(|e| ApiError::from(hutch_core::CoreError::Internal(e.to_string())))?;
    Ok(Json(serde_json::json!({ "templates": templates })))
}

/// `GET /v1/events`: SSE of lifecycle events for the caller's tenant (all for admins).
pub async fn events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let rx = state.manager.events().subscribe();
    let stream = BroadcastStream::new(rx).filter_map(move |ev| {
        let ev = ev.ok()?;
        if !caller.admin && ev.tenant_id.as_deref() != Some(caller.tenant.as_str()) {
            return None;
        }
        let data = serde_json::to_string(&ev).ok()?;
        Some(Ok(Event::default().event(ev.kind.clone()).data(data)))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// Anything unrouted.
pub async fn not_found() -> ApiError {
    ApiError::not_found("no such route; see GET /v1/openapi.json")
}
