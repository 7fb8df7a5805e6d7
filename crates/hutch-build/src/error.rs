//! Errors of template builds.

use hutch_core::CoreError;

/// Why a build could not be started or failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The request is wrong: a bad name, no Dockerfile in the context (400).
    #[error("{0}")]
    BadRequest(String),
    /// The Dockerfile does not parse or plan (400, naming the line).
    #[error(transparent)]
    Dockerfile(#[from] hutch_dockerfile::DockerfileError),
    /// The `.dockerignore` file is wrong (400).
    #[error(transparent)]
    Ignore(#[from] hutch_dockerfile::IgnoreError),
    /// A `COPY` source is missing or leaves the context (400 before a build starts; the
    /// build fails with it when found while building).
    #[error(transparent)]
    Context(#[from] hutch_dockerfile::ContextError),
    /// No such build (404).
    #[error("{0}")]
    NotFound(String),
    /// A step failed: `RUN` exited non-zero, a copy was refused (the build's error).
    #[error("{0}")]
    StepFailed(String),
    /// Too many builds are queued or running (429, naming the limit).
    #[error("{0}")]
    TooMany(String),
    /// The build was cancelled.
    #[error("the build was cancelled")]
    Cancelled,
    /// The manager refused or failed (a sandbox could not be made, a snapshot failed).
    #[error(transparent)]
    Core(#[from] CoreError),
    /// The template store failed (pulling a base image, making the template).
    #[error(transparent)]
    Template(#[from] hutch_template::TemplateError),
    /// The agent of a build sandbox failed.
    #[error("build sandbox: {0}")]
    Agent(#[from] hutch_proto::client::ClientError),
    /// Host I/O failed (the context directory, the cache index).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl BuildError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }
}
