//! A template's start command ("service"): a long-running process the agent starts when a
//! sandbox starts and keeps for its whole life, and the ready check that says when it is up.
//!
//! The host sends a [`ServiceSpec`] with `POST /v1/service`; the agent starts it once (a
//! second call answers with the status of the first), writes every line it prints to the
//! agent's log as `<time> start: <line>` (the sandbox's log, source `start`), reaps it and
//! remembers how it ended. `GET /v1/service` gives its [`ServiceStatus`] with the last lines
//! it printed. The host runs the [`ReadyCheck`] itself, through exec or the TCP tunnel
//! ([`crate::client::service::wait_ready`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Command;

/// The prefix of the start command's lines in the agent's log (after the time).
pub const SERVICE_LOG_PREFIX: &str = "start: ";
/// How many of its last output lines the agent keeps for [`ServiceStatus::tail`].
pub const SERVICE_TAIL_LINES: usize = 20;

/// Where and as whom a sandbox's commands run when their request names neither: a
/// template's `WORKDIR` and `USER` (from its Dockerfile or its image's config), as
/// `docker exec` uses an image's. Carried by the template, its sandboxes and their snapshots.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExecDefaults {
    /// Working directory (absolute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// User (`name`, `uid`, `uid:gid`, `name:group`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

impl ExecDefaults {
    /// Neither is set.
    pub fn is_empty(&self) -> bool {
        self.cwd.is_none() && self.user.is_none()
    }

    /// Fill what a request left out.
    pub fn fill(&self, cwd: &mut Option<String>, user: &mut Option<String>) {
        if cwd.is_none() {
            cwd.clone_from(&self.cwd);
        }
        if user.is_none() {
            user.clone_from(&self.user);
        }
    }
}

/// What a template runs when a sandbox starts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ServiceSpec {
    /// The command (`CMD`/`ENTRYPOINT` of a Dockerfile, `--start-cmd`).
    pub cmd: Command,
    /// Its own environment, over the sandbox's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Its working directory (default: the user's home, else `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Its user (name or uid; default `root`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// When the sandbox counts as ready; `None`: as soon as the command started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<ReadyCheck>,
}

/// What is probed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ReadyProbe {
    /// A command that exits 0 once the service is up (`HEALTHCHECK CMD`), run with the
    /// service's environment, working directory and user.
    Cmd(Command),
    /// A TCP port on the sandbox's loopback that accepts connections once it is up.
    Port(u16),
}

/// How the host decides that a sandbox's service is up.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReadyCheck {
    /// `{"cmd": …}` or `{"port": N}`.
    #[serde(flatten)]
    pub probe: ReadyProbe,
    /// Pause between attempts.
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u64,
    /// Longest one attempt of a command probe may run (it is killed then and counts as a
    /// failure).
    #[serde(default = "default_attempt_timeout_ms")]
    pub attempt_timeout_ms: u64,
    /// Longest the whole check may take: past it, the create fails naming the check.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_interval_ms() -> u64 {
    100
}
fn default_attempt_timeout_ms() -> u64 {
    10_000
}
fn default_timeout_ms() -> u64 {
    60_000
}

impl ReadyCheck {
    /// A check of `probe` with the default timings.
    pub fn new(probe: ReadyProbe) -> Self {
        Self {
            probe,
            interval_ms: default_interval_ms(),
            attempt_timeout_ms: default_attempt_timeout_ms(),
            timeout_ms: default_timeout_ms(),
        }
    }

    /// How the check is named in messages: `port 8080`, `command curl -f localhost:8080`.
    pub fn describe(&self) -> String {
        match &self.probe {
            ReadyProbe::Port(port) => format!("port {port}"),
            ReadyProbe::Cmd(Command::Shell(s)) => format!("command `{s}`"),
            ReadyProbe::Cmd(Command::Argv(argv)) => format!("command `{}`", argv.join(" ")),
        }
    }
}

/// Where a service is in its life.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ServiceState {
    /// No `POST /v1/service` yet.
    NotStarted,
    /// Running.
    Running,
    /// It ended (see the exit fields).
    Exited,
}

/// `GET /v1/service` (and the answer to `POST /v1/service`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ServiceStatus {
    /// Where it is.
    pub state: ServiceState,
    /// Its pid inside the sandbox, once started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Its exit code once exited (`128 + N` for signal N; 127 when it could not be found).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Its last output lines (at most [`SERVICE_TAIL_LINES`]), stdout and stderr together.
    #[serde(default)]
    pub tail: Vec<String>,
}

impl ServiceStatus {
    /// The status of an agent that was never asked to start a service.
    pub fn not_started() -> Self {
        Self {
            state: ServiceState::NotStarted,
            pid: None,
            exit_code: None,
            signal: None,
            tail: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_checks_read_as_cmd_or_port_with_defaults() {
        let port: ReadyCheck = serde_json::from_str(r#"{"port": 8080}"#).expect("port");
        assert_eq!(port.probe, ReadyProbe::Port(8080));
        assert_eq!(port.timeout_ms, 60_000);
        assert_eq!(port.describe(), "port 8080");
        let cmd: ReadyCheck =
            serde_json::from_str(r#"{"cmd": ["test", "-e", "/ready"], "timeout_ms": 5}"#)
                .expect("cmd");
        assert_eq!(
            cmd.probe,
            ReadyProbe::Cmd(Command::Argv(vec![
                "test".into(),
                "-e".into(),
                "/ready".into()
            ]))
        );
        assert_eq!(cmd.timeout_ms, 5);
        assert_eq!(cmd.describe(), "command `test -e /ready`");
        let back: ReadyCheck =
            serde_json::from_value(serde_json::to_value(&cmd).expect("json")).expect("again");
        assert_eq!(back, cmd);
        assert!(serde_json::from_str::<ReadyCheck>(r#"{"interval_ms": 5}"#).is_err());
    }

    #[test]
    fn a_spec_keeps_only_what_is_set() {
        let spec = ServiceSpec {
            cmd: Command::Shell("httpd -f".into()),
            env: BTreeMap::new(),
            cwd: None,
            user: None,
            ready: None,
        };
        assert_eq!(
            serde_json::to_value(&spec).expect("json"),
            serde_json::json!({"cmd": "httpd -f"})
        );
    }
}
