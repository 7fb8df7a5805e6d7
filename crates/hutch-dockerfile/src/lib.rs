//! Dockerfiles for Hutch templates: the pure part of a Dockerfile build.
//!
//! - [`plan`] / [`plan_with_bases`] parse a Dockerfile and evaluate it, with build args and
//!   an optional target stage, into a [`BuildPlan`]: the stages the target needs, each a
//!   list of [`Step`]s carrying the evaluated [`Instruction`] (variables substituted as
//!   Docker substitutes them) and the stage's [`StageConfig`] after it.
//! - [`DockerIgnore`] applies `.dockerignore` rules as Docker does.
//! - [`Context`] reads an extracted build context without following a symlink out of it,
//!   and expands `COPY` sources into [`ContextEntry`]s.
//! - [`step_key`] and [`Context::hash_entries`] make the step cache keys.
//!
//! The build engine (which runs `RUN` in a build sandbox, copies files and snapshots each
//! step) lives elsewhere; nothing here touches a sandbox.
//!
//! **Parsing** uses `parse-dockerfile` (taiki-e): it keeps byte spans for every part (so
//! errors and logs name the line and the instruction as written), parses parser
//! directives (`escape`, `syntax`), here-documents and every instruction, has no
//! dependencies beyond `smallvec`, forbids `unsafe`, and is maintained. `dockerfile-parser`
//! (HPE, pest-based) has no here-documents and its last release is old;
//! `dockerfile-parser-rs` keeps no line numbers, pulls `clap` into the library and lacks
//! `HEALTHCHECK`/`ONBUILD`. What the parser leaves raw (ENV/LABEL/ARG pairs, shell-form
//! continuations, substitution) is done here following Docker's frontend. See
//! `docs/dockerfile.md`.

mod cache;
mod config;
mod context;
mod error;
mod eval;
mod flags;
mod glob;
mod ignore;
mod mounts;
mod paths;
mod plan;
mod shell_pattern;
mod source;
mod step;
mod substitute;
mod values;
mod words;

pub use cache::{base_key, needs_inputs, step_key, STEP_KEY_FORMAT};
pub use config::{default_shell, HealthTest, Healthcheck, StageConfig, DEFAULT_PATH};
pub use context::{Context, ContextEntry, ContextError, EntryKind, MAX_ENTRIES};
pub use error::DockerfileError;
pub use glob::{GlobError, PathPattern, MAX_PATTERN_CHARS};
pub use ignore::{DockerIgnore, IgnoreError};
pub use mounts::{BindMount, CacheMount, CacheSharing, RunMount, SecretMount, MAX_MOUNT_ID_CHARS};
pub use plan::{
    plan, plan_with_bases, Base, BuildPlan, Stage, MAX_CONFIG_BYTES, MAX_DOCKERFILE_BYTES,
    MAX_INSTRUCTIONS,
};
pub use step::{
    CopyFrom, CopyKind, CopySource, CopyStep, HeredocScript, Instruction, RunNetwork, RunStep, Step,
};

/// Any error of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Dockerfile.
    #[error(transparent)]
    Dockerfile(#[from] DockerfileError),
    /// The `.dockerignore` file.
    #[error(transparent)]
    Ignore(#[from] IgnoreError),
    /// The build context.
    #[error(transparent)]
    Context(#[from] ContextError),
}

#[cfg(test)]
mod tests;
