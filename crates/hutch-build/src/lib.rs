//! Template builds from Dockerfiles, run by the server (`POST /v1/templates`).
//!
//! A build plans the Dockerfile (`hutch-dockerfile`), then runs the target stage (and the
//! stages it copies from) step by step in **build sandboxes**: `ns` sandboxes of the
//! stage's base template, with the server's build resources and network policy. `RUN`
//! executes in the sandbox like an exec; `COPY`/`ADD` of context files is a tar stream the
//! sandbox's agent unpacks (owners from `--chown`, modes from the context or `--chmod`);
//! `COPY --from` streams the other stage's files out of its sandbox into this one. Nothing
//! of the Dockerfile runs on the host.
//!
//! After each step that changes files, the sandbox is snapshotted: that snapshot is the
//! step's **cache entry**, keyed by `hutch_dockerfile::step_key` (its parent's key, the
//! instruction, the environment and the files it reads). A rebuild walks the keys and
//! starts its sandbox from the last cached snapshot, so an unchanged Dockerfile does no
//! work and a change rebuilds from the first changed step. The target stage's last state
//! (its base template's root with the last snapshot's files over it) becomes the template
//! (`TemplateStore::build_layered`), its `CMD`/`ENTRYPOINT` the start command and its
//! `HEALTHCHECK` the ready check. See `docs/templates.md`.

mod builds;
mod cache;
mod copy;
mod engine;
mod error;
mod fetch;
mod image;
mod log;
mod mounts;
mod prune;
mod scratch;

pub use builds::{BuildRequest, BuildSettings, Builder, ImageBuild, LogFollow, RegistryAccess};
pub use error::BuildError;
pub use hutch_template::{Credentials, Limits, SandboxResources};
pub use log::{BuildLogLine, LogStream, TransferView};
pub use mounts::{BuildSecrets, MAX_SECRETS, MAX_SECRET_BYTES};
pub use prune::{
    CacheUsage, PrunePolicy, PruneReport, AUTO_PRUNE_EVERY, ORPHAN_GRACE, ORPHAN_GRACE_ENV,
};

use serde::Serialize;

/// Where a build is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BuildStatus {
    /// Waiting for another build of the same template.
    Queued,
    /// Running its steps.
    Running,
    /// The template is ready.
    Succeeded,
    /// A step failed (see `error`).
    Failed,
    /// Cancelled by a client.
    Cancelled,
}

impl BuildStatus {
    /// Whether the build has ended.
    pub fn is_done(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// Where a step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// Not reached yet.
    Pending,
    /// Running.
    Running,
    /// Its result came from the cache.
    Cached,
    /// Ran and finished.
    Done,
    /// Failed (the build failed with it).
    Failed,
}

/// One step of a build as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct StepView {
    /// 1-based number over all the steps the build runs.
    pub number: usize,
    /// The stage it belongs to (`0`, or its `AS` name).
    pub stage: String,
    /// Its Dockerfile line (1-based).
    pub line: usize,
    /// The instruction as written.
    pub instruction: String,
    /// Where it is.
    pub status: StepStatus,
    /// How long it ran (ms), once it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// A build as the API shows it (`GET /v1/templates/{name}/builds/{id}`).
#[derive(Debug, Clone, Serialize)]
pub struct BuildView {
    /// `bld_…`.
    pub id: String,
    /// The template it builds.
    pub template: String,
    /// Where it is.
    pub status: BuildStatus,
    /// Its steps, in the order they run.
    pub steps: Vec<StepView>,
    /// Warnings of the plan (unused build args, VOLUME without effect).
    pub warnings: Vec<String>,
    /// When it was asked for (RFC 3339).
    pub created_at: String,
    /// When it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// How long it ran (ms), once ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
