//! The child side of [`super::ExecPlan::spawn`]: from the clone to `execve`, in a copy of a
//! possibly multi-threaded process. Only raw system calls on data prepared before the clone,
//! each checked with [`check_errno`]: nothing is allocated, no lock is taken, nothing panics.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, RawFd};

use super::{encode, MountSource, Step, MAX_OPENED, REPORT_LEN};
use crate::sys::{self, check_errno, Errno};

/// The program and where to report, prepared by the parent.
pub(super) struct Exec<'a> {
    pub program: &'a CString,
    /// NULL-terminated.
    pub argv: &'a [*const libc::c_char],
    /// NULL-terminated.
    pub envp: &'a [*const libc::c_char],
    /// Write end of the report pipe.
    pub report: RawFd,
}

/// Run every step and exec; on failure report the step and `_exit(127)`. Never returns.
pub(super) fn run(steps: &[(Step<'_>, String)], exec: &Exec<'_>) -> ! {
    let mut opened = Opened::default();
    let mut failed = None;
    for (index, (step, _)) in steps.iter().enumerate() {
        if let Err(Errno(errno)) = perform(step, &mut opened) {
            failed = Some((index, errno));
            break;
        }
    }
    let (index, errno) = failed.unwrap_or_else(|| {
        // SAFETY: program, argv and envp are a NUL-terminated string and NULL-terminated
        // arrays of them, prepared before the clone and alive in this copy of the stack.
        unsafe {
            libc::execve(
                exec.program.as_ptr(),
                exec.argv.as_ptr(),
                exec.envp.as_ptr(),
            )
        };
        (steps.len(), Errno::last().0)
    });
    let report: [u8; REPORT_LEN] = encode(index, errno);
    // SAFETY: write from a stack buffer to the report pipe, then _exit: both
    // async-signal-safe.
    unsafe {
        libc::write(exec.report, report.as_ptr().cast(), REPORT_LEN);
        libc::_exit(127)
    }
}

/// Directories opened by [`Step::OpenDirectory`], in order.
#[derive(Default)]
struct Opened {
    fds: [RawFd; MAX_OPENED],
    len: usize,
}

impl Opened {
    /// The `n`-th opened directory (`EBADF` if there is none).
    fn get(&self, n: usize) -> Result<RawFd, Errno> {
        let open = self.fds.get(..self.len).unwrap_or_default();
        open.get(n).copied().ok_or(Errno(libc::EBADF))
    }
}

fn perform(step: &Step<'_>, opened: &mut Opened) -> Result<(), Errno> {
    match step {
        Step::JoinCgroup(procs) => {
            // SAFETY: writes one byte from a static buffer to a descriptor of the parent's.
            let n = unsafe { libc::write(procs.as_raw_fd(), c"0".as_ptr().cast(), 1) };
            check_errno(n as libc::c_long)?;
        }
        Step::Mount {
            source,
            target,
            fstype,
            flags,
            data,
        } => {
            let fd_path;
            let source = match source {
                MountSource::None => None,
                MountSource::Path(path) => Some(path.as_c_str()),
                MountSource::Opened(n) => {
                    fd_path = FdPath::new(opened.get(*n)?);
                    Some(fd_path.as_c_str())
                }
            };
            sys::mount_c(source, target, fstype.as_deref(), *flags, data.as_deref())?;
        }
        Step::OpenDirectory(path) => {
            if opened.len >= MAX_OPENED {
                return Err(Errno(libc::EMFILE));
            }
            // SAFETY: open on a NUL-terminated string prepared before the clone.
            let fd = unsafe {
                libc::open(
                    path.as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            };
            check_errno(fd.into())?;
            if let Some(slot) = opened.fds.get_mut(opened.len) {
                *slot = fd;
                opened.len += 1;
            }
        }
        Step::Chdir(path) => sys::chdir_c(path)?,
        Step::Mkdir(path) => {
            // SAFETY: mkdir on a NUL-terminated string prepared before the clone.
            if let Err(e) = check_errno(unsafe { libc::mkdir(path.as_ptr(), 0o755) }.into()) {
                if e.0 != libc::EEXIST {
                    return Err(e);
                }
            }
        }
        Step::CreateFile(path) => {
            // SAFETY: open and close on a NUL-terminated string prepared before the clone
            // and the descriptor it returned.
            unsafe {
                let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC;
                let fd = check_errno(libc::open(path.as_ptr(), flags, 0o644).into())?;
                libc::close(fd as RawFd);
            }
        }
        Step::PivotRootHere => sys::pivot_root_here_c()?,
        Step::Unmount { target, flags } => sys::umount2_c(target, *flags)?,
        // The raw credential system calls, not glibc's wrappers: those signal every other
        // thread of the process, which do not exist in this copy.
        Step::SetGroups(groups) => {
            // SAFETY: the pointer and length describe `groups`, which outlives the call.
            let ret = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
            check_errno(ret)?;
        }
        Step::SetGid(gid) => {
            // SAFETY: setresgid takes integers only.
            check_errno(unsafe { libc::syscall(libc::SYS_setresgid, *gid, *gid, *gid) })?;
        }
        Step::SetUid(uid) => {
            // SAFETY: setresuid takes integers only.
            check_errno(unsafe { libc::syscall(libc::SYS_setresuid, *uid, *uid, *uid) })?;
        }
        Step::NoNewPrivs => {
            // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only.
            check_errno(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }.into())?;
        }
        Step::ClearSignalMask => {
            // SAFETY: a zeroed sigset_t is the empty set; the kernel's sigset is 8 bytes; the
            // old-set pointer is null.
            let ret = unsafe {
                let empty: libc::sigset_t = std::mem::zeroed();
                libc::syscall(
                    libc::SYS_rt_sigprocmask,
                    libc::SIG_SETMASK,
                    &empty as *const libc::sigset_t,
                    std::ptr::null::<libc::sigset_t>(),
                    8usize,
                )
            };
            check_errno(ret)?;
        }
        Step::DefaultSignal(signal) => {
            // SAFETY: installing SIG_DFL takes plain values.
            if unsafe { libc::signal(*signal, libc::SIG_DFL) } == libc::SIG_ERR {
                return Err(Errno::last());
            }
        }
        Step::Dup { from, to } if from.as_raw_fd() == *to => {
            // SAFETY: clears the descriptor's flags (close-on-exec); takes integers only.
            check_errno(unsafe { libc::fcntl(*to, libc::F_SETFD, 0) }.into())?;
        }
        Step::Dup { from, to } => sys::dup2_c(from.as_raw_fd(), *to)?,
    }
    Ok(())
}

/// `/proc/self/fd/N`, formatted on the stack.
struct FdPath {
    buf: [u8; 32],
}

impl FdPath {
    fn new(fd: RawFd) -> Self {
        let mut buf = [0u8; 32];
        let prefix = b"/proc/self/fd/";
        buf[..prefix.len()].copy_from_slice(prefix);
        let mut digits = [0u8; 10];
        let (mut n, mut len) = (fd.unsigned_abs(), 0);
        loop {
            digits[len] = b'0' + (n % 10) as u8;
            len += 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for (i, d) in digits[..len].iter().rev().enumerate() {
            buf[prefix.len() + i] = *d;
        }
        Self { buf }
    }

    fn as_c_str(&self) -> &CStr {
        CStr::from_bytes_until_nul(&self.buf).unwrap_or(c"/proc/self/fd/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_paths() {
        assert_eq!(FdPath::new(0).as_c_str(), c"/proc/self/fd/0");
        assert_eq!(FdPath::new(1234).as_c_str(), c"/proc/self/fd/1234");
        assert_eq!(
            FdPath::new(i32::MAX).as_c_str(),
            c"/proc/self/fd/2147483647"
        );
    }
}
