//! [`RootDir`]: writing inside a root filesystem through directory descriptors, never
//! following a symlink.
//!
//! A root built from an image holds whatever its layers say: `etc` may be a symlink to
//! `/etc`, `workspace` one to `/root`. Every write here starts from a descriptor of the
//! root and opens one path component at a time with `O_NOFOLLOW | O_DIRECTORY`, so a
//! symlink or a file where a directory is expected stops the walk with
//! [`PathError::Symlink`] or [`PathError::NotDirectory`] instead of leading outside. Final
//! components are created with `O_CREAT | O_EXCL | O_NOFOLLOW` (after removing what was
//! there) and changed with `*at` calls that do not follow symlinks, so nothing is ever
//! written through a link. Paths given here are relative, `/`-separated and contain no
//! `..` (callers check; [`split_relative`] does it for text paths).

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::error::{ImageError, Result};

/// Why a path inside the root cannot be used as asked.
#[derive(Debug)]
pub(crate) enum PathError {
    /// This prefix of the path is a symlink, which is never followed.
    Symlink(String),
    /// This prefix of the path is neither a directory nor missing.
    NotDirectory(String),
    /// The operating system refused `action` on this prefix.
    Io(&'static str, String, io::Error),
}

impl PathError {
    /// A one-line reason for error messages.
    pub(crate) fn reason(&self) -> String {
        match self {
            Self::Symlink(p) => format!("`{p}` is a symlink, and symlinks are never followed"),
            Self::NotDirectory(p) => format!("`{p}` is not a directory"),
            Self::Io(action, p, e) => format!("{action} `{p}`: {e}"),
        }
    }
}

/// Shorthand for results of operations inside a root.
pub(crate) type PathResult<T> = std::result::Result<T, PathError>;

/// Joins components for messages (`etc/passwd`).
pub(crate) fn display(components: &[&[u8]]) -> String {
    let parts: Vec<String> = components
        .iter()
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    parts.join("/")
}

/// Splits a relative text path into components, refusing absolute paths and `..`.
pub fn split_relative(path: &str) -> Option<Vec<&[u8]>> {
    if path.starts_with('/') {
        return None;
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            other => parts.push(other.as_bytes()),
        }
    }
    Some(parts)
}

/// What is at a path, without following a final symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Nothing.
    Missing,
    /// A directory.
    Directory,
    /// A symlink.
    Symlink,
    /// Anything else (file, fifo, device, socket).
    Other,
}

/// An open root directory that is written only through descriptors.
#[derive(Debug)]
pub struct RootDir {
    /// `O_DIRECTORY` descriptor of the root.
    fd: OwnedFd,
    /// Its path, for messages only.
    path: PathBuf,
    /// Whether ownership is applied (only root may `chown`).
    chown: bool,
}

impl RootDir {
    /// Opens the existing directory `path` (itself not a symlink).
    pub fn open(path: &Path) -> Result<Self> {
        let fd = rfs::open(path, dir_flags(), Mode::empty())
            .map_err(|e| ImageError::io("opening root directory", path, e.into()))?;
        Ok(Self {
            fd,
            path: path.to_path_buf(),
            chown: rustix::process::geteuid().is_root(),
        })
    }

    /// The root's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes `rel` a directory with exactly `mode` and owner `id:id` (when running as root),
    /// creating missing parents (0755). Something that is not a directory there is replaced;
    /// a symlink on the way is refused.
    pub fn ensure_dir(&self, rel: &str, mode: u32, id: u32) -> Result<()> {
        let parts = self.split(rel)?;
        let (name, parents) = parts
            .split_last()
            .ok_or_else(|| self.unsafe_path(rel, "empty path"))?;
        let result = self.walk(parents, true).and_then(|parent| {
            let dir = self.make_dir(parent.as_fd(), name, &parts)?;
            self.set_meta(dir.as_fd(), mode, id, id, &parts)
        });
        result.map_err(|e| self.unsafe_path(rel, &e.reason()))
    }

    /// Keeps a directory at `rel` as it is; anything else there (nothing, a symlink, a file)
    /// becomes a new directory with `mode`, owned by root.
    pub fn ensure_dir_keeping(&self, rel: &str, mode: u32) -> Result<()> {
        let parts = self.split(rel)?;
        let Some((name, parents)) = parts.split_last() else {
            return Ok(());
        };
        let result = self.walk(parents, true).and_then(|parent| {
            if kind_at(parent.as_fd(), name, &parts)? != Kind::Directory {
                let dir = self.make_dir(parent.as_fd(), name, &parts)?;
                self.set_meta(dir.as_fd(), mode, 0, 0, &parts)?;
            }
            Ok(())
        });
        result.map_err(|e| self.unsafe_path(rel, &e.reason()))
    }

    /// Writes `contents` as a new regular file `rel` (mode `mode`, owned by root), replacing
    /// whatever was there (a symlink is removed, never written through).
    pub fn write_file(&self, rel: &str, contents: &[u8], mode: u32) -> Result<()> {
        let parts = self.split(rel)?;
        let (name, parents) = parts
            .split_last()
            .ok_or_else(|| self.unsafe_path(rel, "empty path"))?;
        let result = self.walk(parents, true).and_then(|parent| {
            let mut file = self.create_file(parent.as_fd(), name, &parts)?;
            file.write_all(contents)
                .map_err(|e| PathError::Io("writing", display(&parts), e))?;
            self.set_meta(file.as_fd(), mode, 0, 0, &parts)
        });
        result.map_err(|e| self.unsafe_path(rel, &e.reason()))
    }

    /// Opens the directory `parts` (the root for no parts), one component at a time without
    /// following symlinks. With `create`, missing directories are made (0755, root).
    pub(crate) fn walk(&self, parts: &[&[u8]], create: bool) -> PathResult<OwnedFd> {
        let mut current = rfs::openat(self.fd.as_fd(), c".", dir_flags(), Mode::empty())
            .map_err(|e| PathError::Io("opening", String::from("."), e.into()))?;
        for (i, part) in parts.iter().enumerate() {
            let prefix = &parts[..=i];
            current = match rfs::openat(current.as_fd(), *part, dir_flags(), Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::NOENT) if create => {
                    let dir = self.make_dir(current.as_fd(), part, prefix)?;
                    self.set_meta(dir.as_fd(), 0o755, 0, 0, prefix)?;
                    dir
                }
                Err(Errno::LOOP | Errno::NOTDIR) => {
                    return Err(match kind_at(current.as_fd(), part, prefix)? {
                        Kind::Symlink => PathError::Symlink(display(prefix)),
                        _ => PathError::NotDirectory(display(prefix)),
                    })
                }
                Err(e) => return Err(PathError::Io("opening", display(prefix), e.into())),
            };
        }
        Ok(current)
    }

    /// Makes `name` in `parent` a directory (keeping an existing one, replacing anything
    /// else) and opens it. New directories start as 0700 until [`Self::set_meta`].
    pub(crate) fn make_dir(
        &self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        parts: &[&[u8]],
    ) -> PathResult<OwnedFd> {
        match kind_at(parent, name, parts)? {
            Kind::Directory => {}
            Kind::Missing => mkdir(parent, name, parts)?,
            Kind::Symlink | Kind::Other => {
                remove_all(parent, name, parts)?;
                mkdir(parent, name, parts)?;
            }
        }
        rfs::openat(parent, name, dir_flags(), Mode::empty())
            .map_err(|e| PathError::Io("opening directory", display(parts), e.into()))
    }

    /// Removes whatever is at `name` in `parent` and creates an empty regular file there
    /// (0600 until [`Self::set_meta`]).
    pub(crate) fn create_file(
        &self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        parts: &[&[u8]],
    ) -> PathResult<File> {
        remove_all(parent, name, parts)?;
        let flags =
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rfs::openat(parent, name, flags, Mode::from_raw_mode(0o600))
            .map_err(|e| PathError::Io("creating", display(parts), e.into()))?;
        Ok(File::from(fd))
    }

    /// Sets the owner (when running as root) and then the mode of an open file or directory:
    /// `chown` clears set-id bits, so the mode comes second.
    pub(crate) fn set_meta(
        &self,
        fd: BorrowedFd<'_>,
        mode: u32,
        uid: u32,
        gid: u32,
        parts: &[&[u8]],
    ) -> PathResult<()> {
        if self.chown {
            rfs::fchown(fd, Some(uid_of(uid)), Some(gid_of(gid)))
                .map_err(|e| PathError::Io("changing owner of", display(parts), e.into()))?;
        }
        rfs::fchmod(fd, Mode::from_raw_mode(mode))
            .map_err(|e| PathError::Io("setting mode of", display(parts), e.into()))
    }

    /// Sets the owner of `name` in `parent` without following it (for symlinks and fifos).
    pub(crate) fn set_owner_at(
        &self,
        parent: BorrowedFd<'_>,
        name: &[u8],
        uid: u32,
        gid: u32,
        parts: &[&[u8]],
    ) -> PathResult<()> {
        if !self.chown {
            return Ok(());
        }
        rfs::chownat(
            parent,
            name,
            Some(uid_of(uid)),
            Some(gid_of(gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| PathError::Io("changing owner of", display(parts), e.into()))
    }

    /// Splits `rel`, refusing absolute paths and `..`.
    fn split<'a>(&self, rel: &'a str) -> Result<Vec<&'a [u8]>> {
        split_relative(rel).ok_or_else(|| self.unsafe_path(rel, "not a plain relative path"))
    }

    /// An [`ImageError::UnsafePath`] for `rel`.
    fn unsafe_path(&self, rel: &str, reason: &str) -> ImageError {
        ImageError::UnsafePath {
            root: self.path.clone(),
            path: rel.to_owned(),
            reason: reason.to_owned(),
        }
    }
}

/// Flags for opening a directory component: never a symlink, never inherited.
fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Uid for `chown`; `u32::MAX` (-1, "unchanged") becomes root's.
fn uid_of(id: u32) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(if id == u32::MAX { 0 } else { id })
}

/// Gid for `chown`; `u32::MAX` becomes root's.
fn gid_of(id: u32) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(if id == u32::MAX { 0 } else { id })
}

/// What `name` in `parent` is, without following it.
pub(crate) fn kind_at(parent: BorrowedFd<'_>, name: &[u8], parts: &[&[u8]]) -> PathResult<Kind> {
    match rfs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(match rfs::FileType::from_raw_mode(stat.st_mode) {
            rfs::FileType::Directory => Kind::Directory,
            rfs::FileType::Symlink => Kind::Symlink,
            _ => Kind::Other,
        }),
        Err(Errno::NOENT) => Ok(Kind::Missing),
        Err(e) => Err(PathError::Io("inspecting", display(parts), e.into())),
    }
}

/// `mkdirat(parent, name, 0700)`.
fn mkdir(parent: BorrowedFd<'_>, name: &[u8], parts: &[&[u8]]) -> PathResult<()> {
    rfs::mkdirat(parent, name, Mode::from_raw_mode(0o700))
        .map_err(|e| PathError::Io("creating directory", display(parts), e.into()))
}

/// Removes `name` in `parent` and, for a directory, everything below it, without following
/// symlinks. A missing `name` is not an error.
pub(crate) fn remove_all(parent: BorrowedFd<'_>, name: &[u8], parts: &[&[u8]]) -> PathResult<()> {
    let io_err = |action, e: Errno| PathError::Io(action, display(parts), e.into());
    match rfs::unlinkat(parent, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => return Ok(()),
        Err(Errno::ISDIR) => {}
        Err(e) => return Err(io_err("removing", e)),
    }
    let dir = rfs::openat(parent, name, dir_flags(), Mode::empty())
        .map_err(|e| io_err("opening directory", e))?;
    let mut children = Vec::new();
    for entry in rfs::Dir::read_from(dir.as_fd()).map_err(|e| io_err("listing", e))? {
        let entry = entry.map_err(|e| io_err("listing", e))?;
        let child = entry.file_name().to_bytes();
        if child != b"." && child != b".." {
            children.push(child.to_vec());
        }
    }
    for child in &children {
        let mut child_parts = parts.to_vec();
        child_parts.push(child);
        remove_all(dir.as_fd(), child, &child_parts)?;
    }
    rfs::unlinkat(parent, name, AtFlags::REMOVEDIR).map_err(|e| io_err("removing directory", e))
}

/// Names of the entries of the directory `dir` (without `.` and `..`).
pub(crate) fn list(dir: BorrowedFd<'_>, parts: &[&[u8]]) -> PathResult<Vec<Vec<u8>>> {
    let io_err = |e: Errno| PathError::Io("listing", display(parts), e.into());
    let mut names = Vec::new();
    for entry in rfs::Dir::read_from(dir).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{symlink, PermissionsExt};

    use super::*;

    #[test]
    fn splits_only_plain_relative_paths() {
        assert_eq!(
            split_relative("./etc//hosts"),
            Some(vec![&b"etc"[..], &b"hosts"[..]])
        );
        assert_eq!(split_relative("/etc/hosts"), None);
        assert_eq!(split_relative("a/../../b"), None);
        assert_eq!(split_relative("."), Some(vec![]));
    }

    /// `etc` → the host directory, `workspace` → a host directory: layout writes replace the
    /// links and the host side is untouched.
    #[test]
    fn writes_never_follow_symlinks() {
        let host = tempfile::tempdir().expect("tempdir");
        fs::write(host.path().join("hosts"), b"host file").expect("write");
        fs::set_permissions(host.path(), fs::Permissions::from_mode(0o711)).expect("chmod");
        let scratch = tempfile::tempdir().expect("tempdir");
        let root = scratch.path();
        symlink(host.path(), root.join("etc")).expect("symlink");
        symlink(host.path(), root.join("workspace")).expect("symlink");
        fs::create_dir(root.join("var")).expect("mkdir");
        symlink(host.path(), root.join("var/lib")).expect("symlink");
        let dir = RootDir::open(root).expect("open");

        let err = dir
            .write_file("var/lib/x", b"y", 0o644)
            .expect_err("through a symlink");
        assert!(err.to_string().contains("`var/lib` is a symlink"), "{err}");
        dir.ensure_dir("workspace", 0o755, 0)
            .expect("replaces the link");
        dir.ensure_dir("etc", 0o755, 0).expect("replaces the link");
        dir.write_file("etc/hosts", b"sandbox", 0o644)
            .expect("write");

        assert_eq!(
            fs::read(host.path().join("hosts")).expect("read"),
            b"host file"
        );
        assert_eq!(
            fs::metadata(host.path())
                .expect("stat")
                .permissions()
                .mode()
                & 0o777,
            0o711
        );
        assert!(fs::symlink_metadata(root.join("workspace"))
            .expect("stat")
            .is_dir());
        assert_eq!(fs::read(root.join("etc/hosts")).expect("read"), b"sandbox");
        assert!(!host.path().join("x").exists());
    }
}
