//! `ApiError`: the only place HTTP statuses are chosen.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hutch_core::CoreError;

/// An error answered as `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Machine-readable code.
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
}

impl ApiError {
    /// 400 with `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: "bad_request",
            message: message.into(),
        }
    }

    /// 401.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            code: "unauthorized",
            message: message.into(),
        }
    }

    /// 403: understood and refused, whoever asks.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            code: "forbidden",
            message: message.into(),
        }
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            code: "not_found",
            message: message.into(),
        }
    }

    /// 502: a service inside a sandbox did not answer like an HTTP server (port proxy).
    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_GATEWAY,
            code: "bad_gateway",
            message: message.into(),
        }
    }

    /// 413: a request body over the limit of its route.
    pub fn payload_too_large(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: "payload_too_large",
            message: message.into(),
        }
    }

    /// 422.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "invalid_argument",
            message: message.into(),
        }
    }
}

fn agent_code(code: &str) -> (StatusCode, &'static str) {
    match code {
        "not_found" => (StatusCode::NOT_FOUND, "not_found"),
        "is_a_directory" => (StatusCode::BAD_REQUEST, "is_a_directory"),
        "not_a_directory" => (StatusCode::BAD_REQUEST, "not_a_directory"),
        "bad_request" => (StatusCode::BAD_REQUEST, "bad_request"),
        "not_empty" => (StatusCode::CONFLICT, "not_empty"),
        "already_exists" => (StatusCode::CONFLICT, "already_exists"),
        "permission_denied" => (StatusCode::FORBIDDEN, "permission_denied"),
        "no_space" => (StatusCode::INSUFFICIENT_STORAGE, "no_space"),
        "command_not_found" => (StatusCode::BAD_REQUEST, "command_not_found"),
        "connection_refused" => (StatusCode::BAD_GATEWAY, "connection_refused"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "agent_error"),
    }
}

impl From<CoreError> for ApiError {
    fn from(e: CoreError) -> Self {
        let message = e.to_string();
        let (status, code) = match &e {
            CoreError::InvalidArgument(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_argument"),
            CoreError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            CoreError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            CoreError::Unsupported(_) => (StatusCode::UNPROCESSABLE_ENTITY, "not_supported"),
            CoreError::Quota(_) => (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"),
            CoreError::TooManyExecs(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_execs"),
            CoreError::Agent { code, .. } => agent_code(code),
            CoreError::SandboxFailed(_) => (StatusCode::CONFLICT, "sandbox_failed"),
            CoreError::Database(_) | CoreError::Internal(_) => {
                tracing::error!(error = %message, "internal error");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
        };
        Self {
            status,
            code,
            message,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(serde_json::json!({"error": {"code": self.code, "message": self.message}})),
        )
            .into_response()
    }
}

/// Result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;
