//! The one reaper of the agent: PID 1 (or a subreaper) must collect every child that dies.
//!
//! Orphans anywhere in the sandbox are re-parented to the agent, so exit statuses are
//! collected in exactly one place: on every `SIGCHLD` the reaper locks the child table and
//! calls `waitpid(-1, WNOHANG)` until nothing is left. A status for a pid in the table goes
//! to the exec that spawned it through a oneshot channel; any other status (an orphan) is
//! discarded. Nothing else in the agent may wait for children (no `tokio::process`, no
//! `std::process::Child::wait`), or statuses would be stolen.
//!
//! [`Reaper::spawn`] runs the fork *and* the insertion under the table lock, so a child
//! that exits at once is still found in the table when its `SIGCHLD` is handled.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::oneshot;

use crate::log::log;

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// It called `exit(code)`.
    Exited(i32),
    /// A signal killed it.
    Signaled(i32),
}

impl ExitStatus {
    /// Decode a `waitpid` status (`None` for stop/continue reports, which we never ask for).
    pub fn from_wait_status(status: libc::c_int) -> Option<Self> {
        if libc::WIFEXITED(status) {
            Some(Self::Exited(libc::WEXITSTATUS(status)))
        } else if libc::WIFSIGNALED(status) {
            Some(Self::Signaled(libc::WTERMSIG(status)))
        } else {
            None
        }
    }
}

type Waiters = HashMap<libc::pid_t, oneshot::Sender<ExitStatus>>;

/// The child table and the task that empties it.
#[derive(Debug, Default)]
pub struct Reaper {
    waiters: Mutex<Waiters>,
}

impl Reaper {
    /// Install the `SIGCHLD` stream and start reaping. Must run inside the tokio runtime and
    /// before the first spawn.
    pub fn start() -> io::Result<Arc<Self>> {
        let mut sigchld = signal(SignalKind::child())?;
        let reaper = Arc::new(Self::default());
        let task_reaper = Arc::clone(&reaper);
        tokio::spawn(async move {
            loop {
                task_reaper.reap();
                if sigchld.recv().await.is_none() {
                    log!("SIGCHLD stream ended; children will no longer be reaped");
                    return;
                }
            }
        });
        Ok(reaper)
    }

    /// Run `fork` (which returns the new child's pid) with the table locked and register the
    /// child, so its exit status is delivered to the returned receiver whenever it dies.
    pub fn spawn<E>(
        &self,
        fork: impl FnOnce() -> Result<libc::pid_t, E>,
    ) -> Result<(libc::pid_t, oneshot::Receiver<ExitStatus>), E> {
        let mut waiters = self.lock();
        let pid = fork()?;
        let (tx, rx) = oneshot::channel();
        waiters.insert(pid, tx);
        Ok((pid, rx))
    }

    /// Collect every child that has exited.
    fn reap(&self) {
        let mut waiters = self.lock();
        loop {
            let mut status: libc::c_int = 0;
            // SAFETY: waitpid writes the status into our local int; WNOHANG never blocks.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid == 0 {
                return; // children exist, none has exited
            }
            if pid < 0 {
                match io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::ECHILD) => return, // no children at all
                    _ => {
                        log!("waitpid failed: {}", io::Error::last_os_error());
                        return;
                    }
                }
            }
            let Some(exit) = ExitStatus::from_wait_status(status) else {
                continue;
            };
            if let Some(waiter) = waiters.remove(&pid) {
                // The exec may have given up waiting; nothing to do then.
                let _ = waiter.send(exit);
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Waiters> {
        // A panic while holding the lock cannot leave the map inconsistent (single inserts
        // and removes), so a poisoned lock is still usable.
        self.waiters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_wait_statuses() {
        assert_eq!(
            ExitStatus::from_wait_status(3 << 8),
            Some(ExitStatus::Exited(3))
        );
        assert_eq!(
            ExitStatus::from_wait_status(libc::SIGKILL),
            Some(ExitStatus::Signaled(9))
        );
        // A "stopped by SIGSTOP" report.
        assert_eq!(ExitStatus::from_wait_status(0x137f), None);
    }
}
