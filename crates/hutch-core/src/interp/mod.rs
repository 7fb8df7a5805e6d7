//! The code interpreter: stateful code contexts (Python through a Jupyter kernel, Bash,
//! JavaScript) inside a sandbox, and the events of running code in them.
//!
//! The kernels are driven from inside the sandbox by the *kernel driver*
//! (`hutch_template::interp`, embedded in the binary): a small Python program that speaks the
//! Jupyter messaging protocol through `jupyter_client`, the protocol's reference client, and
//! serves the host newline-delimited JSON on TCP port [`DRIVER_PORT`] of the sandbox's
//! loopback. The `code-interpreter` template starts it with the sandbox (its start command,
//! the Python kernel up before the sandbox counts as ready: `hutch_template::interp`);
//! elsewhere the host starts it on first use (the agent runs `python3 -u -` with the driver
//! as stdin, in the background). The host reaches it through the agent's TCP tunnel, one
//! tunnel per request ([`driver`]). Nothing of ZeroMQ or Jupyter is linked into the host or the agent.
//!
//! Why not a Rust client: `runtimelib`/`jupyter-protocol` (with the `zeromq` crate) would
//! speak the protocol from the host or the agent, but the host cannot reach a kernel's ZeroMQ
//! ports (sandboxes are reached only through the agent), and putting it in the agent would
//! grow the static agent by an async ZeroMQ stack for one feature of one template. The
//! reference client is maintained with the kernels, is already in the `code-interpreter`
//! template, and runs as the sandbox's user, where the kernel runs anyway. See
//! `docs/code-interpreter.md`.
//!
//! The driver records the contexts on the sandbox's disk ([`DRIVER_STATE_DIR`]): a driver
//! started again (after an `ns` wake, in an `ns` fork child) knows the contexts, starts their
//! kernels on first use, and reports `context_restarted: true` (their variables are gone).
//! On `vm`, hibernate/wake and forks keep the driver's and kernels' memory, so contexts
//! survive.

pub mod driver;
mod events;

pub use self::events::{
    CodeError, CodeEvent, CodeLogs, CodeRun, ContextInfo, Execution, RichOutput, RunEnd,
};

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use hutch_template::interp::{
    driver_program, DRIVER_PORT, DRIVER_SOURCE, DRIVER_STATE_DIR, NODE_BOOT_SOURCE,
};

/// Languages of a context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// Python through ipykernel.
    #[default]
    Python,
    /// R through IRkernel, where the template has it (its `ir` kernelspec).
    R,
    /// A persistent `bash`.
    Bash,
    /// A persistent Node.js.
    Javascript,
}

impl Language {
    /// Every language, in the order the docs list them.
    pub const ALL: [Language; 4] = [
        Language::Python,
        Language::R,
        Language::Bash,
        Language::Javascript,
    ];

    /// The name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Python => "python",
            Self::R => "r",
            Self::Bash => "bash",
            Self::Javascript => "javascript",
        }
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Language {
    type Err = InterpError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "python" | "python3" | "py" => Ok(Self::Python),
            "r" | "ir" => Ok(Self::R),
            "bash" | "sh" | "shell" => Ok(Self::Bash),
            "javascript" | "js" | "node" | "nodejs" => Ok(Self::Javascript),
            _ => Err(InterpError::Invalid(format!(
                "unknown language {s:?}: expected python, r, bash or javascript"
            ))),
        }
    }
}

/// A context's id: what the driver made (`ctx_` and hex) or a default's (`default-python`);
/// parsed once where it comes in, 1–64 letters, digits, `_` or `-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ContextId(String);

impl ContextId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ContextId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for ContextId {
    type Err = InterpError;

    /// A malformed id is an unknown context (404), like a malformed sandbox id.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if ok {
            Ok(Self(s.to_string()))
        } else {
            Err(InterpError::UnknownContext(s.chars().take(80).collect()))
        }
    }
}

/// A new context: `POST /v1/sandboxes/{id}/contexts`.
#[derive(Debug, Clone, Default)]
pub struct ContextSpec {
    /// Its language.
    pub language: Language,
    /// Working directory of its kernel (absolute; default the user's home).
    pub cwd: Option<String>,
    /// Environment of its kernel, over the sandbox's.
    pub env: BTreeMap<String, String>,
}

/// Code to run: `POST /v1/sandboxes/{id}/code`.
#[derive(Debug, Clone)]
pub struct CodeRequest {
    /// The code (a cell).
    pub code: String,
    /// The context; `None`: the default context of `language`.
    pub context: Option<ContextId>,
    /// The language of the default context (ignored with a context).
    pub language: Language,
    /// Interrupt the cell after this long (`None`: no limit).
    pub timeout: Option<Duration>,
    /// Environment for this cell only.
    pub env: BTreeMap<String, String>,
}

/// Errors of the code interpreter. Messages are what the API answers.
#[derive(Debug, Clone, thiserror::Error)]
pub enum InterpError {
    /// The sandbox's template cannot run the driver or the language (422).
    #[error(
        "sandbox {sandbox} runs template {template:?}, which cannot run {what} code ({detail}); \
         create the sandbox from the \"code-interpreter\" template"
    )]
    Unavailable {
        /// The sandbox.
        sandbox: String,
        /// Its template.
        template: String,
        /// The language asked for (or "any" when the driver itself could not start).
        what: String,
        /// What the sandbox said.
        detail: String,
    },
    /// No such context in the sandbox (404).
    #[error("context {0} does not exist")]
    UnknownContext(String),
    /// A value of the request is invalid (422).
    #[error("{0}")]
    Invalid(String),
    /// The driver failed or answered against its protocol (502).
    #[error("the code interpreter inside the sandbox failed: {0}")]
    Driver(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_defines_the_node_side_before_the_driver() {
        let text = driver_program();
        let (first, rest) = text.split_once('\n').expect("lines");
        assert!(
            first.starts_with("NODE_BOOT = \"// The Node.js side"),
            "{first:.80}"
        );
        assert!(first.contains("vm.runInThisContext"));
        assert!(
            rest.starts_with("\"\"\"Hutch's kernel driver"),
            "{rest:.80}"
        );
    }

    #[test]
    fn languages_parse_with_their_aliases() {
        for (raw, lang) in [
            ("python", Language::Python),
            ("Python3", Language::Python),
            ("bash", Language::Bash),
            ("sh", Language::Bash),
            ("js", Language::Javascript),
            ("node", Language::Javascript),
        ] {
            assert_eq!(raw.parse::<Language>().ok(), Some(lang), "{raw}");
        }
        let e = "cobol".parse::<Language>().expect_err("unknown");
        assert_eq!(
            e.to_string(),
            "unknown language \"cobol\": expected python, r, bash or javascript"
        );
    }

    #[test]
    fn context_ids_are_short_plain_words_and_others_are_unknown_contexts() {
        for ok in ["ctx_0123abcd", "default-python", "a"] {
            assert_eq!(
                ok.parse::<ContextId>()
                    .map(|c| c.to_string())
                    .ok()
                    .as_deref(),
                Some(ok)
            );
        }
        for bad in ["", "../x", "a b", "ctx/1", &"x".repeat(65)] {
            let e = bad.parse::<ContextId>().expect_err(bad);
            assert!(matches!(e, InterpError::UnknownContext(_)), "{bad}: {e:?}");
        }
        assert_eq!(
            "../x".parse::<ContextId>().expect_err("bad").to_string(),
            "context ../x does not exist"
        );
    }

    #[test]
    fn the_unavailable_message_names_the_template_to_use() {
        let e = InterpError::Unavailable {
            sandbox: "sbx_a".into(),
            template: "minimal".into(),
            what: "python".into(),
            detail: "python3 is not installed".into(),
        };
        assert_eq!(
            e.to_string(),
            "sandbox sbx_a runs template \"minimal\", which cannot run python code (python3 is \
             not installed); create the sandbox from the \"code-interpreter\" template"
        );
    }
}
