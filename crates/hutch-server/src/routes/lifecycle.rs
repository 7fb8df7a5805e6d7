//! Lifecycle beyond create and kill: pause, resume, hibernate, wake; named snapshots; fork
//! and explore.
//!
//! - `POST /v1/sandboxes/{id}/pause|resume|hibernate` → Sandbox
//! - `POST /v1/sandboxes/{id}/wake` → Sandbox plus `woke_in_ms`
//! - `POST /v1/sandboxes/{id}/snapshots {"name"?}` → 201 Snapshot
//! - `GET /v1/snapshots`, `GET|DELETE /v1/snapshots/{id}`
//! - `POST /v1/sandboxes/{id}/fork {"count", "mode"}` → 201 `{"sandboxes": [...]}`
//! - `POST /v1/sandboxes/{id}/explore {"commands", "timeout_seconds", "keep", "score_regex"}`

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use hutch_core::exec::Command;
use hutch_core::fork::{ExploreCommand, ForkCommand, ForkMode, Keep, ScoreRegex};
use hutch_core::ids::SnapshotId;
use hutch_core::CoreError;
use serde::Deserialize;

use super::page::{listing_error, page_answer, PageParams};
use crate::auth::AuthorizedSandbox;
use crate::error::{ApiError, ApiResult};
use crate::extract::{json_or_default, ApiJson, ApiQuery, Caller, JsonBytes};
use crate::AppState;

/// Default explore timeout.
const DEFAULT_EXPLORE_TIMEOUT: f64 = 60.0;

/// `POST /v1/sandboxes/{id}/pause`.
pub async fn pause(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    Ok(Json(state.manager.pause(&id).await?))
}

/// `POST /v1/sandboxes/{id}/resume`.
pub async fn resume(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    Ok(Json(state.manager.resume(&id).await?))
}

/// `POST /v1/sandboxes/{id}/hibernate`.
pub async fn hibernate(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    Ok(Json(state.manager.hibernate(&id).await?))
}

/// `POST /v1/sandboxes/{id}/wake`: the sandbox, with `woke_in_ms`.
pub async fn wake(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    let woken = state.manager.wake(&id).await?;
    let mut body = match serde_json::to_value(&woken.sandbox) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    body.insert("woke_in_ms".into(), woken.woke_in_ms.into());
    Ok(Json(serde_json::Value::Object(body)))
}

/// `POST /v1/sandboxes/{id}/snapshots` body (optional; without a name the snapshot is named
/// by its id).
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SnapshotBody {
    name: Option<String>,
}

/// `POST /v1/sandboxes/{id}/snapshots`.
pub async fn snapshot(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    body: axum::body::Bytes,
) -> ApiResult<impl IntoResponse> {
    let body: SnapshotBody = json_or_default(&body)?;
    let id = sandbox.id;
    let snap = state.manager.snapshot(&id, body.name.as_deref()).await?;
    Ok((StatusCode::CREATED, Json(snap)))
}

/// `GET /v1/snapshots?limit=&cursor=` (`routes/page.rs`).
pub async fn list_snapshots(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<impl IntoResponse> {
    let snapshots = state
        .manager
        .list_snapshots(&caller.scope(), &page.request()?)
        .await
        .map_err(listing_error)?;
    Ok(Json(page_answer("snapshots", snapshots)))
}

/// `GET /v1/snapshots/{id}`.
pub async fn get_snapshot(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let id: SnapshotId = id.parse().map_err(CoreError::from)?;
    Ok(Json(
        state.manager.get_snapshot(&id, &caller.scope()).await?,
    ))
}

/// `DELETE /v1/snapshots/{id}`: 204; 409 while sandboxes created from it exist.
pub async fn delete_snapshot(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let id: SnapshotId = id.parse().map_err(CoreError::from)?;
    state.manager.delete_snapshot(&id, &caller.scope()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The id of the snapshot a create names, by id or by a name unique among the caller's
/// snapshots (404 when none matches, 409 listing the ids when several do).
pub async fn resolve_snapshot(
    state: &AppState,
    caller: &Caller,
    name_or_id: &str,
) -> ApiResult<String> {
    Ok(state
        .manager
        .resolve_snapshot(name_or_id, &caller.scope())
        .await?)
}

/// `POST /v1/sandboxes/{id}/fork` body.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ForkBody {
    count: Option<u32>,
    mode: Option<ForkMode>,
}

/// `POST /v1/sandboxes/{id}/fork`: 201 with the children.
pub async fn fork(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    JsonBytes(body): JsonBytes,
) -> ApiResult<impl IntoResponse> {
    let body: ForkBody = json_or_default(&body)?;
    let id = sandbox.id;
    let cmd = ForkCommand::new(body.count.unwrap_or(1), body.mode.unwrap_or_default())?;
    let children = state.manager.fork(&id, cmd).await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({ "sandboxes": children })),
    ))
}

/// `POST /v1/sandboxes/{id}/explore` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExploreBody {
    commands: Vec<Command>,
    timeout_seconds: Option<f64>,
    keep: Option<String>,
    score_regex: Option<String>,
}

impl ExploreBody {
    fn into_command(self) -> ApiResult<ExploreCommand> {
        let keep = match self.keep.as_deref() {
            None | Some("winner") => Keep::Winner,
            Some(other) => {
                return Err(ApiError::invalid(format!(
                    "keep must be \"winner\", got {other:?}"
                )))
            }
        };
        let secs = self.timeout_seconds.unwrap_or(DEFAULT_EXPLORE_TIMEOUT);
        if !secs.is_finite() || secs <= 0.0 {
            return Err(ApiError::invalid(format!(
                "timeout_seconds must be a positive number, got {secs}"
            )));
        }
        let timeout = Duration::try_from_secs_f64(secs)
            .map_err(|_| ApiError::invalid("timeout_seconds is out of range"))?;
        let score_regex = self
            .score_regex
            .as_deref()
            .map(ScoreRegex::parse)
            .transpose()?;
        Ok(ExploreCommand::new(
            self.commands,
            timeout,
            score_regex,
            keep,
        )?)
    }
}

/// `POST /v1/sandboxes/{id}/explore`.
pub async fn explore(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    ApiJson(body): ApiJson<ExploreBody>,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    let cmd = body.into_command()?;
    Ok(Json(state.manager.explore(&id, cmd).await?))
}
