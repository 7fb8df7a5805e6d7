//! `GET /v1/files/watch?path=&recursive=&include_entry=`: changes under a directory as they
//! happen, from inotify, as NDJSON [`WatchMessage`]s (`hutch_proto::watch`).
//!
//! Each call owns one inotify instance (one fd) and one watch per directory it covers. The
//! instance is read through the `inotify` crate's tokio stream, so a watch costs the agent no
//! thread; directory walks (the start of a recursive watch, a directory made or moved in
//! later) run on the blocking pool. When the host drops the answer the task ends and the
//! instance, with every watch, is closed.
//!
//! How kernel events become [`FileEvent`]s:
//! - `IN_CREATE` → `create`. In a recursive watch a new directory is watched at once and
//!   then listed: what was made in it before its watch existed is reported as `create`
//!   too (a later kernel event for the same entry is then not reported twice).
//! - `IN_MODIFY` marks a file written; `IN_CLOSE_WRITE` of a marked file → one `write`, and
//!   a file written without being closed gets one `write` every [`WRITE_COALESCE_MS`].
//! - `IN_DELETE` → `remove`; `IN_ATTRIB` → `chmod`.
//! - `IN_MOVED_FROM` + `IN_MOVED_TO` with the same cookie → one `rename` (old and new name).
//!   A `MOVED_FROM` left unpaired for [`MOVE_PAIR_WAIT`] moved out of the tree → `remove`; a
//!   `MOVED_TO` without its pair moved in → `create`.
//! - `IN_Q_OVERFLOW` → a `warning`; `IN_DELETE_SELF`, `IN_MOVE_SELF` or `IN_UNMOUNT` of the
//!   watched directory → `end`, the last line.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use hutch_proto::watch::{
    FileEvent, FileEventKind, WatchEnd, WatchMessage, WatchReady, WatchWarning, WatchWarningCode,
    MAX_WATCHED_DIRS, WATCH_CONTENT_TYPE, WRITE_COALESCE_MS,
};
use hutch_proto::FileType;
use hyper::Response;
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{blocking, ops};
use crate::error::{Failure, Result};
use crate::http::{self, AgentBody, Query};
use crate::passwd::Owners;

/// How long a `MOVED_FROM` waits for its `MOVED_TO` (the kernel queues both in one rename,
/// so the pair is at most a read apart).
pub const MOVE_PAIR_WAIT: Duration = Duration::from_millis(20);
/// Lines queued towards the host before the watch waits for it (the kernel then keeps
/// queueing, up to `fs.inotify.max_queued_events`, and reports an overflow past that).
const QUEUE: usize = 64;
/// Bytes of the buffer events are read into (many events per read).
const READ_BUFFER: usize = 64 << 10;
/// How long a `create` made from a listing suppresses the kernel's own event for that entry.
const SYNTHETIC_CREATE_MEMORY: Duration = Duration::from_secs(2);

/// What every directory watch asks the kernel for.
fn dir_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::MODIFY
        | WatchMask::CLOSE_WRITE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
        | WatchMask::EXCL_UNLINK
}

/// `GET /v1/files/watch`.
pub async fn watch(query: &Query) -> Result<Response<AgentBody>> {
    let root = normalize(query.path()?);
    let recursive = query.flag("recursive", false)?;
    let include_entry = query.flag("include_entry", false)?;
    let checked = root.clone();
    let owners = blocking(move || {
        let meta = std::fs::metadata(&checked).map_err(|e| Failure::io("watch", &checked, e))?;
        if !meta.is_dir() {
            return Err(Failure::NotADirectory(format!(
                "watch {checked}: not a directory (watch the directory that holds it)"
            )));
        }
        Ok(if include_entry {
            Owners::load()
        } else {
            Owners::default()
        })
    })
    .await?;
    let inotify = Inotify::init().map_err(|e| inotify_failure(&root, e))?;
    let mut watches = inotify.watches();
    let root_wd = watches
        .add(&root, dir_mask())
        .map_err(|e| inotify_failure(&root, e))?;
    let mut tree = Tree {
        root: root.clone(),
        recursive,
        include_entry,
        watches,
        dirs: HashMap::from([(root_wd.get_watch_descriptor_id(), (root_wd, String::new()))]),
        limit_warned: false,
        owners,
    };
    if recursive {
        let scan = tree.scan(String::new(), false).await;
        if scan.limited {
            return Err(Failure::BadRequest(format!(
                "{root} has more than {MAX_WATCHED_DIRS} directories: watch a smaller tree, or without recursive"
            )));
        }
    }
    let stream = inotify
        .into_event_stream(vec![0u8; READ_BUFFER])
        .map_err(|e| inotify_failure(&root, e))?;
    let (tx, rx) = mpsc::channel(QUEUE);
    let ready = WatchMessage::Ready(WatchReady {
        path: root,
        recursive,
        watched_dirs: tree.dirs.len(),
    });
    tx.try_send(Ok(line(&ready)))
        .expect("the queue is empty when the watch starts");
    tokio::spawn(run(tree, stream, tx));
    Ok(http::stream(WATCH_CONTENT_TYPE, rx))
}

/// The path without trailing slashes (`/` stays `/`).
fn normalize(path: String) -> String {
    match path.trim_end_matches('/') {
        "" => "/".to_string(),
        trimmed => trimmed.to_string(),
    }
}

/// An inotify call failed: the per-user limits get a message naming them.
fn inotify_failure(path: &str, e: std::io::Error) -> Failure {
    match e.raw_os_error() {
        Some(libc::EMFILE) => Failure::Internal(format!(
            "watch {path}: too many inotify instances in this sandbox (fs.inotify.max_user_instances)"
        )),
        Some(libc::ENOSPC) => Failure::Internal(format!(
            "watch {path}: too many inotify watches in this sandbox (fs.inotify.max_user_watches)"
        )),
        _ => Failure::io("watch", path, e),
    }
}

fn line(message: &WatchMessage) -> Bytes {
    let mut text = serde_json::to_vec(message).expect("protocol types always serialize");
    text.push(b'\n');
    Bytes::from(text)
}

/// The watched directories of one call.
struct Tree {
    /// The watched directory, absolute, without a trailing slash.
    root: String,
    recursive: bool,
    include_entry: bool,
    watches: Watches,
    /// Watch descriptor id → (descriptor, directory relative to `root`; "" for `root`).
    dirs: HashMap<i32, (WatchDescriptor, String)>,
    /// Whether the watch-limit warning was sent.
    limit_warned: bool,
    /// Owner names for entries, as of the watch's start.
    owners: Owners,
}

/// What a walk below a directory found.
struct Scan {
    /// Entries found (relative paths), in walk order, with their types.
    entries: Vec<(String, FileType)>,
    /// Whether directories were left unwatched for the limit.
    limited: bool,
}

impl Tree {
    fn absolute(&self, rel: &str) -> String {
        join(&self.root, rel)
    }

    /// Watch every directory below `rel` (not `rel` itself), on the blocking pool; with
    /// `list_entries`, also return every entry found.
    async fn scan(&mut self, rel: String, list_entries: bool) -> Scan {
        let root = self.root.clone();
        let mut watches = self.watches.clone();
        let budget = MAX_WATCHED_DIRS.saturating_sub(self.dirs.len());
        let walked =
            blocking(move || Ok(walk(&root, rel, &mut watches, budget, list_entries))).await;
        let (added, scan) = walked.unwrap_or_else(|_| {
            (
                Vec::new(),
                Scan {
                    entries: Vec::new(),
                    limited: false,
                },
            )
        });
        for (wd, dir) in added {
            self.dirs.insert(wd.get_watch_descriptor_id(), (wd, dir));
        }
        scan
    }

    /// Forget (and remove) the watches of `rel` and everything below it.
    fn unwatch_below(&mut self, rel: &str) {
        let gone: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(_, (_, dir))| is_within(dir, rel))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some((wd, _)) = self.dirs.remove(&id) {
                let _ = self.watches.remove(wd);
            }
        }
    }

    /// Re-root the recorded paths of `from` and below at `to` (a directory renamed).
    fn rename_below(&mut self, from: &str, to: &str) {
        for (_, dir) in self.dirs.values_mut() {
            if is_within(dir, from) {
                *dir = format!("{to}{}", &dir[from.len()..]);
            }
        }
    }

    /// The event for `rel`, with its type and (if asked for) entry read now.
    fn event(&self, kind: FileEventKind, rel: &str, is_dir: bool) -> FileEvent {
        let path = self.absolute(rel);
        let entry = match kind {
            FileEventKind::Remove => None,
            _ => ops::stat_with(&path, &self.owners).ok(),
        };
        let file_type = match (&entry, is_dir) {
            (_, true) => FileType::Dir,
            (Some(entry), false) => entry.file_type,
            (None, false) => FileType::File,
        };
        FileEvent {
            event: kind,
            name: rel.to_string(),
            path,
            file_type,
            old_name: None,
            old_path: None,
            entry: if self.include_entry {
                entry.map(Box::new)
            } else {
                None
            },
        }
    }

    /// The warning for directories left unwatched, once per watch.
    fn limit_warning(&mut self) -> Option<WatchMessage> {
        if self.limit_warned {
            return None;
        }
        self.limit_warned = true;
        Some(WatchMessage::Warning(WatchWarning {
            code: WatchWarningCode::WatchLimit,
            message: format!(
                "this watch covers {MAX_WATCHED_DIRS} directories, its limit: changes in directories made since are not reported"
            ),
        }))
    }
}

/// `base` joined with a relative path ("" is `base` itself).
fn join(base: &str, rel: &str) -> String {
    match (base, rel) {
        (_, "") => base.to_string(),
        ("/", _) => format!("/{rel}"),
        _ => format!("{base}/{rel}"),
    }
}

/// Whether `dir` is `ancestor` or below it (relative paths; "" is the root).
fn is_within(dir: &str, ancestor: &str) -> bool {
    ancestor.is_empty()
        || dir == ancestor
        || (dir.starts_with(ancestor) && dir.as_bytes().get(ancestor.len()) == Some(&b'/'))
}

/// Walk below `start` (relative to `root`), adding a watch for each real directory (never
/// through a symlink) until `budget` is spent. Blocking.
fn walk(
    root: &str,
    start: String,
    watches: &mut Watches,
    budget: usize,
    list_entries: bool,
) -> (Vec<(WatchDescriptor, String)>, Scan) {
    let mut added = Vec::new();
    let mut scan = Scan {
        entries: Vec::new(),
        limited: false,
    };
    let mut pending = vec![start];
    while let Some(dir) = pending.pop() {
        let Ok(reader) = std::fs::read_dir(join(root, &dir)) else {
            continue; // gone already, or unreadable: nothing to watch there
        };
        for item in reader.flatten() {
            let Ok(kind) = item.file_type() else { continue };
            let rel = join_rel(&dir, &item.file_name());
            if list_entries {
                let file_type = if kind.is_dir() {
                    FileType::Dir
                } else if kind.is_symlink() {
                    FileType::Symlink
                } else if kind.is_file() {
                    FileType::File
                } else {
                    FileType::Other
                };
                scan.entries.push((rel.clone(), file_type));
            }
            if !kind.is_dir() {
                continue;
            }
            if added.len() >= budget {
                scan.limited = true;
                continue;
            }
            match watches.add(join(root, &rel), dir_mask() | WatchMask::DONT_FOLLOW) {
                Ok(wd) => {
                    added.push((wd, rel.clone()));
                    pending.push(rel);
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => scan.limited = true,
                Err(_) => {} // removed meanwhile, or not ours to read
            }
        }
    }
    (added, scan)
}

fn join_rel(dir: &str, name: &OsStr) -> String {
    let name = name.to_string_lossy();
    if dir.is_empty() {
        name.into_owned()
    } else {
        format!("{dir}/{name}")
    }
}

/// A `MOVED_FROM` waiting for its `MOVED_TO`.
struct PendingMove {
    cookie: u32,
    rel: String,
    is_dir: bool,
    deadline: Instant,
}

/// The state of a running watch between kernel events.
struct Watcher {
    tree: Tree,
    /// Files written and not reported yet, with when the first unreported write was seen.
    written: HashMap<String, Instant>,
    moves: Vec<PendingMove>,
    /// Entries reported from a listing, with when: the kernel's `IN_CREATE` for one of them
    /// is not reported again.
    listed: HashMap<String, Instant>,
}

/// Read kernel events and send lines until the host goes away or the directory does.
async fn run(
    tree: Tree,
    mut stream: inotify::EventStream<Vec<u8>>,
    tx: mpsc::Sender<std::io::Result<Bytes>>,
) {
    let mut watcher = Watcher {
        tree,
        written: HashMap::new(),
        moves: Vec::new(),
        listed: HashMap::new(),
    };
    let coalesce = Duration::from_millis(WRITE_COALESCE_MS);
    loop {
        let next_write = watcher.written.values().min().map(|t| *t + coalesce);
        let next_move = watcher.moves.iter().map(|m| m.deadline).min();
        let deadline = match (next_write, next_move) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut out = Vec::new();
        let mut ended = false;
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                watcher.due(Instant::now(), &mut out);
            }
            next = stream.next() => match next {
                Some(Ok(event)) => {
                    ended = watcher.handle(event, &mut out).await;
                }
                Some(Err(e)) => {
                    crate::log::log!("watch of {}: reading inotify: {e}", watcher.tree.root);
                    return;
                }
                None => return,
            },
        }
        for message in out {
            if tx.send(Ok(line(&message))).await.is_err() {
                return; // the host went away
            }
        }
        if ended {
            return;
        }
    }
}

impl Watcher {
    /// Report writes and moves whose time has come.
    fn due(&mut self, now: Instant, out: &mut Vec<WatchMessage>) {
        let coalesce = Duration::from_millis(WRITE_COALESCE_MS);
        let mut due: Vec<String> = self
            .written
            .iter()
            .filter(|(_, since)| **since + coalesce <= now)
            .map(|(rel, _)| rel.clone())
            .collect();
        due.sort();
        for rel in due {
            self.written.remove(&rel);
            out.push(self.file(FileEventKind::Write, &rel, false));
        }
        let (gone, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.moves)
            .into_iter()
            .partition(|m| m.deadline <= now);
        self.moves = waiting;
        for moved in gone {
            self.moved_out(moved, out);
        }
    }

    fn file(&self, kind: FileEventKind, rel: &str, is_dir: bool) -> WatchMessage {
        WatchMessage::Event(self.tree.event(kind, rel, is_dir))
    }

    /// An entry moved out of the tree: it is removed as far as the watch can tell.
    fn moved_out(&mut self, moved: PendingMove, out: &mut Vec<WatchMessage>) {
        if moved.is_dir {
            self.tree.unwatch_below(&moved.rel);
        }
        out.push(self.file(FileEventKind::Remove, &moved.rel, moved.is_dir));
    }

    /// Turn one kernel event into messages. Returns true when the watch is over.
    async fn handle(&mut self, event: inotify::EventOwned, out: &mut Vec<WatchMessage>) -> bool {
        let mask = event.mask;
        if mask.contains(EventMask::Q_OVERFLOW) {
            out.push(WatchMessage::Warning(WatchWarning {
                code: WatchWarningCode::Overflow,
                message: "the kernel's inotify queue overflowed: some changes were not reported"
                    .into(),
            }));
            return false;
        }
        let id = event.wd.get_watch_descriptor_id();
        let Some((_, dir)) = self.tree.dirs.get(&id) else {
            return false; // a watch removed meanwhile
        };
        let dir = dir.clone();
        let is_root = dir.is_empty();
        let Some(name) = event.name else {
            return self.self_event(mask, id, is_root, out);
        };
        let rel = join_rel(&dir, &name);
        let is_dir = mask.contains(EventMask::ISDIR);
        let now = Instant::now();
        self.listed
            .retain(|_, at| now.duration_since(*at) < SYNTHETIC_CREATE_MEMORY);
        if mask.contains(EventMask::MOVED_TO) {
            if let Some(i) = self.moves.iter().position(|m| m.cookie == event.cookie) {
                let from = self.moves.remove(i);
                self.renamed(from, rel, is_dir, out);
            } else {
                out.push(self.file(FileEventKind::Create, &rel, is_dir));
                if is_dir && self.tree.recursive {
                    self.watch_new_dir(&rel, false, out).await;
                }
            }
        } else if mask.contains(EventMask::MOVED_FROM) {
            self.written.remove(&rel);
            self.moves.push(PendingMove {
                cookie: event.cookie,
                rel,
                is_dir,
                deadline: now + MOVE_PAIR_WAIT,
            });
        } else if mask.contains(EventMask::CREATE) {
            // An entry reported from a listing (and, if a directory, watched by that walk).
            if self.listed.remove(&rel).is_some() {
                return false;
            }
            out.push(self.file(FileEventKind::Create, &rel, is_dir));
            if is_dir && self.tree.recursive {
                self.watch_new_dir(&rel, true, out).await;
            }
        } else if mask.contains(EventMask::MODIFY) {
            self.written.entry(rel).or_insert(now);
        } else if mask.contains(EventMask::CLOSE_WRITE) {
            if self.written.remove(&rel).is_some() {
                out.push(self.file(FileEventKind::Write, &rel, false));
            }
        } else if mask.contains(EventMask::DELETE) {
            self.written.remove(&rel);
            out.push(self.file(FileEventKind::Remove, &rel, is_dir));
        } else if mask.contains(EventMask::ATTRIB) {
            out.push(self.file(FileEventKind::Chmod, &rel, is_dir));
        }
        false
    }

    /// An event about a watched directory itself (no name).
    fn self_event(
        &mut self,
        mask: EventMask,
        id: i32,
        is_root: bool,
        out: &mut Vec<WatchMessage>,
    ) -> bool {
        if is_root {
            let reason = if mask.contains(EventMask::DELETE_SELF) {
                "the watched directory was removed"
            } else if mask.contains(EventMask::MOVE_SELF) {
                "the watched directory was moved"
            } else if mask.contains(EventMask::UNMOUNT) {
                "the watched directory's filesystem was unmounted"
            } else if mask.contains(EventMask::IGNORED) {
                "the watched directory is no longer watched"
            } else {
                return false; // its own chmod: reported by its parent, not watched here
            };
            let mut flushed = Vec::new();
            self.due(Instant::now() + Duration::from_secs(3600), &mut flushed);
            out.extend(flushed);
            out.push(WatchMessage::End(WatchEnd {
                reason: reason.into(),
            }));
            return true;
        }
        if mask.contains(EventMask::IGNORED) {
            // Removed (its parent reports the removal) or unwatched by us.
            self.tree.dirs.remove(&id);
        }
        false
    }

    /// The second half of a rename within the tree.
    fn renamed(
        &mut self,
        from: PendingMove,
        rel: String,
        is_dir: bool,
        out: &mut Vec<WatchMessage>,
    ) {
        if is_dir {
            self.tree.rename_below(&from.rel, &rel);
        }
        let mut event = self.tree.event(FileEventKind::Rename, &rel, is_dir);
        event.old_path = Some(self.tree.absolute(&from.rel));
        event.old_name = Some(from.rel);
        out.push(WatchMessage::Event(event));
    }

    /// Watch a directory that appeared in a recursive watch, and everything below it. With
    /// `report_contents` (a directory just made), entries made in it before its watch are
    /// reported as `create`.
    async fn watch_new_dir(
        &mut self,
        rel: &str,
        report_contents: bool,
        out: &mut Vec<WatchMessage>,
    ) {
        if self.tree.dirs.len() >= MAX_WATCHED_DIRS {
            out.extend(self.tree.limit_warning());
            return;
        }
        let abs = self.tree.absolute(rel);
        match self
            .tree
            .watches
            .add(&abs, dir_mask() | WatchMask::DONT_FOLLOW)
        {
            Ok(wd) => {
                self.tree
                    .dirs
                    .insert(wd.get_watch_descriptor_id(), (wd, rel.to_string()));
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                out.extend(self.tree.limit_warning());
                return;
            }
            Err(_) => return, // gone already
        }
        let scan = self.tree.scan(rel.to_string(), report_contents).await;
        if scan.limited {
            out.extend(self.tree.limit_warning());
        }
        let now = Instant::now();
        for (child, file_type) in scan.entries {
            let mut event = self.tree.event(FileEventKind::Create, &child, false);
            event.file_type = file_type;
            out.push(WatchMessage::Event(event));
            self.listed.insert(child, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_join_and_nest() {
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/w", "a/b"), "/w/a/b");
        assert_eq!(join("/w", ""), "/w");
        assert!(is_within("a/b", "a"));
        assert!(is_within("a", "a"));
        assert!(!is_within("ab", "a"));
        assert!(is_within("x", ""));
        assert_eq!(normalize("/w//".into()), "/w");
        assert_eq!(normalize("/".into()), "/");
    }
}
