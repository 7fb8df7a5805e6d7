//! The audit log seen from the manager: entries noted in memory as calls end
//! ([`Manager::record_audit`], never a database write on the request's path) and written in
//! one batch with the TTL refreshes (`refresh.rs`: every few seconds and at shutdown). A
//! failed write keeps them for the next one, up to [`MAX_PENDING_AUDIT`] (past it the oldest
//! go, with a warning: a full state disk must not grow the server's memory without bound).

use std::collections::VecDeque;
use std::sync::Mutex;

use super::Manager;
use crate::audit::{AuditEntry, AuditQuery};
use crate::error::CoreResult;
use crate::store::{Page, PageRequest};

/// Most entries kept in memory while the store cannot take them.
pub(super) const MAX_PENDING_AUDIT: usize = 100_000;

/// Entries not written yet, in the order the calls ended.
#[derive(Default)]
pub(super) struct AuditLog {
    pending: Mutex<VecDeque<AuditEntry>>,
}

impl AuditLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<AuditEntry>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Manager {
    /// Note one audited call (written with the next batch).
    pub fn record_audit(&self, entry: AuditEntry) {
        let mut pending = self.audit.lock();
        if pending.len() >= MAX_PENDING_AUDIT {
            pending.pop_front();
            tracing::warn!(
                "audit log: {MAX_PENDING_AUDIT} entries wait for the store; dropping the oldest"
            );
        }
        pending.push_back(entry);
    }

    /// Write the noted entries in one batch (kept for the next try on failure).
    pub(super) async fn flush_audit(&self) {
        let batch: Vec<AuditEntry> = self.audit.lock().drain(..).collect();
        if batch.is_empty() {
            return;
        }
        if let Err(e) = self.store.append_audit(&batch).await {
            tracing::warn!(entries = batch.len(), error = %e, "writing the audit log (kept for the next try)");
            let mut pending = self.audit.lock();
            for entry in batch.into_iter().rev() {
                pending.push_front(entry);
            }
            let over = pending.len().saturating_sub(MAX_PENDING_AUDIT);
            pending.drain(..over);
        }
    }

    /// One page of the entries `query` selects, oldest first (what is written: entries of the
    /// last few seconds come with the next batch).
    pub async fn list_audit(
        &self,
        query: &AuditQuery,
        page: &PageRequest,
    ) -> CoreResult<Page<AuditEntry>> {
        self.store.list_audit(query, page).await
    }
}
