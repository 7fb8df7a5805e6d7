//! `/v1/volumes`: durable volumes.
//!
//! - `POST /v1/volumes {"name", "size_mib"}` → 201 Volume
//! - `GET /v1/volumes` → `{"volumes": [...]}`
//! - `GET /v1/volumes/{id}` → Volume (id or name)
//! - `DELETE /v1/volumes/{id}` → 204 (409 while attached)
//! - `POST /v1/volumes/{id}/check {"repair"?}` → `{"id", "repaired", "report"}` (409 while
//!   attached, or when damage is left)

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use serde::Deserialize;

use crate::error::ApiResult;
use crate::extract::{ApiJson, Caller};
use crate::AppState;

/// `POST /v1/volumes` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeBody {
    name: String,
    size_mib: u64,
}

fn tenant(caller: &Caller) -> Option<&str> {
    (!caller.admin).then_some(caller.tenant.as_str())
}

/// `POST /v1/volumes`.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(body): ApiJson<CreateVolumeBody>,
) -> ApiResult<impl IntoResponse> {
    let v = state
        .manager
        .create_volume(&body.name, body.size_mib, tenant(&caller).map(String::from))
        .await?;
    Ok((StatusCode::CREATED, Json(v)))
}

/// `GET /v1/volumes`.
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<impl IntoResponse> {
    let volumes = state.manager.list_volumes(tenant(&caller))?;
    Ok(Json(serde_json::json!({ "volumes": volumes })))
}

/// `GET /v1/volumes/{id}`.
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(state.manager.get_volume(&id, tenant(&caller))?))
}

/// `DELETE /v1/volumes/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    state.manager.delete_volume(&id, tenant(&caller)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/volumes/{id}/check` body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckVolumeBody {
    #[serde(default)]
    repair: bool,
}

/// `POST /v1/volumes/{id}/check`.
pub async fn check(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<impl IntoResponse> {
    let repair = crate::extract::json_or_default::<CheckVolumeBody>(&body)?.repair;
    Ok(Json(
        state
            .manager
            .check_volume(&id, tenant(&caller), repair)
            .await?,
    ))
}
