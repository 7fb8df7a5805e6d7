//! Extractors: JSON bodies and queries with our error format, and authentication.

use axum::extract::rejection::{BytesRejection, FailedToBufferBody, JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hutch_core::tenant::{Tenant, TenantScope};

use crate::error::ApiError;
use crate::AppState;

/// A JSON body whose rejections are answered in Hutch's error format (400).
pub struct ApiJson<T>(pub T);

impl<T> FromRequest<AppState> for ApiJson<T>
where
    axum::Json<T>: FromRequest<AppState, Rejection = JsonRejection>,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        check_declared_length(&req, state)?;
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Self(v)),
            Err(JsonRejection::BytesRejection(BytesRejection::FailedToBufferBody(
                FailedToBufferBody::LengthLimitError(_),
            ))) => Err(too_large(state)),
            Err(rej) => Err(ApiError::bad_request(match rej {
                JsonRejection::JsonDataError(e) => {
                    format!("invalid request body: {}", source_text(&e))
                }
                JsonRejection::JsonSyntaxError(e) => format!("malformed JSON: {}", source_text(&e)),
                JsonRejection::MissingJsonContentType(_) => {
                    "expected a JSON body with `Content-Type: application/json`".to_string()
                }
                other => other.body_text(),
            })),
        }
    }
}

/// A JSON body as raw bytes (for routes whose body may be empty), within the JSON limit.
pub struct JsonBytes(pub bytes::Bytes);

impl FromRequest<AppState> for JsonBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        check_declared_length(&req, state)?;
        match bytes::Bytes::from_request(req, state).await {
            Ok(b) => Ok(Self(b)),
            Err(BytesRejection::FailedToBufferBody(FailedToBufferBody::LengthLimitError(_))) => {
                Err(too_large(state))
            }
            Err(other) => Err(ApiError::bad_request(other.body_text())),
        }
    }
}

/// 413 before reading anything when `Content-Length` is already over the limit.
fn check_declared_length(req: &Request, state: &AppState) -> Result<(), ApiError> {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > state.json_body_limit() as u64 => Err(too_large(state)),
        _ => Ok(()),
    }
}

fn too_large(state: &AppState) -> ApiError {
    let limit = state.json_body_limit();
    ApiError::payload_too_large(format!(
        "request body is larger than the {} limit of JSON requests (hutch serve --max-json-body); \
         upload file contents with PUT …/files and send large stdin as the body of \
         POST …/exec/stream with Content-Type: application/octet-stream",
        human_size(limit)
    ))
}

/// `1048576` → `1 MiB (1048576 bytes)`.
pub fn human_size(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes & ((1 << 20) - 1) == 0 {
        format!("{} MiB ({bytes} bytes)", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes & ((1 << 10) - 1) == 0 {
        format!("{} KiB ({bytes} bytes)", bytes >> 10)
    } else {
        format!("{bytes}-byte")
    }
}

/// Parse an optional JSON body: empty means `T::default()`.
pub fn json_or_default<T: serde::de::DeserializeOwned + Default>(
    body: &[u8],
) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(if e.is_syntax() || e.is_eof() {
            format!("malformed JSON: {e}")
        } else {
            format!("invalid request body: {e}")
        })
    })
}

/// A query string whose rejections are answered in Hutch's error format (400).
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    axum::extract::Query<T>: FromRequestParts<S, Rejection = QueryRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Self(v)),
            Err(rej) => Err(ApiError::bad_request(format!(
                "invalid query string: {}",
                source_text(&rej)
            ))),
        }
    }
}

/// The innermost message of an error chain (serde's text, without axum's prefix).
fn source_text(e: &dyn std::error::Error) -> String {
    let mut cur: &dyn std::error::Error = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// The authenticated caller, placed in request extensions by [`require_auth`].
#[derive(Debug, Clone)]
pub struct Caller {
    /// Tenant of the key.
    pub tenant: Tenant,
    /// Admin keys see every tenant.
    pub admin: bool,
}

impl Caller {
    /// Whose records this caller may see: its tenant's, or every tenant's for an admin key.
    pub fn scope(&self) -> TenantScope {
        TenantScope::of(&self.tenant, self.admin)
    }
}

/// Middleware of `GET`/`PUT /v1/sandboxes/{id}/files`: a request without an
/// `Authorization` header that carries a `signature` query parameter goes on without a
/// [`Caller`], for the handler to check the signed URL (`routes/files_url.rs`); every other
/// request is [`require_auth`]'s.
pub async fn require_auth_or_signed_url(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let signed = matches!(
        *req.method(),
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::PUT
    ) && !req
        .headers()
        .contains_key(axum::http::header::AUTHORIZATION)
        && req.uri().query().is_some_and(|q| {
            q.split('&')
                .any(|pair| pair.split('=').next() == Some("signature"))
        });
    if signed {
        return next.run(req).await;
    }
    require_auth(State(state), req, next).await
}

/// Middleware: `Authorization: Bearer <key>` on every `/v1/` route behind it, else 401.
/// Keys are taken only from that header: never from a URL or a cookie (the port proxy's
/// browser tokens are checked by the proxy itself and authenticate nothing else).
pub async fn require_auth(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let key = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|s| s.trim().to_string());
    let Some(key) = key else {
        return ApiError::unauthorized("missing `Authorization: Bearer <key>` header")
            .into_response();
    };
    if key.starts_with(hutch_core::sandbox_token::TOKEN_PREFIX) {
        return ApiError::unauthorized(
            "a sandbox token opens only its sandbox's port in a browser; API calls take the \
             API key",
        )
        .into_response();
    }
    match state.authenticate(&key).await {
        Ok(Some(caller)) => {
            // A known client's connection is evicted only after every stranger's.
            if let Some(conn) = req
                .extensions()
                .get::<crate::serve::connections::ConnectionHandle>()
            {
                conn.mark_authenticated();
            }
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Ok(None) => ApiError::unauthorized("invalid API key").into_response(),
        Err(e) => e.into_response(),
    }
}
