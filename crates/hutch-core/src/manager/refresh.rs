//! TTL and idle-clock refreshes, kept in memory and written in batches.
//!
//! Every call on a sandbox refreshes its TTL, and exec, file and PTY calls its idle clock
//! (`last_used`). Writing that to the store on every call made every call fail on a full
//! state disk (SQLite's "database or disk is full"), `cat` on a running sandbox included.
//! So a refresh is only noted in memory ([`Refreshes`]); the manager's records are read
//! with the pending refreshes applied ([`Manager::load`]), so every answer, the TTL reaper
//! and idle hibernation see them at once; and they are written in one batch every
//! [`FLUSH_EVERY`] by the reaper loop and at shutdown ([`Manager::flush_refreshes`]). A
//! failed flush keeps them for the next one and never fails a call. A crash loses at most
//! the last [`FLUSH_EVERY`] of refreshes: a sandbox then expires that much earlier than it
//! would have.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::Manager;
use crate::error::CoreResult;
use crate::ids::SandboxId;
use crate::model::SandboxRecord;
use crate::store::SandboxRefresh;
use crate::time::now_ms;

/// How often pending refreshes are written to the store.
pub(super) const FLUSH_EVERY: Duration = Duration::from_secs(5);

/// Refreshes not written to the store yet, by sandbox.
#[derive(Default)]
pub(super) struct Refreshes {
    pending: Mutex<HashMap<SandboxId, SandboxRefresh>>,
}

impl Refreshes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, SandboxRefresh>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Note `refresh` of sandbox `id` (merged with one pending).
    pub(super) fn note(&self, id: &SandboxId, refresh: SandboxRefresh) {
        let mut pending = self.lock();
        let merged = match pending.get(id) {
            Some(p) => p.merge(refresh),
            None => refresh,
        };
        pending.insert(id.clone(), merged);
    }

    /// `r` as it is with its pending refresh applied.
    pub(super) fn apply(&self, r: &mut SandboxRecord) {
        if let Some(p) = self.lock().get(&r.id) {
            p.apply(r);
        }
    }

    /// Drop the pending refresh of `id` (deleted, or its TTL set anew).
    pub(super) fn forget(&self, id: &SandboxId) {
        self.lock().remove(id);
    }

    /// Every pending refresh, taken out.
    fn take(&self) -> Vec<(SandboxId, SandboxRefresh)> {
        self.lock().drain().collect()
    }

    /// Put back a batch that could not be written (merged with what was noted since).
    fn put_back(&self, batch: Vec<(SandboxId, SandboxRefresh)>) {
        for (id, refresh) in batch {
            self.note(&id, refresh);
        }
    }

    /// How many sandboxes have a refresh pending.
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }
}

impl Manager {
    /// Load a record and refresh its TTL (every call on a sandbox does).
    pub(super) async fn touch(&self, id: &SandboxId) -> CoreResult<SandboxRecord> {
        self.refresh(id, false).await
    }

    /// [`Manager::touch`], and note the sandbox was used (exec, file and PTY calls): the clock
    /// of idle hibernation restarts. Reading its state does not count as using it.
    pub(super) async fn touch_used(&self, id: &SandboxId) -> CoreResult<SandboxRecord> {
        self.refresh(id, true).await
    }

    /// Note the refresh in memory (see the module docs) and return the refreshed record.
    async fn refresh(&self, id: &SandboxId, used: bool) -> CoreResult<SandboxRecord> {
        let mut r = self.load(id).await?;
        let now = now_ms();
        let new_expiry = now + (r.ttl_seconds as i64) * 1000;
        // Skip it when nothing would move by a second or more, and never revive a sandbox
        // whose TTL already ran out: the reaper owns it now.
        let expiry_moves =
            !r.persistent && r.expires_at_ms > now && new_expiry - r.expires_at_ms >= 1000;
        let use_moves = used && now - r.last_used() >= 1000;
        if !expiry_moves && !use_moves {
            return Ok(r);
        }
        let refresh = SandboxRefresh {
            expires_at_ms: expiry_moves.then_some(new_expiry),
            last_used_ms: use_moves.then_some(now),
        };
        self.refreshes.note(id, refresh);
        refresh.apply(&mut r);
        Ok(r)
    }

    /// Write every pending refresh (and the API keys' last uses, `keys.rs`, and the audit
    /// log, `audit.rs`) to the store in one batch each; on failure (a full disk) they are kept for the next flush. Run by the reaper loop every [`FLUSH_EVERY`] and at
    /// shutdown.
    pub async fn flush_refreshes(&self) {
        self.flush_key_uses().await;
        self.flush_audit().await;
        let batch = self.refreshes.take();
        if batch.is_empty() {
            return;
        }
        if let Err(e) = self.store.refresh_sandboxes(&batch).await {
            tracing::warn!(sandboxes = batch.len(), error = %e, "writing TTL refreshes (kept for the next try)");
            self.refreshes.put_back(batch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> SandboxId {
        s.parse().expect("a sandbox id")
    }

    #[test]
    fn refreshes_merge_to_the_later_times_and_put_back_keeps_newer_ones() {
        let refreshes = Refreshes::default();
        let a = id("sbx_a");
        refreshes.note(
            &a,
            SandboxRefresh {
                expires_at_ms: Some(10),
                last_used_ms: None,
            },
        );
        refreshes.note(
            &a,
            SandboxRefresh {
                expires_at_ms: Some(5),
                last_used_ms: Some(7),
            },
        );
        let batch = refreshes.take();
        assert_eq!(
            batch,
            vec![(
                a.clone(),
                SandboxRefresh {
                    expires_at_ms: Some(10),
                    last_used_ms: Some(7)
                }
            )]
        );
        assert_eq!(refreshes.len(), 0);
        // A refresh noted while the batch was being written wins where it is later.
        refreshes.note(
            &a,
            SandboxRefresh {
                expires_at_ms: Some(20),
                last_used_ms: None,
            },
        );
        refreshes.put_back(batch);
        let again = refreshes.take();
        assert_eq!(
            again[0].1,
            SandboxRefresh {
                expires_at_ms: Some(20),
                last_used_ms: Some(7)
            }
        );
        refreshes.note(&a, again[0].1);
        refreshes.forget(&a);
        assert_eq!(refreshes.len(), 0);
    }
}
