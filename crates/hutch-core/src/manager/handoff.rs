//! Hibernated sandboxes between nodes (`crate::handoff`): saving a hibernation where other
//! nodes can fetch it, taking a sandbox over from a dead or draining node, and its first
//! wake on the node that took it.
//!
//! - After a hibernation, its state is exported ([`Backend::export_hibernated`]) into
//!   `<state>/handoff/` and given to the [`SavedStates`] under a new key, which the record
//!   keeps as `saving`. When the upload is done, [`Manager::state_saved`] records it as the
//!   sandbox's `saved_state` — only if the sandbox is still in that same hibernation (its
//!   `saving` is that key), so an upload that finishes late never speaks for a newer state.
//! - [`Manager::take_over`] moves the record here ([`Store::take_over_sandbox`]) with a
//!   uid slot free on this host, as `arrival: fetch`.
//! - Its next wake downloads the archive (checked against the recorded sha256), unpacks it
//!   into a hidden snapshot of this node ([`Backend::import_hibernated`]), points the
//!   record's layer at it (`arrival: start`) and creates the sandbox over it. A crash in
//!   between repeats the step it interrupted.
//! - Once a sandbox runs again its saved state is stale: the record drops it and the object
//!   is deleted.

use std::path::PathBuf;
use std::sync::Arc;

use super::Manager;
#[cfg(doc)]
use crate::backend::Backend;
use crate::error::{CoreError, CoreResult};
use crate::handoff::{Arrival, SavedState, SavedStates};
use crate::ids::{self, SandboxId};
use crate::model::{SandboxRecord, SandboxState};
#[cfg(doc)]
use crate::store::Store;
use crate::uid_slots::Claim;

impl Manager {
    /// Save hibernated sandboxes' states with `states` from now on; `false` if the manager
    /// already has one.
    pub fn set_saved_states(&self, states: Arc<dyn SavedStates>) -> bool {
        self.saved_states.set(states).is_ok()
    }

    fn saved_states(&self) -> Option<&Arc<dyn SavedStates>> {
        self.saved_states.get()
    }

    /// Saves of hibernated sandboxes not uploaded yet (0 without object storage).
    pub fn pending_saves(&self) -> usize {
        self.saved_states().map_or(0, |s| s.pending())
    }

    fn handoff_dir(&self) -> CoreResult<PathBuf> {
        let dir = self.cfg.state_dir.join("handoff");
        super::snapshots::prepare_dir(&dir)?;
        Ok(dir)
    }

    /// Whether `r` can be saved for another node: a backend that can, and no volume (a
    /// volume's files are on this node).
    fn portable(&self, r: &SandboxRecord) -> bool {
        self.saved_states().is_some()
            && r.volumes.is_empty()
            && self
                .backend(r.isolation)
                .is_ok_and(|b| b.capabilities().portable_hibernation)
    }

    /// Hand hibernated `r`'s state over to be saved for other nodes, if it can be (its
    /// transition lock held). A failure is logged: the sandbox stays hibernated here.
    pub(super) async fn save_hibernated(&self, r: &SandboxRecord) {
        if !self.portable(r) {
            return;
        }
        let Some(states) = self.saved_states().cloned() else {
            return;
        };
        if let Err(e) = self.try_save(r, states).await {
            tracing::warn!(id = %r.id, error = %e, "saving a hibernated sandbox for other nodes (it can wake only here)");
        }
    }

    async fn try_save(&self, r: &SandboxRecord, states: Arc<dyn SavedStates>) -> CoreResult<()> {
        let t0 = std::time::Instant::now();
        let token = ids::random_token(12);
        let key = format!("hibernations/{}/{token}.tar", r.id);
        let archive = self.handoff_dir()?.join(format!("{}-{token}.tar", r.id));
        let backend = self.backend(r.isolation)?;
        let bytes = match backend.export_hibernated(r, &archive).await {
            Ok(b) => b,
            Err(e) => {
                let _ = std::fs::remove_file(&archive);
                return Err(e);
            }
        };
        let saving = key.clone();
        self.store
            .modify(&r.id, move |r| {
                r.saving = Some(saving);
                r.saved_state = None;
                Ok(())
            })
            .await?;
        tracing::info!(id = %r.id, key, bytes, ms = t0.elapsed().as_millis() as u64, "hibernated sandbox exported for other nodes");
        states.save(&r.id, &key, archive).await
    }

    /// Save this server's hibernated sandboxes that have no save and none queued (they
    /// hibernated before it had an object store, or a crash cut their save short).
    pub async fn save_unsaved(&self) {
        let Some(states) = self.saved_states().cloned() else {
            return;
        };
        let records = match self.store.all_sandboxes().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "listing hibernated sandboxes to save");
                return;
            }
        };
        for r in records {
            let unsaved = r.state == SandboxState::Hibernated
                && r.saved_state.is_none()
                && r.arrival.is_none()
                && !r.saving.as_deref().is_some_and(|k| states.is_pending(k));
            if !unsaved || !self.portable(&r) {
                continue;
            }
            let _op = self.op_lock(&r.id).await;
            match self.load(&r.id).await {
                Ok(fresh) if fresh.state == SandboxState::Hibernated => {
                    self.save_hibernated(&fresh).await
                }
                _ => {}
            }
        }
    }

    /// The save under `saved.key` of sandbox `id` is uploaded: record it, if the sandbox is
    /// still in the hibernation that save was of. Whether it was recorded (if not, the
    /// caller deletes the object: nothing will ever fetch it).
    pub async fn state_saved(&self, id: &SandboxId, saved: SavedState) -> bool {
        let _op = self.op_lock(id).await;
        let recorded = self
            .store
            .modify(id, move |r| {
                if r.state != SandboxState::Hibernated
                    || r.saving.as_deref() != Some(saved.key.as_str())
                {
                    return Err(CoreError::Conflict("not that hibernation any more".into()));
                }
                r.saving = None;
                r.saved_state = Some(saved);
                Ok(())
            })
            .await;
        match recorded {
            Ok(r) => {
                tracing::info!(id = %id, key = r.saved_state.as_ref().map(|s| s.key.as_str()), "hibernated sandbox saved for other nodes");
                self.events.publish(
                    "sandbox.saved",
                    id,
                    r.tenant(),
                    Some("its hibernated state can wake on another node".into()),
                );
                true
            }
            Err(_) => false,
        }
    }

    /// Take hibernated sandbox `id` over from a dead or draining node whose save of it was
    /// uploaded: it becomes this node's, to be woken here. `Ok(false)` when it is not such
    /// a sandbox (or another node took it first); an error when this node cannot run it
    /// (its template revision is not here, no uid slot is free).
    pub async fn take_over(&self, id: &SandboxId) -> CoreResult<bool> {
        let Some(r) = self.store.get_sandbox(id).await? else {
            return Ok(false);
        };
        if r.state != SandboxState::Hibernated || r.saved_state.is_none() || !self.portable(&r) {
            return Ok(false);
        }
        let rootfs = self.template_rootfs(&r);
        if !rootfs.is_dir() {
            return Err(CoreError::Conflict(format!(
                "sandbox {id} cannot move to this node: its template {}{} is not here (build it on this node first)",
                r.template,
                r.template_rev.map(|n| format!(" revision {n}")).unwrap_or_default()
            )));
        }
        let _op = self.op_lock(id).await;
        let claims = self.uid_slots.lock()?;
        for slot in self.uid_slot_candidates() {
            if claims.claim(slot)? == Claim::Taken {
                continue;
            }
            match self.store.take_over_sandbox(id, slot).await {
                Ok(Some(_)) => {
                    tracing::info!(id = %id, slot, "took over a hibernated sandbox");
                    self.events.publish(
                        "sandbox.moved",
                        id,
                        r.tenant(),
                        Some("taken over by this node; it wakes here".into()),
                    );
                    return Ok(true);
                }
                Ok(None) => {
                    claims.release(slot)?;
                    return Ok(false);
                }
                // A record of this node holds it: the claim just made is right as it is.
                Err(CoreError::Conflict(_)) => continue,
                Err(e) => {
                    claims.release(slot)?;
                    return Err(e);
                }
            }
        }
        Err(self.no_free_uid_slot())
    }

    /// Bring the files of `r`, which arrived from another node, here: download its saved
    /// state, unpack it as a hidden snapshot of this node and make that its layer. Returns
    /// the record as it is then (`arrival: start`).
    pub(super) async fn fetch_arrival(&self, r: SandboxRecord) -> CoreResult<SandboxRecord> {
        let t0 = std::time::Instant::now();
        let (Some(saved), Some(states)) = (r.saved_state.clone(), self.saved_states().cloned())
        else {
            return Err(CoreError::SavedStateUnavailable(format!(
                "sandbox {} moved to this node, but {}",
                r.id,
                if r.saved_state.is_none() {
                    "it has no saved state to fetch"
                } else {
                    "this node has no object store (hutch serve --object-store)"
                }
            )));
        };
        let archive = self.handoff_dir()?.join(format!("{}-arrival.tar", r.id));
        let _ = std::fs::remove_file(&archive);
        states.fetch(&saved, &archive).await?;
        let backend = self.backend(r.isolation)?;
        // What an earlier stay of it on this node left (it moved away and back) must not
        // be stacked over what it brought.
        backend.remove_moved(r.id.as_str()).await?;
        let sid = ids::new_snapshot_id();
        let tmp = self.snapshot_tmp_dir(&sid)?;
        let taken = backend.import_hibernated(&archive, &tmp).await;
        let _ = std::fs::remove_file(&archive);
        let name = format!("arrival of {}", r.id);
        let snapshot = self
            .keep_snapshot(&r, (&sid, &name), (true, false), taken, &tmp)
            .await?;
        let layer = snapshot.id.to_string();
        let r = self
            .store
            .modify(&r.id, move |r| {
                r.layer = Some(layer);
                r.arrival = Some(Arrival::Start);
                Ok(())
            })
            .await?;
        tracing::info!(id = %r.id, bytes = saved.bytes, files = snapshot.files, ms = t0.elapsed().as_millis() as u64, "fetched a sandbox that moved here");
        Ok(r)
    }

    /// `r` runs again: what was saved of its hibernation is stale; forget it (the record has
    /// dropped it already) and delete the object.
    pub(super) async fn forget_saved(
        &self,
        id: &SandboxId,
        saved: Option<SavedState>,
        saving: bool,
    ) {
        if saved.is_none() && !saving {
            return;
        }
        if let Some(states) = self.saved_states() {
            states.discard(id, saved.as_ref()).await;
        }
    }
}
