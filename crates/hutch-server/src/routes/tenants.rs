//! `/v1/tenants`: the tenants of this server (admin keys only; `auth.rs` requires it).
//!
//! - `POST /v1/tenants {"name", "quotas"?, "defaults"?, "allowed_templates"?}` → 201 Tenant
//! - `GET /v1/tenants?limit=&cursor=` → `{"tenants": [...], "next_cursor"?}`
//! - `GET /v1/tenants/{name}` → Tenant with its `usage` now
//! - `PATCH /v1/tenants/{name}` → Tenant (each part given replaces that part)
//! - `DELETE /v1/tenants/{name}` → 204; its keys are revoked; 409 while it owns sandboxes,
//!   snapshots, volumes or templates

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use hutch_core::tenant::quota::TenantUsage;
use hutch_core::tenant::settings::{TenantRecord, TenantSettings, TenantUpdate};
use hutch_core::tenant::Tenant;
use serde::Deserialize;

use super::page::{listing_error, page_answer, PageParams};
use crate::error::ApiResult;
use crate::extract::{ApiJson, ApiQuery};
use crate::AppState;

/// `POST /v1/tenants` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTenantBody {
    name: String,
    quotas: Option<hutch_core::tenant::settings::Quotas>,
    defaults: Option<hutch_core::tenant::settings::SandboxDefaults>,
    allowed_templates: Option<Vec<String>>,
}

/// A tenant as the API shows it.
pub fn tenant_view(t: &TenantRecord) -> serde_json::Value {
    serde_json::json!({
        "name": t.name,
        "quotas": t.settings.quotas,
        "defaults": t.settings.defaults,
        "allowed_templates": t.settings.allowed_templates,
        "created_at": hutch_core::time::rfc3339(t.created_at_ms),
    })
}

fn usage_view(u: &TenantUsage) -> serde_json::Value {
    serde_json::json!({
        "sandboxes": u.sandboxes,
        "cpus": u.cpus,
        "memory_mib": u.memory_mib,
        "creates_last_hour": u.creates_last_hour,
    })
}

/// `POST /v1/tenants`.
pub async fn create(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateTenantBody>,
) -> ApiResult<impl IntoResponse> {
    let name = Tenant::parse(&body.name)?;
    let settings = TenantSettings {
        quotas: body.quotas.unwrap_or_default(),
        defaults: body.defaults.unwrap_or_default(),
        allowed_templates: body.allowed_templates,
    };
    let t = state.manager.create_tenant(name, settings).await?;
    Ok((StatusCode::CREATED, Json(tenant_view(&t))))
}

/// `GET /v1/tenants`.
pub async fn list(
    State(state): State<AppState>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<impl IntoResponse> {
    let tenants = state
        .manager
        .list_tenants(&page.request()?)
        .await
        .map_err(listing_error)?;
    Ok(Json(page_answer(
        "tenants",
        tenants.map(|t| tenant_view(&t)),
    )))
}

/// `GET /v1/tenants/{name}`: with what its sandboxes use now.
pub async fn get(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let name = Tenant::new(name);
    let t = state.manager.tenant(&name).await?;
    let usage = state.manager.tenant_usage(&name).await?;
    let mut view = tenant_view(&t);
    view["usage"] = usage_view(&usage);
    Ok(Json(view))
}

/// `PATCH /v1/tenants/{name}`.
pub async fn update(
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiJson(update): ApiJson<TenantUpdate>,
) -> ApiResult<impl IntoResponse> {
    let t = state
        .manager
        .update_tenant(&Tenant::new(name), &update)
        .await?;
    Ok(Json(tenant_view(&t)))
}

/// `DELETE /v1/tenants/{name}`: its keys stop working at once, open streams included.
pub async fn delete(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    let keys = state.manager.delete_tenant(&Tenant::new(name)).await?;
    state.keys_revoked(&keys);
    Ok(StatusCode::NO_CONTENT)
}
