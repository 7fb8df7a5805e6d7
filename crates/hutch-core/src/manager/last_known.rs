//! The last record this server read of each sandbox, answered when the store cannot be
//! reached at all ([`CoreError::StoreUnavailable`]: a cluster node that lost its database).
//! With it a node keeps serving its sandboxes — exec, files, terminals, whatever needs no
//! write — while every call that must write (a create, a lifecycle change) fails with 503
//! as before. Records are remembered as calls read them and forgotten with the sandbox; a
//! record may be older than the last change this server wrote (the next successful read
//! replaces it), which is what such a call then acts on. Only over a store that can be
//! unreachable ([`crate::store::Store::may_be_unreachable`]): on one host's SQLite nothing
//! is kept, and no call pays for a copy of its record.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::error::CoreError;
use crate::ids::SandboxId;
use crate::model::{SandboxRecord, SandboxState};
use crate::tenant::TenantScope;

/// Most records remembered (beyond it, the map starts again empty).
const MAX_RECORDS: usize = 100_000;

/// See the module docs.
pub(super) struct LastKnown {
    /// Whether records are kept at all.
    keep: bool,
    records: Mutex<HashMap<SandboxId, SandboxRecord>>,
}

impl LastKnown {
    /// Records kept when `keep` (the store can be unreachable).
    pub(super) fn new(keep: bool) -> Self {
        Self {
            keep,
            records: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, SandboxRecord>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What a read of `id` found (`None`: no such sandbox).
    pub(super) fn note(&self, id: &SandboxId, found: Option<&SandboxRecord>) {
        if !self.keep {
            return;
        }
        let mut records = self.lock();
        match found {
            Some(r) => {
                if records.len() >= MAX_RECORDS && !records.contains_key(id) {
                    records.clear();
                }
                records.insert(id.clone(), r.clone());
            }
            None => {
                records.remove(id);
            }
        }
    }

    /// Forget `id` (deleted).
    pub(super) fn forget(&self, id: &SandboxId) {
        self.lock().remove(id);
    }

    /// The record of `id` that `scope` may see, when `e` says the store cannot be reached
    /// and one is remembered; `Err(e)` otherwise.
    pub(super) fn instead_of(
        &self,
        e: CoreError,
        id: &SandboxId,
        scope: &TenantScope,
    ) -> Result<SandboxRecord, CoreError> {
        if !matches!(e, CoreError::StoreUnavailable(_)) {
            return Err(e);
        }
        let remembered = self.lock().get(id).cloned();
        match remembered {
            Some(r) if r.state != SandboxState::Pooled && scope.allows(r.tenant.as_ref()) => {
                tracing::debug!(id = %id, "the store is unreachable: answering from the last record read");
                Ok(r)
            }
            _ => Err(e),
        }
    }
}
