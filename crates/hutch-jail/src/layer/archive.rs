//! A layer as one file: [`pack_layer`] writes a layer directory (0-based ids, overlayfs
//! lower-layer form, as [`super::export_layer`] makes it) into a tar archive, and
//! [`unpack_layer`] makes the same layer again from it, on another host.
//!
//! # Format
//! POSIX tar (GNU long names) in walk order, every directory before what it holds, the
//! layer's root first as `.`. Each entry keeps its owner (0-based), mode (setuid, setgid and
//! sticky bits included) and modification time (seconds). Regular files, directories,
//! symlinks, FIFOs, hard links (`Link` entries naming the first path of the inode) and
//! whiteouts (character devices 0/0). Extended attributes are PAX records
//! `SCHILY.xattr.NAME`, as GNU tar and libarchive write them; the opaque marker of a
//! directory is `SCHILY.xattr.trusted.overlay.opaque`.
//!
//! # Unpacking what may not be ours
//! The archive comes back from object storage, which whoever can write the bucket can also
//! write; the caller checks its sha256 against the one recorded when it was uploaded, and
//! the unpacking trusts nothing anyway:
//! - an entry's path is relative and made only of plain components (no `..`, no root);
//! - every directory on the way to an entry is opened relative to its parent with
//!   `O_NOFOLLOW | O_DIRECTORY`, so a symlink in the archive can never redirect a later
//!   entry outside the layer; a hard link's target is reached the same way and is never a
//!   directory or a symlink followed;
//! - entries are created exclusively (a second entry of one path is refused);
//! - device files other than whiteouts (0/0), sockets and anything else are refused;
//! - of the extended attributes only `user.*`, `security.capability`, the POSIX ACLs and
//!   `trusted.overlay.opaque` = `y` on a directory are set (the rest of `trusted.*` would be
//!   overlayfs's own bookkeeping, which a layer never carries);
//! - ids must be below 65,536 (the size of a sandbox's range).
//!
//! On any error the partial layer is removed.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use tar::{Builder, EntryType, Header};

use super::xattr::OPAQUE;
use super::{layer_usage, remove_layer, LayerStats};
use crate::fsat::{self, Node};
use crate::sys::{self, SysError};
use crate::JailError;

/// PAX prefix of an extended attribute record.
const XATTR_PAX: &str = "SCHILY.xattr.";

/// Ids an archive may carry (a sandbox's range).
const ID_LIMIT: u64 = 65_536;

fn io_err(op: impl Into<String>) -> impl FnOnce(std::io::Error) -> JailError {
    let op = op.into();
    move |source| JailError::Sys { op, source }
}

fn refused(what: String) -> JailError {
    JailError::Refused(format!("unpack a layer archive: {what}"))
}

/// Write the layer at `dir` into a new tar archive at `out` (replaced if it exists). Returns
/// the archive's size in bytes.
pub fn pack_layer(dir: &Path, out: &Path) -> Result<u64, JailError> {
    let file = File::create(out).map_err(io_err(format!("create {}", out.display())))?;
    let mut builder = Builder::new(BufWriter::new(file));
    builder.mode(tar::HeaderMode::Complete);
    let packed = (|| {
        let mut links = std::collections::HashMap::new();
        pack_entry(&mut builder, dir, Path::new("."), &mut links)?;
        let mut writer = builder
            .into_inner()
            .map_err(io_err(format!("write {}", out.display())))?;
        writer
            .flush()
            .map_err(io_err(format!("write {}", out.display())))?;
        let file = writer
            .into_inner()
            .map_err(|e| io_err(format!("write {}", out.display()))(e.into_error()))?;
        file.sync_all()
            .map_err(io_err(format!("sync {}", out.display())))?;
        file.metadata()
            .map(|m| m.len())
            .map_err(io_err(format!("stat {}", out.display())))
    })();
    if packed.is_err() {
        let _ = std::fs::remove_file(out);
    }
    packed
}

/// The extended attributes of `path` (never following it) as PAX records.
fn xattr_records(path: &Path) -> Result<Vec<(String, Vec<u8>)>, JailError> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    let name = path.file_name().map_or(c".".to_owned(), |n| {
        CString::new(n.as_bytes()).unwrap_or_else(|_| c".".to_owned())
    });
    let dir = sys::open_dir_at(None, &sys::cpath(parent)?)?;
    let node = Node::At(&dir, &name);
    let mut records = Vec::new();
    for attr in fsat::list_xattrs(&node)? {
        let Some(value) = fsat::get_xattr(&node, &attr)? else {
            continue;
        };
        let key = attr.to_string_lossy();
        if attr.as_c_str() == OPAQUE || !key.starts_with("trusted.") {
            records.push((format!("{XATTR_PAX}{key}"), value));
        }
    }
    Ok(records)
}

fn base_header(kind: EntryType, meta: &std::fs::Metadata) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(meta.mode() & 0o7777);
    h.set_uid(u64::from(meta.uid()));
    h.set_gid(u64::from(meta.gid()));
    h.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
    h.set_size(0);
    h
}

fn pack_entry<W: Write>(
    b: &mut Builder<W>,
    path: &Path,
    rel: &Path,
    links: &mut std::collections::HashMap<(u64, u64), PathBuf>,
) -> Result<(), JailError> {
    let write = |e: std::io::Error| JailError::Sys {
        op: format!("archive {}", rel.display()),
        source: e,
    };
    let meta =
        std::fs::symlink_metadata(path).map_err(io_err(format!("stat {}", path.display())))?;
    let records = xattr_records(path)?;
    if !records.is_empty() {
        b.append_pax_extensions(records.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
            .map_err(write)?;
    }
    let ft = meta.file_type();
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        let mut h = base_header(EntryType::Directory, &meta);
        b.append_data(&mut h, rel, std::io::empty())
            .map_err(write)?;
        let mut names: Vec<_> = std::fs::read_dir(path)
            .map_err(io_err(format!("list {}", path.display())))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(io_err(format!("list {}", path.display())))?;
        names.sort();
        for name in names {
            pack_entry(b, &path.join(&name), &rel.join(&name), links)?;
        }
    } else if ft.is_file() {
        if meta.nlink() > 1 {
            if let Some(first) = links.get(&(meta.dev(), meta.ino())) {
                let mut h = base_header(EntryType::Link, &meta);
                b.append_link(&mut h, rel, first).map_err(write)?;
                return Ok(());
            }
            links.insert((meta.dev(), meta.ino()), rel.to_path_buf());
        }
        let mut h = base_header(EntryType::Regular, &meta);
        h.set_size(meta.len());
        let f = File::open(path).map_err(io_err(format!("open {}", path.display())))?;
        b.append_data(&mut h, rel, f.take(meta.len()))
            .map_err(write)?;
    } else if ft.is_symlink() {
        let target =
            std::fs::read_link(path).map_err(io_err(format!("readlink {}", path.display())))?;
        let mut h = base_header(EntryType::Symlink, &meta);
        b.append_link(&mut h, rel, target).map_err(write)?;
    } else if ft.is_fifo() {
        let mut h = base_header(EntryType::Fifo, &meta);
        b.append_data(&mut h, rel, std::io::empty())
            .map_err(write)?;
    } else if ft.is_char_device() && meta.rdev() == 0 {
        let mut h = base_header(EntryType::Char, &meta);
        h.set_device_major(0).map_err(write)?;
        h.set_device_minor(0).map_err(write)?;
        b.append_data(&mut h, rel, std::io::empty())
            .map_err(write)?;
    }
    // Sockets and devices are not part of a layer (`export_layer` leaves them out).
    Ok(())
}

/// Make the layer directory `dst` (which must not exist; its parent must) from the archive
/// at `archive`, as [`pack_layer`] wrote it. Returns what the layer holds.
pub fn unpack_layer(archive: &Path, dst: &Path) -> Result<LayerStats, JailError> {
    if dst.symlink_metadata().is_ok() {
        return Err(JailError::InvalidSpec(format!(
            "layer {} already exists",
            dst.display()
        )));
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dst)
        .map_err(io_err(format!("mkdir {}", dst.display())))?;
    let unpacked = (|| {
        let file = File::open(archive).map_err(io_err(format!("open {}", archive.display())))?;
        let root = sys::open_dir_at(None, &sys::cpath(dst)?)?;
        let mut dirs = Vec::new();
        let mut ar = tar::Archive::new(BufReader::new(file));
        let entries = ar
            .entries()
            .map_err(io_err(format!("read {}", archive.display())))?;
        for entry in entries {
            let mut entry = entry.map_err(io_err(format!("read {}", archive.display())))?;
            unpack_entry(&root, &mut entry, &mut dirs)?;
        }
        // Directory times last: creating their entries changed them.
        for (parts, mtime) in dirs.iter().rev() {
            let dir = open_dirs(&root, parts)?;
            fsat::utimes_fd(&dir, &times(*mtime))?;
        }
        layer_usage(dst)
    })();
    if unpacked.is_err() {
        if let Err(e) = remove_layer(dst) {
            tracing::error!(dir = %dst.display(), error = %e, "removing a partial layer");
        }
    }
    unpacked
}

/// The plain components of an archive path (`.` alone: the root, no components).
fn components(path: &Path) -> Result<Vec<CString>, JailError> {
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::Normal(n) => out.push(cname(n)?),
            _ => return Err(refused(format!("the path {} leads out", path.display()))),
        }
    }
    Ok(out)
}

fn cname(n: &OsStr) -> Result<CString, JailError> {
    Ok(fsat::cname(n)?)
}

/// Open the directories `parts` below `root`, none of them followed if it is a symlink.
fn open_dirs(root: &OwnedFd, parts: &[CString]) -> Result<OwnedFd, JailError> {
    let mut dir = sys::open_dir_at(Some(root), c".")?;
    for p in parts {
        dir = sys::open_dir_at(Some(&dir), p).map_err(|e| {
            refused(format!(
                "{} is not a directory of the layer ({e})",
                String::from_utf8_lossy(p.as_bytes())
            ))
        })?;
    }
    Ok(dir)
}

fn times(mtime: u64) -> fsat::Stat {
    let t = libc::timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(0),
        tv_nsec: 0,
    };
    fsat::Stat {
        mode: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        size: 0,
        dev: 0,
        ino: 0,
        nlink: 0,
        atime: t,
        mtime: t,
    }
}

/// The extended attributes an entry may set: `user.*`, `security.capability`, POSIX ACLs and
/// the opaque marker (`y`, directories only).
fn allowed_xattrs(
    entry: &mut tar::Entry<'_, impl Read>,
    is_dir: bool,
) -> Result<Vec<(CString, Vec<u8>)>, JailError> {
    let mut out = Vec::new();
    let Some(exts) = entry
        .pax_extensions()
        .map_err(io_err("read the archive's PAX records"))?
    else {
        return Ok(out);
    };
    for ext in exts {
        let ext = ext.map_err(io_err("read the archive's PAX records"))?;
        let Some(name) = ext.key_bytes().strip_prefix(XATTR_PAX.as_bytes()) else {
            continue;
        };
        let ok = name.starts_with(b"user.")
            || name == b"security.capability"
            || name == b"system.posix_acl_access"
            || name == b"system.posix_acl_default"
            || (name == OPAQUE.to_bytes() && is_dir && ext.value_bytes() == b"y");
        if !ok {
            return Err(refused(format!(
                "extended attribute {} is not one a layer carries",
                String::from_utf8_lossy(name)
            )));
        }
        let name = CString::new(name).map_err(|_| refused("an attribute name with NUL".into()))?;
        out.push((name, ext.value_bytes().to_vec()));
    }
    Ok(out)
}

fn unpack_entry(
    root: &OwnedFd,
    entry: &mut tar::Entry<'_, impl Read>,
    dirs: &mut Vec<(Vec<CString>, u64)>,
) -> Result<(), JailError> {
    let path = entry
        .path()
        .map_err(io_err("read an entry's path"))?
        .into_owned();
    let header = entry.header().clone();
    let kind = header.entry_type();
    let uid = header.uid().map_err(io_err("read an entry's owner"))?;
    let gid = header.gid().map_err(io_err("read an entry's group"))?;
    if uid >= ID_LIMIT || gid >= ID_LIMIT {
        return Err(refused(format!(
            "{} is owned by {uid}:{gid}, outside a sandbox's ids",
            path.display()
        )));
    }
    let (uid, gid) = (uid as u32, gid as u32);
    let mode = header.mode().map_err(io_err("read an entry's mode"))? & 0o7777;
    let mtime = header.mtime().map_err(io_err("read an entry's time"))?;
    let xattrs = allowed_xattrs(entry, kind == EntryType::Directory)?;
    let mut parts = components(&path)?;
    let Some(name) = parts.pop() else {
        // The root: only its attributes.
        if kind != EntryType::Directory {
            return Err(refused("the root entry is not a directory".into()));
        }
        let dir = sys::open_dir_at(Some(root), c".")?;
        set_fd_attrs(&dir, uid, gid, mode, &xattrs)?;
        dirs.push((Vec::new(), mtime));
        return Ok(());
    };
    let parent = open_dirs(root, &parts)?;
    let exists = |e: SysError| -> JailError {
        if e.errno == libc::EEXIST {
            refused(format!("{} appears twice", path.display()))
        } else {
            e.into()
        }
    };
    match kind {
        EntryType::Directory => {
            fsat::mkdir_at(&parent, &name, 0o700).map_err(exists)?;
            let dir = sys::open_dir_at(Some(&parent), &name)?;
            set_fd_attrs(&dir, uid, gid, mode, &xattrs)?;
            parts.push(name);
            dirs.push((parts, mtime));
        }
        EntryType::Regular | EntryType::Continuous => {
            let fd = fsat::open_at(
                &parent,
                &name,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                0o600,
            )
            .map_err(exists)?;
            let mut file = File::from(fd);
            std::io::copy(entry, &mut file).map_err(io_err(format!("write {}", path.display())))?;
            let fd = OwnedFd::from(file);
            set_fd_attrs(&fd, uid, gid, mode, &xattrs)?;
            fsat::utimes_fd(&fd, &times(mtime))?;
        }
        EntryType::Symlink => {
            let target = entry
                .link_name()
                .map_err(io_err("read a symlink's target"))?
                .ok_or_else(|| refused(format!("symlink {} has no target", path.display())))?;
            let target = sys::cpath(&target)?;
            fsat::symlink_at(&target, &parent, &name).map_err(exists)?;
            fsat::chown_at(&parent, &name, uid, gid)?;
            set_at_xattrs(&parent, &name, &xattrs)?;
            fsat::utimes_at(&parent, &name, &times(mtime))?;
        }
        EntryType::Link => {
            let target = entry
                .link_name()
                .map_err(io_err("read a hard link's target"))?
                .ok_or_else(|| refused(format!("hard link {} has no target", path.display())))?
                .into_owned();
            let mut target_parts = components(&target)?;
            let target_name = target_parts
                .pop()
                .ok_or_else(|| refused(format!("hard link {} to the root", path.display())))?;
            let target_dir = open_dirs(root, &target_parts)?;
            match fsat::stat_at(&target_dir, &target_name)? {
                Some(st) if st.kind() == libc::S_IFREG => {}
                _ => {
                    return Err(refused(format!(
                        "hard link {} to {}, which is not a file of the layer",
                        path.display(),
                        target.display()
                    )))
                }
            }
            fsat::link_between(&target_dir, &target_name, &parent, &name).map_err(exists)?;
        }
        EntryType::Fifo => {
            fsat::mknod_at(&parent, &name, libc::S_IFIFO | 0o600, 0).map_err(exists)?;
            fsat::chown_at(&parent, &name, uid, gid)?;
            fsat::chmod_at(&parent, &name, mode)?;
            set_at_xattrs(&parent, &name, &xattrs)?;
            fsat::utimes_at(&parent, &name, &times(mtime))?;
        }
        EntryType::Char => {
            let major = header.device_major().ok().flatten().unwrap_or(1);
            let minor = header.device_minor().ok().flatten().unwrap_or(1);
            if (major, minor) != (0, 0) {
                return Err(refused(format!(
                    "{} is a device ({major}:{minor}), not a whiteout",
                    path.display()
                )));
            }
            fsat::mknod_at(&parent, &name, libc::S_IFCHR, 0).map_err(exists)?;
            fsat::chown_at(&parent, &name, 0, 0)?;
        }
        other => {
            return Err(refused(format!(
                "{} is a {other:?} entry, which a layer never holds",
                path.display()
            )))
        }
    }
    Ok(())
}

fn set_fd_attrs(
    fd: &OwnedFd,
    uid: u32,
    gid: u32,
    mode: u32,
    xattrs: &[(CString, Vec<u8>)],
) -> Result<(), JailError> {
    fsat::chown_fd(fd, uid, gid)?;
    // After the owner: chown clears setuid and setgid bits.
    fsat::chmod_fd(fd, mode)?;
    for (name, value) in xattrs {
        fsat::set_xattr(&Node::Fd(fd), name, value)?;
    }
    Ok(())
}

fn set_at_xattrs(
    dir: &OwnedFd,
    name: &CStr,
    xattrs: &[(CString, Vec<u8>)],
) -> Result<(), JailError> {
    for (attr, value) in xattrs {
        fsat::set_xattr(&Node::At(dir, name), attr, value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
