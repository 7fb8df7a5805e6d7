//! Process handles as the manager takes and gives them: processes that outlive the call
//! that started them, listed, re-attached by pid or tag (with the output they wrote while
//! nobody was attached, and their exit for late attaches), fed stdin, signalled and resized
//! from any call. The agent keeps them (`docs/agent-protocol.md`, "Process handles"); the
//! manager's methods are in `manager/processes.rs`, the HTTP routes in `docs/api.md`.
//!
//! A [`ProcessStream`] is one attached reader: while it is read, the process loses no
//! output however much it writes (a reader that stops reading holds the process back, as
//! an exec's does; with several attached, one that takes nothing for 5 s is let go and told
//! how much it missed). It counts against the sandbox's cap of concurrent execs and keeps
//! the sandbox from idle hibernation while it is open; dropping it detaches, never kills.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use hutch_proto::client::{ClientError, ExecEvent, ExecEvents};
use hutch_proto::{ExecRequest, HandleSpec};

pub use hutch_proto::{
    check_tag, ExecExit, MissedOutput, ProcessInfo, ProcessSelector, ProcessState, PtySize,
};

/// The signal `DELETE …/processes/{sel}` sends.
pub const SIGKILL: i32 = libc::SIGKILL;

use crate::error::{CoreError, CoreResult};
use crate::exec::{Command, ExecCommand};
use crate::manager::{ActiveGuard, ExecSlot, ExitRecorder};

/// A process handle to start: an exec's fields, plus its tag, terminal and stdin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessStart {
    /// What to run.
    pub cmd: Command,
    /// Extra environment, over the sandbox's.
    pub env: BTreeMap<String, String>,
    /// Working directory (absolute; default the user's home, else `/`).
    pub cwd: Option<String>,
    /// User inside the sandbox (default `root`).
    pub user: Option<String>,
    /// Kill its process group after this long (`None`: no limit); its exit then says
    /// `timed_out`.
    pub timeout: Option<Duration>,
    /// A name to find it by, unique among the sandbox's running handles.
    pub tag: Option<String>,
    /// Run it on a terminal of this size (stdout carries the terminal; no stderr).
    pub pty: Option<PtySize>,
    /// Give it a stdin pipe to write to later (a terminal always has one).
    pub stdin: bool,
}

impl ProcessStart {
    /// `cmd` with every other field at its default.
    pub fn new(cmd: Command) -> Self {
        Self {
            cmd,
            env: BTreeMap::new(),
            cwd: None,
            user: None,
            timeout: None,
            tag: None,
            pty: None,
            stdin: false,
        }
    }

    /// The handle that runs an exec command (its stdin bytes, if any, are the caller's to
    /// write: the handle gets a stdin pipe).
    pub fn from_exec(cmd: &ExecCommand, tag: Option<String>) -> Self {
        Self {
            cmd: cmd.cmd.clone(),
            env: cmd.env.clone(),
            cwd: cmd.cwd.clone(),
            user: cmd.user.clone(),
            timeout: cmd.timeout,
            tag,
            pty: None,
            stdin: cmd.stdin.is_some(),
        }
    }

    /// Check what the agent would refuse less clearly: an empty command, a relative cwd,
    /// a bad tag, a terminal without rows or columns.
    pub fn validate(&self) -> CoreResult<()> {
        let invalid = |m: String| Err(CoreError::InvalidArgument(m));
        match &self.cmd {
            Command::Argv(argv) if argv.first().is_none_or(|a| a.is_empty()) => {
                return invalid("cmd must name a program: [\"prog\", \"arg\", …]".into())
            }
            Command::Shell(s) if s.trim().is_empty() => {
                return invalid("cmd must not be an empty string".into())
            }
            _ => {}
        }
        if let Some(cwd) = self.cwd.as_deref().filter(|c| !c.starts_with('/')) {
            return invalid(format!("cwd must be an absolute path, got {cwd:?}"));
        }
        if let Some(tag) = &self.tag {
            hutch_proto::check_tag(tag).map_err(CoreError::InvalidArgument)?;
        }
        if let Some(size) = self.pty {
            check_pty_size(size)?;
        }
        Ok(())
    }

    /// The agent's request for this handle.
    pub fn to_agent_request(&self) -> ExecRequest {
        ExecRequest {
            cmd: self.cmd.clone(),
            env: self.env.clone(),
            cwd: self.cwd.clone(),
            user: self.user.clone(),
            timeout_ms: self.timeout.map(|t| t.as_millis() as u64),
            pty: self.pty,
            stdin: self.stdin || self.pty.is_some(),
            background: true,
            handle: Some(HandleSpec {
                tag: self.tag.clone(),
            }),
        }
    }

    /// The argument vector it runs (a shell string as `sh -c`).
    pub fn argv(&self) -> Vec<String> {
        crate::exec::argv_of(&self.cmd)
    }
}

/// Largest terminal side accepted.
pub const MAX_PTY_SIDE: u16 = 1000;

/// A terminal must have 1 to [`MAX_PTY_SIDE`] columns and rows.
pub fn check_pty_size(size: PtySize) -> CoreResult<()> {
    let side = 1..=MAX_PTY_SIDE;
    if side.contains(&size.cols) && side.contains(&size.rows) {
        Ok(())
    } else {
        Err(CoreError::InvalidArgument(format!(
            "a terminal has 1 to {MAX_PTY_SIDE} columns and rows, got {}x{}",
            size.cols, size.rows
        )))
    }
}

/// Signals by name, as Linux numbers them (the sandbox's kernel is Linux on every backend).
const SIGNALS: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("ILL", libc::SIGILL),
    ("TRAP", libc::SIGTRAP),
    ("ABRT", libc::SIGABRT),
    ("BUS", libc::SIGBUS),
    ("FPE", libc::SIGFPE),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("SEGV", libc::SIGSEGV),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CHLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("IO", libc::SIGIO),
    ("PWR", libc::SIGPWR),
    ("SYS", libc::SIGSYS),
];

/// The number of a signal named `TERM`, `SIGTERM` or `sigterm`; `None` for an unknown name.
pub fn signal_number(name: &str) -> Option<i32> {
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    SIGNALS
        .iter()
        .find(|(n, _)| *n == bare)
        .map(|(_, number)| *number)
}

/// What an attached reader gets, in the order the process wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEvent {
    /// Bytes from stdout (or the terminal).
    Stdout(Bytes),
    /// Bytes from stderr.
    Stderr(Bytes),
    /// The ring dropped this much output before what follows: the attach came later than
    /// the ring reaches back (1 MiB per stream), or the reader was let go for not reading.
    Missed(MissedOutput),
    /// The process ended. Always the last event.
    Exit(ExecExit),
}

/// An attached reader of a process handle (see the module docs). A [`Stream`] of
/// [`ProcessEvent`]s that ends after [`ProcessEvent::Exit`]; an error (the sandbox went
/// away) ends it too.
pub struct ProcessStream {
    pid: u32,
    events: ExecEvents,
    slot: ExecSlot,
    _active: ActiveGuard,
    finished: bool,
}

impl std::fmt::Debug for ProcessStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessStream")
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl ProcessStream {
    pub(crate) fn new(pid: u32, events: ExecEvents, slot: ExecSlot, active: ActiveGuard) -> Self {
        Self {
            pid,
            events,
            slot,
            _active: active,
            finished: false,
        }
    }

    /// The pid of the process it reads.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The next event; `None` after the exit.
    pub async fn next(&mut self) -> Option<CoreResult<ProcessEvent>> {
        futures_util::StreamExt::next(self).await
    }

    fn exit_recorder(&self) -> ExitRecorder {
        self.slot.exit_recorder()
    }
}

impl Stream for ProcessStream {
    type Item = CoreResult<ProcessEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if self.finished {
                return Poll::Ready(None);
            }
            let event = match Pin::new(&mut self.events).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => None,
                Poll::Ready(Some(event)) => Some(event),
            };
            let mapped = match event {
                None => Err(CoreError::AgentConnection(ClientError::Protocol(
                    "the process stream ended without an exit".into(),
                ))),
                Some(Err(e)) => Err(CoreError::from(e)),
                Some(Ok(ExecEvent::Started { .. })) => continue,
                Some(Ok(ExecEvent::Stdout(b))) => Ok(ProcessEvent::Stdout(b)),
                Some(Ok(ExecEvent::Stderr(b))) => Ok(ProcessEvent::Stderr(b)),
                Some(Ok(ExecEvent::Missed(m))) => Ok(ProcessEvent::Missed(m)),
                Some(Ok(ExecEvent::Exit(exit))) => {
                    self.exit_recorder()
                        .record(exit.exit_code, exit.timed_out, exit.duration_ms);
                    Ok(ProcessEvent::Exit(exit))
                }
                Some(Ok(ExecEvent::Error(e))) => Err(CoreError::from(ClientError::Agent(e))),
            };
            if !matches!(
                mapped,
                Ok(ProcessEvent::Stdout(_) | ProcessEvent::Stderr(_) | ProcessEvent::Missed(_))
            ) {
                self.finished = true;
            }
            return Poll::Ready(Some(mapped));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_becomes_a_background_handle_request() {
        let mut start = ProcessStart::new(Command::Shell("top".into()));
        start.tag = Some("t".into());
        start.pty = Some(PtySize { cols: 80, rows: 24 });
        start.timeout = Some(Duration::from_millis(1500));
        let request = start.to_agent_request();
        assert!(request.background && request.stdin);
        assert_eq!(request.timeout_ms, Some(1500));
        assert_eq!(request.handle.and_then(|h| h.tag).as_deref(), Some("t"));
        assert_eq!(start.argv(), vec!["/bin/sh", "-c", "top"]);
    }

    #[test]
    fn signals_are_named_with_or_without_sig() {
        assert_eq!(signal_number("TERM"), Some(15));
        assert_eq!(signal_number("sigkill"), Some(9));
        assert_eq!(signal_number("SIGWINCH"), Some(28));
        assert_eq!(signal_number("TERMINATE"), None);
    }

    #[test]
    fn validation_names_the_problem() {
        let bad = |start: ProcessStart| start.validate().expect_err("invalid").to_string();
        assert_eq!(
            bad(ProcessStart::new(Command::Argv(vec![]))),
            "cmd must name a program: [\"prog\", \"arg\", …]"
        );
        let mut start = ProcessStart::new(Command::Shell("x".into()));
        start.cwd = Some("tmp".into());
        assert_eq!(
            bad(start.clone()),
            "cwd must be an absolute path, got \"tmp\""
        );
        start.cwd = None;
        start.tag = Some(String::new());
        assert_eq!(bad(start.clone()), "a tag must not be empty");
        start.tag = None;
        start.pty = Some(PtySize { cols: 0, rows: 24 });
        assert_eq!(
            bad(start.clone()),
            "a terminal has 1 to 1000 columns and rows, got 0x24"
        );
        start.pty = None;
        assert!(start.validate().is_ok());
    }
}
