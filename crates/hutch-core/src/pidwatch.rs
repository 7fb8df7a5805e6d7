//! Waiting for a process that is not necessarily our child to exit, through a pidfd.
//!
//! The server is a child subreaper, so the init of every sandbox it started is its child
//! and is reaped here; inits re-adopted after a restart belong to another parent and are
//! only observed.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use tokio::io::unix::AsyncFd;

/// Wait until `pid` exits; returns a description of how it ended.
pub async fn wait_exit(pid: i32) -> String {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return "already gone".into();
    }
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: `owned` is an open pidfd that the AsyncFd takes over and keeps open, unchanged,
    // for its whole life.
    let Ok(async_fd) =
        (unsafe { AsyncFd::register_with_interest(owned, tokio::io::Interest::READABLE) })
    else {
        return "cannot watch".into();
    };
    // A pidfd becomes readable when the process exits.
    let _ = async_fd.readable().await;
    let raw = async_fd.get_ref().as_raw_fd();
    // SAFETY: siginfo_t is plain data; zeroed is a valid value for waitid to fill.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `raw` is a valid pidfd owned above; `info` is a valid out pointer.
    let rc = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            raw as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG,
        )
    };
    if rc != 0 {
        return "exited".into();
    }
    // SAFETY: waitid filled `info` for a child-exit siginfo.
    let (code, status) = unsafe { (info.si_code, info.si_status()) };
    match code {
        libc::CLD_EXITED => format!("exit status {status}"),
        libc::CLD_KILLED | libc::CLD_DUMPED => format!("killed by signal {status}"),
        _ => "exited".into(),
    }
}
