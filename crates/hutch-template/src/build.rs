//! Build inputs and outputs shared by every recipe: [`BuildOptions`], [`Progress`] events,
//! and the [`BuildContext`] a recipe reports its steps and tool output through.

use std::path::PathBuf;

use crate::error::TemplateError;

/// How to build a template.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// Debian mirror for `base` (`http://deb.debian.org/debian`). Default: the host's apt
    /// sources for bookworm, else `http://deb.debian.org/debian`.
    pub mirror: Option<String>,
    /// The static busybox copied into `minimal`. Default: `/bin/busybox`.
    pub busybox: Option<PathBuf>,
    /// Rebuild even if the template is ready; the old one is replaced atomically when the
    /// new build succeeds. Do not force while sandboxes use the template.
    pub force: bool,
    /// The start command (and ready check) recorded in the template: sandboxes created from
    /// it run it (`docs/templates.md`, "Start command").
    pub start: Option<hutch_proto::ServiceSpec>,
    /// Set when the build should stop: it fails as the next step would start, leaving the
    /// template as it was.
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// How long a tool a step runs (debootstrap, apt-get) may go without writing a line
    /// before it is killed with everything it started: a stalled mirror or a hung install
    /// fails the build instead of holding it for ever. `None`:
    /// [`DEFAULT_TOOL_SILENCE_LIMIT`].
    pub tool_silence_limit: Option<std::time::Duration>,
    /// Test hook: fail when a step after the first `n` steps would start (`Some(0)` fails
    /// before any work).
    #[doc(hidden)]
    pub fail_after_step: Option<usize>,
}

/// Default of [`BuildOptions::tool_silence_limit`]: ten minutes without a line of output
/// (debootstrap and apt print one per package; the slowest step seen here, unpacking
/// `code-interpreter`'s packages, is silent for under a minute).
pub const DEFAULT_TOOL_SILENCE_LIMIT: std::time::Duration = std::time::Duration::from_secs(600);

/// What a build reports while it runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// A new step started (`running debootstrap`).
    Step(String),
    /// One line of output from a tool the step runs.
    Output(String),
    /// How far a blob's download or extraction is (image templates).
    Transfer(hutch_image::Transfer),
    /// The build (or the wait for another process's build) finished.
    Done {
        /// Wall-clock duration of the whole call.
        seconds: f64,
    },
}

/// A recipe's view of the running build.
pub(crate) struct BuildContext<'a> {
    /// The caller's options.
    pub options: &'a BuildOptions,
    /// Where events go.
    progress: &'a mut dyn FnMut(Progress),
    /// Steps started so far.
    steps: usize,
    /// Name of the current step, for error messages.
    current: String,
}

impl<'a> BuildContext<'a> {
    /// A context for one build.
    pub(crate) fn new(options: &'a BuildOptions, progress: &'a mut dyn FnMut(Progress)) -> Self {
        Self {
            options,
            progress,
            steps: 0,
            current: String::from("starting"),
        }
    }

    /// Starts a new step and reports it.
    pub(crate) fn step(&mut self, name: impl Into<String>) -> Result<(), TemplateError> {
        let name = name.into();
        if self
            .options
            .fail_after_step
            .is_some_and(|n| self.steps >= n)
        {
            return Err(TemplateError::StepFailed {
                step: name,
                message: "injected failure (fail_after_step)".into(),
            });
        }
        if self.cancelled() {
            return Err(TemplateError::StepFailed {
                step: name,
                message: "the build was cancelled".into(),
            });
        }
        self.steps += 1;
        self.current.clone_from(&name);
        (self.progress)(Progress::Step(name));
        Ok(())
    }

    /// Whether the caller asked the build to stop.
    pub(crate) fn cancelled(&self) -> bool {
        self.options
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Reports one line of tool output.
    pub(crate) fn output(&mut self, line: String) {
        (self.progress)(Progress::Output(line));
    }

    /// Reports how far a transfer is.
    pub(crate) fn transfer(&mut self, transfer: hutch_image::Transfer) {
        (self.progress)(Progress::Transfer(transfer));
    }

    /// Name of the current step.
    pub(crate) fn current_step(&self) -> &str {
        &self.current
    }

    /// Attributes a plain I/O error to the current step; other errors pass through.
    pub(crate) fn in_step(&self, error: TemplateError) -> TemplateError {
        match error {
            TemplateError::Io { .. } => TemplateError::StepFailed {
                step: self.current.clone(),
                message: error.to_string(),
            },
            other => other,
        }
    }

    /// A [`TemplateError::StepFailed`] for the current step.
    pub(crate) fn fail(&self, message: impl Into<String>) -> TemplateError {
        TemplateError::StepFailed {
            step: self.current.clone(),
            message: message.into(),
        }
    }
}
