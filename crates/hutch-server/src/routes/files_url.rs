//! Signed file URLs: `POST /v1/sandboxes/{id}/files/url` makes a URL that reads (GET) or
//! writes (PUT) one file of one sandbox, as one user, until it expires, without the API key;
//! [`verify`] is how `GET`/`PUT …/files` accept such a URL. The signature scheme is the
//! sandbox tokens' (`hutch_core::sandbox_token`, one secret and one MAC); see `docs/api.md`.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use hutch_core::ids::SandboxId;
use hutch_core::sandbox_token::{FileGrant, FileOp, TokenError};
use serde::Deserialize;

use crate::auth::authorize_sandbox as authorize;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, Caller};
use crate::AppState;

/// Life of a file URL when the request gives none, in seconds.
pub const DEFAULT_EXPIRES_IN_SECONDS: u64 = 300;
/// Longest life of a file URL, in seconds (7 days).
pub const MAX_EXPIRES_IN_SECONDS: u64 = 7 * 24 * 3600;
/// Longest `user` a file URL may name.
const MAX_USER_LEN: usize = 256;

/// `POST /v1/sandboxes/{id}/files/url` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileUrlBody {
    path: String,
    op: FileOp,
    expires_in_seconds: Option<u64>,
    user: Option<String>,
}

/// Check a `user` given to the file routes: a name or uid, no control characters.
pub(crate) fn check_user(user: &str) -> ApiResult<()> {
    if user.is_empty() || user.len() > MAX_USER_LEN || user.chars().any(char::is_control) {
        return Err(ApiError::bad_request(format!(
            "user must be a user name or uid of the sandbox (1 to {MAX_USER_LEN} characters, no control characters)"
        )));
    }
    Ok(())
}

/// `POST /v1/sandboxes/{id}/files/url {"path", "op", "expires_in_seconds"?, "user"?}` →
/// `201 {"url", "method", "expires_at"}`.
pub async fn file_url(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<FileUrlBody>,
) -> ApiResult<impl IntoResponse> {
    let id = authorize(&state, &caller, &id).await?;
    super::files::check_path(&body.path)?;
    if let Some(user) = &body.user {
        check_user(user)?;
    }
    let expires_in = body
        .expires_in_seconds
        .unwrap_or(DEFAULT_EXPIRES_IN_SECONDS);
    if !(1..=MAX_EXPIRES_IN_SECONDS).contains(&expires_in) {
        return Err(ApiError::invalid(format!(
            "expires_in_seconds must be from 1 to {MAX_EXPIRES_IN_SECONDS} (7 days), got {expires_in}"
        )));
    }
    // 404 for a sandbox that is gone, also for admin keys.
    state.manager.get(&id).await?;
    let expires = hutch_core::time::now_ms() / 1000 + expires_in as i64;
    let grant = FileGrant::new(
        id.as_str(),
        &body.path,
        body.op,
        body.user.as_deref(),
        expires,
    );
    let signature = state.manager.sandbox_tokens().sign_file_url(&grant);
    let expires_text = expires.to_string();
    let mut pairs = vec![("path", body.path.as_str())];
    if let Some(user) = &body.user {
        pairs.push(("user", user.as_str()));
    }
    pairs.push(("expires", expires_text.as_str()));
    pairs.push(("signature", signature.as_str()));
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1:7700");
    let url = format!(
        "{}://{host}/v1/sandboxes/{id}/files?{}",
        state.scheme(),
        hutch_proto::query::build(&pairs)
    );
    let method = match body.op {
        FileOp::Read => "GET",
        FileOp::Write => "PUT",
    };
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({
            "url": url,
            "method": method,
            "op": body.op,
            "path": body.path,
            "user": body.user,
            "expires_at": hutch_core::time::rfc3339(expires * 1000),
        })),
    ))
}

/// The signed part of a file request's query.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Signed<'a> {
    /// `expires=`: Unix seconds.
    pub expires: Option<i64>,
    /// `signature=`.
    pub signature: &'a str,
}

/// Accept a request without a key when its signature verifies for exactly this request:
/// sandbox `id`, `path`, `op` (from the method), `user` and `expires`. A mismatch is 403
/// (the URL is refused, whatever it was made for); an expired URL is 403 naming when it
/// expired. The sandbox itself is looked up by the caller (404 once it is gone).
pub(crate) fn verify(
    state: &AppState,
    id: &str,
    path: &str,
    op: FileOp,
    user: Option<&str>,
    signed: Signed<'_>,
) -> ApiResult<SandboxId> {
    let Some(expires) = signed.expires else {
        return Err(ApiError::unauthorized(
            "a signed file URL carries both expires and signature (make one with POST /v1/sandboxes/{id}/files/url)",
        ));
    };
    let grant = FileGrant::new(id, path, op, user, expires);
    let now = hutch_core::time::now_ms();
    match state
        .manager
        .sandbox_tokens()
        .verify_file_url(&grant, signed.signature, now)
    {
        Ok(()) => {}
        Err(TokenError::Expired) => {
            return Err(ApiError::forbidden(format!(
                "this file URL expired at {}: ask for a new one",
                hutch_core::time::rfc3339(expires.saturating_mul(1000))
            )))
        }
        Err(_) => {
            return Err(ApiError::forbidden(format!(
                "the file URL's signature does not match this request: it was made for another sandbox, path, user or operation (this is a {} of {path}), or altered",
                op.as_str()
            )))
        }
    }
    id.parse()
        .map_err(|_| ApiError::forbidden("the file URL's signature does not match this request"))
}
