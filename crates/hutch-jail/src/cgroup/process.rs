//! cgroups for a process the caller starts itself rather than through [`crate::spawn`]: the
//! `vm` backend's QEMU. The caller creates them with limits, has the child join them before
//! it execs (writing `0` to each `cgroup.procs` moves the writer), and releases them after.

use std::path::PathBuf;

use super::{
    cpu_quota_us, create, kill_all, remove_dirs, wait_empty, write, Created, Layout, CPU_PERIOD_US,
};
use crate::{JailError, Limits};

/// Create the cgroups `<parent>/<id>` in every hierarchy with `limits`; returns their
/// directories (a partial creation is undone on error).
pub fn create_process_cgroups(
    parent: &str,
    id: &str,
    limits: &Limits,
) -> Result<Vec<PathBuf>, JailError> {
    let layout = Layout::detect()?;
    let mut created: Vec<Created> = Vec::new();
    if let Err(e) = create(&layout, parent, id, limits, &mut created) {
        let dirs: Vec<PathBuf> = created.into_iter().map(|c| c.dir).collect();
        let _ = remove_dirs(&dirs);
        return Err(e);
    }
    Ok(created.into_iter().map(|c| c.dir).collect())
}

/// Kill whatever is left in `dirs`, wait until they are empty, and remove them. Refuses
/// directories not named after sandbox `id`. Idempotent.
pub fn release_process_cgroups(id: &str, dirs: &[PathBuf]) -> Result<(), JailError> {
    if let Some(bad) = dirs
        .iter()
        .find(|d| d.file_name() != Some(std::ffi::OsStr::new(id)) || !d.is_absolute())
    {
        return Err(JailError::Refused(format!(
            "remove cgroup {} that is not named after sandbox {id}",
            bad.display()
        )));
    }
    let used_cgroup_kill = kill_all(dirs);
    wait_empty(dirs, !used_cgroup_kill)?;
    remove_dirs(dirs)
}

/// Change the CPU bandwidth of cgroups made by [`create_process_cgroups`] to `cpu_millis`
/// thousandths of a CPU (0: unlimited); directories of other controllers are left alone.
pub fn set_process_cpu_limit(dirs: &[PathBuf], cpu_millis: u32) -> Result<(), JailError> {
    for dir in dirs {
        if dir.join("cpu.cfs_quota_us").exists() {
            let quota = cpu_quota_us(cpu_millis).map_or("-1".to_string(), |q| q.to_string());
            write(dir, "cpu.cfs_quota_us", &quota)?;
        } else if dir.join("cpu.max").exists() {
            let quota = cpu_quota_us(cpu_millis).map_or("max".to_string(), |q| q.to_string());
            write(dir, "cpu.max", &format!("{quota} {CPU_PERIOD_US}"))?;
        }
    }
    Ok(())
}

/// The cgroup directories of sandbox `id` under `parent` that exist now, in every hierarchy
/// (`<hierarchy>/<parent>/<id>`): what a process started for the sandbox joined, whether or
/// not its caller lived to record them.
pub fn sandbox_cgroups(parent: &str, id: &str) -> Vec<PathBuf> {
    match Layout::detect() {
        Ok(layout) => layout
            .sandbox_dirs(parent, id)
            .into_iter()
            .filter(|d| d.is_dir())
            .collect(),
        Err(_) => Vec::new(),
    }
}
