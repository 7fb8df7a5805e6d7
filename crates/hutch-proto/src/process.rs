//! Process handles: processes that outlive the call that started them.
//!
//! An exec whose [`crate::ExecRequest::handle`] is set is registered in the agent's process
//! table under its pid (and its tag, if it has one). Its output goes into a bounded ring per
//! stream, so a later attach (`POST /v1/processes/attach`) gets what it wrote while nobody
//! was listening, then its live output, then its exit. Its stdin, signals and terminal size
//! are reachable by pid or tag from any call (`/v1/processes/input`, `…/signal`, …). The
//! agent keeps exited handles for late attaches for a while (see `docs/agent-protocol.md`).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{ExecExit, PtySize};

/// Longest tag, in bytes.
pub const MAX_TAG_BYTES: usize = 256;

/// What makes an exec a process handle (`ExecRequest::handle`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct HandleSpec {
    /// A name to find the process by, unique among the agent's live handles (a duplicate
    /// is refused with `already_exists`). See [`check_tag`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// Which process handle a call is about: by pid, or by tag.
///
/// A pid or a tag names the live handle that has it; when none has, the most recently
/// exited handle the agent still keeps.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ProcessSelector {
    /// The pid from the process's `Started` frame.
    Pid(u32),
    /// The tag it was started with.
    Tag(String),
}

impl ProcessSelector {
    /// The query parameter that carries this selector (`pid=N` or `tag=NAME`).
    pub fn query_pair(&self) -> (&'static str, String) {
        match self {
            Self::Pid(pid) => ("pid", pid.to_string()),
            Self::Tag(tag) => ("tag", tag.clone()),
        }
    }

    /// The selector of a request's query: exactly one of `pid` and `tag`.
    pub fn from_query(pid: Option<&str>, tag: Option<&str>) -> Result<Self, String> {
        match (pid, tag) {
            (Some(_), Some(_)) => Err("give pid or tag, not both".into()),
            (Some(pid), None) => pid
                .parse()
                .map(Self::Pid)
                .map_err(|_| format!("pid must be a process id, got {pid:?}")),
            (None, Some(tag)) => {
                check_tag(tag)?;
                Ok(Self::Tag(tag.to_string()))
            }
            (None, None) => Err("name the process with pid= or tag=".into()),
        }
    }
}

impl fmt::Display for ProcessSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pid(pid) => write!(f, "process {pid}"),
            Self::Tag(tag) => write!(f, "process tagged {tag:?}"),
        }
    }
}

/// Check a tag: 1 to [`MAX_TAG_BYTES`] bytes of UTF-8 without control characters.
pub fn check_tag(tag: &str) -> Result<(), String> {
    if tag.is_empty() {
        return Err("a tag must not be empty".into());
    }
    if tag.len() > MAX_TAG_BYTES {
        return Err(format!(
            "a tag is at most {MAX_TAG_BYTES} bytes, got {}",
            tag.len()
        ));
    }
    if tag.chars().any(char::is_control) {
        return Err(format!(
            "a tag must not contain control characters: {tag:?}"
        ));
    }
    Ok(())
}

/// Whether a handle still runs.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    /// It runs (or its output is still being drained).
    Running,
    /// It ended; [`ProcessInfo::exit`] says how.
    Exited,
}

/// One process handle, as `GET /v1/processes` and `GET /v1/processes/info` describe it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Its pid inside the sandbox (also its process group).
    pub pid: u32,
    /// Its tag, if it was started with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The argument vector it runs (a shell string as `["/bin/sh", "-c", STRING]`).
    pub cmd: Vec<String>,
    /// The environment the request added (not the whole environment).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Its working directory.
    pub cwd: String,
    /// The user it runs as (the name from the sandbox's `/etc/passwd`).
    pub user: String,
    /// Its terminal's current size; `None` without a terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
    /// Whether it has a stdin to write to (a pipe, or its terminal).
    pub stdin: bool,
    /// When it was started, RFC 3339 UTC with milliseconds.
    pub started_at: String,
    /// Running or exited.
    pub state: ProcessState,
    /// How it ended, once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExecExit>,
}

/// `GET /v1/processes`: live handles, then the exited ones the agent keeps, each by start.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcessList {
    /// The handles.
    pub processes: Vec<ProcessInfo>,
}

/// `Missed` frame: how many bytes of each stream the ring dropped before the output that
/// follows (an attach that came late, or a reader let go for not reading).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MissedOutput {
    /// Bytes of stdout dropped.
    pub stdout: u64,
    /// Bytes of stderr dropped.
    pub stderr: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_come_from_exactly_one_parameter() {
        assert_eq!(
            ProcessSelector::from_query(Some("12"), None),
            Ok(ProcessSelector::Pid(12))
        );
        assert_eq!(
            ProcessSelector::from_query(None, Some("web")),
            Ok(ProcessSelector::Tag("web".into()))
        );
        assert_eq!(
            ProcessSelector::from_query(Some("x"), None),
            Err("pid must be a process id, got \"x\"".into())
        );
        assert!(ProcessSelector::from_query(Some("1"), Some("a")).is_err());
        assert!(ProcessSelector::from_query(None, None).is_err());
        assert!(ProcessSelector::from_query(None, Some("")).is_err());
        assert_eq!(
            ProcessSelector::Tag("w".into()).query_pair(),
            ("tag", "w".into())
        );
    }

    #[test]
    fn tags_are_bounded_printable_text() {
        assert!(check_tag("pty-1 ü").is_ok());
        assert!(check_tag(&"x".repeat(MAX_TAG_BYTES)).is_ok());
        assert!(check_tag(&"x".repeat(MAX_TAG_BYTES + 1)).is_err());
        assert!(check_tag("a\nb").is_err());
        assert!(check_tag("").is_err());
    }

    #[test]
    fn info_round_trips_and_leaves_out_what_is_absent() {
        let info = ProcessInfo {
            pid: 7,
            tag: None,
            cmd: vec!["sleep".into(), "1".into()],
            env: BTreeMap::new(),
            cwd: "/".into(),
            user: "root".into(),
            pty: None,
            stdin: false,
            started_at: "2025-05-20T12:00:00.000Z".into(),
            state: ProcessState::Running,
            exit: None,
        };
        let json = serde_json::to_value(&info).expect("serializes");
        assert_eq!(json["state"], "running");
        assert!(json.get("tag").is_none() && json.get("exit").is_none());
        let back: ProcessInfo = serde_json::from_value(json).expect("parses");
        assert_eq!(back, info);
    }
}
