//! The one checked door to raw system calls.
//!
//! Every `libc` call of the crate that can fail goes through [`check`], which turns the C
//! convention (`-1` and `errno`) into a [`SysError`] that names the operation. The thin
//! wrappers below take Rust types (paths, `OwnedFd`s) so callers hold no raw pointers.
//!
//! Several wrappers are used in the cloned child between `clone` and `execve`: they only
//! allocate (the helper process is single-threaded, so the allocator's locks are free) and
//! never touch threads. The `*_c` cores under them take C strings and return an [`Errno`]
//! without allocating: [`crate::exec_plan`]'s child, cloned from a multi-threaded process,
//! uses those.

use std::ffi::{CStr, CString};
use std::fmt;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::JailError;

/// A failed system call: what was being done and the `errno`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SysError {
    /// What was being done, e.g. `mount proc on /…/merged/proc`.
    pub op: String,
    /// The raw `errno`.
    pub errno: i32,
}

impl SysError {
    /// An error with an explicit errno.
    pub fn new(op: impl Into<String>, errno: i32) -> Self {
        Self {
            op: op.into(),
            errno,
        }
    }

    /// An error from the thread's current `errno`.
    pub fn last(op: impl Into<String>) -> Self {
        let errno = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        Self::new(op, errno)
    }

    /// An error from an `io::Error` (EIO when it carries no errno).
    pub fn io(op: impl Into<String>, err: &std::io::Error) -> Self {
        Self::new(op, err.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl fmt::Display for SysError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.op, errno_text(self.errno))
    }
}

impl From<SysError> for JailError {
    fn from(e: SysError) -> Self {
        JailError::Sys {
            op: e.op,
            source: std::io::Error::from_raw_os_error(e.errno),
        }
    }
}

/// `EPERM (Operation not permitted)`: the symbolic name (when known) and the description.
pub(crate) fn errno_text(errno: i32) -> String {
    let desc = std::io::Error::from_raw_os_error(errno).to_string();
    // `Operation not permitted (os error 1)` -> `Operation not permitted`
    let desc = desc.split(" (os error").next().unwrap_or(&desc).to_string();
    match errno_name(errno) {
        Some(name) => format!("{name} ({desc})"),
        None => format!("errno {errno} ({desc})"),
    }
}

/// Symbolic names of the errnos the jail's setup can plausibly hit.
pub(crate) fn errno_name(errno: i32) -> Option<&'static str> {
    Some(match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::ENOEXEC => "ENOEXEC",
        libc::EBADF => "EBADF",
        libc::ECHILD => "ECHILD",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EMFILE => "EMFILE",
        libc::ENOTTY => "ENOTTY",
        libc::ETXTBSY => "ETXTBSY",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::EPIPE => "EPIPE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ETIMEDOUT => "ETIMEDOUT",
        _ => return None,
    })
}

/// A failed system call's `errno`, read without allocating: what a child cloned from a
/// multi-threaded process may carry (see [`crate::exec_plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Errno(pub i32);

impl Errno {
    /// The thread's current `errno` (EIO if there is none).
    pub fn last() -> Self {
        Self(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    }

    /// The [`SysError`] of `op` (allocates: not in a cloned child of a threaded process).
    pub fn context(self, op: impl Into<String>) -> SysError {
        SysError::new(op, self.0)
    }
}

/// The checked helper without a description: `ret < 0` means failure with `errno` set.
/// Allocates nothing, so it is safe between `clone` and `execve` in any process.
pub(crate) fn check_errno(ret: libc::c_long) -> Result<libc::c_long, Errno> {
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(ret)
    }
}

/// The checked helper: `ret < 0` means failure with `errno` set.
pub(crate) fn check(
    ret: libc::c_long,
    op: impl FnOnce() -> String,
) -> Result<libc::c_long, SysError> {
    check_errno(ret).map_err(|e| e.context(op()))
}

/// A path as a C string (EINVAL when it contains a NUL byte).
pub(crate) fn cpath(path: &Path) -> Result<CString, SysError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        SysError::new(
            format!("path {} contains a NUL byte", path.display()),
            libc::EINVAL,
        )
    })
}

/// A string as a C string (EINVAL when it contains a NUL byte).
pub(crate) fn cstr(s: &str) -> Result<CString, SysError> {
    CString::new(s).map_err(|_| SysError::new(format!("{s:?} contains a NUL byte"), libc::EINVAL))
}

fn opt_ptr(s: Option<&CStr>) -> *const libc::c_char {
    s.map_or(std::ptr::null(), CStr::as_ptr)
}

/// `mount(2)`, allocation-free.
pub(crate) fn mount_c(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> Result<(), Errno> {
    // SAFETY: every pointer is either null or a NUL-terminated string that outlives the call.
    let ret = unsafe {
        libc::mount(
            opt_ptr(source),
            target.as_ptr(),
            opt_ptr(fstype),
            flags,
            opt_ptr(data).cast(),
        )
    };
    check_errno(ret.into()).map(drop)
}

/// `mount(2)`.
pub(crate) fn mount(
    source: Option<&CStr>,
    target: &Path,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
    what: &str,
) -> Result<(), SysError> {
    mount_c(source, &cpath(target)?, fstype, flags, data)
        .map_err(|e| e.context(format!("{what} ({})", target.display())))
}

/// `umount2(2)`, allocation-free.
pub(crate) fn umount2_c(target: &CStr, flags: libc::c_int) -> Result<(), Errno> {
    // SAFETY: `target` is a NUL-terminated string that outlives the call.
    check_errno(unsafe { libc::umount2(target.as_ptr(), flags) }.into()).map(drop)
}

/// `umount2(2)`.
pub(crate) fn umount2(target: &Path, flags: libc::c_int) -> Result<(), SysError> {
    umount2_c(&cpath(target)?, flags).map_err(|e| e.context(format!("umount {}", target.display())))
}

/// `open_tree(2)` flag: clone the mount instead of opening it in place.
pub(crate) const OPEN_TREE_CLONE: libc::c_uint = 1;
/// `mount_setattr(2)` attribute: read-only.
pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
/// `mount_setattr(2)` attribute: ignore device files.
pub(crate) const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
/// `mount_setattr(2)` attribute: ignore setuid bits.
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
/// `mount_setattr(2)` attribute: idmap the mount with `userns_fd`'s mapping.
pub(crate) const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
/// `move_mount(2)` flag: the source is the fd itself.
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `open_tree(AT_FDCWD, path, OPEN_TREE_CLONE | AT_RECURSIVE | OPEN_TREE_CLOEXEC)`: a detached
/// recursive copy of the mount tree at `path`.
pub(crate) fn open_tree_clone(path: &Path) -> Result<OwnedFd, SysError> {
    let p = cpath(path)?;
    let flags =
        OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint;
    // SAFETY: `p` is a NUL-terminated string that outlives the call; open_tree takes no other
    // pointers.
    let ret = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, p.as_ptr(), flags) };
    let fd = check(ret, || format!("open_tree {}", path.display()))?;
    // SAFETY: open_tree returned a fresh file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `mount_setattr(fd, "", AT_EMPTY_PATH | AT_RECURSIVE, {attr_set, userns_fd})`.
pub(crate) fn mount_setattr(
    tree: &OwnedFd,
    attr_set: u64,
    userns: Option<&OwnedFd>,
) -> Result<(), SysError> {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map_or(0, |u| u.as_raw_fd() as u64),
    };
    let flags = (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint;
    // SAFETY: `attr` is a properly laid out `struct mount_attr` that outlives the call and its
    // size is passed alongside; the path is the empty C string.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(ret, || "mount_setattr(IDMAP|RDONLY|NODEV)".to_string()).map(drop)
}

/// `move_mount(fd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)`: attach a detached tree.
pub(crate) fn move_mount(tree: &OwnedFd, target: &Path) -> Result<(), SysError> {
    let t = cpath(target)?;
    // SAFETY: both paths are NUL-terminated strings that outlive the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    check(ret, || format!("move_mount to {}", target.display())).map(drop)
}

/// `mount_setattr` with a bad fd: tells whether the syscall exists (EBADF) or not (ENOSYS).
pub(crate) fn mount_setattr_exists() -> bool {
    // SAFETY: fd -1 and a null attribute pointer with size 0 make the kernel fail early; no
    // memory is read or written.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            -1,
            c"".as_ptr(),
            0,
            std::ptr::null::<MountAttr>(),
            0usize,
        )
    };
    !(ret < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS))
}

/// `pivot_root(".", ".")` in the current directory, allocation-free.
pub(crate) fn pivot_root_here_c() -> Result<(), Errno> {
    // SAFETY: both arguments are the static NUL-terminated string ".".
    check_errno(unsafe { libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) })
        .map(drop)
}

/// `pivot_root(".", ".")` in the current directory.
pub(crate) fn pivot_root_here() -> Result<(), SysError> {
    pivot_root_here_c().map_err(|e| e.context("pivot_root"))
}

/// `chdir(2)`, allocation-free.
pub(crate) fn chdir_c(path: &CStr) -> Result<(), Errno> {
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    check_errno(unsafe { libc::chdir(path.as_ptr()) }.into()).map(drop)
}

/// `chdir(2)`.
pub(crate) fn chdir(path: &Path) -> Result<(), SysError> {
    chdir_c(&cpath(path)?).map_err(|e| e.context(format!("chdir {}", path.display())))
}

/// Raw `clone(2)` with fork semantics (no new stack): returns 0 in the child and the child's pid
/// in the parent.
///
/// # Safety
/// The child is a copy of this one thread, and any lock held by another thread (the
/// allocator's too) stays locked forever in it. So either the caller is single-threaded, or
/// the child runs only async-signal-safe code that allocates nothing until it calls `execve`
/// or `_exit` (what [`crate::exec_plan`]'s child does).
pub(crate) unsafe fn clone_process(flags: libc::c_int) -> Result<libc::pid_t, SysError> {
    let flags = (flags | libc::SIGCHLD) as libc::c_ulong;
    // SAFETY: with a null stack pointer, clone behaves like fork (the child continues on a
    // copy of the parent's stack); the parent-tid/child-tid/tls pointers are null and unused
    // because no CLONE_*TID/SETTLS flag is passed. What the child may do is the caller's
    // promise.
    let ret = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    check(ret, || "clone".to_string()).map(|p| p as libc::pid_t)
}

/// `struct clone_args` of `clone3(2)` (version 2, with `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `clone3(2)` flag: start the child in the cgroup given by `clone_args.cgroup`.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Raw `clone3(2)` with fork semantics and `CLONE_INTO_CGROUP`: the child is born in the v2
/// cgroup `cgroup` (an open directory of it) without migrating anything. Returns 0 in the
/// child and the child's pid in the parent.
///
/// # Safety
/// As [`clone_process`]: the caller must be single-threaded.
pub(crate) unsafe fn clone_into_cgroup(
    flags: libc::c_int,
    cgroup: &OwnedFd,
) -> Result<libc::pid_t, SysError> {
    let args = CloneArgs {
        flags: (flags as u32 as u64) | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: `args` is a valid clone_args of the size passed; stack 0 and stack_size 0 give
    // fork semantics (the child continues on a copy of this stack); no tid/pidfd pointers are
    // requested. Single-threadedness is the caller's promise.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    check(ret, || "clone3(CLONE_INTO_CGROUP)".to_string()).map(|p| p as libc::pid_t)
}

/// `pipe2(O_CLOEXEC)`: (read end, write end).
pub(crate) fn pipe() -> Result<(OwnedFd, OwnedFd), SysError> {
    let mut fds = [-1 as RawFd; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    let ret = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    check(ret.into(), || "pipe2".to_string())?;
    // SAFETY: pipe2 succeeded, so both are fresh descriptors owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `fcntl(F_DUPFD_CLOEXEC, min)`: a close-on-exec copy numbered at least `min`.
pub(crate) fn dup_at_least(fd: RawFd, min: RawFd) -> Result<OwnedFd, SysError> {
    // SAFETY: F_DUPFD_CLOEXEC takes an integer argument; an invalid fd yields EBADF.
    let ret = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) };
    let new = check(ret.into(), || format!("dup fd {fd}"))?;
    // SAFETY: fcntl returned a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(new as RawFd) })
}

/// `dup2(2)`, allocation-free (the new descriptor does not have close-on-exec).
pub(crate) fn dup2_c(fd: RawFd, target: RawFd) -> Result<(), Errno> {
    // SAFETY: dup2 only manipulates the descriptor table.
    check_errno(unsafe { libc::dup2(fd, target) }.into()).map(drop)
}

/// `dup2(2)` (the new descriptor does not have close-on-exec).
pub(crate) fn dup2(fd: RawFd, target: RawFd) -> Result<(), SysError> {
    dup2_c(fd, target).map_err(|e| e.context(format!("dup2 {fd} -> {target}")))
}

/// Close a raw descriptor this process does not track as an `OwnedFd` (errors ignored).
pub(crate) fn close_raw(fd: RawFd) {
    // SAFETY: closing an fd only manipulates the descriptor table; callers pass descriptors
    // they own (copies inherited through clone).
    unsafe { libc::close(fd) };
}

/// Mark every descriptor from `first` up close-on-exec (`close_range(CLOSE_RANGE_CLOEXEC)`,
/// falling back to a loop on kernels without it).
pub(crate) fn cloexec_from(first: RawFd) -> Result<(), SysError> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags in the descriptor table.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if ret == 0 {
        return Ok(());
    }
    let max = match std::fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<RawFd>().ok())
            .max()
            .unwrap_or(first),
        Err(e) => return Err(SysError::io("list /proc/self/fd", &e)),
    };
    for fd in first..=max {
        // SAFETY: F_SETFD on a closed descriptor fails with EBADF, which is ignored.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(())
}

/// Write all of `buf` to `fd`, retrying on EINTR.
pub(crate) fn write_all(fd: &OwnedFd, mut buf: &[u8]) -> Result<(), SysError> {
    while !buf.is_empty() {
        // SAFETY: `buf` is a valid readable slice of `buf.len()` bytes.
        let ret = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
        if ret < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        let n = check(ret as libc::c_long, || "write".to_string())?;
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// One `read(2)`, retrying on EINTR; 0 means end of file.
pub(crate) fn read(fd: &OwnedFd, buf: &mut [u8]) -> Result<usize, SysError> {
    loop {
        // SAFETY: `buf` is a valid writable slice of `buf.len()` bytes.
        let ret = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if ret < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return check(ret as libc::c_long, || "read".to_string()).map(|n| n as usize);
    }
}

/// Wait up to `timeout_ms` for `fd` to become readable (or hung up); false on timeout.
pub(crate) fn poll_readable(fd: &OwnedFd, timeout_ms: i32) -> Result<bool, SysError> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: `pfd` is one valid pollfd and the count is 1.
        let ret = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if ret < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return check(ret.into(), || "poll".to_string()).map(|n| n > 0);
    }
}

/// `waitpid(pid, 0)` retrying on EINTR; returns the raw status.
pub(crate) fn waitpid(
    pid: libc::pid_t,
    flags: libc::c_int,
) -> Result<(libc::pid_t, libc::c_int), SysError> {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out-pointer for the duration of the call.
        let ret = unsafe { libc::waitpid(pid, &mut status, flags) };
        if ret < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        let r = check(ret.into(), || format!("waitpid {pid}"))?;
        return Ok((r as libc::pid_t, status));
    }
}

/// `kill(2)`.
pub(crate) fn kill(pid: libc::pid_t, sig: libc::c_int) -> Result<(), SysError> {
    // SAFETY: kill takes no pointers.
    let ret = unsafe { libc::kill(pid, sig) };
    check(ret.into(), || format!("kill {pid}")).map(drop)
}

/// `pidfd_open(pid, 0)`: a descriptor that keeps naming this process even after its pid is
/// reused, and becomes readable when it exits.
pub(crate) fn pidfd_open(pid: libc::pid_t) -> Result<OwnedFd, SysError> {
    // SAFETY: pidfd_open takes integers only.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = check(ret, || format!("pidfd_open {pid}"))?;
    // SAFETY: pidfd_open returned a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `pidfd_send_signal(fd, sig, NULL, 0)`.
pub(crate) fn pidfd_send_signal(pidfd: &OwnedFd, sig: libc::c_int) -> Result<(), SysError> {
    // SAFETY: a null siginfo pointer is allowed (the kernel fills in a default).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    check(ret, || "pidfd_send_signal".into()).map(drop)
}

/// `chown(2)`.
pub(crate) fn chown(path: &Path, uid: u32, gid: u32) -> Result<(), SysError> {
    let p = cpath(path)?;
    // SAFETY: `p` is a NUL-terminated string that outlives the call.
    let ret = unsafe { libc::chown(p.as_ptr(), uid, gid) };
    check(ret.into(), || format!("chown {}", path.display())).map(drop)
}

/// `openat(dir, name, O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)` (`dir = None`: relative to the
/// working directory).
pub(crate) fn open_dir_at(dir: Option<&OwnedFd>, name: &CStr) -> Result<OwnedFd, SysError> {
    let dirfd = dir.map_or(libc::AT_FDCWD, AsRawFd::as_raw_fd);
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `name` is NUL-terminated and outlives the call.
    let ret = unsafe { libc::openat(dirfd, name.as_ptr(), flags) };
    let fd = check(ret.into(), || {
        format!("open directory {}", name.to_string_lossy())
    })?;
    // SAFETY: openat returned a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `unlinkat(dir, name, flags)` (`AT_REMOVEDIR` for directories).
pub(crate) fn unlinkat(dir: &OwnedFd, name: &CStr, flags: libc::c_int) -> Result<(), SysError> {
    // SAFETY: `name` is NUL-terminated and outlives the call.
    let ret = unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) };
    check(ret.into(), || format!("remove {}", name.to_string_lossy())).map(drop)
}

/// The device number of the filesystem `fd` lives on.
pub(crate) fn fstat_dev(fd: &OwnedFd) -> Result<u64, SysError> {
    // SAFETY: stat is plain old data; all-zero is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer for the duration of the call.
    let ret = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) };
    check(ret.into(), || "fstat".into())?;
    Ok(st.st_dev)
}

/// `_exit(2)`: leave the cloned child without running any destructor or atexit handler.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no Rust state.
    unsafe { libc::_exit(code) }
}

/// `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`: the kernel's Landlock
/// ABI version, or the errno (EOPNOTSUPP when disabled, ENOSYS when not built).
pub(crate) fn landlock_abi() -> Result<i64, i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: a null attribute pointer with size 0 is the documented way to query the version.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if ret < 0 {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO))
    } else {
        Ok(ret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_text_names_the_errno() {
        assert_eq!(errno_text(libc::EPERM), "EPERM (Operation not permitted)");
        assert!(errno_text(4095).starts_with("errno 4095 ("));
        let e = SysError::new("mount proc", libc::EPERM);
        assert_eq!(e.to_string(), "mount proc: EPERM (Operation not permitted)");
    }

    #[test]
    fn check_maps_negative_returns() {
        assert_eq!(check(3, || unreachable!()), Ok(3));
        // SAFETY: closing fd -1 fails with EBADF and has no other effect.
        let ret = unsafe { libc::close(-1) };
        let err = check(ret.into(), || "close".into()).unwrap_err();
        assert_eq!(err.errno, libc::EBADF);
    }
}
