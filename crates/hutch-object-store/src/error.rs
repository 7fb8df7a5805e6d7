//! The one error type of every [`ObjectStore`](crate::ObjectStore) operation.
//!
//! No dependency's type crosses it: transport errors are kept as their message, S3 error
//! documents as their `Code` and `Message`. [`ObjectStoreError::is_unavailable`] is the
//! question the upload queue and a wake on another node ask: "is the store down (retry
//! later), or is this request wrong (retrying will not help)?".

use std::path::PathBuf;

/// What went wrong with an object-store operation.
#[derive(Debug, thiserror::Error)]
pub enum ObjectStoreError {
    /// The store could not be reached, timed out, or answered that it cannot serve now
    /// (HTTP 5xx, 429): the same request may succeed later.
    #[error("object store unavailable: {op} {key}: {reason}")]
    Unavailable {
        /// The operation (`PUT`, `GET`, `HEAD`, `DELETE`, `LIST`).
        op: &'static str,
        /// The key (or prefix) it was about.
        key: String,
        /// What the transport or the server said.
        reason: String,
    },
    /// There is no object under this key.
    #[error("object not found: {key}")]
    NotFound {
        /// The key asked for.
        key: String,
    },
    /// The store refused the credentials or their permissions (HTTP 401 or 403).
    #[error("object store denied {op} {key}: {reason}")]
    Denied {
        /// The operation.
        op: &'static str,
        /// The key (or prefix).
        key: String,
        /// The S3 error code and message.
        reason: String,
    },
    /// The bytes downloaded do not have the sha256 they must have; no file was left.
    #[error("object {key} failed its checksum: expected sha256 {expected}, got {actual}")]
    ChecksumMismatch {
        /// The key downloaded.
        key: String,
        /// The sha256 it must have (the caller's, or the object's own metadata).
        expected: String,
        /// The sha256 of the bytes received.
        actual: String,
    },
    /// The object carries no `sha256` metadata (it was not written by Hutch) and the caller
    /// gave none to check it against.
    #[error("object {key} has no sha256 metadata")]
    NoChecksum {
        /// The key.
        key: String,
    },
    /// The local file changed while it was being uploaded (its sha256 at the end is not the
    /// one it had at the start); the upload was aborted.
    #[error("{path} changed while it was uploaded to {key}")]
    ChangedDuringUpload {
        /// The key it was uploaded to.
        key: String,
        /// The local file.
        path: PathBuf,
    },
    /// The key is not one Hutch writes (see `key.rs`).
    #[error("bad object key {key:?}: {reason}")]
    BadKey {
        /// The key as given.
        key: String,
        /// Why it is refused.
        reason: String,
    },
    /// The store's URL cannot be used.
    #[error("bad object store URL {url:?}: {reason}")]
    BadUrl {
        /// The URL as given, without any user or password in it.
        url: String,
        /// Why it is refused.
        reason: String,
    },
    /// No credentials were given and the environment has none.
    #[error(
        "no object store credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
         (and AWS_SESSION_TOKEN for temporary ones)"
    )]
    NoCredentials,
    /// The store refused the request for another reason (an HTTP 4xx, or an answer this
    /// client cannot read): retrying the same request will not help.
    #[error("object store refused {op} {key}: HTTP {status}: {reason}")]
    Rejected {
        /// The operation.
        op: &'static str,
        /// The key (or prefix).
        key: String,
        /// The HTTP status (200 for an unreadable success answer).
        status: u16,
        /// The S3 error code and message, or what could not be read.
        reason: String,
    },
    /// A local file or directory could not be read or written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done (`read`, `create`, `rename`, ...).
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
}

impl ObjectStoreError {
    /// Whether the store is down or unreachable (connection refused, timeouts, 5xx): the
    /// same operation may succeed later, and a download on another node fails for this
    /// reason rather than a wrong key or checksum.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// Whether the error is about a missing object.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            what,
            path: path.into(),
            source,
        }
    }
}
