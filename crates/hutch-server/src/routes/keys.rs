//! `/v1/keys`: API keys (full and admin keys; `auth.rs` requires it).
//!
//! - `POST /v1/keys {"tenant"?, "scope"?, "name"?, "selector"?, "expires_in_seconds"?,
//!   "format"?}` → 201 Key with its `secret`, shown this once
//! - `GET /v1/keys?limit=&cursor=` → `{"keys": [...], "next_cursor"?}`
//! - `GET /v1/keys/{id}` → Key
//! - `PATCH /v1/keys/{id} {"daily_budget"?, "monthly_budget"?}` → Key: its spending caps
//! - `DELETE /v1/keys/{id}` → 204: the key stops working at once, and whatever it holds
//!   open (streams, terminals, tunnels) is closed
//!
//! A key makes only keys narrower than itself (`NewKey::narrowed_by`), and sees only the
//! keys of its tenant whose selector holds its own.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use hutch_core::ids::KeyId;
use hutch_core::tenant::keys::{KeyBudget, KeyFormat, KeyRecord, KeyScope, NewKey};
use hutch_core::tenant::Tenant;
use hutch_core::CoreError;
use serde::Deserialize;

use super::page::{listing_error, page_answer, PageParams};
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiQuery, Caller};
use crate::AppState;

/// Longest life a key may be given, in seconds (ten years).
const MAX_KEY_LIFE_SECONDS: u64 = 10 * 365 * 24 * 3600;

/// `POST /v1/keys` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateKeyBody {
    tenant: Option<String>,
    scope: Option<KeyScope>,
    name: Option<String>,
    selector: Option<BTreeMap<String, String>>,
    expires_in_seconds: Option<u64>,
    format: Option<KeyFormat>,
    daily_budget: Option<u64>,
    monthly_budget: Option<u64>,
}

/// `PATCH /v1/keys/{id}` body: the key's spending caps, both replaced (`null` or left out:
/// no cap).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateKeyBody {
    daily_budget: Option<u64>,
    monthly_budget: Option<u64>,
}

impl CreateKeyBody {
    fn into_new_key(self, caller: &Caller) -> ApiResult<NewKey> {
        let scope = self.scope.unwrap_or(KeyScope::Full);
        let tenant = match (self.tenant, scope) {
            (Some(t), _) => Tenant::new(t),
            (None, KeyScope::Admin) => caller.tenant.clone(),
            (None, _) if caller.admin => {
                return Err(ApiError::invalid(
                    "tenant is required: the tenant the key acts for (or send X-Hutch-Tenant)",
                ))
            }
            (None, _) => caller.tenant.clone(),
        };
        let expires_at_ms = match self.expires_in_seconds {
            None => None,
            Some(s) if (1..=MAX_KEY_LIFE_SECONDS).contains(&s) => {
                Some(hutch_core::time::now_ms() + i64::try_from(s * 1000).unwrap_or(i64::MAX))
            }
            Some(s) => {
                return Err(ApiError::invalid(format!(
                    "expires_in_seconds must be from 1 to {MAX_KEY_LIFE_SECONDS}, got {s}"
                )))
            }
        };
        Ok(NewKey {
            tenant,
            scope,
            name: self.name,
            selector: self.selector.unwrap_or_default(),
            expires_at_ms,
            format: self.format.unwrap_or_default(),
            budget: KeyBudget {
                daily_budget: self.daily_budget,
                monthly_budget: self.monthly_budget,
            },
        })
    }
}

/// Whether `caller` may see key `k`: an admin any; a tenant's key those of its tenant
/// whose selector holds every pair of its own.
fn sees(caller: &Caller, k: &KeyRecord) -> bool {
    caller.scope().allows(Some(&k.tenant))
        && caller
            .key
            .selector
            .iter()
            .all(|(name, v)| k.selector.get(name) == Some(v))
}

/// `POST /v1/keys` → 201 with the secret in `secret`.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(body): ApiJson<CreateKeyBody>,
) -> ApiResult<impl IntoResponse> {
    let new = body.into_new_key(&caller)?.narrowed_by(&caller.key)?;
    let created = state.manager.create_key(new).await?;
    let mut view = created.key.view();
    view["secret"] = created.secret.into();
    Ok((StatusCode::CREATED, Json(view)))
}

/// `GET /v1/keys`.
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<impl IntoResponse> {
    let keys = state
        .manager
        .list_keys(&caller.scope(), &page.request()?)
        .await
        .map_err(listing_error)?;
    let mut page = keys;
    page.items.retain(|k| sees(&caller, k));
    Ok(Json(page_answer("keys", page.map(|k| k.view()))))
}

fn key_id(raw: &str) -> ApiResult<KeyId> {
    Ok(raw.parse().map_err(CoreError::from)?)
}

/// `GET /v1/keys/{id}`.
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let id = key_id(&id)?;
    let key = state.manager.get_key(&id, &caller.scope()).await?;
    if !sees(&caller, &key) {
        return Err(CoreError::NotFound(format!("API key {id} does not exist")).into());
    }
    Ok(Json(key.view()))
}

/// `PATCH /v1/keys/{id}`: set the key's spending caps (`Manager::set_key_budget` says who
/// may).
pub async fn update(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<UpdateKeyBody>,
) -> ApiResult<impl IntoResponse> {
    let id = key_id(&id)?;
    let key = state.manager.get_key(&id, &caller.scope()).await?;
    if !sees(&caller, &key) {
        return Err(CoreError::NotFound(format!("API key {id} does not exist")).into());
    }
    let budget = KeyBudget {
        daily_budget: body.daily_budget,
        monthly_budget: body.monthly_budget,
    };
    let key = state
        .manager
        .set_key_budget(&id, budget, &caller.key, &caller.scope())
        .await?;
    Ok(Json(key.view()))
}

/// `DELETE /v1/keys/{id}` → 204.
pub async fn revoke(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let id = key_id(&id)?;
    let key = state.manager.get_key(&id, &caller.scope()).await?;
    if !sees(&caller, &key) {
        return Err(CoreError::NotFound(format!("API key {id} does not exist")).into());
    }
    state.manager.revoke_key(&id, &caller.scope()).await?;
    state.keys_revoked(std::slice::from_ref(&id));
    Ok(StatusCode::NO_CONTENT)
}
