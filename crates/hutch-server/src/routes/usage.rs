//! `GET /v1/usage?from=&to=&group_by=sandbox|tenant|key|day&tenant=&key_id=&sandbox_id=`:
//! metered usage (`hutch_core::usage`), summed over the intervals that end in
//! `(from, to]` (RFC 3339 or milliseconds; default: everything up to now), with its cost
//! through the server's rate card.
//!
//! A tenant's key sees its tenant's usage (a key limited by a selector: only what the
//! sandboxes it created used); an admin key everyone's, or one tenant's with `tenant=` (or
//! `X-Hutch-Tenant`).

use axum::extract::State;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use hutch_core::tenant::{Tenant, TenantScope};
use hutch_core::usage::{GroupBy, UsageGroup, UsageQuery, UsageTotals};
use hutch_core::CoreError;
use serde::Deserialize;
use serde_json::{json, Value};

use super::audit::parse_time;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiQuery, Caller};
use crate::AppState;

/// The query of `GET /v1/usage`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageParams {
    from: Option<String>,
    to: Option<String>,
    group_by: Option<String>,
    tenant: Option<String>,
    key_id: Option<String>,
    sandbox_id: Option<String>,
}

/// The JSON of one sum, with its cost when the server has a rate card.
fn totals_view(state: &AppState, usage: &UsageTotals, intervals: u64) -> Value {
    json!({
        "cpu_seconds": usage.cpu_seconds,
        "memory_gib_seconds": usage.memory_gib_seconds,
        "disk_gib_hours": usage.disk_gib_hours,
        "egress_bytes": usage.egress_bytes,
        "cost_micros": state.manager.rate_card().map(|c| c.cost_micros(usage)),
        "intervals": intervals,
    })
}

fn group_view(state: &AppState, group_by: GroupBy, g: &UsageGroup) -> Value {
    let mut v = totals_view(state, &g.usage, g.intervals);
    let field = match group_by {
        GroupBy::Nothing => return v,
        GroupBy::Sandbox => "sandbox_id",
        GroupBy::Tenant => "tenant",
        GroupBy::Key => "key_id",
        GroupBy::Day => "day",
    };
    v[field] = json!(g.key);
    if let Some(kind) = g.kind {
        v["kind"] = json!(kind.as_str());
    }
    v
}

/// `GET /v1/usage`.
pub async fn report(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(q): ApiQuery<UsageParams>,
) -> ApiResult<impl IntoResponse> {
    let scope = match (&q.tenant, caller.scope()) {
        (Some(t), TenantScope::All) => TenantScope::Only(Tenant::new(t.clone())),
        (Some(t), TenantScope::Only(mine)) if t != mine.as_str() => {
            return Err(ApiError::forbidden(
                "a tenant's key reads its own tenant's usage only",
            ))
        }
        (_, scope) => scope,
    };
    let asked_key = q
        .key_id
        .as_deref()
        .map(|k| k.parse().map_err(CoreError::from))
        .transpose()?;
    // A key limited to some sandboxes sees what the sandboxes it made used, no more.
    let key_id = if !caller.admin && !caller.key.selector.is_empty() {
        match asked_key {
            Some(k) if k != caller.key.id => {
                return Err(ApiError::forbidden(
                    "a key limited by a selector reads only its own sandboxes' usage",
                ))
            }
            _ => Some(caller.key.id.clone()),
        }
    } else {
        asked_key
    };
    let resource = q
        .sandbox_id
        .as_deref()
        .map(|s| {
            s.parse::<hutch_core::ids::SandboxId>()
                .map(|id| id.to_string())
                .map_err(CoreError::from)
        })
        .transpose()?;
    let group_by = q
        .group_by
        .as_deref()
        .map(GroupBy::parse)
        .transpose()?
        .unwrap_or_default();
    let from_ms = q
        .from
        .as_deref()
        .map(|v| parse_time("from", v))
        .transpose()?;
    let to_ms = q.to.as_deref().map(|v| parse_time("to", v)).transpose()?;
    if let (Some(f), Some(t)) = (from_ms, to_ms) {
        if f > t {
            return Err(ApiError::invalid("from must not be later than to"));
        }
    }
    let query = UsageQuery {
        scope,
        from_ms,
        to_ms,
        key_id,
        resource,
        group_by,
    };
    let groups = state.manager.usage_report(&query).await?;
    let (total, intervals) = groups
        .iter()
        .fold((UsageTotals::default(), 0), |(t, n), g| {
            (t.plus(&g.usage), n + g.intervals)
        });
    Ok(Json(json!({
        "from": from_ms.map(hutch_core::time::rfc3339),
        "to": to_ms.map(hutch_core::time::rfc3339),
        "group_by": group_by.as_str(),
        "rate_card": state.manager.rate_card(),
        "total": totals_view(&state, &total, intervals),
        "groups": if group_by == GroupBy::Nothing {
            vec![]
        } else {
            groups.iter().map(|g| group_view(&state, group_by, g)).collect::<Vec<_>>()
        },
    })))
}
