//! Confining QEMU: the `vm` backend's defense in depth (code that escapes the guest into
//! QEMU is still in all of this).
//!
//! [`spawn`] clones QEMU straight into new **mount, pid**, IPC, UTS and network namespaces
//! (so the process that execs QEMU is pid 1 of its own pid namespace, and its host pid is
//! the one the server records, watches and kills). Between the clone and `execve`, in the
//! child, with nothing allocated:
//!
//! 1. join the sandbox's cgroups (descriptors of their `cgroup.procs` opened before);
//! 2. make every mount private, mount an empty tmpfs on QEMU's own directory and build the
//!    new root in it: each path of the [`root::RootPlan`] bound at its own path (read-only
//!    where QEMU only reads), its own directory bound read-write from a descriptor;
//!    `pivot_root` into it, detach the old root, remount the tmpfs read-only;
//! 3. drop to the unprivileged uid, gid and groups (raw system calls: the child of a
//!    multi-threaded process must not use glibc's all-threads `setxid`), `no_new_privs`;
//! 4. reset the signal mask and `SIGPIPE`, connect stdin to `/dev/null` and stdout/stderr to
//!    the log, the TAP device to fd [`crate::qemu::TAP_FD`]; exec QEMU with an empty
//!    environment. QEMU's own seccomp filter (`-sandbox`) comes on top.
//!
//! A failing step is reported to the parent over a close-on-exec pipe (step, errno, which
//! path); end of file on it means QEMU was exec'd.

mod child;
pub(crate) mod root;

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::qemu::{QemuError, VmConfig};
use child::{Prepared, Step, REPORT_LEN};

/// How QEMU is confined when it starts (see the module documentation). The uid, gid and
/// groups are the sandbox's; the file tree and the namespaces follow from its [`VmConfig`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QemuJail {
    /// The uid QEMU runs as (never 0).
    pub uid: u32,
    /// Its gid.
    pub gid: u32,
    /// Supplementary groups (the group that may open template memory files; `kvm`).
    pub groups: Vec<u32>,
    /// `cgroup.procs` files QEMU moves itself into.
    pub cgroup_procs: Vec<PathBuf>,
}

/// Namespaces QEMU is cloned into.
const NAMESPACES: libc::c_int = libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWNET;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> QemuError {
    let what = what.into();
    move |source| QemuError::Io { what, source }
}

fn c_path(path: &Path) -> Result<CString, QemuError> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| QemuError::Jail(format!("{} contains a NUL byte", path.display())))
}

/// Start QEMU for `config` in `jail`, its output going to `log`; returns its host pid once
/// it has been exec'd. The caller reaps it.
pub(crate) fn spawn(config: &VmConfig, jail: &QemuJail, log: &File) -> Result<i32, QemuError> {
    if jail.uid == 0 {
        return Err(io("confine QEMU")(std::io::Error::other(
            "refusing to run a jailed QEMU as uid 0",
        )));
    }
    let started = std::time::Instant::now();
    let program = root::program_files(&config.qemu)?;
    let cwd = std::env::current_dir().map_err(io("the working directory"))?;
    let config = &root::with_absolute_paths(config, &cwd);
    let plan = root::RootPlan::new(config, &program, &cwd)?;

    // Everything the child uses, made before the clone.
    let cgroups = jail
        .cgroup_procs
        .iter()
        .map(|p| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .map_err(io(format!("open {}", p.display())))
        })
        .collect::<Result<Vec<File>, _>>()?;
    let null = File::open("/dev/null").map_err(io("open /dev/null"))?;
    let relative = |p: &Path| c_path(p.strip_prefix("/").unwrap_or(p));
    let mut binds = Vec::with_capacity(plan.binds.len());
    for b in &plan.binds {
        // The own directory is hidden under the tmpfs by then: bound from a descriptor.
        let own = b.path == plan.own_dir;
        binds.push((
            c_path(&b.path)?,
            relative(&b.path)?,
            own,
            b.dir,
            b.access.flags(),
        ));
    }
    let dirs = plan
        .directories()
        .iter()
        .map(|d| c_path(d))
        .collect::<Result<Vec<_>, _>>()?;
    let mut argv = vec![c_path(&program.binary)?];
    for arg in config.argv() {
        argv.push(
            CString::new(arg.as_bytes())
                .map_err(|_| QemuError::Jail(format!("argument {arg:?} contains a NUL byte")))?,
        );
    }
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let (report_read, report_write) = pipe()?;
    let prepared = Prepared {
        cgroup_fds: cgroups.iter().map(|f| f.as_raw_fd()).collect(),
        own_dir: c_path(&plan.own_dir)?,
        dirs,
        binds,
        groups: jail.groups.clone(),
        uid: jail.uid,
        gid: jail.gid,
        stdin: null.as_raw_fd(),
        log: log.as_raw_fd(),
        tap: config.tap.as_ref().map(|t| t.as_raw_fd()),
        program: argv[0].clone(),
        argv: argv_ptrs,
        envp: envp.as_ptr(),
        report: report_write.as_raw_fd(),
    };
    // SAFETY: fork semantics (null stack, no tid pointers): the child runs on a copy of this
    // stack and only calls `child::run`, which makes async-signal-safe raw system calls on
    // the data prepared above, allocates nothing, and ends in execve or _exit; it returns
    // in no case, so nothing of this (possibly multi-threaded) process's state is touched
    // in the child.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (NAMESPACES | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        child::run(&prepared);
    }
    if pid < 0 {
        return Err(io("clone QEMU into its namespaces")(
            std::io::Error::last_os_error(),
        ));
    }
    let pid = pid as i32;
    drop(report_write);
    let mut report = [0u8; REPORT_LEN];
    let got = read_report(&report_read, &mut report)?;
    if got == 0 {
        tracing::debug!(
            pid,
            binds = plan.binds.len(),
            spawn_us = started.elapsed().as_micros() as u64,
            "QEMU exec'd in its jail"
        );
        return Ok(pid);
    }
    // SAFETY: waitpid on our own child with a null status pointer.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    let (step, errno, index) = child::decode(&report);
    let source = std::io::Error::from_raw_os_error(errno);
    if step == Step::Exec && errno == libc::ENOENT {
        return Err(QemuError::Missing(program.binary.display().to_string()));
    }
    let path = match step {
        Step::Mkdir => plan
            .directories()
            .get(index)
            .map(|d| Path::new("/").join(d)),
        Step::Bind | Step::Remount => plan.binds.get(index).map(|b| b.path.clone()),
        _ => None,
    };
    let what = match path {
        Some(p) => format!("confine QEMU: {} {}", step.name(), p.display()),
        None => format!("confine QEMU: {}", step.name()),
    };
    Err(QemuError::Io { what, source })
}

/// A close-on-exec pipe: (read end, write end).
fn pipe() -> Result<(OwnedFd, OwnedFd), QemuError> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io("pipe")(std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Read the child's report: 0 bytes once it exec'd, else a whole report.
fn read_report(fd: &OwnedFd, buf: &mut [u8; REPORT_LEN]) -> Result<usize, QemuError> {
    let mut got = 0;
    while got < buf.len() {
        let rest = &mut buf[got..];
        // SAFETY: reads at most `rest.len()` bytes into `rest`.
        let n = unsafe { libc::read(fd.as_raw_fd(), rest.as_mut_ptr().cast(), rest.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(io("read QEMU's start report")(e));
        }
        if n == 0 {
            break;
        }
        got += n as usize;
    }
    Ok(got)
}
