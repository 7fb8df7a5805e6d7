//! The child side of [`super::spawn`]: from the clone to `execve`, in a copy of a possibly
//! multi-threaded process. Only raw system calls on data prepared before the clone: nothing
//! is allocated, no lock is taken, and glibc wrappers that coordinate threads (`setuid` and
//! friends) are avoided.

use std::ffi::{CStr, CString};

/// Bytes of a failure report: step, errno, index of the path (little endian `u32`s).
pub(super) const REPORT_LEN: usize = 12;

/// What the child was doing when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(super) enum Step {
    Cgroup = 1,
    PrivateMounts,
    OwnDir,
    RootTmpfs,
    EnterRoot,
    Mkdir,
    CreateFile,
    Bind,
    Remount,
    PivotRoot,
    DetachOldRoot,
    Chdir,
    RootReadOnly,
    Groups,
    Gid,
    Uid,
    NoNewPrivs,
    Signals,
    Stdio,
    Tap,
    Exec,
}

const STEPS: [Step; 21] = [
    Step::Cgroup,
    Step::PrivateMounts,
    Step::OwnDir,
    Step::RootTmpfs,
    Step::EnterRoot,
    Step::Mkdir,
    Step::CreateFile,
    Step::Bind,
    Step::Remount,
    Step::PivotRoot,
    Step::DetachOldRoot,
    Step::Chdir,
    Step::RootReadOnly,
    Step::Groups,
    Step::Gid,
    Step::Uid,
    Step::NoNewPrivs,
    Step::Signals,
    Step::Stdio,
    Step::Tap,
    Step::Exec,
];

impl Step {
    /// For error messages.
    pub(super) fn name(self) -> &'static str {
        match self {
            Step::Cgroup => "join its cgroups",
            Step::PrivateMounts => "make the mounts private",
            Step::OwnDir => "open its directory",
            Step::RootTmpfs => "mount the tmpfs root",
            Step::EnterRoot => "enter the new root",
            Step::Mkdir => "create directory",
            Step::CreateFile => "create the mount point",
            Step::Bind => "bind",
            Step::Remount => "remount",
            Step::PivotRoot => "pivot_root",
            Step::DetachOldRoot => "detach the old root",
            Step::Chdir => "chdir",
            Step::RootReadOnly => "make the root read-only",
            Step::Groups => "setgroups",
            Step::Gid => "setresgid",
            Step::Uid => "setresuid",
            Step::NoNewPrivs => "no_new_privs",
            Step::Signals => "reset signals",
            Step::Stdio => "connect stdio",
            Step::Tap => "pass the TAP device",
            Step::Exec => "exec QEMU",
        }
    }
}

/// Decode a report: (step, errno, index).
pub(super) fn decode(report: &[u8; REPORT_LEN]) -> (Step, i32, usize) {
    let word = |i: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(&report[i * 4..i * 4 + 4]);
        u32::from_le_bytes(b)
    };
    let step = STEPS
        .iter()
        .copied()
        .find(|s| *s as u32 == word(0))
        .unwrap_or(Step::Exec);
    (step, word(1) as i32, word(2) as usize)
}

/// Everything the child needs, prepared by the parent.
pub(super) struct Prepared {
    /// `cgroup.procs` descriptors.
    pub cgroup_fds: Vec<i32>,
    /// QEMU's own directory (absolute): the tmpfs root is mounted on it.
    pub own_dir: CString,
    /// Directories to create in the root, relative, parents first.
    pub dirs: Vec<CString>,
    /// (source, target relative to the root, is the own directory, is a directory, remount
    /// flags).
    pub binds: Vec<(CString, CString, bool, bool, libc::c_ulong)>,
    pub groups: Vec<u32>,
    pub uid: u32,
    pub gid: u32,
    /// `/dev/null`, read-only.
    pub stdin: i32,
    /// QEMU's log file (stdout and stderr).
    pub log: i32,
    /// The TAP device, to pass as fd `TAP_FD`.
    pub tap: Option<i32>,
    pub program: CString,
    /// NULL-terminated.
    pub argv: Vec<*const libc::c_char>,
    /// NULL-terminated.
    pub envp: *const *const libc::c_char,
    /// Write end of the report pipe.
    pub report: i32,
}

/// `Err((step, index))` with errno set, from a raw return value.
fn check(ret: libc::c_long, step: Step, index: usize) -> Result<(), (Step, usize)> {
    if ret < 0 {
        Err((step, index))
    } else {
        Ok(())
    }
}

fn errno() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Set up and exec; on failure report and `_exit(127)`. Never returns.
pub(super) fn run(p: &Prepared) -> ! {
    let (step, index) = match setup(p) {
        Ok(()) => (Step::Exec, 0),
        Err(failed) => failed,
    };
    let e = errno();
    let mut report = [0u8; REPORT_LEN];
    report[0..4].copy_from_slice(&(step as u32).to_le_bytes());
    report[4..8].copy_from_slice(&(e as u32).to_le_bytes());
    report[8..12].copy_from_slice(&(index as u32).to_le_bytes());
    // SAFETY: write from a stack buffer to the report pipe, then _exit: both async-signal-safe.
    unsafe {
        libc::write(p.report, report.as_ptr().cast(), REPORT_LEN);
        libc::_exit(127)
    }
}

fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> libc::c_long {
    let ptr = |s: Option<&CStr>| s.map_or(std::ptr::null(), CStr::as_ptr);
    // SAFETY: every pointer is NUL-terminated or null and outlives the call.
    unsafe {
        libc::mount(
            ptr(source),
            target.as_ptr(),
            ptr(fstype),
            flags,
            ptr(data).cast(),
        )
        .into()
    }
}

/// `/proc/self/fd/N`, formatted on the stack.
struct FdPath {
    buf: [u8; 32],
}

impl FdPath {
    fn new(fd: i32) -> Self {
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

/// `dup2(from, to)`, clearing close-on-exec also when they are equal.
fn dup_to(from: i32, to: i32) -> libc::c_long {
    // SAFETY: plain descriptor operations.
    unsafe {
        if from == to {
            libc::fcntl(from, libc::F_SETFD, 0).into()
        } else {
            libc::dup2(from, to).into()
        }
    }
}

/// Up to exec; returns only on failure (or with `Ok` if execve returned, i.e. failed).
fn setup(p: &Prepared) -> Result<(), (Step, usize)> {
    for (i, &fd) in p.cgroup_fds.iter().enumerate() {
        // SAFETY: writes one byte from a static buffer to a descriptor opened before the clone.
        let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        check(n as libc::c_long, Step::Cgroup, i)?;
    }
    enter_root(p)?;
    // SAFETY: raw credential system calls (only this thread exists in the child; glibc's
    // wrappers would try to signal the parent's other threads) and prctl, on plain values
    // and a pointer to `groups`, which outlives the call.
    unsafe {
        check(
            libc::syscall(libc::SYS_setgroups, p.groups.len(), p.groups.as_ptr()),
            Step::Groups,
            0,
        )?;
        check(
            libc::syscall(libc::SYS_setresgid, p.gid, p.gid, p.gid),
            Step::Gid,
            0,
        )?;
        check(
            libc::syscall(libc::SYS_setresuid, p.uid, p.uid, p.uid),
            Step::Uid,
            0,
        )?;
        check(
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).into(),
            Step::NoNewPrivs,
            0,
        )?;
    }
    // What Rust's `Command` does for a child: an empty signal mask, SIGPIPE back to default
    // (this process ignores it).
    // SAFETY: a zeroed sigset_t is the empty set; rt_sigprocmask and signal take plain values.
    unsafe {
        let empty: libc::sigset_t = std::mem::zeroed();
        check(
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                &empty as *const libc::sigset_t,
                std::ptr::null::<libc::sigset_t>(),
                8usize,
            ),
            Step::Signals,
            0,
        )?;
        if libc::signal(libc::SIGPIPE, libc::SIG_DFL) == libc::SIG_ERR {
            return Err((Step::Signals, 1));
        }
    }
    check(dup_to(p.stdin, 0), Step::Stdio, 0)?;
    check(dup_to(p.log, 1), Step::Stdio, 1)?;
    check(dup_to(p.log, 2), Step::Stdio, 2)?;
    if let Some(tap) = p.tap {
        check(dup_to(tap, crate::qemu::TAP_FD), Step::Tap, 0)?;
    }
    // SAFETY: program, argv and envp are NUL-terminated strings and NULL-terminated arrays
    // prepared before the clone.
    unsafe { libc::execve(p.program.as_ptr(), p.argv.as_ptr(), p.envp) };
    Err((Step::Exec, 0))
}

/// The new root (see the module documentation of `jail`).
fn enter_root(p: &Prepared) -> Result<(), (Step, usize)> {
    check(
        mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None),
        Step::PrivateMounts,
        0,
    )?;
    // Opened in this mount namespace (a descriptor from the parent's could not be bound
    // here), before the tmpfs hides it; closed at exec.
    // SAFETY: open on a NUL-terminated string prepared before the clone.
    let own = unsafe {
        libc::open(
            p.own_dir.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    check(own.into(), Step::OwnDir, 0)?;
    let own_source = FdPath::new(own);
    check(
        mount(
            Some(c"tmpfs"),
            &p.own_dir,
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            Some(c"mode=0755,size=1m,nr_inodes=4096"),
        ),
        Step::RootTmpfs,
        0,
    )?;
    // SAFETY: chdir, mkdir, open, close on NUL-terminated strings prepared before the clone.
    unsafe {
        check(libc::chdir(p.own_dir.as_ptr()).into(), Step::EnterRoot, 0)?;
        for (i, dir) in p.dirs.iter().enumerate() {
            if libc::mkdir(dir.as_ptr(), 0o755) < 0 && errno() != libc::EEXIST {
                return Err((Step::Mkdir, i));
            }
        }
        for (i, (_, target, _, is_dir, _)) in p.binds.iter().enumerate() {
            if *is_dir {
                continue;
            }
            let fd = libc::open(
                target.as_ptr(),
                libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                0o644,
            );
            check(fd.into(), Step::CreateFile, i)?;
            libc::close(fd);
        }
    }
    for (i, (source, target, is_own, _, flags)) in p.binds.iter().enumerate() {
        let source = if *is_own {
            own_source.as_c_str()
        } else {
            source
        };
        check(
            mount(Some(source), target, None, libc::MS_BIND, None),
            Step::Bind,
            i,
        )?;
        check(
            mount(
                None,
                target,
                None,
                libc::MS_REMOUNT | libc::MS_BIND | flags,
                None,
            ),
            Step::Remount,
            i,
        )?;
    }
    // SAFETY: pivot_root, umount2 and chdir on static or prepared NUL-terminated strings.
    unsafe {
        check(
            libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()),
            Step::PivotRoot,
            0,
        )?;
        check(
            libc::umount2(c".".as_ptr(), libc::MNT_DETACH).into(),
            Step::DetachOldRoot,
            0,
        )?;
        check(libc::chdir(c"/".as_ptr()).into(), Step::Chdir, 0)?;
    }
    check(
        mount(
            None,
            c"/",
            None,
            libc::MS_REMOUNT
                | libc::MS_BIND
                | libc::MS_RDONLY
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | libc::MS_NOEXEC,
            None,
        ),
        Step::RootReadOnly,
        0,
    )?;
    Ok(())
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

    #[test]
    fn reports_round_trip() {
        for step in STEPS {
            let mut report = [0u8; REPORT_LEN];
            report[0..4].copy_from_slice(&(step as u32).to_le_bytes());
            report[4..8].copy_from_slice(&2u32.to_le_bytes());
            report[8..12].copy_from_slice(&7u32.to_le_bytes());
            assert_eq!(decode(&report), (step, 2, 7));
        }
    }
}
