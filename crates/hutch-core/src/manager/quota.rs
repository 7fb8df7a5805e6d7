//! Quota admission: every operation that makes a tenant's sandboxes use more (create, fork
//! and explore children, wake, resume) is admitted here first, so concurrent operations
//! never overshoot a quota together.
//!
//! Admission takes the tenant's lock, reads its quotas and what its sandboxes use (one
//! indexed query, `TenancyStore::tenant_usage`), adds what the operations admitted before
//! and not finished yet will add, checks the new operation fits (`tenant::quota`), and
//! records it as pending. A pending operation names its sandbox, whose own row the usage
//! query leaves out, so nothing is counted twice while its record changes state. The
//! operation holds a [`Reservation`] until it ends: dropped (a failure, a refused wake
//! loses nothing) it simply goes; committed (a create that succeeded) it logs the create
//! for `max_creates_per_hour` under the tenant's lock, then goes.
//!
//! Quotas are atomic within one server. A store shared by many hosts must admit in its own
//! transaction instead (a row lock on the tenant); see `docs/teams.md`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::Manager;
use crate::error::{CoreError, CoreResult};
use crate::ids::SandboxId;
use crate::store::tenancy::CREATE_WINDOW_MS;
use crate::tenant::quota::Footprint;
use crate::tenant::Tenant;
use crate::time::now_ms;

/// An operation admitted and not finished.
struct Pending {
    tenant: Tenant,
    sandbox: SandboxId,
    footprint: Footprint,
}

type PendingMap = Arc<Mutex<HashMap<u64, Pending>>>;

/// The admitted operations and one lock per tenant.
#[derive(Default)]
pub(super) struct QuotaLedger {
    locks: Mutex<HashMap<Tenant, Arc<tokio::sync::Mutex<()>>>>,
    pending: PendingMap,
    next: AtomicU64,
}

impl QuotaLedger {
    fn lock_of(&self, tenant: &Tenant) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(tenant.clone())
            .or_default()
            .clone()
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Pending>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `tenant` has operations admitted and not finished.
    fn busy(&self, tenant: &Tenant) -> bool {
        self.pending().values().any(|p| &p.tenant == tenant)
    }
}

/// An admitted operation; dropping it ends its claim (see the module docs).
#[must_use = "an admission lasts while its reservation is held"]
pub(super) struct Reservation {
    pending: PendingMap,
    token: u64,
    tenant: Tenant,
    creates: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.token);
    }
}

/// Whether an operation's tenant must have a record: a create must (it is refused for a
/// tenant nobody made); a wake or resume of a sandbox whose tenant has none just has no
/// quotas (it is never stranded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TenantRecordNeeded {
    Yes,
    No,
}

impl Manager {
    /// Admit `footprint` for sandbox `sandbox` of `tenant` (`None`: an admin's sandbox of
    /// no tenant, never limited). `QuotaExceeded` when it does not fit.
    pub(super) async fn admit(
        &self,
        tenant: Option<&Tenant>,
        sandbox: &SandboxId,
        footprint: Footprint,
        needed: TenantRecordNeeded,
    ) -> CoreResult<Option<Reservation>> {
        let Some(tenant) = tenant else {
            return Ok(None);
        };
        let lock = self.quota.lock_of(tenant);
        let _held = lock.lock().await;
        let quotas = match self.store.get_tenant(tenant).await? {
            Some(t) => Some(t.settings.quotas),
            None if needed == TenantRecordNeeded::Yes => {
                return Err(missing_tenant(tenant));
            }
            None => None,
        };
        if let Some(quotas) = quotas {
            let (excluding, admitted) = {
                let pending = self.quota.pending();
                let mine: Vec<&Pending> =
                    pending.values().filter(|p| &p.tenant == tenant).collect();
                let mut excluding: Vec<SandboxId> =
                    mine.iter().map(|p| p.sandbox.clone()).collect();
                excluding.push(sandbox.clone());
                let admitted = mine
                    .iter()
                    .fold(crate::tenant::quota::TenantUsage::default(), |u, p| {
                        u.plus(&p.footprint)
                    });
                (excluding, admitted)
            };
            let stored = self
                .store
                .tenant_usage(tenant, &excluding, now_ms() - CREATE_WINDOW_MS)
                .await?;
            let usage = crate::tenant::quota::TenantUsage {
                sandboxes: stored.sandboxes + admitted.sandboxes,
                cpus: stored.cpus + admitted.cpus,
                memory_mib: stored.memory_mib + admitted.memory_mib,
                creates_last_hour: stored.creates_last_hour + admitted.creates_last_hour,
            };
            quotas.check_usage(tenant, &usage, &footprint)?;
        }
        let token = self.quota.next.fetch_add(1, Ordering::Relaxed);
        self.quota.pending().insert(
            token,
            Pending {
                tenant: tenant.clone(),
                sandbox: sandbox.clone(),
                footprint,
            },
        );
        Ok(Some(Reservation {
            pending: self.quota.pending.clone(),
            token,
            tenant: tenant.clone(),
            creates: footprint.creates,
        }))
    }

    /// End an admitted operation that succeeded: its creates are logged (under the
    /// tenant's lock, so no admission counts them both logged and pending).
    pub(super) async fn commit(&self, reservation: Option<Reservation>) {
        let Some(r) = reservation else {
            return;
        };
        if r.creates == 0 {
            return;
        }
        let lock = self.quota.lock_of(&r.tenant);
        let _held = lock.lock().await;
        let now = now_ms();
        for _ in 0..r.creates {
            if let Err(e) = self.store.record_create(&r.tenant, now).await {
                tracing::warn!(tenant = %r.tenant, error = %e, "logging a create for the hourly quota");
            }
        }
        drop(r);
    }

    /// Run `f` under `tenant`'s quota lock if no operation of it is admitted and not
    /// finished (`Conflict` otherwise): deleting a tenant cannot race its creates.
    pub(super) async fn with_tenant_quiet<T>(
        &self,
        tenant: &Tenant,
        f: impl std::future::Future<Output = CoreResult<T>>,
    ) -> CoreResult<T> {
        let lock = self.quota.lock_of(tenant);
        let _held = lock.lock().await;
        if self.quota.busy(tenant) {
            return Err(CoreError::Conflict(format!(
                "tenant {tenant} has sandboxes being created or woken: try again when they are done"
            )));
        }
        f.await
    }
}

/// The 404 of a create for a tenant nobody made.
pub(super) fn missing_tenant(tenant: &Tenant) -> CoreError {
    CoreError::NotFound(format!(
        "tenant {tenant} does not exist (an admin makes it: POST /v1/tenants)"
    ))
}
