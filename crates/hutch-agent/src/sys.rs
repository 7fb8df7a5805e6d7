//! The agent's checked entry to raw syscalls.
//!
//! Every libc call of the agent outside the forked child (see `exec::spawn`) goes through a
//! function here that turns `-1` into an [`io::Error`]. Each `unsafe` block states why the
//! call is sound.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// Turn a libc return value into a result: `-1` means "look at errno".
pub fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// [`cvt`], retrying while the call is interrupted by a signal.
pub fn cvt_retry(mut call: impl FnMut() -> libc::c_int) -> io::Result<libc::c_int> {
    loop {
        match cvt(call()) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// A pipe, both ends close-on-exec: `(read, write)`.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for the kernel to fill.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Open a path with raw flags (always adding `O_CLOEXEC`).
pub fn open(path: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: `path` is a valid NUL-terminated string; the mode argument is ignored
    // without O_CREAT.
    let fd = cvt_retry(|| unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, 0o600) })?;
    // SAFETY: open succeeded; the fd is new and ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Set or clear `O_NONBLOCK` on an fd.
pub fn set_nonblocking(fd: RawFd, nonblocking: bool) -> io::Result<()> {
    // SAFETY: F_GETFL only reads the fd's flags; a bad fd yields EBADF.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    let flags = if nonblocking {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: F_SETFL with flags derived from the current ones.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) }).map(drop)
}

/// Mark an fd close-on-exec so spawned processes do not inherit it.
pub fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_SETFD only changes the fd's descriptor flags.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) }).map(drop)
}

/// Send `signal` to every process of the group `pgid` (an exec's pid: it leads its session).
pub fn kill_group(pgid: u32, signal: i32) -> io::Result<()> {
    let pgid =
        libc::pid_t::try_from(pgid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    if pgid <= 1 {
        // Never signal our own group or "every process" by accident.
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    // SAFETY: kill has no memory effects; a negative pid addresses a process group.
    cvt(unsafe { libc::kill(-pgid, signal) }).map(drop)
}

/// Make sure fds 0, 1 and 2 are open (on `/dev/null` if not), so that pipes created later
/// never land on them and get clobbered when a child's stdio is set up.
pub fn ensure_std_fds() {
    for fd in 0..3 {
        // SAFETY: F_GETFD only queries the fd.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            // open() returns the lowest free fd, which is `fd` here. Keep it open forever.
            if let Ok(null) = open(c"/dev/null", libc::O_RDWR) {
                let raw = null.as_raw_fd();
                std::mem::forget(null);
                if raw != fd {
                    // SAFETY: dup2 onto a closed standard fd; `raw` stays open too.
                    let _ = unsafe { libc::dup2(raw, fd) };
                }
            }
        }
    }
}

/// Raise the soft limit on open files to the hard limit (capped), returning the original
/// limit so spawned processes get it back.
pub fn raise_nofile_limit() -> Option<libc::rlimit> {
    let mut original = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct we pass.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut original) }).ok()?;
    let wanted = original.rlim_max.min(1 << 16);
    if wanted > original.rlim_cur {
        let raised = libc::rlimit {
            rlim_cur: wanted,
            rlim_max: original.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass.
        cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) }).ok()?;
    }
    Some(original)
}

/// Make this process non-dumpable: code in the sandbox (root in its user namespace, but
/// without `CAP_SYS_PTRACE`) can then no longer open `/proc/1/mem`, `/proc/1/environ`,
/// `/proc/1/fd/*` or the agent's other ptrace-guarded files, so it cannot read or patch the
/// agent's memory (fake exec results, capture stdin). Children get their own dumpable flag
/// back at `execve`, so workloads debug each other as usual.
pub fn make_non_dumpable() -> io::Result<()> {
    // SAFETY: PR_SET_DUMPABLE takes one integer argument and has no memory effects.
    cvt(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) }).map(drop)
}

/// Adopt orphaned descendants (so the reaper sees them) when we are not PID 1.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes one integer argument and has no memory effects.
    cvt(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) }).map(drop)
}

/// Set the file mode creation mask; returns the previous one.
pub fn set_umask(mask: u32) -> u32 {
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// Our pid.
pub fn getpid() -> u32 {
    // SAFETY: getpid cannot fail.
    unsafe { libc::getpid() as u32 }
}

/// Our effective uid.
pub fn geteuid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// `(nodename, release)` from uname.
pub fn uname() -> io::Result<(String, String)> {
    // SAFETY: utsname is plain bytes; all-zero is a valid value.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uname fills the struct we pass.
    cvt(unsafe { libc::uname(&mut uts) })?;
    Ok((c_chars(&uts.nodename), c_chars(&uts.release)))
}

fn c_chars(field: &[libc::c_char]) -> String {
    let bytes: Vec<u8> = field
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Set the hostname of our UTS namespace.
pub fn set_hostname(name: &str) -> io::Result<()> {
    // SAFETY: the pointer and length describe `name`'s bytes.
    cvt(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

/// Whether the other end of a character device is gone (`POLLHUP`) right now, without
/// waiting. A virtio-serial port reports `POLLHUP` while no host is connected.
pub fn hung_up(fd: RawFd) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll reads and writes the one pollfd we pass; timeout 0 never blocks.
    cvt_retry(|| unsafe { libc::poll(&mut pfd, 1, 0) })?;
    Ok(pfd.revents & libc::POLLHUP != 0)
}

/// The filesystem type (`statfs` `f_type`, a `*_MAGIC` of `linux/magic.h`) of the open file
/// `fd` is on.
pub fn filesystem_type(fd: RawFd) -> io::Result<i64> {
    // SAFETY: a zeroed statfs is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes into the struct we pass; a bad fd is an error, not UB.
    cvt_retry(|| unsafe { libc::fstatfs(fd, &mut st) })?;
    Ok(st.f_type as i64)
}

/// Make `dir` our root directory and move into it (`chroot` + `chdir("/")`).
pub fn chroot(dir: &Path) -> io::Result<()> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: chroot and chdir read the NUL-terminated paths we pass.
    cvt(unsafe { libc::chroot(c.as_ptr()) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::chdir(c"/".as_ptr()) }).map(drop)
}

/// Set the wall clock.
pub fn set_realtime(unix_ms: u64) -> io::Result<()> {
    let ts = libc::timespec {
        tv_sec: (unix_ms / 1000) as libc::time_t,
        tv_nsec: ((unix_ms % 1000) * 1_000_000) as libc::c_long,
    };
    // SAFETY: clock_settime reads the timespec we pass.
    cvt(unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) }).map(drop)
}

/// `ioctl(fd, request, &value)` for requests that take a pointer to a struct we own.
pub fn ioctl_ptr<T>(fd: RawFd, request: libc::Ioctl, value: &T) -> io::Result<()> {
    // SAFETY: callers pair each request with the struct type the kernel expects for it;
    // the kernel only reads through the pointer for the requests we use.
    cvt(unsafe { libc::ioctl(fd, request, value as *const T) }).map(drop)
}

/// `ioctl(fd, request, &mut value)` for requests that write a struct we own.
pub fn ioctl_out<T>(fd: RawFd, request: libc::Ioctl, value: &mut T) -> io::Result<()> {
    // SAFETY: callers pair each request with the struct type the kernel writes for it; the
    // pointer is valid and exclusive for the call.
    cvt(unsafe { libc::ioctl(fd, request, value as *mut T) }).map(drop)
}

/// `ioctl(fd, request, buf)` for requests that read a variable-length buffer.
pub fn ioctl_bytes(fd: RawFd, request: libc::Ioctl, buf: &[u8]) -> io::Result<()> {
    // SAFETY: callers build `buf` in the layout the request expects (header and payload);
    // the kernel only reads it, within its stated length.
    cvt(unsafe { libc::ioctl(fd, request, buf.as_ptr()) }).map(drop)
}

/// `ioctl(fd, request, arg)` for requests that take an integer argument.
pub fn ioctl_int(fd: RawFd, request: libc::Ioctl, arg: libc::c_int) -> io::Result<libc::c_int> {
    // SAFETY: the requests we use take an int by value and do not touch our memory.
    cvt(unsafe { libc::ioctl(fd, request, arg) })
}

/// A message for an OS error without Rust's " (os error N)" suffix.
pub fn error_text(e: &io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error ") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_to_signal_init_or_every_process() {
        assert!(kill_group(0, 0).is_err());
        assert!(kill_group(1, 0).is_err());
        assert!(kill_group(u32::MAX, 0).is_err());
    }

    #[test]
    fn strips_os_error_suffix() {
        let e = io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(error_text(&e), "No such file or directory");
    }
}

/// The calling thread's filesystem ids and supplementary groups, as the kernel checks
/// file access with them ([`set_thread_fs_identity`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsIdentity {
    /// Filesystem user id.
    pub uid: u32,
    /// Filesystem group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

/// The calling thread's current [`FsIdentity`].
pub fn thread_fs_identity() -> io::Result<FsIdentity> {
    // SAFETY: setfsuid/setfsgid with -1 (an invalid id) change nothing and return the
    // current id; they cannot fail.
    let uid = unsafe { libc::syscall(libc::SYS_setfsuid, u32::MAX) } as u32;
    // SAFETY: as above.
    let gid = unsafe { libc::syscall(libc::SYS_setfsgid, u32::MAX) } as u32;
    // SAFETY: getgroups with size 0 only returns the count.
    let count = cvt(unsafe { libc::getgroups(0, std::ptr::null_mut()) })?;
    let mut groups = vec![0 as libc::gid_t; count as usize];
    // SAFETY: `groups` has room for `count` ids.
    let count = cvt(unsafe { libc::getgroups(count, groups.as_mut_ptr()) })?;
    groups.truncate(count as usize);
    Ok(FsIdentity { uid, gid, groups })
}

/// Set the calling thread's (only this thread's) filesystem ids and supplementary groups
/// through the raw syscalls: libc's `setgroups` would change every thread of the process.
/// Checked afterwards: `setfsuid` reports no error of its own.
pub fn set_thread_fs_identity(identity: &FsIdentity) -> io::Result<()> {
    // SAFETY: the pointer and count describe `identity.groups`, which outlives the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_setgroups,
            identity.groups.len(),
            identity.groups.as_ptr(),
        )
    };
    if ret == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: setfsgid/setfsuid take plain ids and change only this thread's credentials.
    unsafe {
        libc::syscall(libc::SYS_setfsgid, identity.gid);
        libc::syscall(libc::SYS_setfsuid, identity.uid);
    }
    let now = thread_fs_identity()?;
    if now.uid != identity.uid || now.gid != identity.gid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "could not switch file access to uid {} gid {} (have {} {})",
                identity.uid, identity.gid, now.uid, now.gid
            ),
        ));
    }
    Ok(())
}
