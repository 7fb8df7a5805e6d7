//! `/v1/volumes`: durable volumes.
//!
//! - `POST /v1/volumes {"name", "size_mib"}` → 201 Volume
//! - `GET /v1/volumes?limit=&cursor=` → `{"volumes": [...], "next_cursor"?}` (`routes/page.rs`)
//! - `GET /v1/volumes/{id}` → Volume (id or name)
//! - `DELETE /v1/volumes/{id}` → 204 (409 while attached)
//! - `POST /v1/volumes/{id}/check {"repair"?}` → `{"id", "repaired", "report"}` (409 while
//!   attached, or when damage is left)

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use serde::Deserialize;

use super::page::{listing_error, page_answer, PageParams};
use crate::error::ApiResult;
use crate::extract::{ApiJson, ApiQuery, Caller};
use crate::AppState;

/// `POST /v1/volumes` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeBody {
    name: String,
    size_mib: u64,
}

/// `POST /v1/volumes`.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(body): ApiJson<CreateVolumeBody>,
) -> ApiResult<impl IntoResponse> {
    let v = state
        .manager
        .create_volume(
            &body.name,
            body.size_mib,
            (!caller.admin).then(|| caller.tenant.clone()),
        )
        .await?;
    Ok((StatusCode::CREATED, Json(v)))
}

/// `GET /v1/volumes`.
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<impl IntoResponse> {
    let volumes = state
        .manager
        .list_volumes(&caller.scope(), &page.request()?)
        .await
        .map_err(listing_error)?;
    Ok(Json(page_answer("volumes", volumes)))
}

/// `GET /v1/volumes/{id}`.
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(state.manager.get_volume(&id, &caller.scope()).await?))
}

/// `DELETE /v1/volumes/{id}`.
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    state.manager.delete_volume(&id, &caller.scope()).await?;
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
            .check_volume(&id, &caller.scope(), repair)
            .await?,
    ))
}
