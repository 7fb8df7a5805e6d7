//! The step cache of Dockerfile builds (`docs/dockerfile.md`, "Pruning the step cache"):
//! `GET /v1/build-cache` (what it holds) and `POST /v1/build-cache/prune`. Admin keys only
//! (the cache is the server's; `crate::auth::required_permission`).

use axum::extract::State;
use axum::Json;
use serde::Deserialize;

use crate::error::{ApiError, ApiResult};
use crate::extract::json_or_default;
use crate::extract::JsonBytes;
use crate::AppState;

/// `GET /v1/build-cache` → entries, bytes, when the least recently used one was used.
pub async fn usage(State(state): State<AppState>) -> ApiResult<Json<hutch_build::CacheUsage>> {
    Ok(Json(state.builder.cache_usage().await?))
}

/// The body of `POST /v1/build-cache/prune`: what to remove (nothing given: the entries
/// unused for a day, as `docker builder prune` without `--all` removes dangling ones).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PruneBody {
    /// Everything.
    #[serde(default)]
    all: bool,
    /// Entries not used for this many seconds.
    unused_for_seconds: Option<u64>,
    /// Keep at most this many MiB, removing the least recently used entries first.
    keep_mib: Option<u64>,
}

/// The default of a prune that names nothing.
const DEFAULT_UNUSED_FOR_SECONDS: u64 = 24 * 3600;

/// `POST /v1/build-cache/prune` → what was removed and what is left. Waits for running
/// builds to end.
pub async fn prune(
    State(state): State<AppState>,
    JsonBytes(body): JsonBytes,
) -> ApiResult<Json<hutch_build::PruneReport>> {
    let body: PruneBody = json_or_default(&body)?;
    if body.all && (body.unused_for_seconds.is_some() || body.keep_mib.is_some()) {
        return Err(ApiError::bad_request(
            "all removes everything: give it alone, or unused_for_seconds and keep_mib without it",
        ));
    }
    let named = body.all || body.unused_for_seconds.is_some() || body.keep_mib.is_some();
    let policy = hutch_build::PrunePolicy {
        all: body.all,
        unused_for: Some(body.unused_for_seconds)
            .flatten()
            .or((!named).then_some(DEFAULT_UNUSED_FOR_SECONDS))
            .map(std::time::Duration::from_secs),
        keep_bytes: body.keep_mib.map(|m| m.saturating_mul(1 << 20)),
    };
    Ok(Json(state.builder.prune_cache(policy).await?))
}
