//! fork + exec of one workload process, with everything the child needs prepared up front.
//!
//! After `fork` in a multi-threaded process the child may only make async-signal-safe calls:
//! no allocation, no locks. So every string, pointer array and id is built into a
//! [`SpawnPlan`] before forking, and the child runs a fixed list of syscalls:
//!
//! 1. clear the signal mask and restore `SIGPIPE` (Rust ignores it; ignored signals survive
//!    exec),
//! 2. `setsid` (own session and process group: the group id is the pid, so the agent can
//!    signal or kill the whole tree it started),
//! 3. join the exec's cgroup (`vm` guests, [`crate::cgroups`]): best effort, a failure is
//!    reported and the process runs on uncounted,
//! 4. stdio onto fds 0, 1, 2, and `TIOCSCTTY` for a PTY,
//! 5. `oom_score_adj` back to 0 (the jail gives the agent -999 so the OOM killer prefers
//!    the workload), the original `RLIMIT_NOFILE`,
//! 6. `setgroups`, `setresgid`, `setresuid` when switching users,
//! 7. `chdir`, then `execve`.
//!
//! A failing step writes `[step, errno]` to a close-on-exec pipe and exits 127; the parent
//! reads the pipe (empty means exec succeeded) and reports a typed [`SpawnError`]. A cgroup
//! that could not be joined is a single [`NOT_JOINED`] byte ahead of that.

use std::ffi::{CString, NulError};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr;

use crate::sys::{cvt_retry, pipe};

/// Users and groups to switch to in the child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups (including the primary one).
    pub groups: Vec<u32>,
}

/// Everything the child needs, built before forking.
#[derive(Debug)]
pub struct SpawnPlan {
    program: CString,
    // Keeps the strings alive that the pointer arrays point into.
    _argv: Vec<CString>,
    _envp: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
    cwd: CString,
    credentials: Option<Credentials>,
    nofile: Option<libc::rlimit>,
    cgroup_procs: Option<RawFd>,
}

// SAFETY: the raw pointers point into the CStrings owned by the same plan, which are never
// mutated; moving the plan to another thread moves the owners with them.
unsafe impl Send for SpawnPlan {}

impl SpawnPlan {
    /// Build a plan; fails if any string contains a NUL byte.
    pub fn new(
        program: &str,
        argv: &[String],
        env: &[(String, String)],
        cwd: &str,
        credentials: Option<Credentials>,
        nofile: Option<libc::rlimit>,
    ) -> Result<Self, NulError> {
        let program = CString::new(program)?;
        let argv: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_str()))
            .collect::<Result<_, _>>()?;
        let envp: Vec<CString> = env
            .iter()
            .map(|(k, v)| CString::new(format!("{k}={v}")))
            .collect::<Result<_, _>>()?;
        let argv_ptrs = argv
            .iter()
            .map(|a| a.as_ptr())
            .chain([ptr::null()])
            .collect();
        let envp_ptrs = envp
            .iter()
            .map(|e| e.as_ptr())
            .chain([ptr::null()])
            .collect();
        Ok(Self {
            program,
            _argv: argv,
            _envp: envp,
            argv_ptrs,
            envp_ptrs,
            cwd: CString::new(cwd)?,
            credentials,
            nofile,
            cgroup_procs: None,
        })
    }

    /// Make the child join the cgroup whose `cgroup.procs` is open as `procs` (writing `0`
    /// moves the writer), before anything else it starts.
    pub fn join_cgroup(&mut self, procs: RawFd) {
        self.cgroup_procs = Some(procs);
    }
}

/// The child's standard fds: each is dup'ed onto 0, 1 and 2.
#[derive(Debug, Clone, Copy)]
pub struct ChildStdio {
    /// Fds for stdin, stdout, stderr (all close-on-exec in the agent, and not 0..=2).
    pub fds: [RawFd; 3],
    /// Make stdin the controlling terminal (PTY execs).
    pub controlling_tty: bool,
}

/// The step of the child setup that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Step {
    Setup = 1,
    Credentials = 2,
    Chdir = 3,
    Exec = 4,
}

/// Report byte of a child that could not join its cgroup (and went on without it).
const NOT_JOINED: u8 = 9;

/// Why a process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// `fork` or the report pipe failed (out of processes or fds).
    #[error("cannot fork: {0}")]
    Fork(#[source] io::Error),
    /// Session, terminal or stdio setup failed in the child.
    #[error("cannot set up the process: {0}")]
    Setup(#[source] io::Error),
    /// Switching user or groups failed.
    #[error("cannot switch user: {0}")]
    Credentials(#[source] io::Error),
    /// The working directory could not be entered.
    #[error("cannot enter the working directory: {0}")]
    Chdir(#[source] io::Error),
    /// `execve` failed (not found, not executable, bad format, ...).
    #[error("cannot execute: {0}")]
    Exec(#[source] io::Error),
}

/// Fork and exec per `plan`. Returns the child's pid once `execve` has succeeded; `joined`
/// says whether it joined the plan's cgroup (false without one).
/// Call it under [`crate::reaper::Reaper::spawn`] so the child is registered atomically.
pub fn spawn(
    plan: &SpawnPlan,
    stdio: ChildStdio,
    joined: &mut bool,
) -> Result<libc::pid_t, SpawnError> {
    let (report_read, report_write) = pipe().map_err(SpawnError::Fork)?;
    // SAFETY: fork has no memory effects in the parent. In the child we only run
    // `child_after_fork`, which makes async-signal-safe calls on data prepared before the
    // fork and never returns.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(SpawnError::Fork(io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: we are the freshly forked child; see above.
        unsafe { child_after_fork(plan, stdio, report_write.as_raw_fd()) }
    }
    drop(report_write);
    let mut report = [0u8; 6];
    let mut filled = 0;
    while filled < report.len() {
        let rest = &mut report[filled..];
        // SAFETY: the pointer and length describe the unfilled part of `report`.
        let n = cvt_retry(|| unsafe {
            libc::read(
                report_read.as_raw_fd(),
                rest.as_mut_ptr().cast(),
                rest.len(),
            ) as libc::c_int
        })
        .map_err(SpawnError::Fork)?;
        if n == 0 {
            break;
        }
        filled += n as usize;
    }
    *joined = plan.cgroup_procs.is_some();
    let mut report = &report[..filled];
    if report.first() == Some(&NOT_JOINED) {
        *joined = false;
        report = &report[1..];
    }
    if report.len() < 5 {
        return Ok(pid);
    }
    // The child reported a failure and exits with 127; the reaper collects it.
    let errno = i32::from_ne_bytes([report[1], report[2], report[3], report[4]]);
    let error = io::Error::from_raw_os_error(errno);
    Err(match report[0] {
        x if x == Step::Credentials as u8 => SpawnError::Credentials(error),
        x if x == Step::Chdir as u8 => SpawnError::Chdir(error),
        x if x == Step::Exec as u8 => SpawnError::Exec(error),
        _ => SpawnError::Setup(error),
    })
}

/// The forked child. Only async-signal-safe calls; never returns.
///
/// # Safety
/// Must only be called in the child right after `fork`, with `plan` and the fds valid.
unsafe fn child_after_fork(plan: &SpawnPlan, stdio: ChildStdio, report: RawFd) -> ! {
    let fail = |step: Step| -> ! {
        // SAFETY: reading errno and writing a stack buffer to a pipe are async-signal-safe.
        unsafe {
            let errno = *libc::__errno_location();
            let e = errno.to_ne_bytes();
            let msg = [step as u8, e[0], e[1], e[2], e[3]];
            libc::write(report, msg.as_ptr().cast(), msg.len());
            libc::_exit(127)
        }
    };

    // SAFETY: every call below is an async-signal-safe syscall wrapper on stack values,
    // static C strings, or data the plan allocated before the fork.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, ptr::null_mut());
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);

        if libc::setsid() < 0 {
            fail(Step::Setup);
        }
        if let Some(procs) = plan.cgroup_procs {
            if libc::write(procs, b"0".as_ptr().cast(), 1) != 1 {
                libc::write(report, [NOT_JOINED].as_ptr().cast(), 1);
            }
        }
        for (target, &source) in stdio.fds.iter().enumerate() {
            let target = target as RawFd;
            if source == target {
                // dup2 onto itself keeps close-on-exec; clear it instead.
                if libc::fcntl(target, libc::F_SETFD, 0) < 0 {
                    fail(Step::Setup);
                }
            } else if libc::dup2(source, target) < 0 {
                fail(Step::Setup);
            }
        }
        if stdio.controlling_tty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
            fail(Step::Setup);
        }

        // Best effort: a kernel without /proc in the sandbox just keeps the agent's value.
        let oom = libc::open(
            c"/proc/self/oom_score_adj".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        );
        if oom >= 0 {
            libc::write(oom, b"0".as_ptr().cast(), 1);
            libc::close(oom);
        }
        if let Some(limit) = &plan.nofile {
            libc::setrlimit(libc::RLIMIT_NOFILE, limit);
        }

        if let Some(creds) = &plan.credentials {
            if libc::setgroups(creds.groups.len(), creds.groups.as_ptr()) < 0 {
                fail(Step::Credentials);
            }
            if libc::setresgid(creds.gid, creds.gid, creds.gid) < 0 {
                fail(Step::Credentials);
            }
            if libc::setresuid(creds.uid, creds.uid, creds.uid) < 0 {
                fail(Step::Credentials);
            }
        }
        if libc::chdir(plan.cwd.as_ptr()) < 0 {
            fail(Step::Chdir);
        }
        libc::execve(
            plan.program.as_ptr(),
            plan.argv_ptrs.as_ptr(),
            plan.envp_ptrs.as_ptr(),
        );
        fail(Step::Exec)
    }
}
