//! What template builds (`hutch-build`) need of the manager: sandboxes over a build step's
//! snapshot, step snapshots kept as cache entries (hidden from listings, never swept), and
//! the files of a step's snapshot for the finished template.

use std::path::PathBuf;
use std::sync::Arc;

use super::Manager;
use crate::error::{CoreError, CoreResult};
use crate::ids::{SandboxId, SnapshotId};
use crate::model::{CreateSandbox, Isolation, SandboxView};
use crate::snapshot::SnapshotRecord;

impl Manager {
    /// Create a sandbox for a build step: like [`Manager::create`], and `cmd.snapshot` may
    /// name a build cache snapshot.
    pub async fn create_build_sandbox(
        self: &Arc<Self>,
        mut cmd: CreateSandbox,
    ) -> CoreResult<SandboxView> {
        // A build's disk is at most half the ns disk pool (builds share it with the
        // sandboxes), whatever made the pool's size: one smaller than the build setting,
        // made on a small or full disk, would refuse every build otherwise.
        if let Some(pool_mib) = self.backend(Isolation::Ns)?.max_disk_mib().await? {
            let most = (pool_mib / 2).max(64).min(pool_mib);
            cmd.disk_mib = cmd.disk_mib.map(|d| d.min(most));
        }
        // A tenant's build sandbox fits its quotas: a build asks for more than most
        // sandboxes (2 CPUs, 2 GiB), which a tenant allowed less could then never build
        // with. It still counts against them (a build over them fails, naming the quota).
        if let Some(name) = &cmd.tenant {
            let q = self.tenant(name).await?.settings.quotas;
            let cpus = [q.max_cpus, q.max_sandbox_cpus];
            cmd.cpus = cmd
                .cpus
                .map(|c| cpus.into_iter().flatten().fold(c, f64::min));
            let memory = [q.max_memory_mib, q.max_sandbox_memory_mib];
            cmd.memory_mib = cmd
                .memory_mib
                .map(|m| memory.into_iter().flatten().fold(m, u64::min));
            if let Some(most) = q.max_sandbox_disk_mib {
                cmd.disk_mib = cmd.disk_mib.map(|d| d.min(most));
            }
        }
        self.create_sandbox_as(cmd, None, true).await
    }

    /// Snapshot build sandbox `id` as a build cache entry named `label`: not listed with
    /// the snapshots, kept (also across restarts) until [`Manager::delete_build_snapshot`].
    pub async fn snapshot_for_build(
        self: &Arc<Self>,
        id: &SandboxId,
        label: &str,
    ) -> CoreResult<SnapshotRecord> {
        let _op = self.op_lock(id).await;
        let r = self.touch(id).await?;
        if !r.state.can_snapshot() {
            return Err(super::wrong_state(&r, Some("snapshot")));
        }
        self.take_snapshot_as(&r, Some(label), true, true).await
    }

    /// The build cache snapshot `id`, if it still exists.
    pub async fn build_snapshot(&self, id: &SnapshotId) -> CoreResult<Option<SnapshotRecord>> {
        Ok(self.store.get_snapshot(id).await?.filter(|s| s.build))
    }

    /// Delete build cache snapshot `id` (409 while a sandbox is made from it).
    pub async fn delete_build_snapshot(&self, id: &SnapshotId) -> CoreResult<()> {
        let s = self
            .build_snapshot(id)
            .await?
            .ok_or_else(|| CoreError::NotFound(format!("build snapshot {id} does not exist")))?;
        {
            let _snapshots = self.lock_snapshots().await;
            if !self.users_of(id).await?.is_empty() {
                return Err(CoreError::Conflict(format!(
                    "build snapshot {id} is in use"
                )));
            }
            self.store.delete_snapshot(id).await?;
        }
        self.remove_snapshot_dir(&s).await
    }

    /// The directory holding the files of `ns` snapshot `s` (a 0-based layer over its
    /// template), for turning a build's last step into a template.
    pub fn snapshot_files(&self, s: &SnapshotRecord) -> CoreResult<PathBuf> {
        match s.isolation {
            Isolation::Ns => Ok(crate::backend::ns::snapshot_layer(
                &self.cfg.snapshot_dir(&s.id),
            )),
            other => Err(CoreError::NotSupported {
                backend: other,
                feature: "template builds",
            }),
        }
    }

    /// Every snapshot visible to nobody but the build cache.
    pub async fn build_snapshots(&self) -> CoreResult<Vec<SnapshotRecord>> {
        Ok(self
            .store
            .all_snapshots()
            .await?
            .into_iter()
            .filter(|s| s.build)
            .collect())
    }
}

impl Manager {
    /// The volume of a build's cache mount: `tenant`'s volume named `name`, made with
    /// `size_mib` MiB when there is none. Returns its id and whether it was made now.
    pub async fn build_cache_volume(
        self: &Arc<Self>,
        name: &str,
        size_mib: u64,
        tenant: Option<crate::tenant::Tenant>,
    ) -> CoreResult<(crate::ids::VolumeId, bool)> {
        for _ in 0..3 {
            let found = self
                .store
                .all_volumes()
                .await?
                .into_iter()
                .find(|v| v.name == name && v.tenant == tenant);
            if let Some(v) = found {
                return Ok((v.id, false));
            }
            match self.create_volume(name, size_mib, tenant.clone()).await {
                Ok(view) => return Ok((view.id, true)),
                // Another build made it first: use that one.
                Err(CoreError::Conflict(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(CoreError::Internal(format!(
            "the build cache volume {name:?} is neither found nor made"
        )))
    }
}
