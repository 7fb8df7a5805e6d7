//! The cloned child: from "born in new namespaces" to `execve` of the agent as PID 1.
//!
//! The child waits until the parent has written its uid/gid maps and released it, then, in
//! this order: a cgroup namespace rooted at its (already joined) cgroups; own session; ids switched to root of its user namespace (else it would keep
//! acting as unmapped host root); the root filesystem ([`crate::rootfs`]); hostname; loopback
//! up; capabilities dropped; `RLIMIT_CORE` 0; signal dispositions and mask reset; descriptors
//! arranged (`/dev/null` on 0, the log on 1 and 2, the agent's listening socket on
//! [`crate::AGENT_LISTEN_FD`], everything else close-on-exec); `no_new_privs`; Landlock;
//! seccomp **last**; `execve`.
//!
//! Any failure is written to the error pipe as `errno` (4 bytes, little endian) followed by a
//! UTF-8 description, and the child exits. The pipe is close-on-exec, so the parent reads end
//! of file exactly when `execve` succeeded.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use crate::landlock::Enforced;
use crate::rootfs::{self, RootfsPlan, SysfsMount};
use crate::seccomp::Filters;
use crate::sys::{self, check, SysError};
use crate::{caps, landlock, seccomp, AGENT_LISTEN_FD};

/// Path of the agent inside the sandbox.
pub(crate) const AGENT_PATH: &str = "/.hutch/hutch-agent";
/// Descriptors the child keeps are moved at or above this number first, so that placing
/// them on 0–3 never collides.
pub(crate) const HIGH_FD: RawFd = 10;

/// Everything the child needs, prepared by the parent before `clone`.
pub(crate) struct ChildPlan {
    /// Overlay mount point (the future `/`).
    pub merged: PathBuf,
    /// Host path of the agent binary.
    pub agent_binary: PathBuf,
    /// Size of `/tmp` and `/dev/shm`.
    pub tmp_bytes: u64,
    /// Hostname inside.
    pub hostname: String,
    /// Whether the sandbox has a network namespace of its own (then `lo` is brought up
    /// here); otherwise it joined one prepared from outside.
    pub own_netns: bool,
    /// Host file bound read-only at `/etc/resolv.conf`.
    pub resolv_conf: Option<PathBuf>,
    /// Volumes: (idmapped bind under the sandbox dir, path inside, read-only).
    pub volumes: Vec<(PathBuf, String, bool)>,
    /// `argv` of the agent (first element: [`AGENT_PATH`]).
    pub argv: Vec<CString>,
    /// `envp` of the agent (`KEY=VALUE`).
    pub envp: Vec<CString>,
    /// Compiled seccomp filters.
    pub filters: Filters,
    /// Read end of the release pipe.
    pub sync_rd: RawFd,
    /// Write end of the error pipe.
    pub err_wr: RawFd,
    /// The agent log, opened for appending.
    pub log: RawFd,
    /// The agent's listening socket.
    pub listen: RawFd,
    /// The parent's ends of both pipes (closed first thing in the child).
    pub parent_ends: [RawFd; 2],
}

/// Entry point of the child after `clone`. Never returns.
pub(crate) fn run(plan: &ChildPlan) -> ! {
    for fd in plan.parent_ends {
        sys::close_raw(fd);
    }
    // SAFETY: sync_rd is this child's inherited copy of the release pipe's read end; wrapping
    // it transfers ownership to this scope, which alone uses it.
    let sync = unsafe { OwnedFd::from_raw_fd(plan.sync_rd) };
    let mut byte = [0u8; 1];
    if !matches!(sys::read(&sync, &mut byte), Ok(1)) {
        // The parent gave up (or died) before releasing us: leave quietly.
        sys::exit_now(0);
    }
    drop(sync);
    // A panic must not unwind into the parent's code paths of this forked copy.
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| setup_and_exec(plan)))
        .unwrap_or_else(|_| SysError::new("panic during sandbox setup", libc::EIO));
    // SAFETY: err_wr is this child's inherited copy of the error pipe's write end.
    let pipe = unsafe { OwnedFd::from_raw_fd(plan.err_wr) };
    let mut msg = err.errno.to_le_bytes().to_vec();
    msg.extend_from_slice(err.op.as_bytes());
    let _ = sys::write_all(&pipe, &msg);
    sys::exit_now(1)
}

/// Decode a message written by [`run`] into a human-readable error (`op: ENAME (text)`).
pub(crate) fn decode_error(msg: &[u8]) -> String {
    if msg.len() < 4 {
        return format!(
            "truncated error report from the sandbox child ({} bytes)",
            msg.len()
        );
    }
    let mut n = [0u8; 4];
    n.copy_from_slice(&msg[..4]);
    let err = SysError::new(
        String::from_utf8_lossy(&msg[4..]).into_owned(),
        i32::from_le_bytes(n),
    );
    err.to_string()
}

/// Run every setup step and exec the agent; returns only on failure.
fn setup_and_exec(plan: &ChildPlan) -> SysError {
    match setup(plan) {
        Ok(()) => exec(plan),
        Err(e) => e,
    }
}

fn setup(plan: &ChildPlan) -> Result<(), SysError> {
    // Born inside the sandbox's cgroups: a new cgroup namespace is rooted there.
    // SAFETY: unshare takes an integer only.
    let ret = unsafe { libc::unshare(libc::CLONE_NEWCGROUP) };
    check(ret.into(), || "unshare(CLONE_NEWCGROUP)".into())?;
    // SAFETY: setsid takes no arguments.
    check(unsafe { libc::setsid() }.into(), || "setsid".into())?;
    become_root()?;
    let sysfs = rootfs::assemble(&RootfsPlan {
        merged: &plan.merged,
        agent_binary: &plan.agent_binary,
        tmp_bytes: plan.tmp_bytes,
        resolv_conf: plan.resolv_conf.as_deref(),
        volumes: &plan.volumes,
    })?;
    // SAFETY: the pointer and length describe the hostname's bytes, valid for the call.
    let ret = unsafe { libc::sethostname(plan.hostname.as_ptr().cast(), plan.hostname.len()) };
    check(ret.into(), || "sethostname".into())?;
    if plan.own_netns {
        loopback_up()?;
    }
    caps::drop_to_kept()?;
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `no_core` is a valid rlimit that outlives the call.
    let ret = unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) };
    check(ret.into(), || "setrlimit(RLIMIT_CORE)".into())?;
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(0o022) };
    reset_signals()?;
    arrange_fds(plan)?;
    if sysfs == SysfsMount::EmptyTmpfs {
        note("hutch-jail: the kernel refused a sysfs mount; /sys is empty\n");
    }
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only.
    let ret = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    check(ret.into(), || "prctl(PR_SET_NO_NEW_PRIVS)".into())?;
    match landlock::restrict_to_root()? {
        Enforced::Fully => {}
        other => note(&format!(
            "hutch-jail: landlock {other:?} enforced on this kernel\n"
        )),
    }
    seccomp::install(&plan.filters)
}

/// A line for the agent log (fd 2 is the log once descriptors are arranged).
fn note(line: &str) {
    // SAFETY: the pointer and length describe `line`'s bytes; a failed write is ignored.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

fn become_root() -> Result<(), SysError> {
    // SAFETY: an empty list with a null pointer is valid for setgroups.
    let ret = unsafe { libc::setgroups(0, std::ptr::null()) };
    check(ret.into(), || "setgroups([])".into())?;
    // SAFETY: setresgid takes integers only.
    let ret = unsafe { libc::setresgid(0, 0, 0) };
    check(ret.into(), || "setresgid(0)".into())?;
    // SAFETY: setresuid takes integers only.
    let ret = unsafe { libc::setresuid(0, 0, 0) };
    check(ret.into(), || "setresuid(0)".into())?;
    Ok(())
}

/// Bring `lo` up in the sandbox's network namespace.
fn loopback_up() -> Result<(), SysError> {
    // SAFETY: socket takes integers only.
    let fd = check(
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) }.into(),
        || "socket for lo".into(),
    )?;
    // SAFETY: the socket call just returned this fresh descriptor.
    let sock = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    // SAFETY: ifreq is plain old data; all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq for SIOCGIFFLAGS, which fills its flags member.
    let ret = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) };
    check(ret.into(), || "SIOCGIFFLAGS lo".into())?;
    // SAFETY: SIOCGIFFLAGS initialised the flags member of the union.
    unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: `req` is a valid ifreq for SIOCSIFFLAGS.
    let ret = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) };
    check(ret.into(), || "SIOCSIFFLAGS lo up".into()).map(drop)
}

/// Default dispositions for every signal (the helper, a Rust program, ignores SIGPIPE, and
/// ignored signals survive `execve`) and an empty signal mask.
fn reset_signals() -> Result<(), SysError> {
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: installing SIG_DFL is always sound; signals reserved by libc fail with
        // EINVAL, which is ignored.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
    // SAFETY: sigset_t is plain old data, initialised by sigemptyset before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t.
    unsafe { libc::sigemptyset(&mut set) };
    // SAFETY: `set` is a valid, initialised sigset_t; the old-set pointer is null.
    let ret = unsafe { libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) };
    check(ret.into(), || "sigprocmask".into()).map(drop)
}

/// `/dev/null` on 0, the log on 1 and 2, the listening socket on [`AGENT_LISTEN_FD`], every
/// other descriptor close-on-exec (the error pipe closes itself at `execve`).
fn arrange_fds(plan: &ChildPlan) -> Result<(), SysError> {
    // SAFETY: the path is a static NUL-terminated string.
    let raw = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    let raw = check(raw.into(), || "open /dev/null".into())? as RawFd;
    // SAFETY: open just returned this fresh descriptor.
    let first = unsafe { OwnedFd::from_raw_fd(raw) };
    let null = sys::dup_at_least(first.as_raw_fd(), HIGH_FD)?;
    drop(first);
    sys::dup2(null.as_raw_fd(), 0)?;
    sys::dup2(plan.log, 1)?;
    sys::dup2(plan.log, 2)?;
    sys::dup2(plan.listen, AGENT_LISTEN_FD)?;
    drop(null);
    sys::cloexec_from(AGENT_LISTEN_FD + 1)
}

fn exec(plan: &ChildPlan) -> SysError {
    let mut argv: Vec<*const libc::c_char> = plan.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = plan.envp.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    // SAFETY: argv and envp are NULL-terminated arrays of pointers to NUL-terminated strings
    // owned by `plan`, which outlives the call; argv[0] is the program path.
    unsafe { libc::execve(argv[0], argv.as_ptr(), envp.as_ptr()) };
    SysError::last(format!("execve {AGENT_PATH}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_error_reports() {
        let mut msg = libc::EPERM.to_le_bytes().to_vec();
        msg.extend_from_slice(b"mount proc (/x/merged/proc)");
        assert_eq!(
            decode_error(&msg),
            "mount proc (/x/merged/proc): EPERM (Operation not permitted)"
        );
        assert!(decode_error(&[1, 2]).contains("truncated"));
    }
}
