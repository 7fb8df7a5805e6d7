//! Reconciliation at start: what a crash of an earlier server left that no client can use.
//!
//! - A **fork** records its intent before it makes any child (`<state>/fork-intents/<its
//!   hidden snapshot id>`, written and synced) and drops it once its answer is ready (an
//!   explore once it kept its winner). An intent found at start is a fork no client got an
//!   answer from: every sandbox on its snapshot is destroyed, then the snapshot.
//! - A **create** is its record in state `starting`, inserted before anything is made
//!   (`reaper.rs` removes it); a QEMU it started before its record named its pid is found by
//!   its cgroups, `<hierarchy>/<cgroup_parent>/<id>` (`VmBackend::stop_qemu`).
//! - **Orphans**: each backend lists the sandboxes it has something of in this server's
//!   state directory ([`Backend::host_sandbox_ids`]); those no record names are killed and
//!   removed with their cgroups ([`Backend::remove_orphan`]). Cgroups under the shared
//!   parent with nothing of this server's state are another server's and left alone.
//!
//! Each removal is logged and counted (`hutch_reconciled_total{kind}`).

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::Manager;
use crate::error::{CoreError, CoreResult};
use crate::ids::{SandboxId, SnapshotId};

/// The record of one fork in progress; [`ForkIntent::finish`] drops it.
#[must_use = "an intent left behind destroys the fork's children at the next start"]
pub(super) struct ForkIntent {
    path: PathBuf,
}

impl ForkIntent {
    /// The fork answered (or undid itself): its children are the client's.
    pub(super) fn finish(self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "dropping a fork's intent");
        }
    }
}

impl Manager {
    fn fork_intents_dir(&self) -> PathBuf {
        self.cfg.state_dir.join("fork-intents")
    }

    /// Record that a fork over hidden snapshot `snapshot` is making children (synced, so a
    /// crash right after still finds it).
    pub(super) fn record_fork_intent(&self, snapshot: &SnapshotId) -> CoreResult<ForkIntent> {
        let dir = self.fork_intents_dir();
        std::fs::create_dir_all(&dir).map_err(CoreError::io("create", &dir))?;
        let path = dir.join(snapshot.as_str());
        let mut f = std::fs::File::create(&path).map_err(CoreError::io("create", &path))?;
        f.write_all(b"fork\n")
            .and_then(|()| f.sync_all())
            .map_err(CoreError::io("write", &path))?;
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(CoreError::io("sync", &dir))?;
        Ok(ForkIntent { path })
    }

    /// Destroy the children of every fork an earlier server never answered, and their
    /// snapshot.
    pub(super) async fn undo_interrupted_forks(&self) {
        let Ok(entries) = std::fs::read_dir(self.fork_intents_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Ok(snapshot) = name.parse::<SnapshotId>() {
                let children = match self.store.sandboxes_on_layer(snapshot.as_str()).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::error!(%snapshot, error = %e, "finding the children of an interrupted fork");
                        continue;
                    }
                };
                for child in children {
                    let id = child.id.clone();
                    tracing::warn!(%id, %snapshot, "removing a child of a fork no client got an answer from");
                    match self.remove(child, None).await {
                        Ok(()) => {
                            self.metrics
                                .reconciled
                                .fork_children
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            tracing::error!(%id, error = %e, "removing a child of an interrupted fork")
                        }
                    }
                }
                self.release_layer(Some(snapshot.as_str())).await;
            }
            let _ = std::fs::remove_file(entry.path());
        }
    }

    /// Kill and remove what each backend has on the host for sandboxes no record of this
    /// server names: no record at all (left by an interrupted operation), or the record of
    /// another node (it moved there: `handoff.rs`). Safe while sandboxes are made: a
    /// record is written before anything of its sandbox on the host, and the host is read
    /// before the records.
    pub async fn remove_orphans(&self) {
        let mut moved_away = false;
        for backend in self.backends.all() {
            let found = backend.host_sandbox_ids();
            if found.is_empty() {
                continue;
            }
            let own = match self.own_sandbox_ids().await {
                Ok(own) => own,
                Err(e) => {
                    tracing::error!(error = %e, "listing this server's sandboxes");
                    return;
                }
            };
            for id in found {
                let Ok(sid) = id.parse::<SandboxId>() else {
                    continue;
                };
                if own.contains(id.as_str()) {
                    continue;
                }
                // Checked again under its lock: a take-over or a delete may be under way.
                let _op = self.op_lock(&sid).await;
                match self.store.sandbox_is_here(&sid).await {
                    Ok(false) => {}
                    Ok(true) => continue,
                    Err(e) => {
                        tracing::error!(%id, error = %e, "looking up a sandbox found on the host");
                        continue;
                    }
                }
                let moved = match self.store.get_sandbox(&sid).await {
                    Ok(None) => false,
                    Ok(Some(_)) => true,
                    Err(e) => {
                        tracing::error!(%id, error = %e, "looking up a sandbox found on the host");
                        continue;
                    }
                };
                let removed = if moved {
                    tracing::info!(%id, isolation = backend.isolation().as_str(), "removing the files of a sandbox that moved to another node");
                    backend.remove_moved(&id).await
                } else {
                    tracing::warn!(%id, isolation = backend.isolation().as_str(), "removing a sandbox no record names (left by an interrupted operation)");
                    backend.remove_orphan(&id).await
                };
                match removed {
                    Ok(()) => {
                        moved_away |= moved;
                        self.metrics
                            .reconciled
                            .orphans
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tracing::error!(%id, error = %e, "removing an orphaned sandbox"),
                }
            }
        }
        if moved_away {
            self.release_moved_uid_slots().await;
        }
    }

    /// Drop this server's uid slot claims that no record of its own holds any more: those
    /// of sandboxes that moved to another node (their new node claims a slot of its own).
    /// The claims lock is held while the records are read, as a create or a take-over
    /// holds it from its claim to its record.
    async fn release_moved_uid_slots(&self) {
        let claims = match self.uid_slots.lock() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "releasing the uid slots of moved sandboxes");
                return;
            }
        };
        // This node's records, warm guests included (each holds a slot too).
        let records = match (
            self.store.all_sandboxes().await,
            self.store.pooled_sandboxes().await,
        ) {
            (Ok(mut records), Ok(pooled)) => {
                records.extend(pooled);
                records
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "releasing the uid slots of moved sandboxes");
                return;
            }
        };
        let held: std::collections::BTreeSet<u32> = records.iter().map(|r| r.uid_slot).collect();
        if let Err(e) = claims.reconcile(&held) {
            tracing::error!(error = %e, "releasing the uid slots of moved sandboxes");
        }
    }

    /// Remove volume directories no record names (a volume create cut between making its
    /// image and inserting its record): never one with anything mounted in it.
    pub(super) async fn remove_orphan_volumes(&self) {
        let Ok(records) = self.store.all_volumes().await else {
            return;
        };
        let dir = self.cfg.state_dir.join("volumes");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !crate::ids::is_volume_id(&name) || records.iter().any(|v| v.id == name) {
                continue;
            }
            let path = entry.path();
            let prefix = format!("{}/", path.display());
            let mounted = mounts.lines().any(|l| {
                l.split_whitespace()
                    .nth(4)
                    .is_some_and(|m| m == path.to_string_lossy() || m.starts_with(&prefix))
            });
            if mounted {
                tracing::warn!(dir = %path.display(), "a volume directory no record names has a mount in it: left alone");
                continue;
            }
            tracing::warn!(dir = %path.display(), "removing a volume image no record names (left by an interrupted create)");
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {
                    self.metrics
                        .reconciled
                        .orphan_volumes
                        .fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::error!(dir = %path.display(), error = %e, "removing an orphaned volume")
                }
            }
        }
    }
}

impl Manager {
    /// Ids of the sandboxes whose records are this server's (pooled ones included).
    async fn own_sandbox_ids(&self) -> CoreResult<std::collections::HashSet<String>> {
        let mut own: std::collections::HashSet<String> = self
            .store
            .all_sandboxes()
            .await?
            .into_iter()
            .map(|r| r.id.to_string())
            .collect();
        own.extend(
            self.store
                .pooled_sandboxes()
                .await?
                .into_iter()
                .map(|r| r.id.to_string()),
        );
        Ok(own)
    }
}
