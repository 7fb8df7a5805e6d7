//! cgroups: where the hierarchies are, creating a sandbox's cgroups with its limits, and
//! moving a process in and out.
//!
//! Two host layouts are supported:
//! - **v1 (or hybrid)**: one directory per v1 hierarchy we use (`memory` with `memsw`,
//!   `pids`, `cpu`, `cpuacct`, `freezer`; co-mounted controllers share one directory) plus,
//!   when a controller-less cgroup2 is mounted (hybrid), a directory there for `cgroup.kill`
//!   and `cgroup.freeze`.
//! - **pure v2**: one directory with `memory.max`, `memory.swap.max = 0`, `pids.max` and
//!   `cpu.max`, after enabling those controllers in every ancestor's `cgroup.subtree_control`.
//!
//! Every sandbox cgroup is `<hierarchy mount>/<cgroup_parent>/<id>`. The hierarchies are found
//! in `/proc/self/mountinfo`, not assumed at `/sys/fs/cgroup/<name>`.

mod control;
mod process;
mod stats;

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

pub use control::{freeze, thaw};
pub(crate) use control::{kill_all, remove_dirs, wait_empty, CGROUP_TIMEOUT};
pub use process::{
    create_process_cgroups, release_process_cgroups, sandbox_cgroups, set_process_cpu_limit,
};
pub use stats::{cgroup_stats, CgroupStats};

use crate::mountinfo::MountEntry;
use crate::{JailError, Limits};

/// CFS period used for the CPU limit, in microseconds.
pub(crate) const CPU_PERIOD_US: u64 = 100_000;
/// Smallest CFS quota the kernel accepts, in microseconds.
const CPU_MIN_QUOTA_US: u64 = 1_000;

/// A v1 controller the jail uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Controller {
    /// Memory (+swap) limit and OOM accounting.
    Memory,
    /// Task count limit.
    Pids,
    /// CPU bandwidth limit.
    Cpu,
    /// CPU usage accounting.
    Cpuacct,
    /// Pause and resume.
    Freezer,
}

impl Controller {
    const ALL: [Controller; 5] = [
        Controller::Memory,
        Controller::Pids,
        Controller::Cpu,
        Controller::Cpuacct,
        Controller::Freezer,
    ];

    /// The name used in mount options and `/proc/self/cgroup`.
    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
            Controller::Freezer => "freezer",
        }
    }
}

/// One mounted v1 hierarchy carrying some of the controllers we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hierarchy {
    /// Its mount point.
    pub mount: PathBuf,
    /// The controllers of [`Controller::ALL`] it carries.
    pub controllers: Vec<Controller>,
}

/// How the host's cgroups are laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Layout {
    /// v1 controllers, with the controller-less cgroup2 mount of a hybrid host if present.
    V1 {
        /// The v1 hierarchies we use.
        hierarchies: Vec<Hierarchy>,
        /// The cgroup2 mount point (hybrid hosts).
        unified: Option<PathBuf>,
    },
    /// Pure cgroup v2.
    V2 {
        /// The cgroup2 mount point.
        root: PathBuf,
    },
}

impl Layout {
    /// Find the layout in parsed mountinfo: v1 when a v1 `memory` hierarchy is mounted,
    /// otherwise v2 when cgroup2 is mounted.
    pub fn from_mounts(entries: &[MountEntry]) -> Option<Layout> {
        let mut hierarchies: Vec<Hierarchy> = Vec::new();
        let mut unified = None;
        for e in entries {
            match e.fstype.as_str() {
                "cgroup" => {
                    let opts: Vec<&str> = e.super_options.split(',').collect();
                    let controllers: Vec<Controller> = Controller::ALL
                        .into_iter()
                        .filter(|c| opts.contains(&c.name()))
                        .collect();
                    let seen = hierarchies
                        .iter()
                        .any(|h| h.controllers.iter().any(|c| controllers.contains(c)));
                    if !controllers.is_empty() && !seen {
                        hierarchies.push(Hierarchy {
                            mount: e.mount_point.clone(),
                            controllers,
                        });
                    }
                }
                "cgroup2" if unified.is_none() => unified = Some(e.mount_point.clone()),
                _ => {}
            }
        }
        let has_memory = hierarchies
            .iter()
            .any(|h| h.controllers.contains(&Controller::Memory));
        if has_memory {
            Some(Layout::V1 {
                hierarchies,
                unified,
            })
        } else {
            unified.map(|root| Layout::V2 { root })
        }
    }

    /// Where `create` puts the sandbox's directories, in creation order.
    pub fn sandbox_dirs(&self, parent: &str, id: &str) -> Vec<PathBuf> {
        match self {
            Layout::V1 {
                hierarchies,
                unified,
            } => hierarchies
                .iter()
                .map(|h| &h.mount)
                .chain(unified.iter())
                .map(|m| m.join(parent).join(id))
                .collect(),
            Layout::V2 { root } => vec![root.join(parent).join(id)],
        }
    }

    /// The host's layout, from `/proc/self/mountinfo`.
    pub fn detect() -> Result<Layout, JailError> {
        let entries = crate::mountinfo::read()?;
        Layout::from_mounts(&entries).ok_or_else(|| {
            JailError::Unsupported(
                "cgroups (neither a v1 memory hierarchy nor cgroup2 is mounted)".into(),
            )
        })
    }
}

/// A cgroup directory created for a sandbox, and the cgroup the calling process came from in
/// the same hierarchy (to move back to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Created {
    /// The sandbox's cgroup directory.
    pub dir: PathBuf,
    /// The caller's original cgroup directory in that hierarchy.
    pub home: PathBuf,
    /// Whether it lives in a v2 hierarchy (the hybrid unified mount or pure v2).
    pub v2: bool,
}

/// Which line of `/proc/self/cgroup` describes a hierarchy.
enum HierarchyKey<'a> {
    V1(&'a str),
    Unified,
}

/// The caller's cgroup path in a hierarchy, from `/proc/self/cgroup` text.
fn own_path(proc_cgroup: &str, key: &HierarchyKey<'_>) -> Option<String> {
    proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let id = parts.next()?;
        let ctrls = parts.next()?;
        let path = parts.next()?;
        let hit = match key {
            HierarchyKey::V1(name) => ctrls.split(',').any(|c| c == *name),
            HierarchyKey::Unified => id == "0" && ctrls.is_empty(),
        };
        hit.then(|| path.to_string())
    })
}

fn home_of(mount: &Path, proc_cgroup: &str, key: &HierarchyKey<'_>) -> PathBuf {
    let rel = own_path(proc_cgroup, key).unwrap_or_else(|| "/".into());
    mount.join(rel.trim_start_matches('/'))
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), JailError> {
    std::fs::write(dir.join(file), value).map_err(|e| JailError::Sys {
        op: format!("write {value:?} to {}", dir.join(file).display()),
        source: e,
    })
}

fn mkdir(dir: &Path) -> Result<(), JailError> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(JailError::InvalidSpec(format!(
            "cgroup {} already exists (is the sandbox id in use?)",
            dir.display()
        ))),
        Err(e) => Err(JailError::Sys {
            op: format!("mkdir {}", dir.display()),
            source: e,
        }),
    }
}

fn mkdir_parents(dir: &Path) -> Result<(), JailError> {
    std::fs::create_dir_all(dir).map_err(|e| JailError::Sys {
        op: format!("mkdir {}", dir.display()),
        source: e,
    })
}

/// The CFS quota for `cpu_millis` thousandths of a CPU (`None`: unlimited).
pub(crate) fn cpu_quota_us(cpu_millis: u32) -> Option<u64> {
    (cpu_millis > 0).then(|| (u64::from(cpu_millis) * CPU_PERIOD_US / 1000).max(CPU_MIN_QUOTA_US))
}

/// Create the sandbox's cgroups with `limits`, pushing each directory onto `created` as soon
/// as it exists (so the caller can undo a partial creation).
pub(crate) fn create(
    layout: &Layout,
    parent: &str,
    id: &str,
    limits: &Limits,
    created: &mut Vec<Created>,
) -> Result<(), JailError> {
    let proc_cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    match layout {
        Layout::V1 {
            hierarchies,
            unified,
        } => {
            for h in hierarchies {
                let dir = h.mount.join(parent).join(id);
                mkdir_parents(&h.mount.join(parent))?;
                mkdir(&dir)?;
                let key = HierarchyKey::V1(h.controllers[0].name());
                created.push(Created {
                    dir: dir.clone(),
                    home: home_of(&h.mount, &proc_cgroup, &key),
                    v2: false,
                });
                for c in &h.controllers {
                    apply_v1(&dir, *c, limits)?;
                }
            }
            if let Some(u) = unified {
                let dir = u.join(parent).join(id);
                mkdir_parents(&u.join(parent))?;
                mkdir(&dir)?;
                created.push(Created {
                    dir,
                    home: home_of(u, &proc_cgroup, &HierarchyKey::Unified),
                    v2: true,
                });
            }
        }
        Layout::V2 { root } => {
            let mut cur = root.clone();
            enable_v2_controllers(&cur);
            for part in parent.split('/') {
                cur = cur.join(part);
                mkdir_parents(&cur)?;
                enable_v2_controllers(&cur);
            }
            let dir = cur.join(id);
            mkdir(&dir)?;
            created.push(Created {
                dir: dir.clone(),
                home: home_of(root, &proc_cgroup, &HierarchyKey::Unified),
                v2: true,
            });
            apply_v2(&dir, limits)?;
        }
    }
    Ok(())
}

fn apply_v1(dir: &Path, c: Controller, limits: &Limits) -> Result<(), JailError> {
    match c {
        Controller::Memory if limits.memory_bytes > 0 => {
            let v = limits.memory_bytes.to_string();
            // RAM first: memsw must never be below the RAM limit.
            write(dir, "memory.limit_in_bytes", &v)?;
            if dir.join("memory.memsw.limit_in_bytes").exists() {
                write(dir, "memory.memsw.limit_in_bytes", &v)?;
            }
        }
        Controller::Pids => {
            let v = match limits.pids_max {
                0 => "max".to_string(),
                n => n.to_string(),
            };
            write(dir, "pids.max", &v)?;
        }
        Controller::Cpu => {
            write(dir, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
            let quota = cpu_quota_us(limits.cpu_millis).map_or("-1".to_string(), |q| q.to_string());
            write(dir, "cpu.cfs_quota_us", &quota)?;
        }
        Controller::Memory | Controller::Cpuacct | Controller::Freezer => {}
    }
    Ok(())
}

/// Enable memory, pids and cpu for the children of `dir`, one by one (a controller the host
/// lacks is skipped; the limit write reports it).
fn enable_v2_controllers(dir: &Path) {
    let enabled = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    for c in ["memory", "pids", "cpu"] {
        if !enabled.split_whitespace().any(|e| e == c) {
            let _ = std::fs::write(dir.join("cgroup.subtree_control"), format!("+{c}"));
        }
    }
}

fn apply_v2(dir: &Path, limits: &Limits) -> Result<(), JailError> {
    if limits.memory_bytes > 0 {
        write(dir, "memory.max", &limits.memory_bytes.to_string())?;
        if dir.join("memory.swap.max").exists() {
            write(dir, "memory.swap.max", "0")?;
        }
    }
    let pids = match limits.pids_max {
        0 => "max".to_string(),
        n => n.to_string(),
    };
    write(dir, "pids.max", &pids)?;
    let quota = cpu_quota_us(limits.cpu_millis).map_or("max".to_string(), |q| q.to_string());
    write(dir, "cpu.max", &format!("{quota} {CPU_PERIOD_US}"))?;
    Ok(())
}

/// Move the calling thread (the whole single-threaded caller) into every created **v1**
/// cgroup.
///
/// Writing `0` to `tasks` moves only the current thread, which lets the kernel skip the global
/// threadgroup lock whose RCU synchronisation costs several milliseconds per cold migration
/// (`cgroup.procs` would take it). The caller must be single-threaded.
pub(crate) fn join_v1(created: &[Created]) -> Result<(), JailError> {
    for c in created.iter().filter(|c| !c.v2) {
        write(&c.dir, "tasks", "0")?;
    }
    Ok(())
}

/// Move the caller into the created v2 cgroup through `cgroup.procs` (the slow, global path:
/// only used when `clone3(CLONE_INTO_CGROUP)` is unavailable).
pub(crate) fn join_v2(created: &[Created], pid: libc::pid_t) -> Result<(), JailError> {
    for c in created.iter().filter(|c| c.v2) {
        write(&c.dir, "cgroup.procs", &pid.to_string())?;
    }
    Ok(())
}

/// The created v2 directory, if any (the target of `CLONE_INTO_CGROUP`).
pub(crate) fn v2_dir(created: &[Created]) -> Option<&Path> {
    created.iter().find(|c| c.v2).map(|c| c.dir.as_path())
}

/// Move the caller back to where it came from (best effort: used on the way out). `v2` says
/// whether it had joined the v2 cgroup too.
pub(crate) fn leave(created: &[Created], pid: libc::pid_t, v2: bool) {
    for c in created {
        let r = if c.v2 {
            if !v2 {
                continue;
            }
            write(&c.home, "cgroup.procs", &pid.to_string())
        } else {
            write(&c.home, "tasks", "0")
        };
        if let Err(e) = r {
            tracing::warn!(error = %e, "could not move back out of a sandbox cgroup");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mountinfo::parse;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn detects_hybrid_layout() {
        let layout = Layout::from_mounts(&parse(HYBRID)).unwrap();
        let Layout::V1 {
            hierarchies,
            unified,
        } = layout
        else {
            panic!("expected v1");
        };
        let mounts: Vec<_> = hierarchies.iter().map(|h| h.mount.clone()).collect();
        assert_eq!(
            mounts,
            ["cpu", "cpuacct", "memory", "freezer", "pids"]
                .map(|n| PathBuf::from(format!("/sys/fs/cgroup/{n}")))
        );
        assert_eq!(unified, Some(PathBuf::from("/sys/fs/cgroup/unified")));
        let layout = Layout::from_mounts(&parse(HYBRID)).unwrap();
        let dirs = layout.sandbox_dirs("hutch", "sbx_a");
        assert_eq!(dirs.len(), 6);
        assert_eq!(dirs[2], PathBuf::from("/sys/fs/cgroup/memory/hutch/sbx_a"));
        assert_eq!(dirs[5], PathBuf::from("/sys/fs/cgroup/unified/hutch/sbx_a"));
    }

    #[test]
    fn co_mounted_controllers_share_one_hierarchy() {
        let text = "\
1 0 0:1 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
2 0 0:2 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
3 0 0:3 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
4 0 0:1 / /mnt/again rw - cgroup cgroup rw,cpu,cpuacct
";
        let Some(Layout::V1 {
            hierarchies,
            unified: None,
        }) = Layout::from_mounts(&parse(text))
        else {
            panic!("expected v1 without unified");
        };
        assert_eq!(hierarchies.len(), 3);
        assert_eq!(
            hierarchies[0].controllers,
            vec![Controller::Cpu, Controller::Cpuacct]
        );
    }

    #[test]
    fn detects_pure_v2_and_nothing() {
        let text = "1 0 0:1 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            Layout::from_mounts(&parse(text)),
            Some(Layout::V2 {
                root: PathBuf::from("/sys/fs/cgroup")
            })
        );
        assert_eq!(
            Layout::from_mounts(&parse("1 0 0:1 / / rw - ext4 /dev/x rw\n")),
            None
        );
    }

    #[test]
    fn finds_own_cgroup_per_hierarchy() {
        let text = "9:name=systemd:/\n4:memory:/process_api/f6\n2:cpu,cpuacct:/a\n0::/user.slice\n";
        assert_eq!(
            own_path(text, &HierarchyKey::V1("memory")).as_deref(),
            Some("/process_api/f6")
        );
        assert_eq!(
            own_path(text, &HierarchyKey::V1("cpuacct")).as_deref(),
            Some("/a")
        );
        assert_eq!(
            own_path(text, &HierarchyKey::Unified).as_deref(),
            Some("/user.slice")
        );
        assert_eq!(own_path(text, &HierarchyKey::V1("pids")), None);
        assert_eq!(
            home_of(
                Path::new("/sys/fs/cgroup/memory"),
                text,
                &HierarchyKey::V1("memory")
            ),
            PathBuf::from("/sys/fs/cgroup/memory/process_api/f6")
        );
        assert_eq!(
            home_of(
                Path::new("/sys/fs/cgroup/pids"),
                text,
                &HierarchyKey::V1("pids")
            ),
            PathBuf::from("/sys/fs/cgroup/pids")
        );
    }

    #[test]
    fn cpu_quota_from_millis() {
        assert_eq!(cpu_quota_us(0), None);
        assert_eq!(cpu_quota_us(1000), Some(100_000));
        assert_eq!(cpu_quota_us(500), Some(50_000));
        assert_eq!(cpu_quota_us(2500), Some(250_000));
        assert_eq!(cpu_quota_us(1), Some(1_000));
    }
}
