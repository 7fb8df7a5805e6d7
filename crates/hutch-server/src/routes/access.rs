//! Which sandboxes a caller may reach: every route on one sandbox checks here first (its
//! own module, so the resource modules that check it need not import each other).

use hutch_core::ids::SandboxId;
use hutch_core::CoreError;

use crate::error::ApiResult;
use crate::extract::Caller;
use crate::AppState;

/// Parse the path's sandbox id and check the caller may see that sandbox (404 otherwise, with
/// the same message as for an unknown id, so ids do not leak across tenants): one lookup by id
/// and tenant. A malformed id is answered as an unknown one. The typed id it returns is what
/// the handler passes on.
pub async fn authorize(state: &AppState, caller: &Caller, id: &str) -> ApiResult<SandboxId> {
    let id: SandboxId = id.parse().map_err(CoreError::from)?;
    if !caller.admin {
        state.manager.authorize(&id, &caller.scope()).await?;
    }
    Ok(id)
}
