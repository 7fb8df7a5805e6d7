//! The crate's error type. Every message is meant to be read by an operator: it names the
//! step that failed and, for external tools, their last lines of output.

use std::io;
use std::path::{Path, PathBuf};

use crate::names::builtin_names;

/// Everything that can go wrong while building, reading or removing templates.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The name is not a valid template name.
    #[error(
        "invalid template name `{0}`: use 1 to 63 characters from a-z, 0-9, `.`, `_` and `-`, \
         starting with a letter or digit"
    )]
    InvalidName(String),
    /// Not a tag (`[A-Za-z0-9_][A-Za-z0-9_.-]*`, at most 128 characters).
    #[error("invalid template tag `{0}`: use letters, digits, `_`, `.` and `-` (at most 128), not starting with `.` or `-`")]
    InvalidTag(String),
    /// A revision that does not exist (any more).
    #[error("template {name:?} has no revision {rev}")]
    NoRevision {
        /// The template.
        name: String,
        /// The revision asked for.
        rev: u64,
    },
    /// There is no built-in recipe with this name.
    #[error("unknown template `{0}`; built-in templates are: {known}", known = builtin_names().join(", "))]
    Unknown(String),
    /// `--from-image` was asked to build under a built-in template's name.
    #[error("`{0}` is a built-in template; build the image under another name")]
    BuiltinName(String),
    /// Pulling or unpacking an image failed.
    #[error("template build step `{step}` failed: {source}")]
    Image {
        /// The build step, as reported in [`crate::Progress::Step`].
        step: String,
        /// What went wrong.
        #[source]
        source: hutch_image::ImageError,
    },
    /// A host tool the recipe needs is not installed.
    #[error("`{tool}` is not installed on this host; install it with `apt-get install {package}`")]
    MissingTool {
        /// The program or file that was looked for.
        tool: String,
        /// The Debian package that provides it.
        package: String,
    },
    /// The host's busybox is dynamically linked, so it cannot run inside an empty root.
    #[error(
        "{0} is not a static executable; the `minimal` template needs the static busybox from \
         Debian's `busybox-static` package (`apt-get install busybox-static`)"
    )]
    NotStatic(PathBuf),
    /// An external tool run by a build step exited unsuccessfully.
    #[error("template build step `{step}` failed: `{command}` exited with {status}; last output:\n{tail}")]
    ToolFailed {
        /// The build step, as reported in [`crate::Progress::Step`].
        step: String,
        /// The command line that was run.
        command: String,
        /// How it exited (`exit status: 1`, `signal: 9 (SIGKILL)`).
        status: String,
        /// Its last lines of combined stdout and stderr.
        tail: String,
    },
    /// An external tool run by a build step wrote no line for too long and was killed with
    /// everything it started ([`crate::BuildOptions::tool_silence_limit`]).
    #[error(
        "template build step `{step}` failed: `{command}` wrote nothing for {seconds} s and was \
         killed with what it started (the build's tool silence limit; a stalled mirror or a \
         hung install); last output:\n{tail}"
    )]
    ToolSilent {
        /// The build step, as reported in [`crate::Progress::Step`].
        step: String,
        /// The command line that was run.
        command: String,
        /// How long it was silent, in seconds.
        seconds: f64,
        /// Its last lines of combined stdout and stderr.
        tail: String,
    },
    /// A build step failed for a reason other than a tool's exit status.
    #[error("template build step `{step}` failed: {message}")]
    StepFailed {
        /// The build step, as reported in [`crate::Progress::Step`].
        step: String,
        /// What went wrong.
        message: String,
    },
    /// Something is still mounted inside a directory that was about to be deleted, and
    /// unmounting it failed; nothing was deleted through it.
    #[error(
        "refusing to delete {dir}: {mount} is a mount point inside it and could not be unmounted"
    )]
    StillMounted {
        /// The directory being deleted.
        dir: PathBuf,
        /// The mount point found inside it.
        mount: PathBuf,
    },
    /// An isolation other than `auto`, `ns` or `vm`.
    #[error("invalid isolation `{0}`: use auto, ns or vm")]
    InvalidIsolation(String),
    /// The template does not exist or is not ready.
    #[error("template `{0}` does not exist or is not built")]
    NotReady(String),
    /// A file system operation on the template store failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done (`creating directory`, `reading`, …).
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}

impl TemplateError {
    /// Builds an [`TemplateError::Io`] for `action` on `path`.
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// Shorthand used throughout the crate.
pub(crate) type Result<T> = std::result::Result<T, TemplateError>;

/// Adds path context to [`io::Result`]s.
pub(crate) trait IoContext<T> {
    /// Maps the error into [`TemplateError::Io`] for `action` on `path`.
    fn at(self, action: &'static str, path: &Path) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, action: &'static str, path: &Path) -> Result<T> {
        self.map_err(|e| TemplateError::io(action, path, e))
    }
}
