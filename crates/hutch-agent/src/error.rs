//! The agent's error type and the one place where errors become HTTP statuses.
//!
//! Handlers return [`Failure`]; [`Failure::to_wire`] gives the [`AgentError`] body and
//! [`status_of`] the status. A filesystem error keeps its `errno` so the code (`not_found`,
//! `not_empty`, `no_space`, ...) follows from what the kernel said, not from guesswork.

use std::io;

use http::StatusCode;
use hutch_proto::{AgentError, AgentErrorCode};

use crate::sys::error_text;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// A system call on a path failed; the code follows from its errno.
    #[error("{op} {path}: {}", error_text(source))]
    Io {
        /// What we tried (`open`, `rename`, ...).
        op: &'static str,
        /// The path it was tried on.
        path: String,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// The request was malformed.
    #[error("{0}")]
    BadRequest(String),
    /// Something named by the request does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A directory where a file was needed.
    #[error("{0}")]
    IsADirectory(String),
    /// A file where a directory was needed.
    #[error("{0}")]
    NotADirectory(String),
    /// Something that should not exist does.
    #[error("{0}")]
    AlreadyExists(String),
    /// Nothing listens on the TCP port a tunnel asked for.
    #[error("{0}")]
    ConnectionRefused(String),
    /// The process handle has exited.
    #[error("{0}")]
    Exited(String),
    /// A bug or an unexpected condition of the agent.
    #[error("{0}")]
    Internal(String),
}

/// Result alias of the agent.
pub type Result<T, E = Failure> = std::result::Result<T, E>;

impl Failure {
    /// Wrap an I/O error of `op` on `path`.
    pub fn io(op: &'static str, path: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// The protocol's error code.
    pub fn code(&self) -> AgentErrorCode {
        match self {
            Self::Io { source, .. } => code_of_io(source),
            Self::BadRequest(_) => AgentErrorCode::BadRequest,
            Self::NotFound(_) => AgentErrorCode::NotFound,
            Self::IsADirectory(_) => AgentErrorCode::IsADirectory,
            Self::NotADirectory(_) => AgentErrorCode::NotADirectory,
            Self::AlreadyExists(_) => AgentErrorCode::AlreadyExists,
            Self::ConnectionRefused(_) => AgentErrorCode::ConnectionRefused,
            Self::Exited(_) => AgentErrorCode::Exited,
            Self::Internal(_) => AgentErrorCode::Internal,
        }
    }

    /// The error body sent to the host.
    pub fn to_wire(&self) -> AgentError {
        AgentError::new(self.code(), self.to_string())
    }
}

/// The error code an errno stands for.
pub fn code_of_io(e: &io::Error) -> AgentErrorCode {
    match e.raw_os_error() {
        Some(libc::ENOENT) => AgentErrorCode::NotFound,
        Some(libc::EISDIR) => AgentErrorCode::IsADirectory,
        Some(libc::ENOTDIR) => AgentErrorCode::NotADirectory,
        Some(libc::ENOTEMPTY) => AgentErrorCode::NotEmpty,
        Some(libc::EEXIST) => AgentErrorCode::AlreadyExists,
        Some(libc::ECONNREFUSED) => AgentErrorCode::ConnectionRefused,
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => AgentErrorCode::NoSpace,
        Some(libc::EACCES | libc::EPERM | libc::EROFS | libc::ETXTBSY) => {
            AgentErrorCode::PermissionDenied
        }
        Some(libc::ENAMETOOLONG | libc::ELOOP | libc::EINVAL | libc::EXDEV | libc::EBUSY) => {
            AgentErrorCode::BadRequest
        }
        _ => AgentErrorCode::Internal,
    }
}

/// The HTTP status of an error code. The only place statuses are chosen.
pub fn status_of(code: AgentErrorCode) -> StatusCode {
    match code {
        AgentErrorCode::NotFound | AgentErrorCode::CommandNotFound => StatusCode::NOT_FOUND,
        AgentErrorCode::IsADirectory
        | AgentErrorCode::NotADirectory
        | AgentErrorCode::BadRequest => StatusCode::BAD_REQUEST,
        AgentErrorCode::NotEmpty | AgentErrorCode::AlreadyExists | AgentErrorCode::Exited => {
            StatusCode::CONFLICT
        }
        AgentErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
        AgentErrorCode::NoSpace => StatusCode::INSUFFICIENT_STORAGE,
        AgentErrorCode::ConnectionRefused => StatusCode::BAD_GATEWAY,
        AgentErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno(n: i32) -> Failure {
        Failure::io("open", "/x", io::Error::from_raw_os_error(n))
    }

    #[test]
    fn errno_maps_to_code_and_status() {
        let cases = [
            (libc::ENOENT, AgentErrorCode::NotFound, 404),
            (libc::EISDIR, AgentErrorCode::IsADirectory, 400),
            (libc::ENOTDIR, AgentErrorCode::NotADirectory, 400),
            (libc::ENOTEMPTY, AgentErrorCode::NotEmpty, 409),
            (libc::EEXIST, AgentErrorCode::AlreadyExists, 409),
            (libc::ENOSPC, AgentErrorCode::NoSpace, 507),
            (libc::EDQUOT, AgentErrorCode::NoSpace, 507),
            (libc::ECONNREFUSED, AgentErrorCode::ConnectionRefused, 502),
            (libc::EACCES, AgentErrorCode::PermissionDenied, 403),
            (libc::EIO, AgentErrorCode::Internal, 500),
        ];
        for (n, code, status) in cases {
            let f = errno(n);
            assert_eq!(f.code(), code, "errno {n}");
            assert_eq!(status_of(f.code()).as_u16(), status, "errno {n}");
        }
    }

    #[test]
    fn messages_name_the_operation_and_path() {
        assert_eq!(
            errno(libc::ENOENT).to_string(),
            "open /x: No such file or directory"
        );
        let wire = Failure::BadRequest("path must be absolute".into()).to_wire();
        assert_eq!(wire.code, AgentErrorCode::BadRequest);
        assert_eq!(wire.message, "path must be absolute");
    }
}
