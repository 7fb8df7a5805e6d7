//! What a sandbox holds on the host, read from the host's side (`/proc`, `/sys/fs/cgroup`,
//! loop devices): the crash tests check that nothing of a sandbox outlives its record.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Pids of the host processes in sandbox `id`'s cgroups (from `/proc/<pid>/cgroup`).
pub fn processes_of(id: &str) -> Vec<i32> {
    let needle = format!("/hutch/{id}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cgroups = std::fs::read_to_string(e.path().join("cgroup")).ok()?;
            cgroups.lines().any(|l| l.ends_with(&needle)).then_some(pid)
        })
        .collect()
}

/// Sandbox `id`'s cgroup directories that exist, in any hierarchy.
pub fn cgroups_of(id: &str) -> Vec<PathBuf> {
    let root = PathBuf::from("/sys/fs/cgroup");
    let mut dirs = vec![root.join("hutch").join(id)];
    if let Ok(entries) = std::fs::read_dir(&root) {
        dirs.extend(entries.flatten().map(|e| e.path().join("hutch").join(id)));
    }
    dirs.into_iter().filter(|d| d.is_dir()).collect()
}

/// Assert that no process runs in sandbox `id`'s cgroups and none of them is left
/// (`context` starts the messages: the crash point, say).
pub fn assert_no_processes_or_cgroups(id: &str, context: &str) {
    assert_eq!(
        processes_of(id),
        Vec::<i32>::new(),
        "{context}: {id}'s processes"
    );
    assert_eq!(
        cgroups_of(id),
        Vec::<PathBuf>::new(),
        "{context}: {id}'s cgroups"
    );
}

/// Whether sandbox `id`'s cgroup is frozen (by the v1 freezer or cgroup v2's).
pub fn cgroup_frozen(id: &str) -> bool {
    let root = Path::new("/sys/fs/cgroup");
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    read(root.join("freezer/hutch").join(id).join("freezer.state")).trim() == "FROZEN"
        || read(root.join("hutch").join(id).join("cgroup.freeze")).trim() == "1"
        || read(root.join("unified/hutch").join(id).join("cgroup.freeze")).trim() == "1"
}

/// The backing files of the host's loop devices that lie under `dir`.
pub fn loop_devices_under(dir: &Path) -> Vec<String> {
    let out = Command::new("losetup")
        .args(["--list", "--noheadings", "--output", "BACK-FILE"])
        .output()
        .expect("run losetup");
    let prefix = dir.to_string_lossy().to_string();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|f| f.starts_with(&prefix))
        .collect()
}
