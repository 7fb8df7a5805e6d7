//! Exec commands as the manager takes them, and their collected results.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;

use crate::output::{OutputChunks, OutputLease};

pub use hutch_proto::client::StdinSource;
pub use hutch_proto::Command;

/// The argv a command runs (a shell command as `/bin/sh -c`).
pub fn argv_of(cmd: &Command) -> Vec<String> {
    match cmd {
        Command::Argv(v) => v.clone(),
        Command::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
    }
}

/// A validated exec.
#[derive(Debug, Clone)]
pub struct ExecCommand {
    /// What to run.
    pub cmd: Command,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// Working directory.
    pub cwd: Option<String>,
    /// User inside the sandbox.
    pub user: Option<String>,
    /// Bytes for stdin (`None`: `/dev/null`).
    pub stdin: Option<Bytes>,
    /// Kill after this long (`None`: no limit).
    pub timeout: Option<Duration>,
    /// Keep running when the client goes away (streaming only).
    pub background: bool,
}

impl ExecCommand {
    /// The agent request for this command.
    pub fn to_agent_request(&self, pty: Option<hutch_proto::PtySize>) -> hutch_proto::ExecRequest {
        hutch_proto::ExecRequest {
            cmd: self.cmd.clone(),
            env: self.env.clone(),
            cwd: self.cwd.clone(),
            user: self.user.clone(),
            timeout_ms: self.timeout.map(|t| t.as_millis() as u64),
            pty,
            stdin: self.stdin.is_some() || pty.is_some(),
            background: self.background,
            handle: None,
        }
    }
}

/// The result of a collected exec, as the API returns it. It holds its output's share of
/// the server's output budget until dropped (so keep it until the answer is written).
#[derive(Debug, Serialize)]
pub struct ExecOutcome {
    /// Captured stdout, once (the API renders lossy UTF-8 and `stdout_b64` from it).
    #[serde(skip)]
    pub stdout: OutputChunks,
    /// Captured stderr.
    #[serde(skip)]
    pub stderr: OutputChunks,
    /// The output's reservation in the budget, given back on drop.
    #[serde(skip)]
    pub lease: Option<OutputLease>,
    /// Exit status (`128+N` for signal N, 124 for timeout).
    pub exit_code: i32,
    /// Killed by the timeout.
    pub timed_out: bool,
    /// Wall time in the sandbox.
    pub duration_ms: u64,
    /// Stdout went over the cap and was cut.
    pub stdout_truncated: bool,
    /// Stderr went over the cap and was cut.
    pub stderr_truncated: bool,
    /// The command was killed for exceeding the sandbox's memory limit.
    pub oom_killed: bool,
}
