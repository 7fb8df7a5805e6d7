//! The state store: where the manager keeps sandbox, snapshot, volume, tenant and API key
//! records.
//!
//! [`Store`] is the seam: the manager holds an `Arc<dyn Store>` and never sees SQL. Today's
//! implementation is [`SqliteStore`] (one embedded database per host, `store/sqlite.rs`); a
//! store shared by many hosts (PostgreSQL) implements the same trait. Its tenancy half
//! (tenants, keys, the create log, template owners) is [`TenancyStore`], a supertrait in
//! `store/tenancy.rs`, and the audit log [`AuditStore`] (`store/audit.rs`) another, metered usage [`UsageStore`] (`store/usage.rs`) a third, so callers
//! keep talking to one trait object.
//!
//! Every method is one short transaction. What a request needs is answered by lookups the
//! store can index: a sandbox by id (and tenant), the rows whose TTL ran out, the running
//! rows with an idle policy, one page of a listing. Only server start and the warm pool read
//! every row ([`Store::all_sandboxes`], [`Store::pooled_sandboxes`]); the usage sampler
//! reads the running and paused rows every sampling interval and every snapshot and volume
//! every disk interval (`manager/usage.rs`), off any request's path.
//!
//! Listings are paginated: a [`PageRequest`] asks for up to `limit` rows after a [`Cursor`]
//! (opaque to callers: only the store that issued it reads it). Rows come in a stable order
//! (the order they were inserted), so walking the cursors returns every row that existed
//! throughout exactly once, whatever is inserted or deleted meanwhile.

pub mod audit;
mod sqlite;
pub mod tenancy;
pub mod usage;

use std::collections::BTreeMap;

use async_trait::async_trait;

pub use self::audit::AuditStore;
pub use self::sqlite::SqliteStore;
pub use self::tenancy::TenancyStore;
pub use self::usage::UsageStore;
use crate::error::{CoreError, CoreResult};
use crate::ids::{SandboxId, SnapshotId, VolumeId};
use crate::model::{SandboxRecord, SandboxState};
use crate::snapshot::SnapshotRecord;
use crate::tenant::{Tenant, TenantScope};
use crate::volume::VolumeRecord;

/// Where a page of a listing starts: after the row the previous page ended with. Opaque:
/// made by the store that answered the previous page, sent back by the client as it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor(String);

impl Cursor {
    /// A cursor as a client sent it back (checked by the store that reads it).
    pub fn from_client(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    /// The token to give to the client.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Most rows one page may hold.
pub const MAX_PAGE_LIMIT: usize = 1000;

/// Which page of a listing to return.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageRequest {
    /// Rows at most (`None`: every remaining row, as listings answered before pagination).
    pub limit: Option<usize>,
    /// Start after this row (`None`: from the first).
    pub after: Option<Cursor>,
}

impl PageRequest {
    /// Check a client's `limit` (1 to [`MAX_PAGE_LIMIT`]).
    pub fn new(limit: Option<usize>, after: Option<Cursor>) -> CoreResult<Self> {
        if let Some(n) = limit.filter(|n| !(1..=MAX_PAGE_LIMIT).contains(n)) {
            return Err(CoreError::InvalidArgument(format!(
                "limit must be between 1 and {MAX_PAGE_LIMIT}, got {n}"
            )));
        }
        Ok(Self { limit, after })
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The rows, in the listing's order.
    pub items: Vec<T>,
    /// Where the next page starts (`None`: this was the last).
    pub next: Option<Cursor>,
}

impl<T> Page<T> {
    /// The same page with each row mapped.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page {
            items: self.items.into_iter().map(f).collect(),
            next: self.next,
        }
    }
}

/// Which sandboxes a listing returns (warm guests of the pool never).
#[derive(Debug, Clone)]
pub struct SandboxQuery {
    /// Whose.
    pub scope: TenantScope,
    /// Only this state.
    pub state: Option<SandboxState>,
    /// Every pair must match the sandbox's metadata; the key `tenant_id` matches its tenant.
    pub metadata: BTreeMap<String, String>,
}

/// A refresh of one sandbox's TTL and idle clock made by calls on it, written in batches
/// ([`Store::refresh_sandboxes`]): each time only moves later, never back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxRefresh {
    /// When its TTL runs out now (ignored for a persistent sandbox).
    pub expires_at_ms: Option<i64>,
    /// When it was last used (exec, file and PTY calls).
    pub last_used_ms: Option<i64>,
}

impl SandboxRefresh {
    /// Both refreshes in one: the later of each time.
    pub fn merge(self, other: Self) -> Self {
        Self {
            expires_at_ms: self.expires_at_ms.max(other.expires_at_ms),
            last_used_ms: self.last_used_ms.max(other.last_used_ms),
        }
    }

    /// Apply it to `r`: times only move later; a persistent sandbox has no expiry to move.
    pub fn apply(&self, r: &mut SandboxRecord) {
        if let Some(at) = self.expires_at_ms.filter(|_| !r.persistent) {
            r.expires_at_ms = r.expires_at_ms.max(at);
        }
        if let Some(at) = self.last_used_ms {
            r.last_used_ms = r.last_used_ms.max(at);
        }
    }
}

/// A change to one sandbox record, applied by [`Store::modify_sandbox`] under the store's
/// lock; an error leaves the record as it was.
pub type SandboxChange<'a> = Box<dyn FnOnce(&mut SandboxRecord) -> CoreResult<()> + Send + 'a>;

/// The state store (see the module docs).
#[async_trait]
pub trait Store: TenancyStore + AuditStore + UsageStore + Send + Sync {
    // Sandboxes.

    /// Insert a new record. `Conflict` when its uid slot is taken.
    async fn insert_sandbox(&self, r: &SandboxRecord) -> CoreResult<()>;
    /// Replace a record. `NotFound` when there is none.
    async fn update_sandbox(&self, r: &SandboxRecord) -> CoreResult<()>;
    /// Read, change and write one record atomically, so concurrent changes to different
    /// fields never undo each other. `NotFound` when there is none.
    async fn modify_sandbox(
        &self,
        id: &SandboxId,
        change: SandboxChange<'_>,
    ) -> CoreResult<SandboxRecord>;
    /// Apply a batch of refreshes ([`SandboxRefresh::apply`]); records deleted meanwhile
    /// are skipped. The default applies them one by one; a store may write them at once.
    async fn refresh_sandboxes(&self, batch: &[(SandboxId, SandboxRefresh)]) -> CoreResult<()> {
        for (id, refresh) in batch {
            let refresh = *refresh;
            match self
                .modify_sandbox(
                    id,
                    Box::new(move |r| {
                        refresh.apply(r);
                        Ok(())
                    }),
                )
                .await
            {
                Ok(_) | Err(CoreError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
    /// Move hibernated sandbox `id` to this node with uid slot `uid_slot`, arriving
    /// ([`crate::handoff::Arrival::Fetch`]) and holding no network slot: only when another
    /// node owns it, that node is dead or draining, and its saved state was uploaded
    /// ([`SandboxRecord::saved_state`]). `None` when it is not such a sandbox (any more);
    /// `Conflict` when this node's slot `uid_slot` is taken. A store of one node has nothing
    /// to take over.
    async fn take_over_sandbox(
        &self,
        _id: &SandboxId,
        _uid_slot: u32,
    ) -> CoreResult<Option<SandboxRecord>> {
        Ok(None)
    }
    /// Whether calls can fail because the store cannot be reached
    /// ([`CoreError::StoreUnavailable`]: a database over the network), so that the manager
    /// keeps the last records it read to answer from meanwhile. An embedded store: `false`.
    fn may_be_unreachable(&self) -> bool {
        false
    }
    /// Whether sandbox `id` has a record of this node (a store of one node: any record).
    async fn sandbox_is_here(&self, id: &SandboxId) -> CoreResult<bool> {
        Ok(self.get_sandbox(id).await?.is_some())
    }
    /// One record by id (a warm guest's too).
    async fn get_sandbox(&self, id: &SandboxId) -> CoreResult<Option<SandboxRecord>>;
    /// One record by id if `scope` may see it (warm guests never): one indexed lookup.
    async fn get_sandbox_for(
        &self,
        id: &SandboxId,
        scope: &TenantScope,
    ) -> CoreResult<Option<SandboxRecord>>;
    /// Delete a record; whether it existed.
    async fn delete_sandbox(&self, id: &SandboxId) -> CoreResult<bool>;
    /// One page of the sandboxes `query` selects, oldest first.
    async fn list_sandboxes(
        &self,
        query: &SandboxQuery,
        page: &PageRequest,
    ) -> CoreResult<Page<SandboxRecord>>;
    /// Every sandbox but warm guests, oldest first: for server start only.
    async fn all_sandboxes(&self) -> CoreResult<Vec<SandboxRecord>>;
    /// The warm guests of the pool (state `pooled`).
    async fn pooled_sandboxes(&self) -> CoreResult<Vec<SandboxRecord>>;
    /// Sandboxes whose TTL ran out by `now_ms` (never persistent ones), soonest first.
    async fn expired_sandboxes(&self, now_ms: i64) -> CoreResult<Vec<SandboxRecord>>;
    /// Running sandboxes that have an idle-hibernation policy.
    async fn idle_candidates(&self) -> CoreResult<Vec<SandboxRecord>>;
    /// Sandboxes whose layer is snapshot `snapshot_id` (in any state).
    async fn sandboxes_on_layer(&self, snapshot_id: &str) -> CoreResult<Vec<SandboxRecord>>;
    /// Sandboxes in one of `states` that mount volume `volume_id`.
    async fn sandboxes_with_volume(
        &self,
        volume_id: &str,
        states: &[SandboxState],
    ) -> CoreResult<Vec<SandboxRecord>>;
    /// Ids of the volumes mounted by sandboxes in one of `states`.
    async fn volumes_in_use(&self, states: &[SandboxState]) -> CoreResult<Vec<String>>;
    /// Sandboxes per state.
    async fn count_by_state(&self) -> CoreResult<Vec<(SandboxState, u64)>>;

    // Snapshots.

    /// Insert a snapshot record.
    async fn insert_snapshot(&self, r: &SnapshotRecord) -> CoreResult<()>;
    /// One snapshot record by id.
    async fn get_snapshot(&self, id: &SnapshotId) -> CoreResult<Option<SnapshotRecord>>;
    /// The visible (not hidden) snapshots named `name` that `scope` may see, oldest first.
    async fn snapshots_named(
        &self,
        name: &str,
        scope: &TenantScope,
    ) -> CoreResult<Vec<SnapshotRecord>>;
    /// One page of the visible snapshots `scope` may see, oldest first.
    async fn list_snapshots(
        &self,
        scope: &TenantScope,
        page: &PageRequest,
    ) -> CoreResult<Page<SnapshotRecord>>;
    /// Every snapshot record, hidden ones too: for server start only.
    async fn all_snapshots(&self) -> CoreResult<Vec<SnapshotRecord>>;
    /// Delete a snapshot record; whether it existed.
    async fn delete_snapshot(&self, id: &SnapshotId) -> CoreResult<bool>;

    // Volumes.

    /// Insert a volume record.
    async fn insert_volume(&self, r: &VolumeRecord) -> CoreResult<()>;
    /// The volume `scope` may see whose id or name is `key`.
    async fn find_volume(&self, key: &str, scope: &TenantScope)
        -> CoreResult<Option<VolumeRecord>>;
    /// Whether `tenant` (`None`: no tenant) has a volume named `name`.
    async fn volume_name_taken(&self, name: &str, tenant: Option<&Tenant>) -> CoreResult<bool>;
    /// One page of the volumes `scope` may see, oldest first.
    async fn list_volumes(
        &self,
        scope: &TenantScope,
        page: &PageRequest,
    ) -> CoreResult<Page<VolumeRecord>>;
    /// Every volume record.
    async fn all_volumes(&self) -> CoreResult<Vec<VolumeRecord>>;
    /// Delete a volume record; whether it existed.
    async fn delete_volume(&self, id: &VolumeId) -> CoreResult<bool>;
}

impl dyn Store {
    /// [`Store::modify_sandbox`] with a plain closure.
    pub async fn modify(
        &self,
        id: &SandboxId,
        change: impl FnOnce(&mut SandboxRecord) -> CoreResult<()> + Send,
    ) -> CoreResult<SandboxRecord> {
        self.modify_sandbox(id, Box::new(change)).await
    }
}
