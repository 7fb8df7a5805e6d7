//! JSON messages of the agent protocol.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `GET /v1/info`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AgentInfo {
    /// [`crate::PROTOCOL_VERSION`] of the agent.
    pub protocol_version: u32,
    /// The agent's crate version.
    pub agent_version: String,
    /// The sandbox's hostname as the agent sees it.
    pub hostname: String,
    /// `uname -r` inside the sandbox (differs from the host's on `vm`).
    pub kernel: String,
    /// The agent's own pid (1 when it is the sandbox's init).
    pub pid: u32,
}

/// What to run: an argv (no shell) or a string for `/bin/sh -c`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Command {
    /// Run this program directly; `argv[0]` is looked up in `PATH` when it has no `/`.
    Argv(Vec<String>),
    /// Run under `/bin/sh -c`.
    Shell(String),
}

/// Terminal size for PTY execs and resize frames.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct PtySize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// The first frame of `POST /v1/exec`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExecRequest {
    /// What to run.
    pub cmd: Command,
    /// Extra environment, layered over the sandbox's environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the user's home, else `/`).
    #[serde(default)]
    pub cwd: Option<String>,
    /// User name or numeric uid from the sandbox's `/etc/passwd` (default `root`).
    #[serde(default)]
    pub user: Option<String>,
    /// Kill the whole process group after this long; the exit then reports `timed_out`.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Run on a pseudo-terminal of this size (stdout carries the terminal output; no stderr).
    #[serde(default)]
    pub pty: Option<PtySize>,
    /// When true the host sends `Stdin` frames; when false stdin is `/dev/null`.
    #[serde(default)]
    pub stdin: bool,
    /// Keep the process running when the host goes away before it exits (the exec stream is
    /// reset or the connection drops). By default (`false`) the agent then kills the whole
    /// process group, so an abandoned call leaves nothing behind. A background process's
    /// output is read and discarded once nobody listens; its timeout still applies.
    #[serde(default)]
    pub background: bool,
    /// Start the process as a handle ([`crate::process`]): registered by pid and tag, its
    /// output kept in a ring for later attaches, never killed when a call goes away (as
    /// `background`), its input and signals reachable from any call. The `Started` frame
    /// then says `"handle": true` (an agent that predates handles leaves it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle: Option<crate::HandleSpec>,
}

/// `Started` frame.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExecStarted {
    /// The process id inside the sandbox.
    pub pid: u32,
    /// True when the process was registered as a handle (the request asked for one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub handle: bool,
}

/// `Exit` frame: always the last frame of an exec response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExecExit {
    /// Exit status; `128 + N` when killed by signal N; 124 when killed by the timeout.
    pub exit_code: i32,
    /// The signal that ended the process, if any.
    #[serde(default)]
    pub signal: Option<i32>,
    /// True when the timeout killed the process group.
    #[serde(default)]
    pub timed_out: bool,
    /// Wall time from spawn to exit in milliseconds.
    pub duration_ms: u64,
    /// Processes of this exec the OOM killer killed, counted in a cgroup of the exec's own
    /// (a `vm` guest's agent); `None` when the agent cannot tell (on `ns` the host counts
    /// the sandbox's OOM kills instead; older agents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kills: Option<u64>,
}

/// `Signal` frame inside an exec body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SignalFrame {
    /// Signal number (e.g. 15 for SIGTERM).
    pub signal: i32,
}

/// `POST /v1/signal`: signal a process group started by an exec.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SignalRequest {
    /// The pid from [`ExecStarted`].
    pub pid: u32,
    /// Signal number.
    pub signal: i32,
}

/// Kind of a filesystem entry.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FileType {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link (not followed).
    Symlink,
    /// Anything else (fifo, socket, device).
    Other,
}

/// One entry of a listing, or the answer to stat.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileEntry {
    /// Base name.
    pub name: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Entry type.
    #[serde(rename = "type")]
    pub file_type: FileType,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits, e.g. `0o644` (as a number).
    pub mode: u32,
    /// Modification time, RFC 3339 UTC.
    pub modified_at: String,
    /// Owner's user id (as the sandbox sees it).
    #[serde(default)]
    pub uid: u32,
    /// Group id.
    #[serde(default)]
    pub gid: u32,
    /// The owner's name in the sandbox's `/etc/passwd`, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The group's name in the sandbox's `/etc/group`, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Link target, for symlinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// The file's metadata: its `user.*` extended attributes ([`crate::file_metadata`]).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metadata: crate::file_metadata::FileMetadata,
}

/// `GET /v1/files/list`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ListResponse {
    /// Entries, depth-first, sorted by path.
    pub entries: Vec<FileEntry>,
}

/// `POST /v1/files/mkdir` (creates parents; succeeds if it exists as a directory).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MkdirRequest {
    /// Absolute path.
    pub path: String,
}

/// `POST /v1/files/move` (rename; creates the destination's parents).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MoveRequest {
    /// Existing path.
    pub from: String,
    /// New path.
    pub to: String,
}

/// `POST /v1/identity`: who the sandbox is. Sent after create and after every restore.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct IdentityRequest {
    /// New hostname (where the agent may set it).
    #[serde(default)]
    pub hostname: Option<String>,
    /// Environment every later exec starts from.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Host entropy to mix into the kernel RNG (`vm`), base64-free raw bytes as numbers.
    #[serde(default)]
    pub entropy: Vec<u8>,
    /// Wall clock to set (`vm`), milliseconds since the Unix epoch.
    #[serde(default)]
    pub unix_time_ms: Option<u64>,
    /// Network settings the agent applies to the guest's interface (`vm`; an `ns` sandbox's
    /// network is configured from outside and this stays `None`).
    #[serde(default)]
    pub network: Option<GuestNetwork>,
    /// The size the root disk was grown to (`vm`, a sandbox with a `disk_mib` beyond its
    /// template image's): the agent waits until the root's block device shows it and grows
    /// the mounted root filesystem to fill it. The call fails if that cannot be done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_disk_bytes: Option<u64>,
    /// Mount points to detach first (`vm`): volumes the guest's memory had mounted that this
    /// sandbox does not have (a child of a parent's read-write volume). Detached lazily.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmount: Vec<String>,
    /// Volumes to mount (`vm`): disks attached to slots that were empty in the guest's memory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<GuestVolume>,
}

/// A volume disk the agent mounts in a `vm` guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestVolume {
    /// The virtio-blk serial number that names the disk (`/sys/block/vdX/serial`).
    pub serial: String,
    /// Absolute mount point (created with its parents).
    pub path: String,
    /// Mount read-only (the host also attaches the disk read-only).
    #[serde(default)]
    pub read_only: bool,
}

/// A guest's IPv4 settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestNetwork {
    /// Interface to configure (`None`: the first one that is not `lo`).
    #[serde(default)]
    pub interface: Option<String>,
    /// Address with prefix length, e.g. `10.213.0.2/30`.
    pub address: String,
    /// Default gateway.
    pub gateway: String,
    /// Nameservers written to `/etc/resolv.conf`.
    #[serde(default)]
    pub nameservers: Vec<String>,
}

/// Machine-readable error codes of the agent.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AgentErrorCode {
    /// The path does not exist.
    NotFound,
    /// The path is a directory where a file was needed (or the reverse).
    IsADirectory,
    /// The path is not a directory.
    NotADirectory,
    /// The directory is not empty (remove without `recursive`).
    NotEmpty,
    /// The request was malformed.
    BadRequest,
    /// Permission denied inside the sandbox.
    PermissionDenied,
    /// The path already exists.
    AlreadyExists,
    /// No space left (disk or quota).
    NoSpace,
    /// The program to exec was not found.
    CommandNotFound,
    /// Nothing listens on the TCP port a tunnel asked for (`POST /v1/tcp`).
    ConnectionRefused,
    /// The process handle has exited: it takes no more input or signals.
    Exited,
    /// Anything else.
    Internal,
}

/// Error body of every non-2xx agent response, and payload of `Error` frames.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AgentError {
    /// Machine-readable code.
    pub code: AgentErrorCode,
    /// Human-readable message.
    pub message: String,
}

impl AgentErrorCode {
    /// The wire name of the code (`not_found`, `no_space`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::IsADirectory => "is_a_directory",
            Self::NotADirectory => "not_a_directory",
            Self::NotEmpty => "not_empty",
            Self::BadRequest => "bad_request",
            Self::PermissionDenied => "permission_denied",
            Self::AlreadyExists => "already_exists",
            Self::NoSpace => "no_space",
            Self::CommandNotFound => "command_not_found",
            Self::ConnectionRefused => "connection_refused",
            Self::Exited => "exited",
            Self::Internal => "internal",
        }
    }
}

impl std::fmt::Display for AgentErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl AgentError {
    /// An error with this code and message.
    pub fn new(code: AgentErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for AgentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for AgentError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_code_names_match_serde() {
        for code in [
            AgentErrorCode::NotFound,
            AgentErrorCode::IsADirectory,
            AgentErrorCode::NotADirectory,
            AgentErrorCode::NotEmpty,
            AgentErrorCode::BadRequest,
            AgentErrorCode::PermissionDenied,
            AgentErrorCode::AlreadyExists,
            AgentErrorCode::NoSpace,
            AgentErrorCode::CommandNotFound,
            AgentErrorCode::ConnectionRefused,
            AgentErrorCode::Exited,
            AgentErrorCode::Internal,
        ] {
            let json = serde_json::to_string(&code).expect("serializes");
            assert_eq!(json, format!("\"{}\"", code.as_str()));
        }
    }

    #[test]
    fn exec_request_defaults_and_command_forms() {
        let r: ExecRequest = serde_json::from_str(r#"{"cmd": "echo hi"}"#).expect("parses");
        assert_eq!(r.cmd, Command::Shell("echo hi".into()));
        assert!(!r.background && !r.stdin && r.pty.is_none());
        let r: ExecRequest =
            serde_json::from_str(r#"{"cmd": ["ls", "-l"], "background": true}"#).expect("parses");
        assert_eq!(r.cmd, Command::Argv(vec!["ls".into(), "-l".into()]));
        assert!(r.background && r.handle.is_none());
        let r: ExecRequest =
            serde_json::from_str(r#"{"cmd": "top", "handle": {"tag": "t"}}"#).expect("parses");
        assert_eq!(r.handle.and_then(|h| h.tag).as_deref(), Some("t"));
        // A plain start frame is what agents before handles sent.
        let plain = serde_json::to_string(&ExecStarted {
            pid: 3,
            handle: false,
        })
        .expect("json");
        assert_eq!(plain, r#"{"pid":3}"#);
    }
}
