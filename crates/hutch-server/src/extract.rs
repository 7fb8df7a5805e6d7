//! Extractors: JSON bodies and queries with our error format (authentication is
//! `auth.rs`).

use axum::extract::rejection::{BytesRejection, FailedToBufferBody, JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;

pub use crate::auth::Caller;
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

/// A WebSocket upgrade whose rejections (no `Upgrade: websocket`, a wrong version, no key)
/// are answered in Hutch's error format with axum's status (400, 405, 426), not as plain
/// text.
pub struct WsUpgrade(pub axum::extract::ws::WebSocketUpgrade);

impl<S> FromRequestParts<S> for WsUpgrade
where
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        use axum::response::IntoResponse;
        match axum::extract::ws::WebSocketUpgrade::from_request_parts(parts, state).await {
            Ok(ws) => Ok(Self(ws)),
            Err(rej) => {
                let message = format!(
                    "this route is a WebSocket: {} (send Connection: upgrade, Upgrade: websocket, Sec-WebSocket-Version: 13 and a Sec-WebSocket-Key)",
                    rej.body_text()
                );
                let status = rej.into_response().status();
                Err(ApiError {
                    status,
                    code: if status == axum::http::StatusCode::UPGRADE_REQUIRED {
                        "upgrade_required"
                    } else {
                        "bad_request"
                    },
                    message,
                    details: None,
                })
            }
        }
    }
}
