//! Templates seen from the manager: which tenants see which (a template a tenant built is
//! private to it, every other one is shared), the root a sandbox runs (the revision its
//! record names), and old revisions nothing uses any more, collected.

use std::collections::HashSet;
use std::path::PathBuf;

use hutch_template::TemplateInfo;

use super::Manager;
use crate::error::{CoreError, CoreResult};
use crate::model::SandboxRecord;
use crate::tenant::{Tenant, TenantScope};

/// A template as a caller sees it: its description and the tenant it is private to
/// (`None`: shared by every tenant).
#[derive(Debug, Clone)]
pub struct VisibleTemplate {
    /// The template.
    pub info: TemplateInfo,
    /// Its tenant, when private.
    pub tenant: Option<Tenant>,
}

impl Manager {
    /// The templates `scope` sees: the shared ones and its tenant's own.
    pub async fn visible_templates(&self, scope: &TenantScope) -> CoreResult<Vec<VisibleTemplate>> {
        let owners = self.store.template_owners().await?;
        Ok(self
            .templates
            .list()?
            .into_iter()
            .map(|info| VisibleTemplate {
                tenant: owners.get(&info.name).cloned(),
                info,
            })
            .filter(|t| t.tenant.is_none() || scope.allows(t.tenant.as_ref()))
            .collect())
    }

    /// Template `name` if `scope` sees it.
    pub async fn visible_template(
        &self,
        name: &str,
        scope: &TenantScope,
    ) -> CoreResult<Option<VisibleTemplate>> {
        let Some(info) = self.templates.get(name) else {
            return Ok(None);
        };
        let tenant = self.store.template_owner(name).await?;
        Ok((tenant.is_none() || scope.allows(tenant.as_ref()))
            .then_some(VisibleTemplate { info, tenant }))
    }

    /// The tenant template `name` is private to (`None`: shared, or no such template).
    pub async fn template_owner(&self, name: &str) -> CoreResult<Option<Tenant>> {
        self.store.template_owner(name).await
    }

    /// Before a build of template `name` for `tenant` (`None`: an admin's, which may
    /// rebuild any): claim the name for the tenant, or refuse (409) a name that is shared
    /// or another tenant's. Names are one namespace, so the refusal tells a tenant that a
    /// name is taken, never by whom.
    pub async fn claim_template_for_build(
        &self,
        name: &str,
        tenant: Option<&Tenant>,
    ) -> CoreResult<()> {
        let Some(tenant) = tenant else {
            return Ok(());
        };
        let taken = || {
            CoreError::Conflict(format!(
                "the template name {name:?} is taken: choose another name"
            ))
        };
        match self.store.template_owner(name).await? {
            Some(owner) if &owner == tenant => return Ok(()),
            Some(_) => return Err(taken()),
            None if self.templates.get(name).is_some() => {
                return Err(CoreError::Conflict(format!(
                    "template {name:?} is shared by every tenant: only an admin key may rebuild it; build under another name"
                )))
            }
            None => {}
        }
        if &self.store.claim_template(name, tenant).await? != tenant {
            return Err(taken());
        }
        Ok(())
    }

    /// The root filesystem `r` runs: its template's revision that it was created from.
    pub(super) fn template_rootfs(&self, r: &SandboxRecord) -> PathBuf {
        self.templates.rootfs_at(&r.template, r.template_rev)
    }

    /// Delete the old template revisions no sandbox, snapshot or tag uses (at start, and
    /// after a build replaced a template), then the image blobs no revision left records.
    /// Returns how many revisions went.
    pub async fn collect_template_revisions(&self) -> CoreResult<usize> {
        let removed = self.collect_unused_revisions().await?;
        self.collect_blobs().await;
        Ok(removed)
    }

    async fn collect_unused_revisions(&self) -> CoreResult<usize> {
        let names = self.templates.names_with_old_revisions();
        if names.is_empty() {
            return Ok(0);
        }
        let mut used: HashSet<(String, u64)> = HashSet::new();
        for r in self.store.all_sandboxes().await? {
            if let Some(rev) = r.template_rev {
                used.insert((r.template, rev));
            }
        }
        for s in self.store.all_snapshots().await? {
            if let Some(rev) = s.template_rev {
                used.insert((s.template, rev));
            }
        }
        for name in &names {
            for rev in self.templates.tags(name).into_values() {
                used.insert((name.clone(), rev));
            }
        }
        let mut removed = 0;
        for name in names {
            for rev in self.templates.old_revisions(&name) {
                if used.contains(&(name.clone(), rev)) {
                    continue;
                }
                match self.templates.remove_revision(&name, rev) {
                    Ok(true) => {
                        removed += 1;
                        tracing::info!(template = %name, rev, "removed an unused template revision");
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(template = %name, rev, error = %e, "removing a template revision")
                    }
                }
            }
        }
        Ok(removed)
    }
}
