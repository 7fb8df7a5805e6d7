//! cgroups for a process the caller starts itself rather than through [`crate::spawn`]: the
//! `vm` backend's QEMU. The caller creates them with limits, has the child join them before
//! it execs (writing `0` to each `cgroup.procs` moves the writer), and releases them after.

use std::path::PathBuf;

use super::{create, kill_all, remove_dirs, wait_empty, Created, Layout};
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
