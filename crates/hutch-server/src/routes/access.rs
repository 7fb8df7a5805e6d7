//! Which sandboxes a caller may reach: every route on one sandbox checks here first (its
//! own module, so the resource modules that check it need not import each other).

use crate::error::ApiResult;
use crate::extract::Caller;
use crate::AppState;

/// Check the caller may see sandbox `id` (404 otherwise, with the same message as for an
/// unknown id, so ids do not leak across tenants): one lookup by id and tenant.
pub async fn authorize(state: &AppState, caller: &Caller, id: &str) -> ApiResult<()> {
    if caller.admin {
        return Ok(());
    }
    Ok(state.manager.authorize(id, &caller.scope()).await?)
}
