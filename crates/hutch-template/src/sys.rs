//! The crate's only raw system calls: `flock`, `umount2`, `renameat2`, `syncfs`, `geteuid`
//! and `prctl(PR_SET_PDEATHSIG)`, each behind one
//! checked helper that converts the C result into an [`std::io::Result`].

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// Converts a path into the NUL-terminated form the kernel expects.
fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("path {} contains a NUL byte", path.display()),
        )
    })
}

/// Turns a `-1`-on-error return value into an [`io::Result`].
fn check(ret: libc::c_int) -> io::Result<()> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Takes an exclusive `flock` on `fd`. With `wait == false` it returns
/// [`io::ErrorKind::WouldBlock`] instead of waiting when another open file description
/// holds the lock. Interrupted waits are retried.
pub(crate) fn flock_exclusive(fd: BorrowedFd<'_>, wait: bool) -> io::Result<()> {
    flock(fd, libc::LOCK_EX, wait)
}

/// Takes a shared `flock` on `fd` (waiting for an exclusive holder).
pub(crate) fn flock_shared(fd: BorrowedFd<'_>) -> io::Result<()> {
    flock(fd, libc::LOCK_SH, true)
}

fn flock(fd: BorrowedFd<'_>, kind: libc::c_int, wait: bool) -> io::Result<()> {
    let op = if wait { kind } else { kind | libc::LOCK_NB };
    loop {
        // SAFETY: `fd` is a valid open descriptor for the duration of the borrow, and
        // `flock` only reads its integer arguments.
        let ret = unsafe { libc::flock(fd.as_raw_fd(), op) };
        match check(ret) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Unmounts the mount on `target` without following a final symlink; with `detach` the
/// unmount is lazy (`MNT_DETACH`), which succeeds even while the mount is busy.
pub(crate) fn unmount(target: &Path, detach: bool) -> io::Result<()> {
    let path = c_path(target)?;
    let mut flags = libc::UMOUNT_NOFOLLOW;
    if detach {
        flags |= libc::MNT_DETACH;
    }
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
    check(unsafe { libc::umount2(path.as_ptr(), flags) })
}

/// Atomically swaps two existing paths (`renameat2` with `RENAME_EXCHANGE`).
pub(crate) fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    let a = c_path(a)?;
    let b = c_path(b)?;
    // SAFETY: both strings are valid, NUL-terminated and outlive the call; `AT_FDCWD`
    // makes relative paths resolve against the working directory, as `rename` does.
    check(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    })
}

/// Whether this process runs with effective uid 0.
pub(crate) fn is_root() -> bool {
    // SAFETY: `geteuid` has no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() == 0 }
}

/// Flushes the file system holding `fd` to stable storage (`syncfs`).
pub(crate) fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: `fd` is a valid open descriptor for the duration of the borrow.
    check(unsafe { libc::syncfs(fd.as_raw_fd()) })
}

/// Makes the child started by `cmd` receive `SIGKILL` when the thread that started it
/// exits, so a build tool never outlives an abandoned or killed build.
pub(crate) fn kill_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and only calls `prctl`,
    // which is async-signal-safe and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            let sig = libc::c_ulong::try_from(libc::SIGKILL).unwrap_or(9);
            check(libc::prctl(libc::PR_SET_PDEATHSIG, sig, 0, 0, 0))
        });
    }
}
