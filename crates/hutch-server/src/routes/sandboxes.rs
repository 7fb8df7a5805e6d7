//! `/v1/sandboxes`: create, list (paginated: `routes/page.rs`), get, update, kill, usage.
//!
//! Every call on one sandbox starts with `access::authorize`: one indexed lookup of the id
//! within the caller's tenant.

use std::collections::BTreeMap;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use hutch_core::model::{
    CreateSandbox, IsolationRequest, ListFilter, SandboxState, UpdateSandbox, TENANT_KEY,
};
use hutch_core::tenant::Tenant;
use serde::Deserialize;

use crate::auth::AuthorizedSandbox;
use crate::error::{ApiError, ApiResult};
use crate::extract::{json_or_default, ApiJson, Caller, JsonBytes};
use crate::AppState;

/// `POST /v1/sandboxes` body.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    template: Option<String>,
    isolation: Option<IsolationRequest>,
    ttl_seconds: Option<u64>,
    persistent: Option<bool>,
    metadata: Option<BTreeMap<String, String>>,
    env: Option<BTreeMap<String, String>>,
    cpus: Option<f64>,
    memory_mib: Option<u64>,
    disk_mib: Option<u64>,
    pids_max: Option<u32>,
    snapshot: Option<String>,
    network: Option<hutch_core::net::policy::PolicySpec>,
    volumes: Option<Vec<hutch_core::volume::VolumeMount>>,
    idle_hibernate_seconds: Option<u64>,
    max_cost_micros: Option<u64>,
}

/// Validate an environment map: names are non-empty, without `=` or NUL; values without NUL.
pub fn validate_env(env: &BTreeMap<String, String>) -> ApiResult<()> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(ApiError::invalid(format!(
                "invalid environment variable name {k:?}"
            )));
        }
        if v.contains('\0') {
            return Err(ApiError::invalid(format!(
                "environment variable {k} contains a NUL byte"
            )));
        }
    }
    Ok(())
}

fn validate_metadata(m: &BTreeMap<String, String>) -> ApiResult<()> {
    if m.len() > 64 {
        return Err(ApiError::invalid("metadata may have at most 64 keys"));
    }
    for (k, v) in m {
        if k.is_empty() || k.len() > 128 || v.len() > 1024 {
            return Err(ApiError::invalid(format!(
                "metadata key {k:?}: keys must be 1-128 bytes and values at most 1024 bytes"
            )));
        }
    }
    Ok(())
}

/// A template reference Hutch accepts: a name of 1-64 of `[A-Za-z0-9._-]`, not starting
/// with `.`, alone (the newest revision), with `@rev` or with `:tag`.
pub fn validate_template_name(reference: &str) -> ApiResult<()> {
    let t = hutch_template::TemplateRef::parse(reference)
        .map_err(ApiError::invalid)?
        .name();
    let ok = !t.is_empty()
        && t.len() <= 64
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !t.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "invalid template name {reference:?}"
        )))
    }
}

/// Give `metadata` every pair of the caller's key selector (a key limited to `team=ml`
/// makes and keeps only sandboxes with `team=ml`); 403 for a pair it contradicts.
fn keep_selector(caller: &Caller, metadata: &mut BTreeMap<String, String>) -> ApiResult<()> {
    for (k, v) in &caller.key.selector {
        match metadata.get(k) {
            None => {
                metadata.insert(k.clone(), v.clone());
            }
            Some(mine) if mine == v => {}
            Some(mine) => {
                return Err(ApiError::forbidden(format!(
                    "this key reaches only sandboxes with {k}={v}, not {k}={mine}"
                )))
            }
        }
    }
    Ok(())
}

impl CreateBody {
    fn into_command(self, caller: &Caller) -> ApiResult<CreateSandbox> {
        if let Some(t) = &self.template {
            validate_template_name(t)?;
        }
        let env = self.env.unwrap_or_default();
        validate_env(&env)?;
        let mut metadata = self.metadata.unwrap_or_default();
        validate_metadata(&metadata)?;
        keep_selector(caller, &mut metadata)?;
        // The tenant is its own field: the caller's, or the one an admin names.
        let named = metadata.remove(TENANT_KEY).map(Tenant::new);
        let tenant = if caller.admin {
            named
        } else {
            Some(caller.tenant.clone())
        };
        if self.cpus.is_some_and(|c| !c.is_finite()) {
            return Err(ApiError::invalid("cpus must be a finite number"));
        }
        Ok(CreateSandbox {
            template: self.template,
            isolation: self.isolation.unwrap_or_default(),
            ttl_seconds: self.ttl_seconds,
            persistent: self.persistent.unwrap_or(false),
            tenant,
            metadata,
            env,
            cpus: self.cpus,
            memory_mib: self.memory_mib,
            disk_mib: self.disk_mib,
            pids_max: self.pids_max,
            network: self.network,
            snapshot: self.snapshot,
            idle_hibernate_seconds: self.idle_hibernate_seconds,
            volumes: self.volumes.unwrap_or_default(),
            created_by: Some(caller.key.id.clone()),
            max_cost_micros: self.max_cost_micros,
            id: None,
        })
    }
}

/// `POST /v1/sandboxes`.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    placed: Option<Extension<crate::PlacedSandboxId>>,
    JsonBytes(body): JsonBytes,
) -> ApiResult<impl IntoResponse> {
    let body: CreateBody = json_or_default(&body)?;
    let mut cmd = body.into_command(&caller)?;
    cmd.id = placed.map(|Extension(p)| p.0);
    if let Some(s) = &cmd.snapshot {
        cmd.snapshot = Some(super::lifecycle::resolve_snapshot(&state, &caller, s).await?);
    }
    let view = state.manager.create(cmd).await?;
    Ok((StatusCode::CREATED, Json(view)))
}

/// `GET /v1/sandboxes?state=running&metadata.KEY=VALUE&limit=N&cursor=C`.
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> ApiResult<impl IntoResponse> {
    let mut filter = ListFilter::default();
    let (mut limit, mut cursor) = (None, None);
    for (k, v) in url_pairs(query.as_deref().unwrap_or("")) {
        if k == "limit" {
            limit = Some(v);
        } else if k == "cursor" {
            cursor = Some(v);
        } else if k == "state" {
            filter.state = Some(SandboxState::parse(&v).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "unknown state {v:?}; expected one of starting, running, paused, hibernated, stopped, failed, lost"
                ))
            })?);
        } else if let Some(key) = k.strip_prefix("metadata.") {
            filter.metadata.insert(key.to_string(), v);
        } else {
            return Err(ApiError::bad_request(format!(
                "unknown query parameter {k:?}; use state=, metadata.KEY=, limit= or cursor="
            )));
        }
    }
    let page = super::page::page_request(limit.as_deref(), cursor.as_deref())?;
    // A key limited by a selector lists only what it selects (nothing, when the query
    // asks for another value of one of its pairs).
    let mut selected = filter.metadata.clone();
    if keep_selector(&caller, &mut selected).is_err() {
        return Ok(Json(super::page::page_answer(
            "sandboxes",
            hutch_core::store::Page::<serde_json::Value> {
                items: vec![],
                next: None,
            },
        )));
    }
    filter.metadata = selected;
    let sandboxes = state
        .manager
        .list(&filter, &caller.scope(), &page)
        .await
        .map_err(super::page::listing_error)?;
    Ok(Json(super::page::page_answer("sandboxes", sandboxes)))
}

/// Decode `a=b&c=d` with percent-decoding and `+` as space.
pub fn url_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET /v1/sandboxes/{id}`.
pub async fn get(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    Ok(Json(state.manager.get(&id).await?))
}

/// `PATCH /v1/sandboxes/{id}` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateBody {
    ttl_seconds: Option<u64>,
    persistent: Option<bool>,
    metadata: Option<BTreeMap<String, String>>,
    idle_hibernate_seconds: Option<u64>,
}

/// `PATCH /v1/sandboxes/{id}`.
pub async fn update(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    sandbox: AuthorizedSandbox,
    ApiJson(body): ApiJson<UpdateBody>,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    let mut metadata = body.metadata;
    if let Some(m) = &mut metadata {
        validate_metadata(m)?;
        keep_selector(&caller, m)?;
    }
    // A tenant's metadata cannot move its sandbox; an admin's replaces the tenant with the
    // `tenant_id` it names (or none), as the metadata map it replaces held it.
    let named = metadata
        .as_mut()
        .map(|m| m.remove(TENANT_KEY).map(Tenant::new));
    let tenant = if caller.admin { named } else { None };
    Ok(Json(
        state
            .manager
            .update(
                &id,
                UpdateSandbox {
                    ttl_seconds: body.ttl_seconds,
                    persistent: body.persistent,
                    metadata,
                    tenant,
                    idle_hibernate_seconds: body.idle_hibernate_seconds,
                },
            )
            .await?,
    ))
}

/// `DELETE /v1/sandboxes/{id}`.
pub async fn kill(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    state.manager.kill(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/sandboxes/{id}/usage`: memory, CPU, tasks and OOM kills right now.
pub async fn usage(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    let usage = state.manager.usage(&id).await?;
    Ok(Json(
        serde_json::json!({ "sandbox_id": id, "usage": usage }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_query_pairs() {
        assert_eq!(
            url_pairs("state=running&metadata.tenant_id=a%20b+c&x"),
            vec![
                ("state".into(), "running".into()),
                ("metadata.tenant_id".into(), "a b c".into()),
                ("x".into(), "".into())
            ]
        );
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
