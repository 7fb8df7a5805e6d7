//! [`TenancyStore`]: tenants, API keys, the log of creates hourly quotas count, and the
//! owners of tenant-private templates. A supertrait of [`super::Store`], so the manager
//! reaches it through the same `Arc<dyn Store>`.
//!
//! What must not race is one call here: deleting a tenant checks it owns nothing and removes
//! it with its keys in one transaction, and claiming a template name for a tenant is one
//! insert-unless-present. Quotas are admitted by the manager under a per-tenant lock
//! (`manager/quota.rs`) over [`TenancyStore::tenant_usage`], one indexed read.

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::{Page, PageRequest};
use crate::error::CoreResult;
use crate::ids::{KeyId, SandboxId};
use crate::tenant::keys::{KeyBudget, KeyRecord};
use crate::tenant::quota::TenantUsage;
use crate::tenant::settings::TenantRecord;
use crate::tenant::{Tenant, TenantScope};

/// How long a create counts against `max_creates_per_hour`.
pub const CREATE_WINDOW_MS: i64 = 3_600_000;

/// Tenants, keys, creates and template owners (see the module docs).
#[async_trait]
pub trait TenancyStore: Send + Sync {
    // Tenants.

    /// Insert a new tenant. `Conflict` when one of that name exists.
    async fn insert_tenant(&self, t: &TenantRecord) -> CoreResult<()>;
    /// One tenant by name.
    async fn get_tenant(&self, name: &Tenant) -> CoreResult<Option<TenantRecord>>;
    /// One page of tenants, oldest first.
    async fn list_tenants(&self, page: &PageRequest) -> CoreResult<Page<TenantRecord>>;
    /// Replace a tenant's settings. `NotFound` when there is none.
    async fn update_tenant(&self, t: &TenantRecord) -> CoreResult<()>;
    /// Delete tenant `name` and its keys, in one transaction, unless it still owns a
    /// sandbox, a snapshot, a volume or a template (`Conflict` counting them). Returns the
    /// ids of the keys deleted. `NotFound` when there is no such tenant.
    async fn delete_tenant(&self, name: &Tenant) -> CoreResult<Vec<KeyId>>;
    /// What `tenant`'s sandboxes use, leaving out the sandboxes `excluding` names, with the
    /// creates logged since `since_ms`.
    async fn tenant_usage(
        &self,
        tenant: &Tenant,
        excluding: &[SandboxId],
        since_ms: i64,
    ) -> CoreResult<TenantUsage>;
    /// Log one create of `tenant` at `at_ms` (and forget creates older than the window).
    async fn record_create(&self, tenant: &Tenant, at_ms: i64) -> CoreResult<()>;

    // API keys.

    /// Insert a key under the SHA-256 of its secret (`tenant::keys::hash_secret`).
    async fn insert_key(&self, secret_hash: &str, key: &KeyRecord) -> CoreResult<()>;
    /// The key whose secret hashes to `secret_hash`.
    async fn key_by_secret_hash(&self, secret_hash: &str) -> CoreResult<Option<KeyRecord>>;
    /// One key by id.
    async fn get_key(&self, id: &KeyId) -> CoreResult<Option<KeyRecord>>;
    /// One page of the keys of the tenants `scope` covers, oldest first.
    async fn list_keys(
        &self,
        scope: &TenantScope,
        page: &PageRequest,
    ) -> CoreResult<Page<KeyRecord>>;
    /// Replace a key's spending caps; whether it exists.
    async fn set_key_budget(&self, id: &KeyId, budget: &KeyBudget) -> CoreResult<bool>;
    /// Delete a key; whether it existed.
    async fn delete_key(&self, id: &KeyId) -> CoreResult<bool>;
    /// Write when keys were last used (a batch; times only move later).
    async fn record_key_uses(&self, uses: &[(KeyId, i64)]) -> CoreResult<()>;

    // Template owners (a template without one is shared by every tenant).

    /// The tenant a template is private to.
    async fn template_owner(&self, name: &str) -> CoreResult<Option<Tenant>>;
    /// Every private template and its tenant.
    async fn template_owners(&self) -> CoreResult<BTreeMap<String, Tenant>>;
    /// Claim template name `name` for `tenant` unless another tenant holds it; the owner
    /// after the call (`tenant` when claimed or already its own).
    async fn claim_template(&self, name: &str, tenant: &Tenant) -> CoreResult<Tenant>;
    /// Forget a template's owner (it was deleted).
    async fn forget_template(&self, name: &str) -> CoreResult<()>;
}
