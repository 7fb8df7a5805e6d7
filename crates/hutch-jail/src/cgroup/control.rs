//! Acting on a sandbox's cgroups: kill everything, wait until empty, remove, freeze, thaw.
//!
//! None of this forks; it is safe from a multi-threaded server.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::JailError;

/// How long freezing, emptying and removal may take before giving up.
pub(crate) const CGROUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Poll `f` with a growing pause (0.2 ms up to 10 ms) until it returns true or `timeout`.
pub(crate) fn poll_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(200);
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

/// Pids listed in `dir/cgroup.procs` (empty when the directory is gone).
pub(crate) fn procs(dir: &Path) -> Vec<libc::pid_t> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn write(path: &Path, value: &str) -> Result<(), JailError> {
    std::fs::write(path, value).map_err(|e| JailError::Sys {
        op: format!("write {value:?} to {}", path.display()),
        source: e,
    })
}

/// Kill every task of the sandbox. Thaws a v1 freezer first (frozen v1 tasks cannot die),
/// then writes `cgroup.kill` where a v2 directory has it. Returns whether `cgroup.kill` was
/// used; without it the caller kills the init and [`wait_empty`] re-sends SIGKILL.
pub(crate) fn kill_all(dirs: &[PathBuf]) -> bool {
    for d in dirs {
        let state = d.join("freezer.state");
        if state.exists() {
            let _ = std::fs::write(&state, "THAWED");
        }
    }
    let mut used = false;
    for d in dirs {
        let kill = d.join("cgroup.kill");
        if kill.exists() && std::fs::write(&kill, "1").is_ok() {
            used = true;
        }
    }
    used
}

/// Wait until no task is left in any of `dirs`. With `resend_kill`, SIGKILL every listed task
/// on each round (the fallback when `cgroup.kill` is missing).
pub(crate) fn wait_empty(dirs: &[PathBuf], resend_kill: bool) -> Result<(), JailError> {
    let empty = poll_until(CGROUP_TIMEOUT, || {
        let mut all_empty = true;
        for d in dirs {
            let pids = procs(d);
            if !pids.is_empty() {
                all_empty = false;
                if resend_kill {
                    for pid in pids {
                        // SAFETY: kill takes no pointers; the pid was read from the sandbox's
                        // own cgroup, which only holds sandbox tasks.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
            }
        }
        all_empty
    });
    if empty {
        Ok(())
    } else {
        Err(JailError::Timeout(format!(
            "the sandbox's cgroups to empty ({})",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }
}

/// Remove the cgroup directories (last created first). A missing directory is fine; a busy one
/// is retried until the timeout.
pub(crate) fn remove_dirs(dirs: &[PathBuf]) -> Result<(), JailError> {
    for d in dirs.iter().rev() {
        let mut last_err = None;
        let gone = poll_until(CGROUP_TIMEOUT, || match std::fs::remove_dir(d) {
            Ok(()) => true,
            Err(e) if e.kind() == ErrorKind::NotFound => true,
            Err(e) => {
                last_err = Some(e);
                false
            }
        });
        if !gone {
            return Err(JailError::Sys {
                op: format!("rmdir {}", d.display()),
                source: last_err.unwrap_or_else(|| std::io::Error::from_raw_os_error(libc::EBUSY)),
            });
        }
    }
    Ok(())
}

/// Which freezer interface the sandbox has.
enum Freezer<'a> {
    /// cgroup v2 (pure or the hybrid unified mount): `cgroup.freeze`.
    V2(Vec<&'a PathBuf>),
    /// cgroup v1: `freezer.state`.
    V1(Vec<&'a PathBuf>),
}

fn freezer(dirs: &[PathBuf]) -> Result<Freezer<'_>, JailError> {
    let v2: Vec<&PathBuf> = dirs
        .iter()
        .filter(|d| d.join("cgroup.freeze").exists())
        .collect();
    if !v2.is_empty() {
        return Ok(Freezer::V2(v2));
    }
    let v1: Vec<&PathBuf> = dirs
        .iter()
        .filter(|d| d.join("freezer.state").exists())
        .collect();
    if !v1.is_empty() {
        return Ok(Freezer::V1(v1));
    }
    Err(JailError::Unsupported(
        "freezing (the sandbox has no freezer cgroup)".into(),
    ))
}

/// `frozen 1` in a v2 `cgroup.events`.
fn v2_frozen(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .map(|t| super::stats::keyed(&t, "frozen") == Some(1))
        .unwrap_or(false)
}

fn v1_state(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("freezer.state"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Freeze every task of the sandbox and wait until the kernel reports it frozen.
pub fn freeze(cgroups: &[PathBuf]) -> Result<(), JailError> {
    match freezer(cgroups)? {
        Freezer::V2(dirs) => {
            for d in &dirs {
                write(&d.join("cgroup.freeze"), "1")?;
            }
            if !poll_until(CGROUP_TIMEOUT, || dirs.iter().all(|d| v2_frozen(d))) {
                return Err(JailError::Timeout("the sandbox to freeze".into()));
            }
        }
        Freezer::V1(dirs) => {
            for d in &dirs {
                write(&d.join("freezer.state"), "FROZEN")?;
            }
            if !poll_until(CGROUP_TIMEOUT, || {
                dirs.iter().all(|d| v1_state(d) == "FROZEN")
            }) {
                return Err(JailError::Timeout("the sandbox to freeze".into()));
            }
        }
    }
    Ok(())
}

/// Thaw the sandbox and wait until the kernel reports it running.
pub fn thaw(cgroups: &[PathBuf]) -> Result<(), JailError> {
    match freezer(cgroups)? {
        Freezer::V2(dirs) => {
            for d in &dirs {
                write(&d.join("cgroup.freeze"), "0")?;
            }
            if !poll_until(CGROUP_TIMEOUT, || dirs.iter().all(|d| !v2_frozen(d))) {
                return Err(JailError::Timeout("the sandbox to thaw".into()));
            }
        }
        Freezer::V1(dirs) => {
            for d in &dirs {
                write(&d.join("freezer.state"), "THAWED")?;
            }
            if !poll_until(CGROUP_TIMEOUT, || {
                dirs.iter().all(|d| v1_state(d) == "THAWED")
            }) {
                return Err(JailError::Timeout("the sandbox to thaw".into()));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_until_returns_early_and_times_out() {
        let mut n = 0;
        assert!(poll_until(Duration::from_secs(1), || {
            n += 1;
            n == 3
        }));
        assert_eq!(n, 3);
        assert!(!poll_until(Duration::from_millis(5), || false));
    }

    #[test]
    fn missing_dirs_are_empty_and_removable() {
        let dirs = vec![PathBuf::from("/nonexistent/hutch-test-cgroup")];
        assert!(procs(&dirs[0]).is_empty());
        wait_empty(&dirs, true).unwrap();
        remove_dirs(&dirs).unwrap();
        assert!(matches!(freeze(&dirs), Err(JailError::Unsupported(_))));
    }
}
