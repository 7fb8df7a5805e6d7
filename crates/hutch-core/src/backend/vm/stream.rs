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
use super::{vm_error, VmBackend, HIBERNATED, SAVE_TIMEOUT, SNAPSHOT_DISK, SNAPSHOT_STATE};
use crate::backend::{Backend, SnapshotTaken};
use crate::error::{CoreError, CoreResult};
use crate::model::SandboxRecord;
use crate::snapshot::SnapshotKind;

impl VmBackend {
    /// A memory snapshot of `r` into `dir` ([`Backend::snapshot`]); with `in_memory` (a
    /// fork's) its shared memory goes to tmpfs (`fork_memory.rs`) when it is streamed.
    pub(super) fn memory_snapshot(
        &self,
        r: &SandboxRecord,
        dir: &Path,
        in_memory: bool,
    ) -> CoreResult<SnapshotTaken> {
        // What its guest has in each volume slot, for sandboxes restored from it.
        super::volumes::write_layout(&self.cfg, r, dir)?;
        let hibernated = self.dir(&r.id).join(HIBERNATED);
        if hibernated.is_file() && !Backend::alive(self, r) {
            // Hibernated: its saved state is already a snapshot.
            std::fs::copy(&hibernated, dir.join(SNAPSHOT_STATE))
                .and_then(|_| {
                    std::fs::copy(self.dir(&r.id).join("disk.qcow2"), dir.join(SNAPSHOT_DISK))
                })
                .map_err(|e| CoreError::Internal(format!("copy the hibernated state: {e}")))?;
        } else {
            // Saved straight into shared memory (stream.rs), else the plain way below.
            let t0 = std::time::Instant::now();
            let streamed = tokio::runtime::Handle::current()
                .block_on(self.snapshot_streamed(r, dir, in_memory));
            tracing::debug!(id = %r.id, ms = t0.elapsed().as_millis() as u64, ok = streamed.is_ok(), "snapshot: streamed");
            match streamed {
                Ok(shared_bytes) => {
                    return Ok(SnapshotTaken {
                        kind: SnapshotKind::Memory,
                        size_bytes: std::fs::metadata(dir.join(SNAPSHOT_DISK))
                            .map_or(0, |m| m.len())
                            + shared_bytes,
                        files: 2,
                    })
                }
                Err(e) => {
                    tracing::warn!(id = %r.id, error = %e, "streaming the snapshot into shared memory; saving it to a file instead")
                }
            }
            let t0 = std::time::Instant::now();
            tokio::runtime::Handle::current().block_on(self.snapshot_running(r, dir))?;
            tracing::debug!(id = %r.id, ms = t0.elapsed().as_millis() as u64, "snapshot: memory saved, disk copied, guest resumed");
        }
        let t0 = std::time::Instant::now();
        let shared = tokio::runtime::Handle::current().block_on(self.share_memory(r, dir));
        tracing::debug!(id = %r.id, ms = t0.elapsed().as_millis() as u64, "snapshot: memory shared");
        let shared_bytes = match shared {
            Ok(bytes) => bytes,
            Err(e) => {
                // Children then load their own copy of the RAM from the full stream.
                tracing::warn!(id = %r.id, error = %e, "sharing the snapshot's memory");
                0
            }
        };
        let size = |name: &str| std::fs::metadata(dir.join(name)).map_or(0, |m| m.len());
        Ok(SnapshotTaken {
            kind: SnapshotKind::Memory,
            size_bytes: size(SNAPSHOT_STATE) + size(SNAPSHOT_DISK) + shared_bytes,
            files: 2,
        })
    }

    /// Snapshot the running guest of `r` into `dir` (its disk) and a new shared memory
    /// directory it names (`hutch_vm::share::link_shared`); returns the bytes the shared
    /// memory adds. The guest is running again when this returns, whatever happened.
    pub(super) async fn snapshot_streamed(
        &self,
        r: &SandboxRecord,
        dir: &Path,
        in_memory: bool,
    ) -> CoreResult<u64> {
        let target = self.new_shared(r, in_memory).await?;
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
            self.copy_disk_and_resume(r, dir, saved, t0).await
        };
        let (loaded, saved) = tokio::join!(loading, saving);
        tracing::debug!(id = %r.id, ms = t0.elapsed().as_millis() as u64, "snapshot: streamed into shared memory");
        saved?;
        loaded.map(drop).map_err(vm_error)
    }

    /// Snapshot a running guest into `dir`: stop it, save memory and device state, copy its
    /// disk while it is stopped (migration has flushed it), let it run again.
    async fn snapshot_running(&self, r: &SandboxRecord, dir: &Path) -> CoreResult<()> {
        let t0 = std::time::Instant::now();
        let saved = self.stop_and_save(r, &dir.join(SNAPSHOT_STATE)).await;
        self.copy_disk_and_resume(r, dir, saved, t0).await
    }

    /// After the save of a stopped guest (`saved`, begun at `t0`): copy its disk into the
    /// snapshot directory `dir` while it is still stopped (migration has flushed it), then
    /// let it run again whatever happened.
    async fn copy_disk_and_resume(
        &self,
        r: &SandboxRecord,
        dir: &Path,
        saved: CoreResult<()>,
        t0: std::time::Instant,
    ) -> CoreResult<()> {
        let save_ms = t0.elapsed().as_millis() as u64;
        let copied = saved.and_then(|()| {
            std::fs::copy(self.dir(&r.id).join("disk.qcow2"), dir.join(SNAPSHOT_DISK))
                .map(drop)
                .map_err(|e| CoreError::Internal(format!("copy the disk: {e}")))
        });
        let resumed = self.qmp(r, async |q| q.cont().await).await;
        tracing::debug!(id = %r.id, save_ms, resumed_ms = t0.elapsed().as_millis() as u64, "snapshot: guest saved, disk copied, running again");
        copied.and(resumed)
    }
}
