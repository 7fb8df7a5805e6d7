//! Network namespaces without `ip netns`: a namespace is created by a short-lived thread that
//! unshares it and opens `/proc/thread-self/ns/net`; the open descriptor keeps it alive (no
//! bind mount to clean up). Other processes join it through `/proc/<server pid>/fd/<fd>`.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use crate::NetError;

/// Move the calling thread into the network namespace `ns`.
pub fn enter(ns: BorrowedFd<'_>) -> Result<(), NetError> {
    // SAFETY: setns takes a valid open descriptor (borrowed for the call) and a flag.
    let ret = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if ret == 0 {
        Ok(())
    } else {
        Err(NetError::Sys {
            op: "setns(CLONE_NEWNET)".into(),
            source: std::io::Error::last_os_error(),
        })
    }
}

/// Move the calling thread into a new, empty network namespace and return a descriptor of it.
/// Only for threads that end afterwards (or move back with [`enter`]).
pub fn unshare_new() -> Result<OwnedFd, NetError> {
    // SAFETY: unshare takes an integer flag; CLONE_NEWNET affects only this thread.
    let ret = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    if ret != 0 {
        return Err(NetError::Sys {
            op: "unshare(CLONE_NEWNET)".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    current()
}

/// A descriptor of the calling thread's network namespace.
pub fn current() -> Result<OwnedFd, NetError> {
    File::open("/proc/thread-self/ns/net")
        .map(OwnedFd::from)
        .map_err(NetError::sys("open /proc/thread-self/ns/net"))
}

/// Write a sysctl of the calling thread's network namespace (`key` like
/// `net/ipv4/ip_forward`).
pub fn write_sysctl(key: &str, value: &str) -> Result<(), NetError> {
    let path = format!("/proc/sys/{key}");
    let mut f = File::options()
        .write(true)
        .open(&path)
        .map_err(NetError::sys(format!("open {path}")))?;
    f.write_all(value.as_bytes())
        .map_err(NetError::sys(format!("write {value:?} to {path}")))
}

/// Read a sysctl of the calling thread's network namespace.
pub fn read_sysctl(key: &str) -> Result<String, NetError> {
    let path = format!("/proc/sys/{key}");
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(NetError::sys(format!("read {path}")))
}

/// Run `f` on a new thread that first joins the network namespace `ns`.
pub fn run_in<T: Send + 'static>(
    ns: &OwnedFd,
    f: impl FnOnce() -> Result<T, NetError> + Send + 'static,
) -> Result<T, NetError> {
    let ns = ns
        .try_clone()
        .map_err(NetError::sys("duplicate a netns descriptor"))?;
    std::thread::Builder::new()
        .name("hutch-netns".into())
        .spawn(move || {
            enter(ns.as_fd())?;
            f()
        })
        .map_err(NetError::sys("start a netns thread"))?
        .join()
        .map_err(|_| NetError::Invalid("a netns thread panicked".into()))?
}
