//! Exec a program into new namespaces from **any** process, the multi-threaded server
//! included: everything the child does between `clone` and `execve` is an [`ExecPlan`], a
//! list of [`Step`]s prepared (and allocated) by the parent before the clone.
//!
//! The child of a multi-threaded process is a copy of one thread: a lock another thread held
//! at the clone (the allocator's, glibc's `setxid` broadcast) stays held forever in it. So
//! the child here runs the steps in order with raw system calls on the prepared data, checks
//! each through the crate's allocation-free checked helper, allocates nothing, takes no lock
//! and ends in `execve` or `_exit`. Credentials are set with raw `setgroups`, `setresgid` and
//! `setresuid` for the same reason.
//!
//! A failing step is reported to the parent over a close-on-exec pipe as a fixed-size record
//! ([`REPORT_LEN`] bytes: the step's index and the `errno`, little-endian `u32`s; the index
//! equals the number of steps when `execve` itself failed); end of file on the pipe means the
//! program was exec'd. The parent names the step by the label it gave it ([`ExecPlan::push`]),
//! so the child never formats a message.
//!
//! The `ns` sandbox child ([`crate::spawn`]) is not built on this: it runs in the
//! single-threaded helper, where the crate's allocating wrappers are safe. QEMU's jail
//! (`hutch_vm::qemu::jail`) is.

mod child;

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::sys;

/// Bytes of a failure report: step index and errno (little-endian `u32`s).
pub const REPORT_LEN: usize = 8;
/// How many directories a plan may hold open at once ([`Step::OpenDirectory`]).
pub const MAX_OPENED: usize = 4;

/// Where a [`Step::Mount`] mounts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountSource {
    /// No source (a remount, a propagation change).
    None,
    /// A path (or a filesystem's source name, e.g. `tmpfs`).
    Path(CString),
    /// The `n`-th [`Step::OpenDirectory`] of the plan, through `/proc/self/fd/N`: a
    /// directory that an earlier step hid (e.g. under a mount on it). A step naming one not
    /// opened (yet) fails with `EBADF`.
    Opened(usize),
}

/// One thing the child does. Paths are relative to its working directory at that step.
#[derive(Debug)]
pub enum Step<'fd> {
    /// Write `0` to this open `cgroup.procs`: move into its cgroup.
    JoinCgroup(BorrowedFd<'fd>),
    /// `mount(2)`.
    Mount {
        /// Its source.
        source: MountSource,
        /// The mount point.
        target: CString,
        /// Filesystem type.
        fstype: Option<CString>,
        /// `MS_*` flags.
        flags: libc::c_ulong,
        /// Filesystem options.
        data: Option<CString>,
    },
    /// Open a directory (`O_PATH`, close-on-exec) and keep it for [`MountSource::Opened`]:
    /// opened in the child's own mount namespace (a descriptor of the parent's could not be
    /// mounted there). At most [`MAX_OPENED`]; more fail with `EMFILE`.
    OpenDirectory(CString),
    /// `chdir(2)`.
    Chdir(CString),
    /// `mkdir(path, 0755)`; an existing directory is fine.
    Mkdir(CString),
    /// Create an empty file (mode 0644) if there is none: a mount point for a file.
    CreateFile(CString),
    /// `pivot_root(".", ".")`: the working directory becomes the root, the old root is
    /// stacked on it (detach it with [`Step::Unmount`] of `.`).
    PivotRootHere,
    /// `umount2(2)`.
    Unmount {
        /// The mount point.
        target: CString,
        /// `MNT_*` flags.
        flags: libc::c_int,
    },
    /// `setgroups(2)` (raw system call).
    SetGroups(Vec<libc::gid_t>),
    /// `setresgid(gid, gid, gid)` (raw system call).
    SetGid(libc::gid_t),
    /// `setresuid(uid, uid, uid)` (raw system call): from root to another uid this also
    /// clears every capability.
    SetUid(libc::uid_t),
    /// `prctl(PR_SET_NO_NEW_PRIVS)`.
    NoNewPrivs,
    /// An empty signal mask (a child inherits its parent's).
    ClearSignalMask,
    /// This signal's disposition back to the default (ignored signals survive `execve`).
    DefaultSignal(libc::c_int),
    /// `dup2(from, to)`; the copy is not close-on-exec, also when `from == to`.
    Dup {
        /// The descriptor (the parent's, inherited).
        from: BorrowedFd<'fd>,
        /// The number the program finds it at.
        to: RawFd,
    },
}

impl Step<'_> {
    /// A bind mount of `source` on `target`.
    pub fn bind(source: MountSource, target: CString) -> Self {
        Step::Mount {
            source,
            target,
            fstype: None,
            flags: libc::MS_BIND,
            data: None,
        }
    }

    /// The read-only/`nosuid`/… remount of a bind mount (`flags` are added to
    /// `MS_REMOUNT | MS_BIND`).
    pub fn remount_bind(target: CString, flags: libc::c_ulong) -> Self {
        Step::Mount {
            source: MountSource::None,
            target,
            fstype: None,
            flags: libc::MS_REMOUNT | libc::MS_BIND | flags,
            data: None,
        }
    }
}

/// Why an [`ExecPlan`] did not exec its program.
#[derive(Debug, thiserror::Error)]
pub enum ExecPlanError {
    /// A path or argument cannot be passed to the kernel.
    #[error("{0} contains a NUL byte")]
    Nul(String),
    /// The report pipe could not be made.
    #[error("pipe: {0}")]
    Pipe(#[source] std::io::Error),
    /// The clone into the namespaces failed.
    #[error("clone: {0}")]
    Clone(#[source] std::io::Error),
    /// The child's report could not be read.
    #[error("read the child's report: {0}")]
    Report(#[source] std::io::Error),
    /// A step failed in the child (which then exited).
    #[error("{label}: {source}")]
    Step {
        /// The step's label, as given to [`ExecPlan::push`].
        label: String,
        /// Its `errno`.
        source: std::io::Error,
    },
    /// Every step was done and `execve` failed.
    #[error("exec {program}: {source}")]
    Exec {
        /// The program.
        program: String,
        /// Its `errno` (`ENOENT`: not there).
        source: std::io::Error,
    },
}

/// `path` as a C string for a [`Step`].
pub fn c_path(path: &Path) -> Result<CString, ExecPlanError> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| ExecPlanError::Nul(path.display().to_string()))
}

/// What a cloned child does up to `execve` of `program` (see the module documentation).
/// The program gets an empty environment.
#[derive(Debug)]
pub struct ExecPlan<'fd> {
    program: CString,
    argv: Vec<CString>,
    steps: Vec<(Step<'fd>, String)>,
}

impl<'fd> ExecPlan<'fd> {
    /// Exec `program` with `args` (after `argv[0]`, which is `program`).
    pub fn new<A: AsRef<OsStr>>(program: &Path, args: &[A]) -> Result<Self, ExecPlanError> {
        let program = c_path(program)?;
        let mut argv = vec![program.clone()];
        for arg in args {
            let arg = arg.as_ref();
            argv.push(
                CString::new(arg.as_bytes())
                    .map_err(|_| ExecPlanError::Nul(format!("argument {arg:?}")))?,
            );
        }
        Ok(Self {
            program,
            argv,
            steps: Vec::new(),
        })
    }

    /// Add a step; `label` names it in the error when it fails (`bind /usr/lib`).
    pub fn push(&mut self, label: impl Into<String>, step: Step<'fd>) -> &mut Self {
        self.steps.push((step, label.into()));
        self
    }

    /// The labels of the steps, in order.
    pub fn labels(&self) -> impl Iterator<Item = &str> {
        self.steps.iter().map(|(_, label)| label.as_str())
    }

    /// The steps, in order.
    pub fn steps(&self) -> impl Iterator<Item = &Step<'fd>> {
        self.steps.iter().map(|(step, _)| step)
    }

    /// Clone a child into `namespaces` (`CLONE_NEW*` flags), run the steps there and exec
    /// the program; returns its pid (in this pid namespace) once it was exec'd. The caller
    /// reaps it. On failure the child has been reaped.
    pub fn spawn(&self, namespaces: libc::c_int) -> Result<libc::pid_t, ExecPlanError> {
        let os = |e: sys::SysError| std::io::Error::from_raw_os_error(e.errno);
        let mut argv: Vec<*const libc::c_char> = self.argv.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());
        let envp: [*const libc::c_char; 1] = [std::ptr::null()];
        let (report_read, report_write) = sys::pipe().map_err(|e| ExecPlanError::Pipe(os(e)))?;
        let exec = child::Exec {
            program: &self.program,
            argv: &argv,
            envp: &envp,
            report: report_write.as_raw_fd(),
        };
        // SAFETY: the child runs only `child::run`, which makes async-signal-safe raw system
        // calls on the data prepared above, allocates nothing, takes no lock and ends in
        // execve or _exit: the contract of `clone_process` for a multi-threaded caller.
        let pid =
            unsafe { sys::clone_process(namespaces) }.map_err(|e| ExecPlanError::Clone(os(e)))?;
        if pid == 0 {
            child::run(&self.steps, &exec);
        }
        drop(report_write);
        let report = read_report(&report_read).map_err(|e| ExecPlanError::Report(os(e)))?;
        let Some((index, errno)) = report else {
            return Ok(pid);
        };
        let _ = sys::waitpid(pid, 0);
        let source = std::io::Error::from_raw_os_error(errno);
        Err(match self.steps.get(index) {
            Some((_, label)) => ExecPlanError::Step {
                label: label.clone(),
                source,
            },
            None => ExecPlanError::Exec {
                program: self.program.to_string_lossy().into_owned(),
                source,
            },
        })
    }
}

/// Read the child's report: `None` at end of file (it exec'd), else (step index, errno).
fn read_report(fd: &OwnedFd) -> Result<Option<(usize, i32)>, sys::SysError> {
    let mut buf = [0u8; REPORT_LEN];
    let mut got = 0;
    while got < buf.len() {
        match sys::read(fd, &mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok((got > 0).then(|| decode(&buf)))
}

/// A report as the child writes it.
fn encode(index: usize, errno: i32) -> [u8; REPORT_LEN] {
    let mut report = [0u8; REPORT_LEN];
    report[..4].copy_from_slice(&(index as u32).to_le_bytes());
    report[4..].copy_from_slice(&errno.to_le_bytes());
    report
}

/// (step index, errno) of a report.
fn decode(report: &[u8; REPORT_LEN]) -> (usize, i32) {
    let mut index = [0u8; 4];
    index.copy_from_slice(&report[..4]);
    let mut errno = [0u8; 4];
    errno.copy_from_slice(&report[4..]);
    (
        u32::from_le_bytes(index) as usize,
        i32::from_le_bytes(errno),
    )
}

#[cfg(test)]
mod tests;
