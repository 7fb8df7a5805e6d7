//! envd's messages (`spec/process/process.proto`, `spec/filesystem/filesystem.proto`) in
//! proto3's JSON mapping: lowerCamelCase names (the original snake_case names are accepted
//! too, as proto3 JSON parsers must), bytes as base64, enums by name, 64-bit integers as
//! strings, unknown fields ignored.

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Deserializer};

/// Bytes, base64 in JSON.
#[derive(Debug, Clone, Default)]
pub struct B64(pub Vec<u8>);

impl<'de> Deserialize<'de> for B64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let engine = base64::engine::general_purpose::STANDARD;
        let s = s.trim_end_matches('=');
        base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(s)
            .or_else(|_| engine.decode(s))
            .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(s))
            .map(B64)
            .map_err(serde::de::Error::custom)
    }
}

/// Encode bytes for JSON.
pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// `process.ProcessConfig`.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct ProcessConfig {
    /// The program.
    pub cmd: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment.
    pub envs: BTreeMap<String, String>,
    /// Working directory.
    pub cwd: Option<String>,
}

/// `process.PTY.Size`.
#[derive(Debug, Deserialize, Default, Clone, Copy)]
#[serde(default)]
pub struct PtySize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// `process.PTY`.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct Pty {
    /// Its size.
    pub size: Option<PtySize>,
}

/// `process.StartRequest`.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct StartRequest {
    /// What to run.
    pub process: Option<ProcessConfig>,
    /// Run on a terminal.
    pub pty: Option<Pty>,
    /// A name to find it by.
    pub tag: Option<String>,
    /// Keep stdin open for input.
    pub stdin: Option<bool>,
}

/// `process.ProcessSelector` (a oneof: `pid` or `tag`).
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(default)]
pub struct ProcessSelector {
    /// By pid.
    pub pid: Option<u32>,
    /// By tag.
    pub tag: Option<String>,
}

/// Requests that name a process: `ConnectRequest`, `CloseStdinRequest`.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct Selected {
    /// The process.
    pub process: Option<ProcessSelector>,
}

/// `process.ProcessInput` (a oneof: `stdin` or `pty` bytes).
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct ProcessInput {
    /// Bytes for stdin.
    pub stdin: Option<B64>,
    /// Bytes typed into the terminal.
    pub pty: Option<B64>,
}

impl ProcessInput {
    /// The bytes, whichever way they came.
    pub fn bytes(self) -> Vec<u8> {
        self.stdin.or(self.pty).map(|b| b.0).unwrap_or_default()
    }
}

/// `process.SendInputRequest`.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct SendInputRequest {
    /// The process.
    pub process: Option<ProcessSelector>,
    /// What to send.
    pub input: Option<ProcessInput>,
}

/// `process.SendSignalRequest`.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct SendSignalRequest {
    /// The process.
    pub process: Option<ProcessSelector>,
    /// `SIGNAL_SIGTERM`, `SIGNAL_SIGKILL` (or their numbers).
    pub signal: Option<serde_json::Value>,
}

impl SendSignalRequest {
    /// The signal number.
    pub fn number(&self) -> Option<i32> {
        match self.signal.as_ref()? {
            serde_json::Value::Number(n) => n.as_i64().map(|n| n as i32),
            serde_json::Value::String(s) => match s.as_str() {
                "SIGNAL_SIGTERM" | "SIGTERM" => Some(15),
                "SIGNAL_SIGKILL" | "SIGKILL" => Some(9),
                other => other.parse().ok(),
            },
            _ => None,
        }
    }
}

/// `process.UpdateRequest`.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct UpdateRequest {
    /// The process.
    pub process: Option<ProcessSelector>,
    /// The new terminal size.
    pub pty: Option<Pty>,
}

/// `process.StreamInputRequest` (a oneof: `start`, `data` or `keepalive`).
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct StreamInputRequest {
    /// The first message: which process.
    pub start: Option<Selected>,
    /// Input.
    pub data: Option<StreamInputData>,
}

/// `process.StreamInputRequest.DataEvent`.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct StreamInputData {
    /// The bytes.
    pub input: Option<ProcessInput>,
}

/// Requests with a path: `StatRequest`, `MakeDirRequest`, `RemoveRequest`.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct PathRequest {
    /// The path.
    pub path: String,
}

/// `filesystem.ListDirRequest`.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct ListDirRequest {
    /// The directory.
    pub path: String,
    /// How deep (1: its entries).
    pub depth: Option<u32>,
}

/// `filesystem.MoveRequest`.
#[derive(Debug, Deserialize, Default)]
#[serde(default)]
pub struct MoveRequest {
    /// From.
    pub source: String,
    /// To.
    pub destination: String,
}

/// `filesystem.WatchDirRequest` and `CreateWatcherRequest`.
#[derive(Debug, Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct WatchRequest {
    /// The directory.
    pub path: String,
    /// Its subdirectories too.
    pub recursive: bool,
    /// Each event carries the entry.
    #[serde(alias = "include_entry")]
    pub include_entry: bool,
    /// Watch through network mounts (not supported: inotify sees only this mount).
    #[serde(alias = "allow_network_mounts")]
    pub allow_network_mounts: bool,
}

/// `GetWatcherEventsRequest`, `RemoveWatcherRequest`.
#[derive(Debug, Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
pub struct WatcherRequest {
    /// The watcher.
    #[serde(alias = "watcher_id")]
    pub watcher_id: String,
}

/// The `filesystem.FilesystemEvent`s of one Hutch file event: a rename is envd's (fsnotify's)
/// `RENAME` of the old name, then `CREATE` of the new one.
pub fn filesystem_events(e: &hutch_proto::FileEvent) -> Vec<serde_json::Value> {
    use hutch_proto::FileEventKind as K;
    let with_entry = |name: &str, kind: &str, entry: bool| {
        let mut v = serde_json::json!({"name": name, "type": kind});
        if let (true, Some(en)) = (entry, e.entry.as_deref()) {
            v["entry"] = entry_info(en);
        }
        v
    };
    match e.event {
        K::Create => vec![with_entry(&e.name, "EVENT_TYPE_CREATE", true)],
        K::Write => vec![with_entry(&e.name, "EVENT_TYPE_WRITE", true)],
        K::Remove => vec![with_entry(&e.name, "EVENT_TYPE_REMOVE", false)],
        K::Chmod => vec![with_entry(&e.name, "EVENT_TYPE_CHMOD", true)],
        K::Rename => {
            let mut out = Vec::new();
            if let Some(old) = &e.old_name {
                out.push(with_entry(old, "EVENT_TYPE_RENAME", false));
            }
            out.push(with_entry(&e.name, "EVENT_TYPE_CREATE", true));
            out
        }
    }
}

/// Where E2B's file metadata lives among a file's pairs: key `k` is Hutch's `e2b.k`, the
/// attribute `user.e2b.k` that envd uses.
pub const METADATA_NAMESPACE: &str = "e2b.";

/// `filesystem.EntryInfo` of a Hutch file entry.
pub fn entry_info(e: &hutch_proto::FileEntry) -> serde_json::Value {
    use hutch_proto::FileType;
    let (kind, letter) = match e.file_type {
        FileType::Dir => ("FILE_TYPE_DIRECTORY", 'd'),
        FileType::Symlink => ("FILE_TYPE_SYMLINK", 'l'),
        _ => ("FILE_TYPE_FILE", '-'),
    };
    let mut v = serde_json::json!({
        "name": e.name,
        "type": kind,
        "path": e.path,
        "size": e.size.to_string(),
        "mode": e.mode,
        "permissions": permissions(letter, e.mode),
        "modifiedTime": e.modified_at,
    });
    if let Some(owner) = &e.owner {
        v["owner"] = serde_json::Value::String(owner.clone());
    }
    if let Some(group) = &e.group {
        v["group"] = serde_json::Value::String(group.clone());
    }
    if let Some(t) = &e.symlink_target {
        v["symlinkTarget"] = serde_json::Value::String(t.clone());
    }
    let metadata = hutch_proto::file_metadata::within(&e.metadata, METADATA_NAMESPACE);
    if !metadata.is_empty() {
        v["metadata"] = serde_json::json!(metadata);
    }
    v
}

/// `drwxr-xr-x` from a type letter and permission bits.
fn permissions(kind: char, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(kind);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse_from_proto_json() {
        let r: StartRequest = serde_json::from_str(
            r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"}},"stdin":false,"unknown":1}"#,
        )
        .expect("parses");
        let p = r.process.expect("process");
        assert_eq!(
            (p.cmd.as_str(), p.args.len(), p.envs["A"].as_str()),
            ("/bin/bash", 3, "1")
        );
        let s: SendInputRequest =
            serde_json::from_str(r#"{"process":{"pid":7},"input":{"stdin":"aGk="}}"#)
                .expect("parses");
        assert_eq!(s.process.expect("sel").pid, Some(7));
        assert_eq!(s.input.expect("input").bytes(), b"hi");
        let k: SendSignalRequest =
            serde_json::from_str(r#"{"process":{"tag":"t"},"signal":"SIGNAL_SIGKILL"}"#)
                .expect("parses");
        assert_eq!(k.number(), Some(9));
    }

    #[test]
    fn permissions_read_like_ls() {
        assert_eq!(permissions('d', 0o755), "drwxr-xr-x");
        assert_eq!(permissions('-', 0o640), "-rw-r-----");
    }
}
