//! Health, metrics, OpenAPI, events, and the 404 fallback.

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
    let mut text = state.manager.metrics_text(false).await?;
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
    let mut text = state.manager.metrics_text(true).await?;
    text.push_str(&crate::serve::connections::Connections::render(
        &state.connection_stats(),
    ));
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text))
}

/// `GET /v1/openapi.json`.
pub async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON)
}

/// `GET /v1/events?since=N` query.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Replay the kept events after this sequence number first.
    since: Option<u64>,
}

/// `GET /v1/events`: SSE of lifecycle and exec events for the caller's tenant (all for
/// admins), each with its sequence number as the SSE `id`. `?since=N` (or the
/// `Last-Event-ID` header a reconnecting EventSource sends) replays the kept events after
/// `N` first; events missed beyond the replay window are announced by one `events.lost`.
pub async fn events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    crate::extract::ApiQuery(q): crate::extract::ApiQuery<EventsQuery>,
    headers: axum::http::HeaderMap,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let since = match q.since {
        Some(n) => Some(n),
        None => match headers.get("last-event-id") {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or_else(|| {
                        ApiError::bad_request("Last-Event-ID must be an event's sequence number")
                    })?,
            ),
        },
    };
    let sub = state.manager.events().subscribe_since(since);
    let visible = move |ev: &hutch_core::events::Event| {
        caller.admin || ev.tenant_id.as_deref() == Some(caller.tenant.as_str())
    };
    let to_sse = |ev: &hutch_core::events::Event| {
        let data = serde_json::to_string(ev).ok()?;
        Some(Ok(Event::default()
            .id(ev.seq.to_string())
            .event(ev.kind.clone())
            .data(data)))
    };
    let mut first: Vec<Result<Event, Infallible>> = Vec::new();
    if sub.lost > 0 {
        let data = serde_json::json!({
            "type": "events.lost",
            "count": sub.lost,
            "detail": format!(
                "{} events after {} are older than the replay window ({} events) and were not kept",
                sub.lost,
                since.unwrap_or(0),
                hutch_core::events::REPLAY_WINDOW
            ),
        });
        first.push(Ok(Event::default()
            .event("events.lost")
            .data(data.to_string())));
    }
    let last_replayed = sub.replay.last().map(|e| e.seq).or(since).unwrap_or(0);
    let visible_replay = visible.clone();
    first.extend(
        sub.replay
            .iter()
            .filter(|e| visible_replay(e))
            .filter_map(to_sse),
    );
    let live = BroadcastStream::new(sub.live).filter_map(move |ev| {
        let ev = ev.ok()?;
        if ev.seq <= last_replayed || !visible(&ev) {
            return None;
        }
        to_sse(&ev)
    });
    Ok(Sse::new(futures_util::stream::iter(first).chain(live)).keep_alive(KeepAlive::default()))
}

/// Anything unrouted.
pub async fn not_found() -> ApiError {
    ApiError::not_found("no such route; see GET /v1/openapi.json")
}
