//! Descriptor-relative filesystem calls (`*at`, `f*`, `l*xattr`) for walking and copying
//! trees that a sandbox wrote: nothing here follows a symlink in its last component, and
//! every call names its directory by descriptor, so arbitrarily deep trees work without ever
//! building a long path.
//!
//! Every call goes through [`sys::check`] like the rest of the crate's syscalls.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

use crate::sys::{check, SysError};

/// The parts of `struct stat` a layer copy needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stat {
    /// Type and permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number of a device file.
    pub rdev: u64,
    /// Size in bytes.
    pub size: u64,
    /// Device of the filesystem.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Hard link count.
    pub nlink: u64,
    /// Access time.
    pub atime: libc::timespec,
    /// Modification time.
    pub mtime: libc::timespec,
}

impl Stat {
    fn from_raw(st: &libc::stat) -> Self {
        Self {
            mode: st.st_mode,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: st.st_rdev,
            size: u64::try_from(st.st_size).unwrap_or(0),
            dev: st.st_dev,
            ino: st.st_ino,
            nlink: st.st_nlink,
            atime: libc::timespec {
                tv_sec: st.st_atime,
                tv_nsec: st.st_atime_nsec,
            },
            mtime: libc::timespec {
                tv_sec: st.st_mtime,
                tv_nsec: st.st_mtime_nsec,
            },
        }
    }

    /// The file type bits.
    pub fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    /// Permission bits including setuid, setgid and sticky.
    pub fn perm(&self) -> u32 {
        self.mode & 0o7777
    }

    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }

    /// An overlayfs whiteout: a character device with device number 0/0.
    pub fn is_whiteout(&self) -> bool {
        self.kind() == libc::S_IFCHR && self.rdev == 0
    }
}

/// A file name (one path component) as a C string.
pub(crate) fn cname(name: &std::ffi::OsStr) -> Result<CString, SysError> {
    CString::new(name.as_bytes())
        .map_err(|_| SysError::new("file name with a NUL byte", libc::EINVAL))
}

fn what(name: &CStr) -> String {
    name.to_string_lossy().into_owned()
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; `None` when it does not exist.
pub(crate) fn stat_at(dir: &OwnedFd, name: &CStr) -> Result<Option<Stat>, SysError> {
    // SAFETY: stat is plain old data; all-zero is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated and `st` a valid out-pointer, both outliving the call.
    let ret = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    match check(ret.into(), || format!("stat {}", what(name))) {
        Ok(_) => Ok(Some(Stat::from_raw(&st))),
        Err(e) if e.errno == libc::ENOENT => Ok(None),
        Err(e) => Err(e),
    }
}

/// `fstat(fd)`.
pub(crate) fn stat_fd(fd: &OwnedFd) -> Result<Stat, SysError> {
    // SAFETY: stat is plain old data; all-zero is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer for the duration of the call.
    let ret = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) };
    check(ret.into(), || "fstat".into())?;
    Ok(Stat::from_raw(&st))
}

fn owned(ret: libc::c_int) -> OwnedFd {
    // SAFETY: the caller checked `ret` is a fresh descriptor the kernel just returned.
    unsafe { OwnedFd::from_raw_fd(ret as RawFd) }
}

/// `openat(dir, name, flags | O_NOFOLLOW | O_CLOEXEC, mode)`.
pub(crate) fn open_at(
    dir: &OwnedFd,
    name: &CStr,
    flags: libc::c_int,
    mode: u32,
) -> Result<OwnedFd, SysError> {
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `name` is NUL-terminated and outlives the call.
    let ret = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags, mode) };
    check(ret.into(), || format!("open {}", what(name)))?;
    Ok(owned(ret))
}

/// `mkdirat(dir, name, mode)`.
pub(crate) fn mkdir_at(dir: &OwnedFd, name: &CStr, mode: u32) -> Result<(), SysError> {
    // SAFETY: `name` is NUL-terminated and outlives the call.
    let ret = unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) };
    check(ret.into(), || format!("mkdir {}", what(name))).map(drop)
}

/// `mknodat(dir, name, mode, dev)` (whiteouts and FIFOs only).
pub(crate) fn mknod_at(dir: &OwnedFd, name: &CStr, mode: u32, dev: u64) -> Result<(), SysError> {
    // SAFETY: `name` is NUL-terminated and outlives the call.
    let ret = unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, dev) };
    check(ret.into(), || format!("mknod {}", what(name))).map(drop)
}

/// `readlinkat(dir, name)`.
pub(crate) fn readlink_at(dir: &OwnedFd, name: &CStr) -> Result<CString, SysError> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: `name` is NUL-terminated; `buf` is writable for the length passed.
    let ret = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let n = check(ret as libc::c_long, || format!("readlink {}", what(name)))? as usize;
    if n >= buf.len() {
        return Err(SysError::new(
            format!("readlink {}", what(name)),
            libc::ENAMETOOLONG,
        ));
    }
    buf.truncate(n);
    CString::new(buf).map_err(|_| SysError::new("symlink target with a NUL byte", libc::EINVAL))
}

/// `symlinkat(target, dir, name)`.
pub(crate) fn symlink_at(target: &CStr, dir: &OwnedFd, name: &CStr) -> Result<(), SysError> {
    // SAFETY: both strings are NUL-terminated and outlive the call.
    let ret = unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) };
    check(ret.into(), || format!("symlink {}", what(name))).map(drop)
}

/// `linkat(AT_FDCWD, existing, dir, name, 0)`.
pub(crate) fn link_at(existing: &CStr, dir: &OwnedFd, name: &CStr) -> Result<(), SysError> {
    // SAFETY: both strings are NUL-terminated and outlive the call.
    let ret = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            existing.as_ptr(),
            dir.as_raw_fd(),
            name.as_ptr(),
            0,
        )
    };
    check(ret.into(), || format!("link {}", what(name))).map(drop)
}

/// `linkat(old_dir, old_name, new_dir, new_name, 0)`: a hard link to an entry reached by
/// descriptor (its last component not followed).
pub(crate) fn link_between(
    old_dir: &OwnedFd,
    old_name: &CStr,
    new_dir: &OwnedFd,
    new_name: &CStr,
) -> Result<(), SysError> {
    // SAFETY: both names are NUL-terminated and outlive the call.
    let ret = unsafe {
        libc::linkat(
            old_dir.as_raw_fd(),
            old_name.as_ptr(),
            new_dir.as_raw_fd(),
            new_name.as_ptr(),
            0,
        )
    };
    check(ret.into(), || format!("link {}", what(new_name))).map(drop)
}

/// `fchownat(dir, name, uid, gid, AT_SYMLINK_NOFOLLOW)`.
pub(crate) fn chown_at(dir: &OwnedFd, name: &CStr, uid: u32, gid: u32) -> Result<(), SysError> {
    // SAFETY: `name` is NUL-terminated and outlives the call.
    let ret = unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            name.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    check(ret.into(), || format!("chown {}", what(name))).map(drop)
}

/// `fchown(fd, uid, gid)`.
pub(crate) fn chown_fd(fd: &OwnedFd, uid: u32, gid: u32) -> Result<(), SysError> {
    // SAFETY: plain integer arguments.
    let ret = unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) };
    check(ret.into(), || "fchown".into()).map(drop)
}

/// `fchmodat(dir, name, mode, 0)`: only for entries this process just created (never a
/// symlink, which `fchmodat` would follow).
pub(crate) fn chmod_at(dir: &OwnedFd, name: &CStr, mode: u32) -> Result<(), SysError> {
    // SAFETY: `name` is NUL-terminated and outlives the call.
    let ret = unsafe { libc::fchmodat(dir.as_raw_fd(), name.as_ptr(), mode, 0) };
    check(ret.into(), || format!("chmod {}", what(name))).map(drop)
}

/// `fchmod(fd, mode)`.
pub(crate) fn chmod_fd(fd: &OwnedFd, mode: u32) -> Result<(), SysError> {
    // SAFETY: plain integer arguments.
    let ret = unsafe { libc::fchmod(fd.as_raw_fd(), mode) };
    check(ret.into(), || "fchmod".into()).map(drop)
}

/// `utimensat(dir, name, [atime, mtime], AT_SYMLINK_NOFOLLOW)`.
pub(crate) fn utimes_at(dir: &OwnedFd, name: &CStr, st: &Stat) -> Result<(), SysError> {
    let times = [st.atime, st.mtime];
    // SAFETY: `name` is NUL-terminated and `times` points to two timespecs, both outliving
    // the call.
    let ret = unsafe {
        libc::utimensat(
            dir.as_raw_fd(),
            name.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    check(ret.into(), || format!("set times of {}", what(name))).map(drop)
}

/// `futimens(fd, [atime, mtime])`.
pub(crate) fn utimes_fd(fd: &OwnedFd, st: &Stat) -> Result<(), SysError> {
    let times = [st.atime, st.mtime];
    // SAFETY: `times` points to two timespecs that outlive the call.
    let ret = unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) };
    check(ret.into(), || "set times".into()).map(drop)
}

/// Where extended attributes of a node are read and written.
pub(crate) enum Node<'a> {
    /// An open file or directory.
    Fd(&'a OwnedFd),
    /// The entry `name` of directory `dir`, not followed if it is a symlink.
    At(&'a OwnedFd, &'a CStr),
}

impl Node<'_> {
    /// `/proc/self/fd/DIR/NAME` for the `l*xattr` calls (the directory is reached through its
    /// descriptor; the last component is not followed).
    fn proc_path(dir: &OwnedFd, name: &CStr) -> Result<CString, SysError> {
        let mut p = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
        p.extend_from_slice(name.to_bytes());
        CString::new(p).map_err(|_| SysError::new("path with a NUL byte", libc::EINVAL))
    }

    fn label(&self) -> String {
        match self {
            Node::Fd(_) => "directory".into(),
            Node::At(_, n) => what(n),
        }
    }
}

/// Names of the extended attributes of `node`.
pub(crate) fn list_xattrs(node: &Node<'_>) -> Result<Vec<CString>, SysError> {
    let mut buf = vec![0u8; 4096];
    loop {
        let ret = match node {
            // SAFETY: `buf` is writable for the length passed.
            Node::Fd(fd) => unsafe {
                libc::flistxattr(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())
            },
            Node::At(dir, name) => {
                let p = Node::proc_path(dir, name)?;
                // SAFETY: `p` is NUL-terminated; `buf` is writable for the length passed.
                unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) }
            }
        };
        match check(ret as libc::c_long, || {
            format!("list xattrs of {}", node.label())
        }) {
            Ok(n) => {
                buf.truncate(n as usize);
                return Ok(buf
                    .split(|b| *b == 0)
                    .filter(|n| !n.is_empty())
                    .filter_map(|n| CString::new(n).ok())
                    .collect());
            }
            Err(e) if e.errno == libc::ERANGE && buf.len() < (1 << 20) => {
                buf = vec![0u8; buf.len() * 4];
            }
            Err(e) if e.errno == libc::ENOTSUP => return Ok(Vec::new()),
            Err(e) => return Err(e),
        }
    }
}

/// The value of extended attribute `attr` of `node`; `None` when it is not set.
pub(crate) fn get_xattr(node: &Node<'_>, attr: &CStr) -> Result<Option<Vec<u8>>, SysError> {
    let mut buf = vec![0u8; 4096];
    loop {
        let ret = match node {
            // SAFETY: `attr` is NUL-terminated; `buf` is writable for the length passed.
            Node::Fd(fd) => unsafe {
                libc::fgetxattr(
                    fd.as_raw_fd(),
                    attr.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            },
            Node::At(dir, name) => {
                let p = Node::proc_path(dir, name)?;
                // SAFETY: `p` and `attr` are NUL-terminated; `buf` is writable for its length.
                unsafe {
                    libc::lgetxattr(
                        p.as_ptr(),
                        attr.as_ptr(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    )
                }
            }
        };
        match check(ret as libc::c_long, || {
            format!("read xattr {} of {}", what(attr), node.label())
        }) {
            Ok(n) => {
                buf.truncate(n as usize);
                return Ok(Some(buf));
            }
            Err(e) if e.errno == libc::ENODATA || e.errno == libc::ENOTSUP => return Ok(None),
            Err(e) if e.errno == libc::ERANGE && buf.len() < (1 << 20) => {
                buf = vec![0u8; buf.len() * 16];
            }
            Err(e) => return Err(e),
        }
    }
}

/// Set extended attribute `attr` of `node` to `value`.
pub(crate) fn set_xattr(node: &Node<'_>, attr: &CStr, value: &[u8]) -> Result<(), SysError> {
    let ret = match node {
        // SAFETY: `attr` is NUL-terminated; `value` is readable for the length passed.
        Node::Fd(fd) => unsafe {
            libc::fsetxattr(
                fd.as_raw_fd(),
                attr.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        },
        Node::At(dir, name) => {
            let p = Node::proc_path(dir, name)?;
            // SAFETY: `p` and `attr` are NUL-terminated; `value` is readable for its length.
            unsafe {
                libc::lsetxattr(
                    p.as_ptr(),
                    attr.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    0,
                )
            }
        }
    };
    check(ret.into(), || {
        format!("set xattr {} of {}", what(attr), node.label())
    })
    .map(drop)
}

/// Remove extended attribute `attr` of `node` (absent is fine).
pub(crate) fn remove_xattr(node: &Node<'_>, attr: &CStr) -> Result<(), SysError> {
    let ret = match node {
        // SAFETY: `attr` is NUL-terminated and outlives the call.
        Node::Fd(fd) => unsafe { libc::fremovexattr(fd.as_raw_fd(), attr.as_ptr()) },
        Node::At(dir, name) => {
            let p = Node::proc_path(dir, name)?;
            // SAFETY: `p` and `attr` are NUL-terminated and outlive the call.
            unsafe { libc::lremovexattr(p.as_ptr(), attr.as_ptr()) }
        }
    };
    match check(ret.into(), || {
        format!("remove xattr {} of {}", what(attr), node.label())
    }) {
        Err(e) if e.errno != libc::ENODATA => Err(e),
        _ => Ok(()),
    }
}
