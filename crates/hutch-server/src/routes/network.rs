//! `PUT /v1/sandboxes/{id}/network`: replace a sandbox's egress policy at once.

use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use hutch_core::net::policy::PolicySpec;

use crate::auth::AuthorizedSandbox;
use crate::error::ApiResult;
use crate::extract::ApiJson;
use crate::AppState;

/// `PUT /v1/sandboxes/{id}/network {"egress", "allow", "deny"}` → the sandbox. Connections
/// the new policy forbids are cut; a sandbox created with `egress: "none"` cannot gain a
/// network (409).
pub async fn put_network(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    ApiJson(spec): ApiJson<PolicySpec>,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    Ok(Json(state.manager.set_network(&id, spec).await?))
}
