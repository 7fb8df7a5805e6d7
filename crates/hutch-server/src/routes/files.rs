//! `/v1/sandboxes/{id}/files…`: read, write, remove, list, stat, mkdir, move, and directory
//! trees as tar streams (`files/archive`).
//!
//! Paths are resolved by the agent inside the sandbox's own root, so `..` cannot leave it.
//! Reads and writes take `user` (the file is opened as that user of the sandbox) and accept
//! a signed URL instead of the key (`files_url.rs`); watches are in `files_watch.rs`.
//! Archives are made and unpacked by the agent too: the server relays their bytes and never
//! reads an entry.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::TryStreamExt;
use hutch_core::ids::SandboxId;
use hutch_core::sandbox_token::FileOp;
use hutch_proto::file_metadata;
use serde::Deserialize;

use super::files_url;
use crate::auth::{authorize_sandbox, AuthorizedSandbox};
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiQuery, Caller};
use crate::AppState;

/// Headers of an upload that carry the file's metadata: `X-Hutch-Meta-<key>: <value>`.
pub const METADATA_HEADER_PREFIX: &str = "x-hutch-meta-";

/// `?path=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    path: String,
}

/// `?path=[&user=][&expires=&signature=]` of a read.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadQuery {
    path: String,
    user: Option<String>,
    expires: Option<i64>,
    signature: Option<String>,
}

/// `?path=&mode=[&user=][&expires=&signature=]` of a write.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteQuery {
    path: String,
    mode: Option<String>,
    user: Option<String>,
    expires: Option<i64>,
    signature: Option<String>,
}

/// `?path=&recursive=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveQuery {
    path: String,
    recursive: Option<bool>,
}

/// `?path=&depth=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    path: String,
    depth: Option<u32>,
}

/// `{"path"}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MkdirBody {
    path: String,
}

/// `{"from", "to"}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveBody {
    from: String,
    to: String,
}

/// Check a path from a request: absolute, without NUL bytes (400 otherwise).
pub(crate) fn check_path(p: &str) -> ApiResult<()> {
    if !p.starts_with('/') {
        return Err(ApiError::bad_request(format!(
            "path must be absolute, got {p:?}"
        )));
    }
    if p.contains('\0') {
        return Err(ApiError::bad_request("path must not contain NUL bytes"));
    }
    Ok(())
}

/// Parse an octal mode such as `0644` or `755`.
fn parse_mode(m: &str) -> ApiResult<u32> {
    let digits = m.strip_prefix("0o").unwrap_or(m);
    match u32::from_str_radix(digits, 8) {
        Ok(v) if v <= 0o7777 => Ok(v),
        _ => Err(ApiError::bad_request(format!(
            "mode must be octal permission bits like 0644, got {m:?}"
        ))),
    }
}

/// A response streaming what the agent sends, as `content_type`.
fn streamed_answer<S, E>(stream: S, content_type: &'static str) -> Response
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, E>> + Send + 'static,
    E: std::fmt::Display,
{
    let body = Body::from_stream(stream.map_err(|e| std::io::Error::other(e.to_string())));
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// A request body as the byte stream the agent is fed from.
fn upload_stream(
    body: Body,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static {
    body.into_data_stream()
        .map_err(|e| std::io::Error::other(e.to_string()))
}

/// Who may touch a file: the key's caller (checked against the sandbox), or, without a key,
/// a signed URL for exactly this request ([`files_url::verify`]).
fn access<'a>(
    caller: Option<Caller>,
    expires: Option<i64>,
    signature: Option<&'a str>,
) -> ApiResult<Result<Caller, files_url::Signed<'a>>> {
    match (caller, signature) {
        (Some(caller), _) => Ok(Ok(caller)),
        (None, Some(signature)) => Ok(Err(files_url::Signed { expires, signature })),
        // The auth layer lets a request without a key through only with a signature.
        (None, None) => Err(ApiError::unauthorized(
            "missing `Authorization: Bearer <key>` header",
        )),
    }
}

/// The sandbox of a file request, by the key's caller or by the URL's signature.
async fn file_sandbox(
    state: &AppState,
    access: Result<Caller, files_url::Signed<'_>>,
    id: &str,
    path: &str,
    op: FileOp,
    user: Option<&str>,
) -> ApiResult<SandboxId> {
    check_path(path)?;
    if let Some(user) = user {
        files_url::check_user(user)?;
    }
    match access {
        Ok(caller) => authorize_sandbox(state, &caller, id).await,
        Err(signed) => files_url::verify(state, id, path, op, user, signed),
    }
}

/// `GET /v1/sandboxes/{id}/files?path=[&user=]` → raw bytes (read as `user`, if given). With
/// `expires=&signature=` from `POST …/files/url`, no key is needed.
pub async fn read(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> ApiResult<Response> {
    let access = access(caller.map(|c| c.0), q.expires, q.signature.as_deref())?;
    let user = q.user.as_deref();
    let id = file_sandbox(&state, access, &id, &q.path, FileOp::Read, user).await?;
    let agent = state.manager.agent(&id).await?;
    let stream = state
        .manager
        .agent_call(&id, agent.read_file_as(&q.path, user).await)
        .await?;
    Ok(streamed_answer(stream, "application/octet-stream"))
}

/// `PUT /v1/sandboxes/{id}/files?path=&mode=[&user=]` with raw bytes → 204 (written as
/// `user`, if given). Each `X-Hutch-Meta-<key>: <value>` header becomes one pair of the
/// file's metadata (its `user.<key>` extended attribute). With `expires=&signature=` from
/// `POST …/files/url`, no key is needed.
pub async fn write(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<WriteQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<StatusCode> {
    let access = access(caller.map(|c| c.0), q.expires, q.signature.as_deref())?;
    let user = q.user.as_deref();
    let metadata = file_metadata::from_headers(&headers, METADATA_HEADER_PREFIX, "")
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let id = file_sandbox(&state, access, &id, &q.path, FileOp::Write, user).await?;
    let mode = q.mode.as_deref().map(parse_mode).transpose()?;
    let agent = state.manager.agent(&id).await?;
    let stream = upload_stream(body);
    state
        .manager
        .agent_call(
            &id,
            agent
                .write_file_as(&q.path, mode, user, &metadata, stream)
                .await,
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/sandboxes/{id}/files/archive?path=` → a tar stream of the directory (or file).
pub async fn read_archive(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<Response> {
    let id = sandbox.id;
    check_path(&q.path)?;
    let agent = state.manager.agent(&id).await?;
    let stream = state
        .manager
        .agent_call(&id, agent.read_archive(&q.path).await)
        .await?;
    Ok(streamed_answer(stream, "application/x-tar"))
}

/// `PUT /v1/sandboxes/{id}/files/archive?path=` with a tar stream → 204: unpacked by the
/// agent below the directory `path`.
pub async fn write_archive(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    ApiQuery(q): ApiQuery<PathQuery>,
    body: Body,
) -> ApiResult<StatusCode> {
    let id = sandbox.id;
    check_path(&q.path)?;
    let agent = state.manager.agent(&id).await?;
    let stream = upload_stream(body);
    state
        .manager
        .agent_call(&id, agent.write_archive(&q.path, stream).await)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/sandboxes/{id}/files?path=&recursive=` → 204.
pub async fn remove(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    ApiQuery(q): ApiQuery<RemoveQuery>,
) -> ApiResult<StatusCode> {
    let id = sandbox.id;
    check_path(&q.path)?;
    let agent = state.manager.agent(&id).await?;
    state
        .manager
        .agent_call(
            &id,
            agent.remove(&q.path, q.recursive.unwrap_or(false)).await,
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/sandboxes/{id}/files/list?path=&depth=`.
pub async fn list(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    check_path(&q.path)?;
    let depth = q.depth.unwrap_or(1);
    if !(1..=32).contains(&depth) {
        return Err(ApiError::bad_request("depth must be between 1 and 32"));
    }
    let agent = state.manager.agent(&id).await?;
    let listing = state
        .manager
        .agent_call(&id, agent.list(&q.path, Some(depth)).await)
        .await?;
    Ok(Json(listing))
}

/// `GET /v1/sandboxes/{id}/files/stat?path=`.
pub async fn stat(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    ApiQuery(q): ApiQuery<PathQuery>,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    check_path(&q.path)?;
    let agent = state.manager.agent(&id).await?;
    let entry = state
        .manager
        .agent_call(&id, agent.stat(&q.path).await)
        .await?;
    Ok(Json(entry))
}

/// `POST /v1/sandboxes/{id}/files/mkdir {"path"}` → 204.
pub async fn mkdir(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    ApiJson(b): ApiJson<MkdirBody>,
) -> ApiResult<StatusCode> {
    let id = sandbox.id;
    check_path(&b.path)?;
    let agent = state.manager.agent(&id).await?;
    state
        .manager
        .agent_call(&id, agent.mkdir(&b.path).await)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/sandboxes/{id}/files/move {"from", "to"}` → 204.
pub async fn rename(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    ApiJson(b): ApiJson<MoveBody>,
) -> ApiResult<StatusCode> {
    let id = sandbox.id;
    check_path(&b.from)?;
    check_path(&b.to)?;
    let agent = state.manager.agent(&id).await?;
    state
        .manager
        .agent_call(&id, agent.rename(&b.from, &b.to).await)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_as_octal() {
        assert_eq!(parse_mode("0644").ok(), Some(0o644));
        assert_eq!(parse_mode("755").ok(), Some(0o755));
        assert!(parse_mode("0999").is_err());
        assert!(parse_mode("rwx").is_err());
        assert!(check_path("relative/x").is_err());
    }
}
