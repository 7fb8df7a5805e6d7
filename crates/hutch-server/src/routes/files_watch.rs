//! File watches: `GET /v1/sandboxes/{id}/files/watch` streams changes below a directory as
//! SSE (the default) or NDJSON (`Accept: application/x-ndjson`); the polled form is
//! `POST …/files/watchers`, `GET …/files/watchers/{wid}/events` and `DELETE
//! …/files/watchers/{wid}`. See `docs/files-watch.md`.
//!
//! The stream's first message (`ready`) is sent once the watch is armed; then one message
//! per change (`event`), `warning`s when changes may have been missed, and `end` when the
//! directory goes away. If the sandbox stops or is deleted, the last message is `error`.
//! Closing the connection ends the watch inside the sandbox.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::{Stream, StreamExt};
use hutch_core::manager::{FileWatch, WatchOptions};
use hutch_core::CoreError;
use hutch_proto::watch::WATCH_CONTENT_TYPE;
use hutch_proto::WatchMessage;
use serde::Deserialize;

use super::negotiate::accepts;
use crate::auth::authorize_sandbox as authorize;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiQuery, Caller};
use crate::AppState;

/// `?path=&recursive=&include_entry=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    path: String,
    recursive: Option<bool>,
    include_entry: Option<bool>,
}

/// `POST …/files/watchers` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatcherBody {
    path: String,
    recursive: Option<bool>,
    include_entry: Option<bool>,
}

fn options(recursive: Option<bool>, include_entry: Option<bool>) -> WatchOptions {
    WatchOptions {
        recursive: recursive.unwrap_or(false),
        include_entry: include_entry.unwrap_or(false),
    }
}

/// The name (SSE event name, NDJSON `kind`) and JSON of a message.
fn message_json(message: &WatchMessage) -> (&'static str, serde_json::Value) {
    let kind = match message {
        WatchMessage::Ready(_) => "ready",
        WatchMessage::Event(_) => "event",
        WatchMessage::Warning(_) => "warning",
        WatchMessage::End(_) => "end",
    };
    let mut value = serde_json::to_value(message).expect("watch messages serialize");
    if let Some(object) = value.as_object_mut() {
        object.remove("kind");
    }
    (kind, value)
}

/// The `error` message that ends a watch whose sandbox went away.
fn error_json(e: CoreError) -> serde_json::Value {
    let api = ApiError::from(e);
    serde_json::json!({ "code": api.code, "message": api.message })
}

/// Every message of a watch, `ready` first, an `error` last if the watch failed.
fn messages(
    watch: FileWatch,
) -> impl Stream<Item = (&'static str, serde_json::Value)> + Send + 'static {
    let ready = message_json(&WatchMessage::Ready(watch.ready().clone()));
    let rest = futures_util::stream::unfold(Some(watch), |watch| async move {
        let mut watch = watch?;
        match watch.next().await? {
            Ok(message) => Some((message_json(&message), Some(watch))),
            Err(e) => Some((("error", error_json(e)), None)),
        }
    });
    futures_util::stream::iter([ready]).chain(rest)
}

/// `GET /v1/sandboxes/{id}/files/watch?path=&recursive=&include_entry=`.
pub async fn watch(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<WatchQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let id = authorize(&state, &caller, &id).await?;
    super::files::check_path(&q.path)?;
    let watch = state
        .manager
        .watch_files(&id, &q.path, options(q.recursive, q.include_entry))
        .await?;
    if accepts(&headers, WATCH_CONTENT_TYPE) {
        let lines = messages(watch).map(|(kind, mut value)| {
            if let Some(object) = value.as_object_mut() {
                object.insert("kind".into(), kind.into());
            }
            let mut line = value.to_string();
            line.push('\n');
            Ok::<_, Infallible>(bytes::Bytes::from(line))
        });
        return Ok((
            [(header::CONTENT_TYPE, WATCH_CONTENT_TYPE)],
            Body::from_stream(lines),
        )
            .into_response());
    }
    let events = messages(watch).map(|(kind, value)| {
        Ok::<_, Infallible>(Event::default().event(kind).data(value.to_string()))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// `POST /v1/sandboxes/{id}/files/watchers {"path", "recursive"?, "include_entry"?}` →
/// `201 {"id", "path", "recursive", "watched_dirs"}`, armed.
pub async fn create_watcher(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<WatcherBody>,
) -> ApiResult<impl IntoResponse> {
    let id = authorize(&state, &caller, &id).await?;
    super::files::check_path(&body.path)?;
    let info = state
        .manager
        .create_watcher(&id, &body.path, options(body.recursive, body.include_entry))
        .await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// `GET /v1/sandboxes/{id}/files/watchers/{wid}/events` → what the watcher collected since
/// the last call: `{"events", "warnings", "dropped", "end"?}`.
pub async fn watcher_events(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, watcher)): Path<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    let id = authorize(&state, &caller, &id).await?;
    Ok(Json(state.manager.watcher_events(&id, &watcher)?))
}

/// `DELETE /v1/sandboxes/{id}/files/watchers/{wid}` → 204.
pub async fn remove_watcher(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, watcher)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let id = authorize(&state, &caller, &id).await?;
    state.manager.remove_watcher(&id, &watcher)?;
    Ok(StatusCode::NO_CONTENT)
}
