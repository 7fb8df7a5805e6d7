//! A cgroup per exec in a `vm` guest: how the agent tells that the guest kernel's OOM killer
//! killed an exec's process.
//!
//! In a guest the agent is init (`--root`). At start it mounts cgroup2 at `/sys/fs/cgroup`
//! (unless one is mounted there already) and enables the memory controller for the root's
//! children. Every exec then runs in a child cgroup `hutch-exec-N` of its own, which the
//! forked child joins before it execs (so everything it starts is in it too). The
//! difference of that cgroup's `memory.events` `oom_kill` count between the spawn and the
//! exit says how many of its processes the OOM killer killed — exactly, per exec: an OOM
//! kill in a concurrent exec is counted in that exec's own cgroup.
//!
//! Cgroups are reused rather than removed: an exec's cgroup goes back to a pool once it is
//! empty (one still holding a process the exec left behind waits until that has exited).
//! Removing a memory cgroup whose page cache is still charged leaves a "dying" cgroup in
//! the kernel until those pages are reclaimed, and creating one per exec would also cost
//! every exec a `mkdir` and an `rmdir`; the pool holds as many as execs ever ran at once.
//!
//! On `ns` the host's cgroup of the sandbox counts OOM kills; the agent there runs without
//! exec cgroups and reports no count.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::sys::{self, cvt};

/// Where the guest's cgroup2 hierarchy is mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// `CGROUP2_SUPER_MAGIC` from `linux/magic.h`.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// Prefix of the exec cgroups' names.
const PREFIX: &str = "hutch-exec-";

/// The exec cgroups of a guest agent.
#[derive(Debug)]
pub struct ExecCgroups {
    root: PathBuf,
    next: AtomicU64,
    pool: Mutex<Pool>,
}

#[derive(Debug, Default)]
struct Pool {
    /// Empty cgroups, ready for the next exec.
    free: Vec<PathBuf>,
    /// Cgroups of finished execs that still held processes when they exited.
    busy: Vec<PathBuf>,
}

/// One exec's cgroup, from before the fork until after the exit.
#[derive(Debug)]
pub struct ExecCgroup {
    dir: PathBuf,
    procs: OwnedFd,
    /// Its `oom_kill` count before the exec (counts are cumulative and cgroups reused).
    oom_before: u64,
}

impl ExecCgroup {
    /// The cgroup's `cgroup.procs`, open for writing: the child writes `0` to it to join.
    pub fn procs_fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }
}

impl ExecCgroups {
    /// Mount cgroup2 at [`CGROUP_ROOT`] if needed and enable the memory controller for its
    /// children.
    pub fn setup() -> io::Result<Self> {
        let root = PathBuf::from(CGROUP_ROOT);
        if !is_cgroup2(&root)? {
            mount_cgroup2(&root)?;
        }
        let controllers = std::fs::read_to_string(root.join("cgroup.controllers"))?;
        if !controllers.split_whitespace().any(|c| c == "memory") {
            return Err(io::Error::other(
                "the guest kernel has no memory cgroup controller",
            ));
        }
        std::fs::write(root.join("cgroup.subtree_control"), "+memory")?;
        Ok(Self::at(root))
    }

    fn at(root: PathBuf) -> Self {
        Self {
            root,
            next: AtomicU64::new(1),
            pool: Mutex::default(),
        }
    }

    /// An empty cgroup for one exec: a free one from the pool, else a new one.
    pub fn create(&self) -> io::Result<ExecCgroup> {
        let reused = {
            let mut pool = self.lock_pool();
            let Pool { free, busy } = &mut *pool;
            busy.retain(|dir| match populated(dir) {
                Some(false) => {
                    free.push(dir.clone());
                    false
                }
                Some(true) => true,
                // Gone (removed by someone in the guest): forget it.
                None => false,
            });
            free.pop()
        };
        let dir = match reused {
            Some(dir) => dir,
            None => self.make()?,
        };
        let procs = CString::new(
            dir.join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
        .and_then(|p| sys::open(&p, libc::O_WRONLY | libc::O_CLOEXEC));
        match procs {
            Ok(procs) => {
                let oom_before = read_oom_kills(&dir).unwrap_or(0);
                Ok(ExecCgroup {
                    dir,
                    procs,
                    oom_before,
                })
            }
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                Err(e)
            }
        }
    }

    /// A new cgroup directory with a name not taken yet.
    fn make(&self) -> io::Result<PathBuf> {
        loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let dir = self.root.join(format!("{PREFIX}{n}"));
            match std::fs::create_dir(&dir) {
                Ok(()) => return Ok(dir),
                // Made by someone else in the guest: not ours.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// After the exec's process exited: how many of the cgroup's processes the OOM killer
    /// killed during the exec (`None` if that cannot be read). The cgroup goes back to the
    /// pool, at once if it is empty, else once it is.
    pub fn finish(&self, cgroup: ExecCgroup) -> Option<u64> {
        let ExecCgroup {
            dir,
            procs,
            oom_before,
        } = cgroup;
        drop(procs);
        let kills = read_oom_kills(&dir).map(|now| now.saturating_sub(oom_before));
        let mut pool = self.lock_pool();
        match populated(&dir) {
            Some(false) => pool.free.push(dir),
            Some(true) => pool.busy.push(dir),
            None => {}
        }
        kills
    }

    fn lock_pool(&self) -> std::sync::MutexGuard<'_, Pool> {
        // Pushes, pops and retains cannot leave the lists inconsistent.
        self.pool
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The `oom_kill` count of the cgroup `dir`.
fn read_oom_kills(dir: &Path) -> Option<u64> {
    oom_kills(&std::fs::read_to_string(dir.join("memory.events")).ok()?)
}

/// Whether the cgroup `dir` holds processes (`cgroup.events`); `None` if it is gone.
fn populated(dir: &Path) -> Option<bool> {
    let events = std::fs::read_to_string(dir.join("cgroup.events")).ok()?;
    Some(events.lines().any(|l| {
        l.split_once(' ')
            .is_some_and(|(k, v)| k == "populated" && v.trim() != "0")
    }))
}

/// The `oom_kill` count of a `memory.events` file.
fn oom_kills(events: &str) -> Option<u64> {
    events.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == "oom_kill").then(|| value.trim().parse().ok())?
    })
}

fn is_cgroup2(dir: &Path) -> io::Result<bool> {
    let c = CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a zeroed statfs is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs writes into the struct we pass and reads the NUL-terminated path.
    cvt(unsafe { libc::statfs(c.as_ptr(), &mut st) })?;
    Ok(st.f_type as i64 == CGROUP2_SUPER_MAGIC)
}

/// Mount cgroup2 at `dir`, with `favordynmods` where the kernel knows it (6.1 does): every
/// exec moves a process between cgroups, which otherwise waits for an RCU grace period.
fn mount_cgroup2(dir: &Path) -> io::Result<()> {
    let c = CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mount = |data: Option<&std::ffi::CStr>| {
        // SAFETY: mount reads the NUL-terminated strings we pass.
        cvt(unsafe {
            libc::mount(
                c"cgroup2".as_ptr(),
                c.as_ptr(),
                c"cgroup2".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                data.map_or(std::ptr::null(), |d| d.as_ptr().cast()),
            )
        })
        .map(drop)
    };
    mount(Some(c"favordynmods")).or_else(|_| mount(None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_oom_kill_count() {
        let events = "low 0\nhigh 0\nmax 3\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(oom_kills(events), Some(1));
        assert_eq!(oom_kills("low 0\n"), None);
        assert_eq!(oom_kills("oom_kill x\n"), None);
    }

    #[test]
    fn a_cgroup_that_cannot_be_opened_is_removed_and_taken_names_skipped() {
        // A plain directory stands in for the hierarchy: its new directories have no
        // `cgroup.procs`, so opening it fails and the directory is removed again.
        let dir = tempfile::tempdir().expect("tempdir");
        let cgroups = ExecCgroups::at(dir.path().to_path_buf());
        std::fs::create_dir(dir.path().join("hutch-exec-1")).expect("taken name");
        assert!(cgroups.create().is_err());
        assert!(dir.path().join("hutch-exec-1").is_dir());
        assert!(!dir.path().join("hutch-exec-2").exists());
    }

    /// A fake cgroup directory (plain files) in `root`.
    fn fake_cgroup(root: &Path, name: &str, populated: bool, oom_kills: u64) -> PathBuf {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("cgroup.procs"), "").expect("procs");
        std::fs::write(
            dir.join("cgroup.events"),
            format!("populated {}\nfrozen 0\n", u8::from(populated)),
        )
        .expect("events");
        std::fs::write(
            dir.join("memory.events"),
            format!("oom 1\noom_kill {oom_kills}\n"),
        )
        .expect("events");
        dir
    }

    #[test]
    fn cgroups_are_reused_once_empty_and_count_only_their_exec() {
        let root = tempfile::tempdir().expect("tempdir");
        let cgroups = ExecCgroups::at(root.path().to_path_buf());
        let dir = fake_cgroup(root.path(), "hutch-exec-7", false, 2);
        cgroups.lock_pool().free.push(dir.clone());
        let cg = cgroups.create().expect("reuse");
        assert_eq!((cg.dir.clone(), cg.oom_before), (dir.clone(), 2));
        assert!(cg.procs_fd() >= 0);
        // One OOM kill during the exec; a process it left behind keeps the cgroup busy.
        fake_cgroup(root.path(), "hutch-exec-7", true, 3);
        assert_eq!(cgroups.finish(cg), Some(1));
        assert_eq!(cgroups.lock_pool().busy, std::slice::from_ref(&dir));
        // Not reused while busy: the next exec would need a new one (none can be made here).
        assert!(cgroups.create().is_err());
        // Once empty it is reused.
        fake_cgroup(root.path(), "hutch-exec-7", false, 3);
        let cg = cgroups.create().expect("reuse");
        assert_eq!((cg.dir.clone(), cg.oom_before), (dir.clone(), 3));
        assert_eq!(cgroups.finish(cg), Some(0));
        assert_eq!(cgroups.lock_pool().free, [dir]);
        assert!(cgroups.lock_pool().busy.is_empty());
    }
}
