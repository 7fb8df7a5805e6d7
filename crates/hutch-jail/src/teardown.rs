//! Destroying a sandbox: kill every task, wait until its cgroups are empty, detach its mounts,
//! remove its cgroups, delete its directory — without ever deleting through a mount point.
//! [`stop`] does the same but keeps the sandbox's upper layer (hibernation).
//!
//! A recursive delete that crossed the idmapped bind at `lower` would delete the shared
//! template, so deletion happens only after `/proc/self/mountinfo` shows nothing mounted at or
//! beneath the directory, and the walk itself refuses to enter a directory on another device.
//! The walk is iterative with one open directory at a time: a sandbox can leave arbitrarily
//! deep trees in its upper layer.
//!
//! Nothing here forks: [`destroy`] is safe from a multi-threaded server (call it from a
//! blocking task). Every step tolerates work already done, so it is idempotent.

use std::ffi::{CString, OsString};
use std::io::ErrorKind;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cgroup::{self, Layout, CGROUP_TIMEOUT};
use crate::sys::{self, SysError};
use crate::{mountinfo, mounts, procstat, JailError, JailSpec, SpawnedJail};

/// What [`destroy`] needs; every field is plain data a server can keep in its database.
///
/// The agent socket is not removed separately: keep it inside `sandbox_dir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Teardown {
    /// Sandbox id; every cgroup directory must end with it.
    pub id: String,
    /// The sandbox directory (deleted entirely).
    pub sandbox_dir: PathBuf,
    /// Host pid of the sandbox's init (`None` when it never started).
    pub init_pid: Option<i32>,
    /// Its start time (field 22 of `/proc/PID/stat`), so a reused pid is never killed.
    pub init_start_time: Option<u64>,
    /// The sandbox's cgroup directories as returned by [`crate::spawn`] (may be empty).
    pub cgroups: Vec<PathBuf>,
    /// The `cgroup_parent` of the spec: `<hierarchy>/<cgroup_parent>/<id>` directories are
    /// removed too, even when `cgroups` was never recorded (a crash right after spawn).
    pub cgroup_parent: String,
}

impl Teardown {
    /// Everything needed to destroy what `spawn(spec)` returned as `spawned`.
    pub fn new(spec: &JailSpec, spawned: &SpawnedJail) -> Self {
        Self {
            id: spec.id.clone(),
            sandbox_dir: spec.sandbox_dir.clone(),
            init_pid: Some(spawned.init_pid),
            init_start_time: Some(spawned.init_start_time),
            cgroups: spawned.cgroups.clone(),
            cgroup_parent: spec.cgroup_parent.clone(),
        }
    }

    /// The recorded cgroups plus the ones derived from `cgroup_parent` and `id` that exist.
    fn all_cgroups(&self) -> Vec<PathBuf> {
        let mut all = self.cgroups.clone();
        if let Ok(layout) = Layout::detect() {
            for d in layout.sandbox_dirs(&self.cgroup_parent, &self.id) {
                if !all.contains(&d) && d.exists() {
                    all.push(d);
                }
            }
        }
        all
    }

    /// Refuse records that could make teardown act outside the sandbox.
    fn check(&self) -> Result<(), JailError> {
        let id_ok = !self.id.is_empty()
            && self.id != "."
            && self.id != ".."
            && self
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !id_ok {
            return Err(JailError::Refused(format!(
                "tear down sandbox id {:?}",
                self.id
            )));
        }
        let parent_ok = self.cgroup_parent.split('/').all(|p| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        });
        if !parent_ok {
            return Err(JailError::Refused(format!(
                "tear down with cgroup_parent {:?}",
                self.cgroup_parent
            )));
        }
        for c in &self.cgroups {
            if c.file_name() != Some(std::ffi::OsStr::new(&self.id)) || !c.is_absolute() {
                return Err(JailError::Refused(format!(
                    "remove cgroup {} that is not named after sandbox {}",
                    c.display(),
                    self.id
                )));
            }
        }
        let dir_ok = self.sandbox_dir.is_absolute()
            && self.sandbox_dir.parent().is_some()
            && !self
                .sandbox_dir
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir));
        if !dir_ok {
            return Err(JailError::Refused(format!(
                "delete sandbox_dir {}",
                self.sandbox_dir.display()
            )));
        }
        Ok(())
    }
}

/// Kill the sandbox and remove everything [`crate::spawn`] created. Idempotent.
///
/// The init, once dead, stays a zombie until its parent reaps it; when that parent is the
/// calling process (the server is the sandboxes' subreaper), it is reaped here.
pub fn destroy(t: &Teardown) -> Result<(), JailError> {
    release(t)?;
    if !looks_like_a_sandbox_dir(&t.sandbox_dir) {
        return Err(JailError::Refused(format!(
            "delete {}: it does not look like a sandbox directory (no upper/work/lower/merged/agent.log)",
            t.sandbox_dir.display()
        )));
    }
    remove_tree_safely(&t.sandbox_dir)
}

/// Stop the sandbox but keep its files: kill every task, detach its mounts, remove its cgroups
/// and every entry of `sandbox_dir` except `upper/` (the sandbox's writes) and `agent.log`.
/// [`crate::spawn`] over the same `sandbox_dir` and uid range starts it again on the kept
/// upper layer (hibernate/wake on `ns`: the filesystem survives, processes do not).
/// Idempotent; also cleans up after a spawn that was interrupted.
pub fn stop(t: &Teardown) -> Result<(), JailError> {
    release(t)?;
    if !looks_like_a_sandbox_dir(&t.sandbox_dir) {
        return Err(JailError::Refused(format!(
            "clean {}: it does not look like a sandbox directory (no upper/work/lower/merged/agent.log)",
            t.sandbox_dir.display()
        )));
    }
    let entries = match std::fs::read_dir(&t.sandbox_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(JailError::Sys {
                op: format!("list {}", t.sandbox_dir.display()),
                source: e,
            })
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name == "upper" || name == "agent.log" {
            continue;
        }
        let path = entry.path();
        let is_dir = entry.file_type().is_ok_and(|ft| ft.is_dir());
        if is_dir {
            remove_tree_safely(&path)?;
        } else if let Err(e) = std::fs::remove_file(&path) {
            if e.kind() != ErrorKind::NotFound {
                return Err(JailError::Sys {
                    op: format!("remove {}", path.display()),
                    source: e,
                });
            }
        }
    }
    Ok(())
}

/// Kill every task, wait for them, detach every mount beneath `sandbox_dir` and remove the
/// cgroups: everything but the files.
fn release(t: &Teardown) -> Result<(), JailError> {
    t.check()?;
    let cgroups = t.all_cgroups();
    let init = init_handle(t);
    let used_cgroup_kill = cgroup::kill_all(&cgroups);
    if let Some(pidfd) = &init {
        // Killing PID 1 of the sandbox's pid namespace kills every task in it.
        let _ = sys::pidfd_send_signal(pidfd, libc::SIGKILL);
        let ms = i32::try_from(CGROUP_TIMEOUT.as_millis()).unwrap_or(i32::MAX);
        if !sys::poll_readable(pidfd, ms)? {
            return Err(JailError::Timeout(format!("init {:?} to exit", t.init_pid)));
        }
    }
    if let (Some(pid), Some(start)) = (t.init_pid, t.init_start_time) {
        if procstat::is_our_zombie(pid, start) {
            let _ = sys::waitpid(pid, libc::WNOHANG);
        }
    }
    cgroup::wait_empty(&cgroups, !used_cgroup_kill)?;
    unmount_all_under(&t.sandbox_dir)?;
    cgroup::remove_dirs(&cgroups)
}

/// A guard against a corrupt record naming an unrelated directory: a sandbox directory is
/// missing, empty, holds only sockets, or holds one of the entries `spawn` creates.
fn looks_like_a_sandbox_dir(dir: &Path) -> bool {
    const OURS: [&str; 5] = ["upper", "work", "lower", "merged", "agent.log"];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return true;
    };
    let mut only_sockets = true;
    for e in entries.flatten() {
        if OURS.iter().any(|o| e.file_name() == *o) {
            return true;
        }
        let socket = e
            .file_type()
            .is_ok_and(|t| std::os::unix::fs::FileTypeExt::is_socket(&t));
        only_sockets &= socket;
    }
    only_sockets
}

/// A pidfd on the recorded init if it still exists (running or zombie). The start time is
/// checked *after* the pidfd pins the process, so a reused pid is never signalled.
fn init_handle(t: &Teardown) -> Option<OwnedFd> {
    let (pid, start) = (t.init_pid?, t.init_start_time?);
    let pidfd = sys::pidfd_open(pid).ok()?;
    (procstat::read(pid)?.start_time == start).then_some(pidfd)
}

/// Detach every mount at or beneath `dir` (deepest first), then check none is left.
pub(crate) fn unmount_all_under(dir: &Path) -> Result<(), JailError> {
    let canon = match dir.canonicalize() {
        Ok(c) => c,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(JailError::Sys {
                op: format!("resolve {}", dir.display()),
                source: e,
            })
        }
    };
    for _ in 0..8 {
        let found = mountinfo::mounts_at_or_under(&mountinfo::read()?, &canon);
        if found.is_empty() {
            return Ok(());
        }
        for m in found {
            mounts::detach(&m)?;
        }
    }
    Err(JailError::Refused(format!(
        "give up unmounting beneath {}: mounts keep reappearing",
        canon.display()
    )))
}

/// Delete `dir` recursively, refusing if anything is mounted at or beneath it and never
/// entering another filesystem. A missing `dir` is success.
pub(crate) fn remove_tree_safely(dir: &Path) -> Result<(), JailError> {
    let meta = match dir.symlink_metadata() {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(JailError::Sys {
                op: format!("stat {}", dir.display()),
                source: e,
            })
        }
    };
    if !meta.is_dir() {
        return Err(JailError::Refused(format!(
            "delete {}: not a directory",
            dir.display()
        )));
    }
    let canon = dir.canonicalize().map_err(|e| JailError::Sys {
        op: format!("resolve {}", dir.display()),
        source: e,
    })?;
    if let Some(m) = mountinfo::mounts_at_or_under(&mountinfo::read()?, &canon).first() {
        return Err(JailError::Refused(format!(
            "delete {}: {} is still mounted",
            canon.display(),
            m.display()
        )));
    }
    remove_tree(&canon)?;
    match std::fs::remove_dir(&canon) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(JailError::Sys {
            op: format!("rmdir {}", canon.display()),
            source: e,
        }),
        _ => Ok(()),
    }
}

fn cname(name: &std::ffi::OsStr) -> Result<CString, SysError> {
    CString::new(name.as_bytes())
        .map_err(|_| SysError::new("file name with a NUL byte", libc::EINVAL))
}

/// Unlink every non-directory in `dir` and return the names of its subdirectories.
fn scan(dir: &OwnedFd) -> Result<Vec<OsString>, JailError> {
    let listing = format!("/proc/self/fd/{}", dir.as_raw_fd());
    let entries = std::fs::read_dir(&listing).map_err(|e| JailError::Sys {
        op: "list a directory of the sandbox".into(),
        source: e,
    })?;
    let mut subdirs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| JailError::Sys {
            op: "read a directory of the sandbox".into(),
            source: e,
        })?;
        let is_dir = entry
            .file_type()
            .map(|t| t.is_dir())
            .map_err(|e| JailError::Sys {
                op: format!("stat {:?}", entry.file_name()),
                source: e,
            })?;
        if is_dir {
            subdirs.push(entry.file_name());
        } else {
            sys::unlinkat(dir, &cname(&entry.file_name())?, 0)?;
        }
    }
    Ok(subdirs)
}

/// Empty `root` (which stays), depth-first, one directory descriptor open at a time.
fn remove_tree(root: &Path) -> Result<(), JailError> {
    empty_dir(sys::open_dir_at(None, &sys::cpath(root)?)?, root)
}

/// Empty the directory open as `dir` (which stays), depth-first, one directory descriptor open
/// at a time, never entering another filesystem. `label` names it in errors.
pub(crate) fn empty_dir(dir: OwnedFd, label: &Path) -> Result<(), JailError> {
    let root = label;
    let mut cur = dir;
    let dev = sys::fstat_dev(&cur)?;
    // (name in parent, subdirectories still to delete) for every level from `root` down.
    let mut stack: Vec<(OsString, Vec<OsString>)> = vec![(OsString::new(), scan(&cur)?)];
    while let Some((_, pending)) = stack.last_mut() {
        if let Some(sub) = pending.pop() {
            let next = sys::open_dir_at(Some(&cur), &cname(&sub)?)?;
            if sys::fstat_dev(&next)? != dev {
                return Err(JailError::Refused(format!(
                    "delete beneath {}: {:?} is on another filesystem",
                    root.display(),
                    sub
                )));
            }
            cur = next;
            let subdirs = scan(&cur)?;
            stack.push((sub, subdirs));
            continue;
        }
        let Some((name, _)) = stack.pop() else { break };
        if stack.is_empty() {
            break;
        }
        let parent = sys::open_dir_at(Some(&cur), c"..")?;
        sys::unlinkat(&parent, &cname(&name)?, libc::AT_REMOVEDIR)?;
        cur = parent;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn teardown(dir: &Path) -> Teardown {
        Teardown {
            id: "sbx_t".into(),
            sandbox_dir: dir.to_path_buf(),
            init_pid: None,
            init_start_time: None,
            cgroups: vec![],
            cgroup_parent: "hutch-unit-test".into(),
        }
    }

    #[test]
    fn removes_deep_and_wide_trees() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("sbx");
        let mut deep = dir.join("upper");
        for i in 0..300 {
            deep = deep.join(format!("d{i}"));
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("f"), "x").unwrap();
        for i in 0..50 {
            let w = dir.join("upper").join(format!("w{i}"));
            std::fs::create_dir(&w).unwrap();
            std::fs::write(w.join("f"), "x").unwrap();
            std::os::unix::fs::symlink("/etc/passwd", w.join("link")).unwrap();
        }
        std::fs::write(dir.join("agent.log"), "").unwrap();
        // A symlink to a directory outside must be unlinked, not followed.
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("escape")).unwrap();
        destroy(&teardown(&dir)).unwrap();
        assert!(!dir.exists());
        assert!(outside.join("keep").exists());
        // Idempotent.
        destroy(&teardown(&dir)).unwrap();
    }

    #[test]
    fn stop_keeps_only_the_upper_layer_and_the_log() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("sbx");
        for d in ["upper/root", "work/work", "lower", "merged", "layer-0"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::write(dir.join("upper/root/kept"), "x").unwrap();
        std::fs::write(dir.join("agent.log"), "log").unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(dir.join("agent.sock")).unwrap();
        stop(&teardown(&dir)).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["agent.log", "upper"]);
        assert!(dir.join("upper/root/kept").exists());
        // Idempotent; and a directory that is not a sandbox's is left alone.
        stop(&teardown(&dir)).unwrap();
        let other = tmp.path().join("precious");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("data"), "x").unwrap();
        assert!(matches!(
            stop(&teardown(&other)),
            Err(JailError::Refused(_))
        ));
        assert!(other.join("data").exists());
    }

    #[test]
    fn refuses_to_delete_a_directory_that_is_not_a_sandbox() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("precious");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("data"), "x").unwrap();
        let err = destroy(&teardown(&dir)).unwrap_err();
        assert!(
            err.to_string().contains("does not look like a sandbox"),
            "{err}"
        );
        assert!(dir.join("data").exists());
        // Empty or missing directories are fine.
        std::fs::remove_file(dir.join("data")).unwrap();
        destroy(&teardown(&dir)).unwrap();
        assert!(!dir.exists());
    }

    #[test]
    fn refuses_dangerous_records() {
        let mut t = teardown(Path::new("/tmp/x"));
        t.cgroups = vec![PathBuf::from("/sys/fs/cgroup/memory/hutch")];
        assert!(matches!(destroy(&t), Err(JailError::Refused(_))));
        let mut t = teardown(Path::new("/"));
        t.cgroups = vec![];
        assert!(matches!(destroy(&t), Err(JailError::Refused(_))));
        let mut t = teardown(Path::new("/tmp/x"));
        t.id = "..".into();
        assert!(matches!(destroy(&t), Err(JailError::Refused(_))));
        let mut t = teardown(Path::new("/tmp/x"));
        t.cgroup_parent = "../..".into();
        assert!(matches!(destroy(&t), Err(JailError::Refused(_))));
    }

    #[test]
    fn refuses_to_delete_through_a_mount() {
        let entries = mountinfo::read().unwrap();
        // `/proc` is always a mount point: deleting it must be refused before touching it.
        assert!(!mountinfo::mounts_at_or_under(&entries, Path::new("/proc")).is_empty());
        let err = remove_tree_safely(Path::new("/proc")).unwrap_err();
        assert!(err.to_string().contains("is still mounted"), "{err}");
    }
}
