//! What the reconciliation at start finds of `vm` sandboxes no record names
//! (`manager/reconcile.rs`): their directories and records in this server's state, and their
//! QEMU, found by its cgroups since no pid was recorded.

use super::VmBackend;
use crate::backend::ns::sandbox_entries;
use crate::error::{CoreError, CoreResult};

impl VmBackend {
    /// Ids with vm records, or a sandbox directory holding a guest's overlay.
    pub(super) fn ids_on_host(&self) -> Vec<String> {
        let mut ids = sandbox_entries(&self.cfg.state_dir.join("vm-records"));
        for id in sandbox_entries(&self.cfg.state_dir.join("sandboxes")) {
            if self.dir(&id).join("disk.qcow2").exists() && !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }

    /// Kill what runs in sandbox `id`'s cgroups (its QEMU), remove them, its directory and
    /// its records (blocking).
    pub(super) fn remove_orphan_now(&self, id: &str) -> CoreResult<()> {
        let cgroups = hutch_jail::sandbox_cgroups(&self.cfg.cgroup_parent, id);
        hutch_jail::release_process_cgroups(id, &cgroups)
            .map_err(|e| CoreError::Internal(format!("QEMU cgroups: {e}")))?;
        // Only files here (overlay, sockets, logs): no mounts to cross.
        match std::fs::remove_dir_all(self.dir(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(CoreError::Internal(format!(
                    "remove {}: {e}",
                    self.dir(id).display()
                )))
            }
            _ => {}
        }
        self.remove_records(id)
    }
}
