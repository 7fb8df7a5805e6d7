//! API keys seen from the manager: the admin key made at first start, making, listing and
//! revoking keys, looking a secret up, and when each key was last used.
//!
//! A key's last use is noted in memory on every request ([`Manager::note_key_use`]) and
//! written in batches with the TTL refreshes (`refresh.rs`), never one database write per
//! request; listings show the newer of the written and the noted time.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{write_secret, Manager};
use crate::error::{CoreError, CoreResult};
use crate::ids::KeyId;
use crate::store::{Page, PageRequest};
use crate::tenant::keys::{hash_secret, KeyBudget, KeyFormat, KeyRecord, KeyScope, NewKey};
use crate::tenant::{Tenant, TenantScope, ADMIN_TENANT};
use crate::time::now_ms;

/// A key just made: its secret (shown this once) and its record.
#[derive(Debug, Clone)]
pub struct CreatedKey {
    /// The secret, to hand to the client; the store keeps only its hash.
    pub secret: String,
    /// Its record.
    pub key: KeyRecord,
}

/// Last uses of keys not written to the store yet.
#[derive(Default)]
pub(super) struct KeyUses {
    pending: Mutex<HashMap<KeyId, i64>>,
}

impl KeyUses {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<KeyId, i64>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Manager {
    /// Make sure an admin key exists; returns it (the one in `<state>/admin.key`, made now
    /// when there is none the store knows).
    pub async fn ensure_admin_key(&self) -> CoreResult<String> {
        let path = self.admin_key_path();
        if let Ok(existing) = std::fs::read_to_string(&path) {
            let key = existing.trim().to_string();
            if self
                .store
                .key_by_secret_hash(&hash_secret(&key))
                .await?
                .is_some()
            {
                return Ok(key);
            }
        }
        let created = self
            .insert_key(&NewKey {
                tenant: Tenant::new(ADMIN_TENANT),
                scope: KeyScope::Admin,
                name: Some("admin key made at first start".into()),
                selector: Default::default(),
                expires_at_ms: None,
                format: KeyFormat::Hutch,
                budget: KeyBudget::default(),
            })
            .await?;
        write_secret(&path, &created.secret)?;
        Ok(created.secret)
    }

    /// Make a key as asked (already narrowed to what its maker may grant). A tenant key's
    /// tenant must exist (404 otherwise); admin keys belong to no tenant but `admin`.
    pub async fn create_key(&self, new: NewKey) -> CoreResult<CreatedKey> {
        new.validate()?;
        if new.expires_at_ms.is_some_and(|at| at <= now_ms()) {
            return Err(CoreError::InvalidArgument(
                "expires_at must be in the future".into(),
            ));
        }
        let new = if new.scope == KeyScope::Admin {
            NewKey {
                tenant: Tenant::new(ADMIN_TENANT),
                ..new
            }
        } else {
            self.tenant(&new.tenant).await?;
            new
        };
        self.insert_key(&new).await
    }

    async fn insert_key(&self, new: &NewKey) -> CoreResult<CreatedKey> {
        let secret = new.format.generate();
        let key = new.record(&secret, now_ms());
        self.store.insert_key(&hash_secret(&secret), &key).await?;
        tracing::info!(key = %key.id, tenant = %key.tenant, scope = key.scope.as_str(), "API key created");
        Ok(CreatedKey { secret, key })
    }

    /// The key a secret belongs to, if any (expired ones too: the caller says why it
    /// refuses them). One lookup by the secret's SHA-256.
    pub async fn authenticate(&self, secret: &str) -> CoreResult<Option<KeyRecord>> {
        self.store.key_by_secret_hash(&hash_secret(secret)).await
    }

    /// Note that key `id` was used now (written in the next batch).
    pub fn note_key_use(&self, id: &KeyId) {
        let now = now_ms();
        let mut pending = self.key_uses.lock();
        let at = pending.entry(id.clone()).or_insert(now);
        *at = (*at).max(now);
    }

    /// Write the noted key uses in one batch (kept for the next try on failure).
    pub(super) async fn flush_key_uses(&self) {
        let batch: Vec<(KeyId, i64)> = self.key_uses.lock().drain().collect();
        if batch.is_empty() {
            return;
        }
        if let Err(e) = self.store.record_key_uses(&batch).await {
            tracing::warn!(keys = batch.len(), error = %e, "writing key uses (kept for the next try)");
            let mut pending = self.key_uses.lock();
            for (id, at) in batch {
                let t = pending.entry(id).or_insert(at);
                *t = (*t).max(at);
            }
        }
    }

    /// `k` with its last use noted but not written yet.
    fn with_pending_use(&self, mut k: KeyRecord) -> KeyRecord {
        if let Some(at) = self.key_uses.lock().get(&k.id) {
            k.last_used_ms = k.last_used_ms.max(Some(*at));
        }
        k
    }

    /// One page of the keys of the tenants `scope` covers.
    pub async fn list_keys(
        &self,
        scope: &TenantScope,
        page: &PageRequest,
    ) -> CoreResult<Page<KeyRecord>> {
        Ok(self
            .store
            .list_keys(scope, page)
            .await?
            .map(|k| self.with_pending_use(k)))
    }

    /// Key `id` if `scope` covers its tenant (404 otherwise, as for an unknown id).
    pub async fn get_key(&self, id: &KeyId, scope: &TenantScope) -> CoreResult<KeyRecord> {
        self.store
            .get_key(id)
            .await?
            .filter(|k| scope.allows(Some(&k.tenant)))
            .map(|k| self.with_pending_use(k))
            .ok_or_else(|| CoreError::NotFound(format!("API key {id} does not exist")))
    }

    /// Set key `id`'s spending caps, as key `setter` asks: an admin key sets any key's; a
    /// tenant's `full` key sets those of the other keys of its tenant, never its own (a
    /// key cannot raise its own cap), and no higher than its own.
    pub async fn set_key_budget(
        &self,
        id: &KeyId,
        budget: KeyBudget,
        setter: &KeyRecord,
        scope: &TenantScope,
    ) -> CoreResult<KeyRecord> {
        let key = self.get_key(id, scope).await?;
        if !setter.is_admin() {
            if setter.id == key.id {
                return Err(CoreError::Forbidden(
                    "a key cannot change its own budget: ask an admin or another full key of its tenant".into(),
                ));
            }
            if setter.scope != KeyScope::Full {
                return Err(CoreError::Forbidden(
                    "only full and admin keys set budgets".into(),
                ));
            }
            if !budget.within(&setter.budget) {
                return Err(CoreError::Forbidden(
                    "this key cannot give another key a larger budget than its own".into(),
                ));
            }
        }
        if !self.store.set_key_budget(id, &budget).await? {
            return Err(CoreError::NotFound(format!("API key {id} does not exist")));
        }
        tracing::info!(key = %id, ?budget, "API key budget set");
        self.get_key(id, scope).await
    }

    /// Delete key `id` (within `scope`); it stops working at once for new requests. Returns
    /// the record it had.
    pub async fn revoke_key(&self, id: &KeyId, scope: &TenantScope) -> CoreResult<KeyRecord> {
        let key = self.get_key(id, scope).await?;
        if !self.store.delete_key(id).await? {
            return Err(CoreError::NotFound(format!("API key {id} does not exist")));
        }
        self.key_uses.lock().remove(id);
        tracing::info!(key = %id, tenant = %key.tenant, "API key revoked");
        Ok(key)
    }
}
