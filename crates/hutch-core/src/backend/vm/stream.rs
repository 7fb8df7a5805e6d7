//! A memory snapshot of a running guest streamed straight into shared memory.
//!
//! The plain way (`snapshot_running`, then `share_memory`) saves the guest's RAM and device
//! state to a file, lets the guest run again, then starts a loading QEMU that reads that
//! file into a shared memory file: two passes over the RAM one after the other, plus the
//! loader's start. Here the loading QEMU is started while the guest is being stopped, and
//! the guest's migration goes through a pipe straight into it: saving and loading overlap,
//! the loader's start is hidden behind the save, no full stream is written to disk, and the
//! guest runs again as soon as its side of the stream is written. Whatever fails, the caller
//! falls back to the plain way.

use std::os::fd::AsFd;
use std::path::Path;

use super::share::SharedTarget;
use super::{vm_error, VmBackend, SAVE_TIMEOUT, SNAPSHOT_DISK};
use crate::error::{CoreError, CoreResult};
use crate::model::SandboxRecord;

impl VmBackend {
    /// Snapshot the running guest of `r` into `dir` (its disk) and a new shared memory
    /// directory it names (`hutch_vm::share::link_shared`); returns the bytes the shared
    /// memory adds. The guest is running again when this returns, whatever happened.
    pub(super) async fn snapshot_streamed(&self, r: &SandboxRecord, dir: &Path) -> CoreResult<u64> {
        let target = self.new_shared(r).await?;
        let streamed = self.stream_into(r, dir, &target).await;
        self.publish_shared(&target, dir, streamed)
    }

    async fn stream_into(
        &self,
        r: &SandboxRecord,
        dir: &Path,
        target: &SharedTarget,
    ) -> CoreResult<()> {
        let t0 = std::time::Instant::now();
        let (read, write) = hutch_vm::share::stream_pipe().map_err(vm_error)?;
        // Each side owns its end and drops it once QEMU has its own copy (or on failure):
        // a loader that fails makes the guest's writes fail (EPIPE) instead of blocking, and
        // a save that fails ends the loader's stream.
        let loading = async move {
            let mut loader = hutch_vm::share::Loader::start(
                &target.bake.config,
                &target.scratch,
                &target.dir,
                Some(target.jail.clone()),
            )
            .await?;
            loader.load(read.as_fd()).await?;
            drop(read);
            loader.finish().await
        };
        let saving = async move {
            let saved = self
                .qmp_within(r, SAVE_TIMEOUT, async |q| {
                    q.stop().await?;
                    q.ignore_shared(false).await?;
                    q.getfd("save", write.as_fd()).await?;
                    drop(write);
                    q.migrate("fd:save").await?;
                    q.wait_migration(SAVE_TIMEOUT).await
                })
                .await;
            let save_ms = t0.elapsed().as_millis() as u64;
            // Migration has flushed the disk; copy it while the guest is still stopped.
            let copied = saved.and_then(|()| {
                std::fs::copy(self.dir(&r.id).join("disk.qcow2"), dir.join(SNAPSHOT_DISK))
                    .map(drop)
                    .map_err(|e| CoreError::Internal(format!("copy the disk: {e}")))
            });
            let resumed = self.qmp(r, async |q| q.cont().await).await;
            tracing::debug!(id = %r.id, save_ms, resumed_ms = t0.elapsed().as_millis() as u64, "snapshot: guest saved into the pipe, running again");
            copied.and(resumed)
        };
        let (loaded, saved) = tokio::join!(loading, saving);
        tracing::debug!(id = %r.id, ms = t0.elapsed().as_millis() as u64, "snapshot: streamed into shared memory");
        saved?;
        loaded.map(drop).map_err(vm_error)
    }
}
