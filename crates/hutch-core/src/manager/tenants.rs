//! Tenants seen from the manager: making, changing and deleting them, and what a tenant's
//! record means for its creates (defaults, allowed and visible templates, size and TTL
//! limits). Quota admission is `quota.rs`.

use super::quota::missing_tenant;
use super::Manager;
use crate::error::{CoreError, CoreResult};
use crate::ids::KeyId;
use crate::model::CreateSandbox;
use crate::store::{Page, PageRequest};
use crate::tenant::quota::TenantUsage;
use crate::tenant::settings::{TenantRecord, TenantSettings, TenantUpdate};
use crate::tenant::Tenant;
use crate::time::now_ms;

impl Manager {
    /// Make tenant `name` with `settings` (`Conflict` when it exists).
    pub async fn create_tenant(
        &self,
        name: Tenant,
        settings: TenantSettings,
    ) -> CoreResult<TenantRecord> {
        self.check_tenant_settings(&settings)?;
        let record = TenantRecord {
            name,
            settings,
            created_at_ms: now_ms(),
        };
        self.store.insert_tenant(&record).await?;
        tracing::info!(tenant = %record.name, "tenant created");
        Ok(record)
    }

    fn check_tenant_settings(&self, settings: &TenantSettings) -> CoreResult<()> {
        settings.validate()?;
        if let Some(spec) = &settings.defaults.network {
            self.requested_policy(Some(spec)).map_err(|e| match e {
                CoreError::InvalidArgument(m) => {
                    CoreError::InvalidArgument(format!("defaults.network: {m}"))
                }
                other => other,
            })?;
        }
        Ok(())
    }

    /// Tenant `name` (404 when there is none).
    pub async fn tenant(&self, name: &Tenant) -> CoreResult<TenantRecord> {
        self.store
            .get_tenant(name)
            .await?
            .ok_or_else(|| missing_tenant(name))
    }

    /// What tenant `name`'s sandboxes use now, as its quotas count it.
    pub async fn tenant_usage(&self, name: &Tenant) -> CoreResult<TenantUsage> {
        self.tenant(name).await?;
        self.store
            .tenant_usage(
                name,
                &[],
                now_ms() - crate::store::tenancy::CREATE_WINDOW_MS,
            )
            .await
    }

    /// One page of tenants, oldest first.
    pub async fn list_tenants(&self, page: &PageRequest) -> CoreResult<Page<TenantRecord>> {
        self.store.list_tenants(page).await
    }

    /// Change tenant `name`'s settings. New quotas apply to the next operations; nothing
    /// running is stopped.
    pub async fn update_tenant(
        &self,
        name: &Tenant,
        update: &TenantUpdate,
    ) -> CoreResult<TenantRecord> {
        let mut record = self.tenant(name).await?;
        let settings = update.apply(&record.settings);
        self.check_tenant_settings(&settings)?;
        record.settings = settings;
        self.store.update_tenant(&record).await?;
        tracing::info!(tenant = %name, "tenant changed");
        Ok(record)
    }

    /// Delete tenant `name` and its keys: `Conflict` while it owns a sandbox, snapshot,
    /// volume or template, or has a create or wake in flight. Returns the deleted keys' ids
    /// (the server closes what they hold open).
    pub async fn delete_tenant(&self, name: &Tenant) -> CoreResult<Vec<KeyId>> {
        let keys = self
            .with_tenant_quiet(name, self.store.delete_tenant(name))
            .await?;
        tracing::info!(tenant = %name, keys = keys.len(), "tenant deleted");
        Ok(keys)
    }

    /// `cmd` with what its tenant's record fills in where the request left settings out.
    pub(super) fn apply_tenant_defaults(cmd: &CreateSandbox, t: &TenantRecord) -> CreateSandbox {
        let d = &t.settings.defaults;
        let mut cmd = cmd.clone();
        cmd.ttl_seconds = cmd.ttl_seconds.or(d.ttl_seconds);
        cmd.cpus = cmd.cpus.or(d.cpus);
        cmd.memory_mib = cmd.memory_mib.or(d.memory_mib);
        cmd.disk_mib = cmd.disk_mib.or(d.disk_mib);
        if cmd.network.is_none() {
            cmd.network = d.network.clone();
        }
        if cmd.isolation == crate::model::IsolationRequest::Auto {
            cmd.isolation = d.isolation.unwrap_or(cmd.isolation);
        }
        cmd
    }

    /// `Forbidden` unless tenant `t` may create sandboxes from `template`; `NotFound` (the
    /// words of an unknown template) when the template is another tenant's.
    pub(super) async fn check_template_for(
        &self,
        t: Option<&TenantRecord>,
        template: &str,
    ) -> CoreResult<()> {
        let Some(t) = t else {
            return Ok(());
        };
        if let Some(owner) = self.store.template_owner(template).await? {
            if owner != t.name {
                return Err(CoreError::NotFound(
                    self.unknown_template_message(template, Some(&t.name)).await,
                ));
            }
        }
        if !t.settings.allows_template(template) {
            let allowed = t.settings.allowed_templates.clone().unwrap_or_default();
            return Err(CoreError::Forbidden(format!(
                "tenant {} may create sandboxes only from the templates {}: not {template:?}",
                t.name,
                if allowed.is_empty() {
                    "(none)".to_string()
                } else {
                    allowed.join(", ")
                }
            )));
        }
        Ok(())
    }
}
