//! `PATCH /v1/templates/{name}`: change a ready template's start command (and ready
//! check) or its default isolation, as `hutch template set-start` and `set-isolation` do.
//! Sandboxes created afterwards get the change; running ones, snapshots and hibernated
//! sandboxes keep what they started with. `PUT`/`DELETE /v1/templates/{name}/tags/{tag}`
//! point a tag at a revision or remove it.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use hutch_proto::ServiceSpec;
use serde::Deserialize;

use super::templates::{check_start, may_change, shown, unknown_template};
use crate::error::{ApiError, ApiResult};
use crate::extract::Caller;
use crate::AppState;

/// The body: each field present is changed; `"start": null` removes the start command.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplatePatch {
    #[serde(default, deserialize_with = "present")]
    start: Option<Option<ServiceSpec>>,
    isolation: Option<String>,
}

/// A field that is there, even as `null` (`Some(None)`), apart from one left out (`None`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Whether `caller` may `what` template `name`, which must exist: another tenant's and an
/// unknown name are 404 before the store is touched.
async fn changeable(state: &AppState, caller: &Caller, name: &str, what: &str) -> ApiResult<()> {
    may_change(state, caller, name, what).await?;
    if state.manager.templates().get(name).is_none() {
        return Err(unknown_template(state, caller, name));
    }
    Ok(())
}

/// `PATCH /v1/templates/{name}` → the template as `GET` shows it.
pub async fn patch(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    // Whose template it is comes first: another tenant's is 404 whatever the body says.
    changeable(&state, &caller, &name, "change").await?;
    let patch: TemplatePatch = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
    if patch.start.is_none() && patch.isolation.is_none() {
        return Err(ApiError::bad_request(
            "say what to change: start (a start command, or null to remove it) or isolation (auto, ns or vm)",
        ));
    }
    let start = match patch.start {
        Some(Some(spec)) => Some(Some(check_start(spec)?)),
        other => other,
    };
    if state.builder.building(&name) {
        return Err(ApiError::conflict(format!(
            "template {name:?} is being built: change it once the build ends"
        )));
    }
    let store = state.manager.templates().clone();
    let n = name.clone();
    tokio::task::spawn_blocking(move || -> Result<(), hutch_template::TemplateError> {
        if let Some(isolation) = &patch.isolation {
            store.set_isolation(&n, isolation)?;
        }
        if let Some(start) = start {
            store.set_start(&n, start)?;
        }
        Ok(())
    })
    .await
    .map_err(|e| ApiError::from(hutch_core::CoreError::Task(e)))??;
    shown(&state, &caller, &name).await.map(Json)
}

/// The body of `PUT /v1/templates/{name}/tags/{tag}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TagBody {
    rev: u64,
}

/// `PUT /v1/templates/{name}/tags/{tag}` `{"rev": N}` → the template as `GET` shows it
/// (404 for a revision that is gone).
pub async fn put_tag(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((name, tag)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    changeable(&state, &caller, &name, "tag").await?;
    hutch_template::validate_tag(&tag)?;
    let TagBody { rev } = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
    let store = state.manager.templates().clone();
    let n = name.clone();
    tokio::task::spawn_blocking(move || store.set_tag(&n, &tag, rev))
        .await
        .map_err(|e| ApiError::from(hutch_core::CoreError::Task(e)))??;
    shown(&state, &caller, &name).await.map(Json)
}

/// `DELETE /v1/templates/{name}/tags/{tag}` → 204 (404 for a tag it does not have). The
/// revision stays while something uses it.
pub async fn delete_tag(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((name, tag)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    changeable(&state, &caller, &name, "tag").await?;
    let store = state.manager.templates().clone();
    let (n, t) = (name.clone(), tag.clone());
    let removed = tokio::task::spawn_blocking(move || store.remove_tag(&n, &t))
        .await
        .map_err(|e| ApiError::from(hutch_core::CoreError::Task(e)))??;
    if !removed {
        return Err(ApiError::not_found(format!(
            "template {name:?} has no tag {tag:?}"
        )));
    }
    if let Err(e) = state.manager.collect_template_revisions().await {
        tracing::warn!(error = %e, "collecting unused template revisions");
    }
    Ok(StatusCode::NO_CONTENT)
}
