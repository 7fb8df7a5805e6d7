//! The networking crate's error type.

/// Errors of sandbox networking.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A system call failed.
    #[error("{op}: {source}")]
    Sys {
        /// What was being done.
        op: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A netlink request failed.
    #[error("netlink: {op}: {message}")]
    Netlink {
        /// What was being done.
        op: String,
        /// The kernel's answer.
        message: String,
    },
    /// `nft` failed or is missing.
    #[error("nftables: {0}")]
    Nft(String),
    /// A host command (`nft`) did not finish within its deadline and was killed.
    #[error("{0}")]
    HostCommand(#[from] hutch_host_command::HostCommandError),
    /// A policy or configuration value is invalid.
    #[error("{0}")]
    Invalid(String),
    /// Every address of the pool is in use.
    #[error("the sandbox address pool {0} is exhausted")]
    PoolExhausted(String),
    /// Networking is not available on this server.
    #[error("{0}")]
    Unavailable(String),
}

impl NetError {
    pub(crate) fn sys(op: impl Into<String>) -> impl FnOnce(std::io::Error) -> NetError {
        let op = op.into();
        move |source| NetError::Sys { op, source }
    }
}
