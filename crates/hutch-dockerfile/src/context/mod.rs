//! [`Context`]: the build context (an already extracted directory) read safely, and the
//! expansion of `COPY`/`ADD` sources into [`ContextEntry`]s.
//!
//! The context is untrusted input on the server's host. Everything is opened from a
//! descriptor of the context's root, one component at a time, with `O_NOFOLLOW`, so no
//! symlink is ever followed by the kernel. Sources follow Docker's rules:
//!
//! - a source is relative to the context root and cleaned (`a/../b` is `b`); one that
//!   climbs out (`../x`) is refused, and so is an absolute one (Docker would read `/x` as
//!   the context's `x`; Hutch refuses it so that a host path is never implied);
//! - `*`, `?` and `[…]` match within one path component (Go's `filepath.Match`), and a
//!   pattern that matches nothing is an error, as is a named source that does not exist;
//! - a symlink met while resolving a source (as the source itself or as a directory on the
//!   way) is followed only inside the context: its target is resolved against its own
//!   directory, and an absolute target or one that climbs above the root is refused.
//!   Symlinks *inside* a copied directory are copied as symlinks, never followed;
//! - `.dockerignore` applies to every real path: an excluded entry is not in the context
//!   (naming it is "not found"), and an excluded directory is entered only when an
//!   exception (`!…`) may bring back something below it;
//! - only regular files, directories and symlinks can be copied; a fifo, socket or device
//!   in what a source copies is refused naming it.

use std::collections::{BTreeSet, HashSet};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::glob::{self, Glob};
use crate::ignore::DockerIgnore;
use crate::paths;

mod error;
mod hash;

pub use error::ContextError;

/// Symlinks followed while resolving one source, at most (Linux's own limit).
const MAX_SYMLINK_HOPS: usize = 40;
/// Entries one `resolve` may return, at most.
pub const MAX_ENTRIES: usize = 1_000_000;

/// What a context entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symlink (copied as one).
    Symlink,
}

impl EntryKind {
    pub(crate) fn tag(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Directory => "dir",
            Self::Symlink => "symlink",
        }
    }
}

/// One thing a `COPY`/`ADD` copies from the context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextEntry {
    /// The source (as given to [`Context::resolve`]) this entry comes from.
    pub source: String,
    /// Where it is, relative to the context root (`.` for the root): symlinks on the way
    /// to a source are resolved, so this path has none.
    pub path: String,
    /// Where it goes relative to the destination: a source that is a file, its name (the
    /// name as written, even through a symlink); a source that is a directory, `` for the
    /// directory itself and the inner path for what is below it.
    pub dest_relative: String,
    /// The entry is a source itself (a named source or a wildcard match), not something
    /// found inside a source directory.
    pub is_source_root: bool,
    /// File, directory or symlink.
    pub kind: EntryKind,
    /// Permission bits, set-id and sticky bits included (`0o7777` mask).
    pub mode: u32,
    /// Size in bytes of a file (0 for the others).
    pub size: u64,
    /// A symlink's target, as stored.
    pub symlink_target: Option<String>,
}

/// An extracted build context, read through descriptors from its root.
#[derive(Debug)]
pub struct Context {
    root: OwnedFd,
    path: PathBuf,
}

/// A resolved path: where it really is and what it is.
struct Node {
    real: String,
    stat: Stat,
}

impl Context {
    /// Opens the context directory (the directory itself may be reached through symlinks
    /// of the server's own paths; nothing inside it is).
    pub fn open(dir: &Path) -> Result<Self, ContextError> {
        let root = rfs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ContextError::Open {
            path: dir.to_owned(),
            error: e.into(),
        })?;
        Ok(Self {
            root,
            path: dir.to_owned(),
        })
    }

    /// The directory this context was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Expands `COPY`/`ADD` sources (paths relative to the context root, wildcards
    /// allowed) into the entries they copy, source by source, each source's entries in
    /// walk order (a directory before what is inside it).
    pub fn resolve<S: AsRef<str>>(
        &self,
        sources: &[S],
        ignore: &DockerIgnore,
    ) -> Result<Vec<ContextEntry>, ContextError> {
        let mut out = Vec::new();
        for source in sources {
            let source = source.as_ref();
            let cleaned = check_source(source)?;
            if glob::has_wildcard(&cleaned) {
                let mut matches = Vec::new();
                let components: Vec<&str> = cleaned.split('/').collect();
                self.expand(source, ".", ".", &components, ignore, &mut matches)?;
                let before = out.len();
                for logical in matches {
                    if let Some(node) = self.resolve_path(source, &logical, ignore)? {
                        self.add_root(source, &logical, &node, ignore, &mut out)?;
                    }
                }
                if out.len() == before {
                    return Err(ContextError::NoMatch {
                        source_path: source.to_owned(),
                    });
                }
            } else {
                let logical = glob::unescape(&cleaned);
                let found = self.resolve_path(source, &logical, ignore)?;
                let before = out.len();
                if let Some(node) = found {
                    self.add_root(source, &logical, &node, ignore, &mut out)?;
                }
                if out.len() == before {
                    return Err(ContextError::NotFound {
                        source_path: source.to_owned(),
                    });
                }
            }
            if out.len() > MAX_ENTRIES {
                return Err(ContextError::TooManyEntries {
                    source_path: source.to_owned(),
                });
            }
        }
        Ok(out)
    }

    /// Opens a file entry's content for reading (`O_NOFOLLOW` on every component); the
    /// engine copies it from here.
    pub fn open_file(&self, path: &str) -> Result<File, ContextError> {
        let path = &check_source(path)?;
        let fd = self.open_real(path, false)?;
        let stat = rfs::fstat(&fd).map_err(|e| io_error("reading", path, e))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(io_error("opening", path, Errno::ISDIR));
        }
        Ok(File::from(fd))
    }

    /// Reads a small file of the context (the Dockerfile, `.dockerignore`) if it exists,
    /// refusing one larger than `limit` bytes or reached through a symlink.
    pub fn read_to_string(&self, path: &str, limit: u64) -> Result<Option<String>, ContextError> {
        let cleaned = check_source(path)?;
        let mut file = match self.open_file(&cleaned) {
            Ok(f) => f,
            Err(ContextError::Io { error, .. })
                if error.raw_os_error() == Some(Errno::NOENT.raw_os_error()) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let mut text = String::new();
        (&mut file)
            .take(limit + 1)
            .read_to_string(&mut text)
            .map_err(|e| ContextError::Io {
                action: "reading",
                path: cleaned.clone(),
                error: e,
            })?;
        if text.len() as u64 > limit {
            return Err(ContextError::TooLarge {
                path: cleaned,
                limit,
            });
        }
        Ok(Some(text))
    }

    /// Opens a real path (no symlinks in it) from the root, `O_NOFOLLOW` on each
    /// component; `directory` asks for a directory.
    fn open_real(&self, real: &str, directory: bool) -> Result<OwnedFd, ContextError> {
        let mut current: Option<OwnedFd> = None;
        let components: Vec<&str> = real
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        if components.is_empty() {
            return rfs::openat(
                &self.root,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| io_error("opening", ".", e));
        }
        if components.contains(&"..") {
            return Err(ContextError::Outside {
                source_path: real.to_owned(),
            });
        }
        for (i, component) in components.iter().enumerate() {
            let last = i + 1 == components.len();
            let mut flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            if !last || directory {
                flags |= OFlags::DIRECTORY;
            } else {
                // A fifo planted where a file is expected must not block the open.
                flags |= OFlags::NONBLOCK;
            }
            let dir: BorrowedFd<'_> = current.as_ref().map_or(self.root.as_fd(), |f| f.as_fd());
            let fd = rfs::openat(dir, *component, flags, Mode::empty())
                .map_err(|e| io_error("opening", real, e))?;
            current = Some(fd);
        }
        Ok(current.expect("at least one component was opened"))
    }

    /// Resolves a cleaned relative path, following symlinks inside the context. `None`:
    /// it does not exist (or `.dockerignore` leaves it out).
    fn resolve_path(
        &self,
        source: &str,
        logical: &str,
        ignore: &DockerIgnore,
    ) -> Result<Option<Node>, ContextError> {
        let mut pending: std::collections::VecDeque<String> = logical
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(str::to_owned)
            .collect();
        let mut resolved: Vec<String> = Vec::new();
        let mut dirs: Vec<OwnedFd> = Vec::new();
        let mut last_link: Option<(String, String)> = None;
        let mut hops = 0;
        let mut stat = rfs::fstat(&self.root).map_err(|e| io_error("reading", ".", e))?;
        while let Some(component) = pending.pop_front() {
            if component == "." || component.is_empty() {
                continue;
            }
            if component == ".." {
                if resolved.pop().is_none() {
                    return Err(match last_link {
                        Some((link, target)) => ContextError::SymlinkOutside {
                            source_path: source.to_owned(),
                            link,
                            target,
                        },
                        None => ContextError::Outside {
                            source_path: source.to_owned(),
                        },
                    });
                }
                dirs.pop();
                let dir = dirs.last().map_or(self.root.as_fd(), |f| f.as_fd());
                stat = rfs::fstat(dir).map_err(|e| io_error("reading", &resolved.join("/"), e))?;
                continue;
            }
            let dir = dirs.last().map_or(self.root.as_fd(), |f| f.as_fd());
            let real = join_real(&resolved, &component);
            let found = match rfs::statat(dir, component.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(s) => s,
                Err(Errno::NOENT) | Err(Errno::NOTDIR) => return Ok(None),
                Err(e) => return Err(io_error("reading", &real, e)),
            };
            match FileType::from_raw_mode(found.st_mode) {
                FileType::Symlink => {
                    if ignore.excludes(&real) {
                        return Ok(None);
                    }
                    hops += 1;
                    if hops > MAX_SYMLINK_HOPS {
                        return Err(ContextError::SymlinkLoop {
                            source_path: source.to_owned(),
                        });
                    }
                    let target = read_link(dir, &component, &real)?;
                    if target.starts_with('/') {
                        return Err(ContextError::SymlinkOutside {
                            source_path: source.to_owned(),
                            link: real,
                            target,
                        });
                    }
                    for part in target.split('/').rev() {
                        pending.push_front(part.to_owned());
                    }
                    last_link = Some((real, target));
                }
                FileType::Directory => {
                    if !pending.is_empty() {
                        let fd = rfs::openat(
                            dir,
                            component.as_str(),
                            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                            Mode::empty(),
                        )
                        .map_err(|e| io_error("opening", &real, e))?;
                        dirs.push(fd);
                    }
                    resolved.push(component);
                    stat = found;
                }
                _ => {
                    if pending.iter().any(|c| !c.is_empty() && c != ".") {
                        return Ok(None);
                    }
                    resolved.push(component);
                    stat = found;
                }
            }
        }
        let real = if resolved.is_empty() {
            ".".to_owned()
        } else {
            resolved.join("/")
        };
        let is_dir = FileType::from_raw_mode(stat.st_mode) == FileType::Directory;
        if real != "." && ignore.excludes(&real) && !(is_dir && ignore.may_include_below(&real)) {
            return Ok(None);
        }
        Ok(Some(Node { real, stat }))
    }

    /// Expands a wildcard pattern's components from `real_dir` (logical path `logical`),
    /// collecting the logical paths it matches.
    fn expand(
        &self,
        source: &str,
        real_dir: &str,
        logical: &str,
        components: &[&str],
        ignore: &DockerIgnore,
        out: &mut Vec<String>,
    ) -> Result<(), ContextError> {
        let Some((first, rest)) = components.split_first() else {
            out.push(logical.to_owned());
            return Ok(());
        };
        let descend = |this: &Self, child_logical: String, out: &mut Vec<String>| {
            if rest.is_empty() {
                out.push(child_logical);
                return Ok(());
            }
            match this.resolve_path(source, &child_logical, ignore)? {
                Some(node) if FileType::from_raw_mode(node.stat.st_mode) == FileType::Directory => {
                    this.expand(source, &node.real, &child_logical, rest, ignore, out)
                }
                _ => Ok(()),
            }
        };
        if !glob::has_wildcard(first) {
            return descend(self, paths::join(logical, &glob::unescape(first)), out);
        }
        let pattern = Glob::new(first, false).map_err(|reason| ContextError::BadPattern {
            source_path: source.to_owned(),
            reason,
        })?;
        let dir = self.open_real(real_dir, true)?;
        for name in list_dir(&dir, real_dir)? {
            if pattern.matches(&name) {
                descend(self, paths::join(logical, &name), out)?;
            }
        }
        Ok(())
    }

    /// Adds a resolved source and, for a directory, everything visible below it.
    fn add_root(
        &self,
        source: &str,
        logical: &str,
        node: &Node,
        ignore: &DockerIgnore,
        out: &mut Vec<ContextEntry>,
    ) -> Result<(), ContextError> {
        let kind = entry_kind(&node.real, &node.stat)?;
        if kind != EntryKind::Directory {
            out.push(ContextEntry {
                source: source.to_owned(),
                path: node.real.clone(),
                dest_relative: paths::base_name(&paths::clean(logical)).to_owned(),
                is_source_root: true,
                kind,
                mode: node.stat.st_mode & 0o7777,
                size: node.stat.st_size as u64,
                symlink_target: None,
            });
            return Ok(());
        }
        let mut found = vec![ContextEntry {
            source: source.to_owned(),
            path: node.real.clone(),
            dest_relative: String::new(),
            is_source_root: true,
            kind,
            mode: node.stat.st_mode & 0o7777,
            size: 0,
            symlink_target: None,
        }];
        let mut tentative: HashSet<usize> = HashSet::new();
        if node.real != "." && ignore.excludes(&node.real) {
            tentative.insert(0);
        }
        self.walk(source, &node.real, ignore, &mut found, &mut tentative)?;
        out.extend(prune_tentative(found, &tentative));
        Ok(())
    }

    /// Walks the directory `real` (depth first, names sorted), appending what is visible.
    /// Excluded directories that an exception may reach into are appended and marked
    /// `tentative`: they stay only if something below them does.
    fn walk(
        &self,
        source: &str,
        real: &str,
        ignore: &DockerIgnore,
        found: &mut Vec<ContextEntry>,
        tentative: &mut HashSet<usize>,
    ) -> Result<(), ContextError> {
        struct Pending {
            parent: Rc<OwnedFd>,
            name: String,
            real: String,
            dest: String,
        }
        let root_fd = Rc::new(self.open_real(real, true)?);
        let mut stack: Vec<Pending> = Vec::new();
        let push_children = |stack: &mut Vec<Pending>, fd: &Rc<OwnedFd>, real: &str, dest: &str| {
            let names = list_dir(fd, real)?;
            for name in names.into_iter().rev() {
                stack.push(Pending {
                    parent: Rc::clone(fd),
                    real: join_real_str(real, &name),
                    dest: if dest.is_empty() {
                        name.clone()
                    } else {
                        format!("{dest}/{name}")
                    },
                    name,
                });
            }
            Ok::<(), ContextError>(())
        };
        push_children(&mut stack, &root_fd, real, "")?;
        while let Some(item) = stack.pop() {
            if found.len() > MAX_ENTRIES {
                return Err(ContextError::TooManyEntries {
                    source_path: source.to_owned(),
                });
            }
            let stat =
                match rfs::statat(&*item.parent, item.name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(s) => s,
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(io_error("reading", &item.real, e)),
                };
            let excluded = ignore.excludes(&item.real);
            let file_type = FileType::from_raw_mode(stat.st_mode);
            if excluded
                && !(file_type == FileType::Directory && ignore.may_include_below(&item.real))
            {
                continue;
            }
            let kind = entry_kind(&item.real, &stat)?;
            let symlink_target = match kind {
                EntryKind::Symlink => Some(read_link(item.parent.as_fd(), &item.name, &item.real)?),
                _ => None,
            };
            if excluded {
                tentative.insert(found.len());
            }
            found.push(ContextEntry {
                source: source.to_owned(),
                path: item.real.clone(),
                dest_relative: item.dest.clone(),
                is_source_root: false,
                kind,
                mode: stat.st_mode & 0o7777,
                size: if kind == EntryKind::File {
                    stat.st_size as u64
                } else {
                    0
                },
                symlink_target,
            });
            if kind == EntryKind::Directory {
                let fd = rfs::openat(
                    &*item.parent,
                    item.name.as_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| io_error("opening", &item.real, e))?;
                push_children(&mut stack, &Rc::new(fd), &item.real, &item.dest)?;
            }
        }
        Ok(())
    }
}

/// Drops tentative directories with nothing visible below them.
fn prune_tentative(found: Vec<ContextEntry>, tentative: &HashSet<usize>) -> Vec<ContextEntry> {
    if tentative.is_empty() {
        return found;
    }
    let mut needed: BTreeSet<String> = BTreeSet::new();
    let mut keep = vec![false; found.len()];
    for (i, entry) in found.iter().enumerate().rev() {
        let visible = !tentative.contains(&i) || needed.contains(&entry.path);
        if visible {
            keep[i] = true;
            let mut parent = entry.path.as_str();
            while let Some((up, _)) = parent.rsplit_once('/') {
                needed.insert(up.to_owned());
                parent = up;
            }
            needed.insert(".".to_owned());
        }
    }
    found
        .into_iter()
        .zip(keep)
        .filter_map(|(e, k)| k.then_some(e))
        .collect()
}

/// Cleans a source and refuses absolute ones and ones that climb out.
fn check_source(source: &str) -> Result<String, ContextError> {
    if source.starts_with('/') {
        return Err(ContextError::Absolute {
            source_path: source.to_owned(),
        });
    }
    let cleaned = paths::clean(source);
    if cleaned == ".." || cleaned.starts_with("../") {
        return Err(ContextError::Outside {
            source_path: source.to_owned(),
        });
    }
    Ok(cleaned)
}

fn entry_kind(path: &str, stat: &Stat) -> Result<EntryKind, ContextError> {
    let kind = match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Directory,
        FileType::Symlink => EntryKind::Symlink,
        FileType::Fifo => "fifo".into_unsupported(path)?,
        FileType::Socket => "socket".into_unsupported(path)?,
        FileType::CharacterDevice => "character device".into_unsupported(path)?,
        FileType::BlockDevice => "block device".into_unsupported(path)?,
        _ => "special file".into_unsupported(path)?,
    };
    Ok(kind)
}

trait IntoUnsupported {
    fn into_unsupported(self, path: &str) -> Result<EntryKind, ContextError>;
}

impl IntoUnsupported for &'static str {
    fn into_unsupported(self, path: &str) -> Result<EntryKind, ContextError> {
        Err(ContextError::UnsupportedType {
            path: path.to_owned(),
            kind: self,
        })
    }
}

/// The names in a directory, sorted, without `.` and `..`.
fn list_dir(dir: &impl AsFd, real: &str) -> Result<Vec<String>, ContextError> {
    let entries = rfs::Dir::read_from(dir).map_err(|e| io_error("listing", real, e))?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io_error("listing", real, e))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let name = std::str::from_utf8(name).map_err(|_| ContextError::NotUtf8 {
            dir: real.to_owned(),
        })?;
        names.push(name.to_owned());
    }
    names.sort();
    Ok(names)
}

fn read_link(dir: BorrowedFd<'_>, name: &str, real: &str) -> Result<String, ContextError> {
    let target =
        rfs::readlinkat(dir, name, Vec::new()).map_err(|e| io_error("reading", real, e))?;
    target.into_string().map_err(|_| ContextError::NotUtf8 {
        dir: real.to_owned(),
    })
}

fn join_real(resolved: &[String], name: &str) -> String {
    if resolved.is_empty() {
        name.to_owned()
    } else {
        format!("{}/{name}", resolved.join("/"))
    }
}

fn join_real_str(dir: &str, name: &str) -> String {
    if dir == "." || dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

fn io_error(action: &'static str, path: &str, errno: Errno) -> ContextError {
    ContextError::Io {
        action,
        path: path.to_owned(),
        error: errno.into(),
    }
}
