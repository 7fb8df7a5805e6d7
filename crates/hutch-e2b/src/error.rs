//! Errors of the E2B-compatible API, answered the way E2B's servers answer them.
//!
//! The control plane answers `{"code": <HTTP status>, "message": …}` (E2B's `Error`
//! schema). The sandbox data plane answers the same for plain HTTP routes; its Connect RPCs
//! answer Connect errors (`connect.rs`). A sandbox that is gone is a 502 whose message
//! contains "The sandbox was not found": the SDKs look for that wording to raise
//! `SandboxNotFoundException` instead of a generic error.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hutch_core::CoreError;
use hutch_server::error::ApiError;

/// What the SDKs look for in a 502 to tell that the sandbox does not exist (any more).
pub const SANDBOX_NOT_FOUND: &str = "The sandbox was not found";

/// An error of the E2B-compatible API.
#[derive(Debug, thiserror::Error)]
pub enum E2bError {
    /// From Hutch's core or HTTP layer, with the status Hutch's own API would give.
    #[error("{}", .0.message)]
    Hutch(ApiError),
    /// A request this layer refuses itself.
    #[error("{message}")]
    Status {
        /// The HTTP status.
        status: StatusCode,
        /// Why.
        message: String,
    },
    /// The sandbox a data-plane request names is unknown or gone (502, the SDKs' wording).
    #[error("{SANDBOX_NOT_FOUND}: {id}")]
    SandboxGone {
        /// The id the request named.
        id: String,
    },
}

impl E2bError {
    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::status(StatusCode::BAD_REQUEST, message)
    }

    /// 401.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::status(StatusCode::UNAUTHORIZED, message)
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::status(StatusCode::NOT_FOUND, message)
    }

    /// 409.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::status(StatusCode::CONFLICT, message)
    }

    /// 501: an E2B feature Hutch does not have (the message says which and what to use).
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::status(StatusCode::NOT_IMPLEMENTED, message)
    }

    /// Any status.
    pub fn status(status: StatusCode, message: impl Into<String>) -> Self {
        Self::Status {
            status,
            message: message.into(),
        }
    }

    /// The HTTP status of the answer.
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::Hutch(e) => e.status,
            Self::Status { status, .. } => *status,
            Self::SandboxGone { .. } => StatusCode::BAD_GATEWAY,
        }
    }

    /// Hutch's error code (`not_found`, `conflict`, …) when the error came from Hutch.
    pub fn hutch_code(&self) -> Option<&'static str> {
        match self {
            Self::Hutch(e) => Some(e.code),
            _ => None,
        }
    }

    /// The text of the answer.
    pub fn message(&self) -> String {
        self.to_string()
    }
}

impl From<ApiError> for E2bError {
    fn from(e: ApiError) -> Self {
        Self::Hutch(e)
    }
}

impl From<CoreError> for E2bError {
    fn from(e: CoreError) -> Self {
        Self::Hutch(ApiError::from(e))
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let status = self.http_status();
        let mut body = serde_json::json!({
            "code": status.as_u16(),
            "message": self.message(),
        });
        if let Self::SandboxGone { id } = &self {
            body["sandboxId"] = serde_json::Value::String(id.clone());
        }
        (status, axum::Json(body)).into_response()
    }
}

/// Results of this crate.
pub type E2bResult<T> = Result<T, E2bError>;
