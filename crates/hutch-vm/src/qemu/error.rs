//! Why QEMU could not be used or started.

use super::config::MIN_VERSION;

/// Why QEMU could not be used or started.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    /// The binary is not installed.
    #[error("{0} not found; install Debian's qemu-system-x86 package")]
    Missing(String),
    /// The binary is too old.
    #[error("QEMU {found} is too old; need {}.{} or newer", MIN_VERSION.0, MIN_VERSION.1)]
    TooOld {
        /// The version it reported.
        found: String,
    },
    /// The jail for QEMU cannot be built (a path it needs, its libraries).
    #[error("cannot confine QEMU: {0}")]
    Jail(String),
    /// `--version` output that does not parse.
    #[error("cannot parse QEMU version from {0:?}")]
    UnknownVersion(String),
    /// Spawning or waiting failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
}
