//! One layer's entries applied to the root, in archive order (see the table in `mod.rs`).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsFd;

use rustix::fs::{self as rfs, AtFlags, Mode, Timespec, Timestamps};
use tar::EntryType;

use super::entries::{EntryHead, Member, Pending, MAX_NAME};
use super::{Layer, Limits, Summary};
use crate::error::{ImageError, Result};
use crate::rootdir::{self, display, Kind, PathError, PathResult, RootDir};

/// Prefix of whiteout files.
const WHITEOUT: &[u8] = b".wh.";

/// Name of the opaque-directory marker.
const OPAQUE: &[u8] = b".wh..wh..opq";

/// Set-uid and set-gid bits, stripped from every mode.
const SETID: u32 = 0o6000;

/// What this layer created at a path (for hard links and same-layer whiteouts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Created {
    /// A regular file, symlink or fifo: a hard link may point here.
    Linkable,
    /// A directory.
    Directory,
}

/// The state of applying one layer.
pub(super) struct LayerApply<'a, 's> {
    /// The root written to.
    root: &'a RootDir,
    /// The layer, for messages.
    layer: &'a Layer<'a>,
    /// Image-wide limits.
    limits: Limits,
    /// Image-wide counts.
    summary: &'s mut Summary,
    /// Paths (`a/b/c`) this layer created so far.
    created: HashMap<Vec<u8>, Created>,
}

impl<'a, 's> LayerApply<'a, 's> {
    /// A fresh state for `layer`.
    pub(super) fn new(
        root: &'a RootDir,
        layer: &'a Layer<'a>,
        limits: Limits,
        summary: &'s mut Summary,
    ) -> Self {
        Self {
            root,
            layer,
            limits,
            summary,
            created: HashMap::new(),
        }
    }

    /// Applies every entry of `archive`.
    pub(super) fn run<R: Read>(mut self, archive: &mut tar::Archive<R>) -> Result<()> {
        let mut entries = archive.entries().map_err(|e| self.corrupt(e))?.raw(true);
        let mut pending = Pending::default();
        for entry in &mut entries {
            let mut entry = entry.map_err(|e| self.corrupt(e))?;
            let head = match pending.take(&mut entry) {
                Ok(Member::Extension) => continue,
                Ok(Member::Entry(head)) => head,
                Err(message) => {
                    let path = String::from_utf8_lossy(&entry.header().path_bytes()).into_owned();
                    return Err(self.refuse(&path, message));
                }
            };
            self.entry(head, &mut entry)?;
        }
        Ok(())
    }

    /// Applies one entry whose data is `data`.
    fn entry(&mut self, head: EntryHead, data: &mut dyn Read) -> Result<()> {
        let shown = String::from_utf8_lossy(&head.path).into_owned();
        let parts = clean(&head.path).map_err(|reason| self.refuse(&shown, reason))?;
        let Some((name, parents)) = parts.split_last() else {
            return Ok(()); // The root itself: its mode and owner stay Hutch's.
        };
        if name.starts_with(WHITEOUT) {
            return self.whiteout(&parts, &shown);
        }
        self.summary.files += 1;
        if self.summary.files > self.limits.max_files {
            return Err(self.limit("file count", self.limits.max_files, format!("at `{shown}`")));
        }
        if head.had_xattrs {
            self.summary.xattrs_ignored += 1;
        }
        if head.kind.is_file() || head.kind.is_contiguous() || head.kind.is_gnu_sparse() {
            let left = self.limits.max_bytes.saturating_sub(self.summary.bytes);
            if head.size > left {
                return Err(self.limit(
                    "size",
                    self.limits.max_bytes,
                    format!(
                        "`{shown}` declares {} bytes with {} already unpacked",
                        head.size, self.summary.bytes
                    ),
                ));
            }
            if head.kind.is_gnu_sparse() {
                return Err(self.refuse(&shown, "GNU sparse files are not supported".into()));
            }
        }
        let kind = head.kind;
        if kind == EntryType::Char || kind == EntryType::Block {
            self.summary.devices_skipped += 1;
            return Ok(());
        }
        let known = kind.is_file()
            || kind.is_contiguous()
            || kind.is_dir()
            || kind.is_symlink()
            || kind.is_hard_link()
            || kind.is_fifo();
        if !known {
            return Err(self.refuse(
                &shown,
                format!("entry type {:?} is not supported", kind.as_byte() as char),
            ));
        }
        if head.mode & SETID != 0 {
            self.summary.setid_stripped += 1;
        }
        let mode = head.mode & !SETID;
        let parent = self
            .root
            .walk(parents, true)
            .map_err(|e| self.refuse(&shown, e.reason()))?;
        let parent = parent.as_fd();
        let result = if kind.is_dir() {
            self.root.make_dir(parent, name, &parts).and_then(|dir| {
                self.root
                    .set_meta(dir.as_fd(), mode, head.uid, head.gid, &parts)
            })
        } else if kind.is_symlink() {
            let target = head.link.clone().unwrap_or_default();
            if target.is_empty() || target.len() as u64 > MAX_NAME {
                return Err(self.refuse(&shown, "symlink with an empty or overlong target".into()));
            }
            self.symlink(parent, name, &target, &head, &parts)
        } else if kind.is_hard_link() {
            return self.hard_link(parent, name, &head, &parts, &shown);
        } else if kind.is_fifo() {
            self.fifo(parent, name, mode, &head, &parts)
        } else {
            return self.file(parent, name, mode, &head, data, &parts, &shown);
        };
        result.map_err(|e| self.refuse(&shown, e.reason()))?;
        let created = if kind.is_dir() {
            Created::Directory
        } else {
            Created::Linkable
        };
        self.created.insert(parts.join(&b'/'), created);
        Ok(())
    }

    /// A regular file: replaces what is there, copies the data under the size limit.
    #[allow(clippy::too_many_arguments)]
    fn file(
        &mut self,
        parent: std::os::fd::BorrowedFd<'_>,
        name: &[u8],
        mode: u32,
        head: &EntryHead,
        data: &mut dyn Read,
        parts: &[&[u8]],
        shown: &str,
    ) -> Result<()> {
        let mut out = self
            .root
            .create_file(parent, name, parts)
            .map_err(|e| self.refuse(shown, e.reason()))?;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match data.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.corrupt(e)),
            };
            self.summary.bytes += n as u64;
            if self.summary.bytes > self.limits.max_bytes {
                return Err(self.limit(
                    "size",
                    self.limits.max_bytes,
                    format!("while writing `{shown}`"),
                ));
            }
            out.write_all(&buf[..n])
                .map_err(|e| ImageError::io("writing", self.root.path().join(display(parts)), e))?;
        }
        self.root
            .set_meta(out.as_fd(), mode, head.uid, head.gid, parts)
            .map_err(|e| self.refuse(shown, e.reason()))?;
        let time = Timespec {
            tv_sec: i64::try_from(head.mtime).unwrap_or(0),
            tv_nsec: 0,
        };
        // Best effort: a wrong mtime harms nothing.
        let _ = rfs::futimens(
            out.as_fd(),
            &Timestamps {
                last_access: time,
                last_modification: time,
            },
        );
        self.created.insert(parts.join(&b'/'), Created::Linkable);
        Ok(())
    }

    /// A symlink, never followed: `target` is stored as text.
    fn symlink(
        &self,
        parent: std::os::fd::BorrowedFd<'_>,
        name: &[u8],
        target: &[u8],
        head: &EntryHead,
        parts: &[&[u8]],
    ) -> PathResult<()> {
        rootdir::remove_all(parent, name, parts)?;
        rfs::symlinkat(target, parent, name)
            .map_err(|e| PathError::Io("creating symlink", display(parts), e.into()))?;
        self.root
            .set_owner_at(parent, name, head.uid, head.gid, parts)
    }

    /// A fifo.
    fn fifo(
        &self,
        parent: std::os::fd::BorrowedFd<'_>,
        name: &[u8],
        mode: u32,
        head: &EntryHead,
        parts: &[&[u8]],
    ) -> PathResult<()> {
        rootdir::remove_all(parent, name, parts)?;
        rfs::mknodat(
            parent,
            name,
            rfs::FileType::Fifo,
            Mode::from_raw_mode(mode),
            0,
        )
        .map_err(|e| PathError::Io("creating fifo", display(parts), e.into()))?;
        self.root
            .set_owner_at(parent, name, head.uid, head.gid, parts)?;
        // Just made as a fifo, so this names no symlink.
        rfs::chmodat(parent, name, Mode::from_raw_mode(mode), AtFlags::empty())
            .map_err(|e| PathError::Io("setting mode of", display(parts), e.into()))
    }

    /// A hard link: only to a file, symlink or fifo this layer made earlier.
    fn hard_link(
        &mut self,
        parent: std::os::fd::BorrowedFd<'_>,
        name: &[u8],
        head: &EntryHead,
        parts: &[&[u8]],
        shown: &str,
    ) -> Result<()> {
        let raw = head.link.clone().unwrap_or_default();
        let target_shown = String::from_utf8_lossy(&raw).into_owned();
        let target = clean(&raw).map_err(|reason| {
            self.refuse(
                shown,
                format!("hard link target `{target_shown}`: {reason}"),
            )
        })?;
        let key = target.join(&b'/');
        if self.created.get(&key) != Some(&Created::Linkable) {
            return Err(self.refuse(
                shown,
                format!("hard link to `{target_shown}`, which is not a file this layer created before it"),
            ));
        }
        if key == parts.join(&b'/') {
            return Ok(());
        }
        let Some((target_name, target_parents)) = target.split_last() else {
            return Err(self.refuse(shown, "hard link to the root".into()));
        };
        let result = self.root.walk(target_parents, false).and_then(|from| {
            rootdir::remove_all(parent, name, parts)?;
            rfs::linkat(from.as_fd(), *target_name, parent, name, AtFlags::empty())
                .map_err(|e| PathError::Io("creating hard link", display(parts), e.into()))
        });
        result.map_err(|e| self.refuse(shown, e.reason()))?;
        self.created.insert(parts.join(&b'/'), Created::Linkable);
        Ok(())
    }

    /// `.wh.NAME` deletes NAME from lower layers; `.wh..wh..opq` empties its directory of
    /// what lower layers put there. Other `.wh..wh.` names (aufs metadata) are ignored.
    fn whiteout(&mut self, parts: &[&[u8]], shown: &str) -> Result<()> {
        let (name, parents) = parts.split_last().expect("a whiteout has a name");
        if *name == OPAQUE {
            return self.opaque(parents, shown);
        }
        if name.starts_with(b".wh..wh.") {
            return Ok(());
        }
        let hidden = &name[WHITEOUT.len()..];
        if hidden.is_empty() || hidden == b"." || hidden == b".." {
            return Err(self.refuse(shown, "whiteout of an invalid name".into()));
        }
        let mut target: Vec<&[u8]> = parents.to_vec();
        target.push(hidden);
        if self.created.contains_key(&target.join(&b'/')) {
            return Ok(()); // Whiteouts hide lower layers only.
        }
        let dir = match self.root.walk(parents, false) {
            Ok(dir) => dir,
            Err(PathError::Io(_, _, e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(())
            }
            Err(e) => return Err(self.refuse(shown, e.reason())),
        };
        if rootdir::kind_at(dir.as_fd(), hidden, &target)
            .map_err(|e| self.refuse(shown, e.reason()))?
            != Kind::Missing
        {
            self.summary.whiteouts += 1;
        }
        rootdir::remove_all(dir.as_fd(), hidden, &target)
            .map_err(|e| self.refuse(shown, e.reason()))
    }

    /// Removes from the directory `dir` everything this layer did not create.
    fn opaque(&mut self, dir: &[&[u8]], shown: &str) -> Result<()> {
        let result = self.root.walk(dir, true).and_then(|fd| {
            let mut removed = 0;
            for child in rootdir::list(fd.as_fd(), dir)? {
                let mut path: Vec<&[u8]> = dir.to_vec();
                path.push(&child);
                if !self.created.contains_key(&path.join(&b'/')) {
                    rootdir::remove_all(fd.as_fd(), &child, &path)?;
                    removed += 1;
                }
            }
            Ok(removed)
        });
        self.summary.whiteouts += result.map_err(|e| self.refuse(shown, e.reason()))?;
        Ok(())
    }

    /// An [`ImageError::UnsafeEntry`].
    fn refuse(&self, entry: &str, reason: String) -> ImageError {
        ImageError::UnsafeEntry {
            layer: self.layer.digest.to_owned(),
            entry: entry.to_owned(),
            reason,
        }
    }

    /// An [`ImageError::LimitExceeded`].
    fn limit(&self, limit: &'static str, max: u64, detail: String) -> ImageError {
        ImageError::LimitExceeded {
            layer: self.layer.digest.to_owned(),
            limit,
            max,
            detail,
        }
    }

    /// An [`ImageError::CorruptLayer`].
    fn corrupt(&self, e: impl std::fmt::Display) -> ImageError {
        super::corrupt(self.layer, e)
    }
}

/// The components of an archive path: `./` and empty components dropped; absolute paths
/// and `..` refused.
fn clean(path: &[u8]) -> std::result::Result<Vec<&[u8]>, String> {
    if path.first() == Some(&b'/') {
        return Err(String::from("absolute path"));
    }
    if path.len() as u64 > MAX_NAME {
        return Err(format!("path longer than {MAX_NAME} bytes"));
    }
    let mut parts = Vec::new();
    for part in path.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err(String::from("path with a `..` component")),
            other => parts.push(other),
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleans_archive_paths() {
        assert_eq!(
            clean(b"./usr//bin/").expect("ok"),
            vec![&b"usr"[..], &b"bin"[..]]
        );
        assert_eq!(clean(b"./").expect("ok"), Vec::<&[u8]>::new());
        assert!(clean(b"/etc/shadow").is_err());
        assert!(clean(b"a/../../etc").is_err());
        assert!(clean(b"..").is_err());
    }
}
