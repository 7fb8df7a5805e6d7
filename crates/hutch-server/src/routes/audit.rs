//! `GET /v1/audit?key_id=&sandbox_id=&since=&until=&tenant=&limit=&cursor=`: the audit log
//! (full and admin keys; `auth.rs` requires it), oldest first, paginated (`routes/page.rs`).
//! A tenant's key reads its tenant's entries; an admin key every entry, or one tenant's
//! with `tenant=` (or `X-Hutch-Tenant`). Times are RFC 3339 or milliseconds since the epoch.

use axum::extract::State;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use hutch_core::audit::AuditQuery;
use hutch_core::tenant::{Tenant, TenantScope};
use hutch_core::CoreError;
use serde::Deserialize;

use super::page::{listing_error, page_answer, page_request};
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiQuery, Caller};
use crate::AppState;

/// The query of `GET /v1/audit`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditParams {
    key_id: Option<String>,
    sandbox_id: Option<String>,
    tenant: Option<String>,
    since: Option<String>,
    until: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

/// `2025-05-20T12:00:00Z` (or with a fraction of a second) or milliseconds since the epoch.
pub(crate) fn parse_time(name: &str, v: &str) -> ApiResult<i64> {
    if let Ok(ms) = v.parse::<i64>() {
        return Ok(ms);
    }
    hutch_proto::time::parse_rfc3339_millis(v).ok_or_else(|| {
        ApiError::bad_request(format!(
            "{name} must be an RFC 3339 time (2025-05-20T12:00:00Z) or milliseconds since the epoch, got {v:?}"
        ))
    })
}

/// `GET /v1/audit`.
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(q): ApiQuery<AuditParams>,
) -> ApiResult<impl IntoResponse> {
    let scope = match (&q.tenant, caller.scope()) {
        (Some(t), TenantScope::All) => TenantScope::Only(Tenant::new(t.clone())),
        (Some(t), TenantScope::Only(mine)) if t != mine.as_str() => {
            return Err(ApiError::forbidden(
                "a tenant's key reads its own tenant's audit log only",
            ))
        }
        (_, scope) => scope,
    };
    let query = AuditQuery {
        scope,
        key_id: q
            .key_id
            .as_deref()
            .map(|k| k.parse().map_err(CoreError::from))
            .transpose()?,
        sandbox: q
            .sandbox_id
            .as_deref()
            .map(|s| s.parse().map_err(CoreError::from))
            .transpose()?,
        since_ms: q
            .since
            .as_deref()
            .map(|v| parse_time("since", v))
            .transpose()?,
        until_ms: q
            .until
            .as_deref()
            .map(|v| parse_time("until", v))
            .transpose()?,
    };
    let page = page_request(q.limit.as_deref(), q.cursor.as_deref())?;
    let entries = state
        .manager
        .list_audit(&query, &page)
        .await
        .map_err(listing_error)?;
    Ok(Json(page_answer("entries", entries.map(|e| e.view()))))
}
