//! Warm guests for the manager's pool (`manager/warm.rs`): restored ahead of any request,
//! warmed up and paused, then claimed by a create.
//!
//! Under TCG a new QEMU's first exec costs 100–180 ms more than the next ones (TCG
//! translating the guest's fork/exec/exit paths; translations are not part of a snapshot),
//! so a create that restores on demand answers its first exec in ~290 ms. A warm guest has
//! paid that already: its claim is `cont`, the CPU limit the request asked for, and the
//! identity call (hostname, entropy with a CRNG reseed, clock, environment, network).

use std::path::{Path, PathBuf};

use hutch_proto::client::AgentClient;

use super::{Started, VmBackend};
use crate::backend::blocking;
use crate::error::{CoreError, CoreResult};
use crate::model::SandboxRecord;

impl VmBackend {
    /// Restore a guest for the pool: the record's identity without its network, the first
    /// programs run once, then paused (no CPU until claimed).
    pub(super) async fn restore_warm(
        &self,
        record: &SandboxRecord,
        rootfs: &Path,
    ) -> CoreResult<Started> {
        self.check()?;
        let started = self.restore(record, rootfs, None, true).await;
        if started.is_err() {
            let dir = self.dir(&record.id);
            let _ = blocking(move || {
                let _ = std::fs::remove_dir_all(dir);
                Ok(())
            })
            .await;
        }
        started
    }

    /// Make the warm guest of `record` the sandbox `record` describes: let it run, apply the
    /// requested CPU bandwidth, and give it its identity (reseeding its CRNG: warm guests of
    /// one bake share their RNG state until then).
    pub(super) async fn claim_warm_guest(
        &self,
        record: &SandboxRecord,
        agent: &AgentClient,
    ) -> CoreResult<()> {
        let cgroups: Vec<PathBuf> = record.cgroups.iter().map(PathBuf::from).collect();
        hutch_jail::set_process_cpu_limit(&cgroups, (record.cpus * 1000.0).round() as u32)
            .map_err(CoreError::from)?;
        let mut identity = Self::identity(record)?;
        identity.network = self.guest_config(record)?;
        self.qmp(record, async |q| q.cont().await).await?;
        agent
            .identity(&identity)
            .await
            .map_err(|e| CoreError::SandboxFailed(format!("identity of the warm guest: {e}")))
    }
}
