//! The merge walk: copy a source tree onto a destination tree with overlayfs's rules, shifting
//! ids, two directory descriptors open at a time.

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use super::xattr::{self, OPAQUE};
use super::{IdShift, LayerStats};
use crate::fsat::{self, cname, Node, Stat};
use crate::sys::{self, SysError};
use crate::{teardown, JailError};

/// One directory being walked.
struct Level {
    /// Its metadata in the source (times are applied when it is left).
    st: Stat,
    /// Entries still to visit.
    pending: Vec<OsString>,
}

/// Names in the directory open as `dir`.
fn list(dir: &OwnedFd) -> Result<Vec<OsString>, JailError> {
    let path = format!("/proc/self/fd/{}", dir.as_raw_fd());
    let entries = std::fs::read_dir(&path).map_err(|e| JailError::Sys {
        op: "list a directory of the layer".into(),
        source: e,
    })?;
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| JailError::Sys {
            op: "read a directory of the layer".into(),
            source: e,
        })?;
        names.push(entry.file_name());
    }
    Ok(names)
}

/// Whether `node` carries `trusted.overlay.opaque = "y"`.
fn is_opaque(node: &Node<'_>) -> Result<bool, SysError> {
    Ok(fsat::get_xattr(node, OPAQUE)?.is_some_and(|v| v == b"y"))
}

/// Copy the extended attributes of `src` that a layer keeps onto `dst`. With `replace`, the
/// attributes `dst` already has (but the opaque marker) are removed first.
fn copy_xattrs(
    src: &Node<'_>,
    dst: &Node<'_>,
    shift: &IdShift,
    replace: bool,
) -> Result<(), SysError> {
    if replace {
        for name in fsat::list_xattrs(dst)? {
            if name.as_c_str() != OPAQUE {
                fsat::remove_xattr(dst, &name)?;
            }
        }
    }
    for name in fsat::list_xattrs(src)? {
        let Some(value) = fsat::get_xattr(src, &name)? else {
            continue;
        };
        if let Some(v) = xattr::translate(name.as_bytes(), &value, shift) {
            fsat::set_xattr(dst, &name, &v)?;
        }
    }
    Ok(())
}

/// Remove the entry `name` of `dir`, whatever it is (a directory with all it holds).
fn remove_entry(dir: &OwnedFd, name: &CStr, st: &Stat) -> Result<(), JailError> {
    if st.is_dir() {
        let sub = sys::open_dir_at(Some(dir), name)?;
        teardown::empty_dir(sub, Path::new(&*name.to_string_lossy()))?;
        sys::unlinkat(dir, name, libc::AT_REMOVEDIR)?;
    } else {
        sys::unlinkat(dir, name, 0)?;
    }
    Ok(())
}

/// The walk's state: where it is in both trees and what it has copied.
struct Walk<'a> {
    shift: IdShift,
    dst_root: &'a Path,
    src_dev: u64,
    /// Directories the walk is in, top first.
    stack: Vec<Level>,
    /// Path of the current directory relative to the top (to hard-link by path).
    rel: PathBuf,
    /// First copy of each multiply-linked source file, by (device, inode).
    links: HashMap<(u64, u64), PathBuf>,
    skipped: u64,
    /// Make a plain tree, not a layer ([`merge_as`]).
    flatten: bool,
}

/// Copy the tree at `src` onto the directory `dst` (which exists), shifting ids with `shift`:
/// non-directories and whiteouts replace what is in `dst`, opaque directories replace
/// directories, other directories merge into directories. Returns the number of entries left
/// out (sockets and devices).
pub(crate) fn merge(src: &Path, dst: &Path, shift: IdShift) -> Result<u64, JailError> {
    merge_as(src, dst, shift, false)
}

/// [`merge`], and with `flatten` the result is a plain tree rather than a layer: whiteouts
/// delete what they name and are not copied, opaque directories replace what was there and
/// lose their marker.
pub(crate) fn merge_as(
    src: &Path,
    dst: &Path,
    shift: IdShift,
    flatten: bool,
) -> Result<u64, JailError> {
    let mut src_dir = sys::open_dir_at(None, &sys::cpath(src)?)?;
    let mut dst_dir = sys::open_dir_at(None, &sys::cpath(dst)?)?;
    let top = fsat::stat_fd(&src_dir)?;
    let mut w = Walk {
        shift,
        dst_root: dst,
        src_dev: top.dev,
        stack: Vec::new(),
        rel: PathBuf::new(),
        links: HashMap::new(),
        skipped: 0,
        flatten,
    };
    w.set_owner_mode_xattrs(&Node::Fd(&src_dir), &Node::Fd(&dst_dir), &top, true)?;
    w.stack.push(Level {
        st: top,
        pending: list(&src_dir)?,
    });
    while let Some(level) = w.stack.last_mut() {
        if let Some(name) = level.pending.pop() {
            if let Some((s, d)) = w.entry(&src_dir, &dst_dir, &name)? {
                src_dir = s;
                dst_dir = d;
            }
            continue;
        }
        // Leaving a directory: its times last (creating entries changed them).
        let done = w
            .stack
            .pop()
            .expect("the loop checked the stack is not empty");
        fsat::utimes_fd(&dst_dir, &done.st)?;
        let Some(parent) = w.stack.last() else {
            break;
        };
        src_dir = sys::open_dir_at(Some(&src_dir), c"..")?;
        dst_dir = sys::open_dir_at(Some(&dst_dir), c"..")?;
        let back = fsat::stat_fd(&src_dir)?;
        if (back.dev, back.ino) != (parent.st.dev, parent.st.ino) {
            return Err(JailError::Refused(format!(
                "copy {}: the tree changed while it was being copied",
                src.display()
            )));
        }
        w.rel.pop();
    }
    Ok(w.skipped)
}

impl Walk<'_> {
    /// Owner, mode and attributes of a directory, FIFO or file from the source's `st`.
    /// `replace`: drop the attributes the destination had (a directory merged into).
    fn set_owner_mode_xattrs(
        &self,
        src: &Node<'_>,
        dst: &Node<'_>,
        st: &Stat,
        replace: bool,
    ) -> Result<(), SysError> {
        let (uid, gid) = (self.shift.map(st.uid), self.shift.map(st.gid));
        // chown clears setuid/setgid: mode after owner, attributes (file capabilities) last.
        match dst {
            Node::Fd(fd) => {
                fsat::chown_fd(fd, uid, gid)?;
                fsat::chmod_fd(fd, st.perm())?;
            }
            Node::At(dir, name) => {
                fsat::chown_at(dir, name, uid, gid)?;
                if st.kind() != libc::S_IFLNK {
                    fsat::chmod_at(dir, name, st.perm())?;
                }
            }
        }
        copy_xattrs(src, dst, &self.shift, replace)
    }

    /// Copy one entry of the current directory. Returns the descriptors of the directory to
    /// descend into, if the entry is one.
    fn entry(
        &mut self,
        src_dir: &OwnedFd,
        dst_dir: &OwnedFd,
        name: &OsString,
    ) -> Result<Option<(OwnedFd, OwnedFd)>, JailError> {
        let c = cname(name)?;
        let Some(st) = fsat::stat_at(src_dir, &c)? else {
            return Ok(None);
        };
        let existing = fsat::stat_at(dst_dir, &c)?;
        if st.is_dir() {
            if st.dev != self.src_dev {
                self.skipped += 1;
                return Ok(None);
            }
            return self
                .directory(src_dir, dst_dir, name, &c, st, existing)
                .map(Some);
        }
        if let Some(e) = &existing {
            remove_entry(dst_dir, &c, e)?;
        }
        let src = Node::At(src_dir, &c);
        let dst = Node::At(dst_dir, &c);
        match st.kind() {
            // Flattening: the whiteout removed what it names (above), and is gone itself.
            libc::S_IFCHR if st.is_whiteout() && self.flatten => {}
            libc::S_IFCHR if st.is_whiteout() => {
                fsat::mknod_at(dst_dir, &c, libc::S_IFCHR, 0)?;
                fsat::chown_at(dst_dir, &c, 0, 0)?;
            }
            libc::S_IFREG => self.file(src_dir, dst_dir, name, &c, &st)?,
            libc::S_IFLNK => {
                let target = fsat::readlink_at(src_dir, &c)?;
                fsat::symlink_at(&target, dst_dir, &c)?;
                self.set_owner_mode_xattrs(&src, &dst, &st, false)?;
                fsat::utimes_at(dst_dir, &c, &st)?;
            }
            libc::S_IFIFO => {
                fsat::mknod_at(dst_dir, &c, libc::S_IFIFO | 0o600, 0)?;
                self.set_owner_mode_xattrs(&src, &dst, &st, false)?;
                fsat::utimes_at(dst_dir, &c, &st)?;
            }
            _ => self.skipped += 1,
        }
        Ok(None)
    }

    /// Create or merge into the directory `name` and return both descriptors to descend.
    fn directory(
        &mut self,
        src_dir: &OwnedFd,
        dst_dir: &OwnedFd,
        name: &OsString,
        c: &CString,
        st: Stat,
        existing: Option<Stat>,
    ) -> Result<(OwnedFd, OwnedFd), JailError> {
        let src_opaque = is_opaque(&Node::At(src_dir, c))?;
        let merge_into = existing.is_some_and(|e| e.is_dir()) && !src_opaque;
        let opaque = if merge_into {
            // Merging into a directory of the base keeps whether it hides the template.
            is_opaque(&Node::At(dst_dir, c))?
        } else {
            if let Some(e) = &existing {
                remove_entry(dst_dir, c, e)?;
            }
            fsat::mkdir_at(dst_dir, c, 0o700)?;
            // A directory that replaces a file or whiteout of the base hides the template's
            // entry of that name too (overlayfs stops at the base's non-directory).
            src_opaque || existing.is_some()
        };
        let sub_src = sys::open_dir_at(Some(src_dir), c)?;
        let check = fsat::stat_fd(&sub_src)?;
        if (check.dev, check.ino) != (st.dev, st.ino) {
            return Err(JailError::Refused(format!(
                "copy {:?}: the tree changed while it was being copied",
                name
            )));
        }
        let sub_dst = sys::open_dir_at(Some(dst_dir), c)?;
        self.set_owner_mode_xattrs(&Node::Fd(&sub_src), &Node::Fd(&sub_dst), &st, merge_into)?;
        if opaque && !self.flatten {
            fsat::set_xattr(&Node::Fd(&sub_dst), OPAQUE, b"y")?;
        } else if merge_into {
            fsat::remove_xattr(&Node::Fd(&sub_dst), OPAQUE)?;
        }
        let pending = list(&sub_src)?;
        self.rel.push(name);
        self.stack.push(Level { st, pending });
        Ok((sub_src, sub_dst))
    }

    /// Copy a regular file (or hard-link it to its first copy).
    fn file(
        &mut self,
        src_dir: &OwnedFd,
        dst_dir: &OwnedFd,
        name: &OsString,
        c: &CString,
        st: &Stat,
    ) -> Result<(), JailError> {
        let key = (st.dev, st.ino);
        if st.nlink > 1 {
            if let Some(first) = self.links.get(&key) {
                let existing = sys::cpath(&self.dst_root.join(first))?;
                match fsat::link_at(&existing, dst_dir, c) {
                    Ok(()) => return Ok(()),
                    // Too long a path or the first copy is gone: copy the data again.
                    Err(e) if matches!(e.errno, libc::ENAMETOOLONG | libc::ENOENT) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let src_fd = fsat::open_at(src_dir, c, libc::O_RDONLY | libc::O_NONBLOCK, 0)?;
        let check = fsat::stat_fd(&src_fd)?;
        if check.kind() != libc::S_IFREG || (check.dev, check.ino) != key {
            return Err(JailError::Refused(format!(
                "copy {:?}: the file changed while it was being copied",
                name
            )));
        }
        let dst_fd = fsat::open_at(
            dst_dir,
            c,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            0o600,
        )?;
        let (src_file, dst_file) = (File::from(src_fd), File::from(dst_fd));
        std::io::copy(&mut &src_file, &mut &dst_file).map_err(|e| JailError::Sys {
            op: format!("copy the data of {:?}", name),
            source: e,
        })?;
        let (src_fd, dst_fd) = (OwnedFd::from(src_file), OwnedFd::from(dst_file));
        self.set_owner_mode_xattrs(&Node::Fd(&src_fd), &Node::Fd(&dst_fd), st, false)?;
        fsat::utimes_fd(&dst_fd, st)?;
        if st.nlink > 1 {
            self.links.insert(key, self.rel.join(name));
        }
        Ok(())
    }
}

/// Count what the tree at `root` holds, walking it like [`merge`] does.
pub(crate) fn usage(root: &Path) -> Result<LayerStats, JailError> {
    let mut stats = LayerStats {
        dirs: 1,
        ..LayerStats::default()
    };
    let mut cur = sys::open_dir_at(None, &sys::cpath(root)?)?;
    let dev = fsat::stat_fd(&cur)?.dev;
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![list(&cur)?];
    while let Some(pending) = stack.last_mut() {
        let Some(name) = pending.pop() else {
            stack.pop();
            if stack.is_empty() {
                break;
            }
            cur = sys::open_dir_at(Some(&cur), c"..")?;
            continue;
        };
        let c = cname(&name)?;
        let Some(st) = fsat::stat_at(&cur, &c)? else {
            continue;
        };
        match st.kind() {
            libc::S_IFDIR if st.dev == dev => {
                cur = sys::open_dir_at(Some(&cur), &c)?;
                stats.dirs += 1;
                stack.push(list(&cur)?);
            }
            libc::S_IFREG if seen.insert((st.dev, st.ino)) => {
                stats.files += 1;
                stats.bytes += st.size;
            }
            libc::S_IFLNK => stats.symlinks += 1,
            libc::S_IFCHR if st.is_whiteout() => stats.whiteouts += 1,
            _ => {}
        }
    }
    Ok(stats)
}
