//! File watches: the messages of `GET /v1/files/watch`.
//!
//! The answer is NDJSON (`application/x-ndjson`): one [`WatchMessage`] per line. The first
//! line is always [`WatchMessage::Ready`], written once every inotify watch is in place, so a
//! caller that waits for it sees every change made after. Then [`WatchMessage::Event`]s
//! arrive as the kernel reports changes, with the occasional [`WatchMessage::Warning`]
//! (events were lost, a directory could not be watched). [`WatchMessage::End`] is the last
//! line when the watched directory itself goes away; otherwise the answer lasts until the
//! host drops it, which removes every watch of that call.

use serde::{Deserialize, Serialize};

use crate::FileEntry;
use crate::FileType;

/// Content type of a watch answer.
pub const WATCH_CONTENT_TYPE: &str = "application/x-ndjson";

/// Most directories one recursive watch covers (one inotify watch each). A tree with more
/// at the start is refused (`bad_request`); directories made later beyond it are not
/// watched, and a [`WatchWarningCode::WatchLimit`] warning says so once.
pub const MAX_WATCHED_DIRS: usize = 8192;

/// What happened to an entry.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum FileEventKind {
    /// Created (or moved into the watched tree from outside it).
    Create,
    /// Its contents changed. Bursts of writes are coalesced: one event when the writer
    /// closes the file, and at most one every [`WRITE_COALESCE_MS`] while it keeps writing.
    Write,
    /// Removed (or moved out of the watched tree).
    Remove,
    /// Renamed within the watched tree: `name`/`path` are the new name, `old_name`/`old_path`
    /// the old one.
    Rename,
    /// Its metadata changed: mode, owner, timestamps, link count (`IN_ATTRIB`).
    Chmod,
}

/// Longest a file being written without a close goes without a `write` event, in ms.
pub const WRITE_COALESCE_MS: u64 = 200;

/// One change under a watched directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileEvent {
    /// What happened.
    pub event: FileEventKind,
    /// The path relative to the watched directory (`notes/a.txt`).
    pub name: String,
    /// The absolute path inside the sandbox.
    pub path: String,
    /// The entry's type: from the kernel's `IN_ISDIR` for directories, else from an lstat
    /// when the event is read (`file` when the entry is already gone).
    #[serde(rename = "type")]
    pub file_type: FileType,
    /// For a rename, the old path relative to the watched directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_name: Option<String>,
    /// For a rename, the old absolute path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_path: Option<String>,
    /// The entry as `files/stat` gives it, read when the event is handled (only when the
    /// watch asked for `include_entry`, and the entry still exists).
    /// (Boxed: most events carry none.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<Box<FileEntry>>,
}

/// The first message: every watch is in place.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WatchReady {
    /// The watched directory (absolute).
    pub path: String,
    /// Whether subdirectories are watched too.
    pub recursive: bool,
    /// Directories watched (1 unless recursive).
    pub watched_dirs: usize,
}

/// Why a watch may have missed events.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WatchWarningCode {
    /// The kernel's event queue overflowed (`IN_Q_OVERFLOW`): events were dropped.
    Overflow,
    /// A new directory was not watched: the watch already covers [`MAX_WATCHED_DIRS`], or
    /// the kernel's `fs.inotify.max_user_watches` is reached.
    WatchLimit,
}

/// Events may have been missed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WatchWarning {
    /// What kind of loss.
    pub code: WatchWarningCode,
    /// What happened, for people.
    pub message: String,
}

/// The watch is over.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WatchEnd {
    /// Why (the watched directory was removed, moved, or its filesystem unmounted).
    pub reason: String,
}

/// One line of a watch answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WatchMessage {
    /// Always first: the watch is armed.
    Ready(WatchReady),
    /// A change.
    Event(FileEvent),
    /// Events may have been missed.
    Warning(WatchWarning),
    /// Always last, when the watched directory is gone.
    End(WatchEnd),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_tagged_lines() {
        let event = WatchMessage::Event(FileEvent {
            event: FileEventKind::Rename,
            name: "b.txt".into(),
            path: "/w/b.txt".into(),
            file_type: FileType::File,
            old_name: Some("a.txt".into()),
            old_path: Some("/w/a.txt".into()),
            entry: None,
        });
        let line = serde_json::to_string(&event).expect("serializes");
        assert_eq!(
            line,
            r#"{"kind":"event","event":"rename","name":"b.txt","path":"/w/b.txt","type":"file","old_name":"a.txt","old_path":"/w/a.txt"}"#
        );
        assert_eq!(
            serde_json::from_str::<WatchMessage>(&line).expect("parses"),
            event
        );
        let ready: WatchMessage = serde_json::from_str(
            r#"{"kind":"ready","path":"/w","recursive":true,"watched_dirs":3}"#,
        )
        .expect("parses");
        assert!(matches!(
            ready,
            WatchMessage::Ready(WatchReady {
                watched_dirs: 3,
                ..
            })
        ));
    }
}
