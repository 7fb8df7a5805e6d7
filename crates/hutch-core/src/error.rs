//! The core's error type. The HTTP layer maps each variant to a status in one place.

/// Errors of the sandbox manager.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// The request was malformed or a value is invalid (400/422).
    #[error("{0}")]
    InvalidArgument(String),
    /// The named thing does not exist (404).
    #[error("{0}")]
    NotFound(String),
    /// The sandbox is in a state that does not allow the operation (409).
    #[error("{0}")]
    Conflict(String),
    /// The sandbox's isolation backend cannot do this (yet) (422).
    #[error("{0}")]
    Unsupported(String),
    /// A limit or quota would be exceeded (429).
    #[error("{0}")]
    Quota(String),
    /// The sandbox already runs as many execs as it may at once (429).
    #[error("{0}")]
    TooManyExecs(String),
    /// The sandbox's agent answered with an error about the request (passed through).
    #[error("{message}")]
    Agent {
        /// Agent error code (snake_case), e.g. `not_found`.
        code: String,
        /// The agent's message.
        message: String,
    },
    /// The sandbox could not be created or has died.
    #[error("sandbox failed: {0}")]
    SandboxFailed(String),
    /// The state database failed.
    #[error("state database: {0}")]
    Database(String),
    /// A bug or an unexpected host failure.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<rusqlite::Error> for CoreError {
    fn from(e: rusqlite::Error) -> Self {
        CoreError::Database(e.to_string())
    }
}

/// Result alias for the core.
pub type CoreResult<T> = Result<T, CoreError>;
