//! Template revisions seen from the manager: the root a sandbox runs is the revision its
//! record names, and old revisions nothing uses any more are collected.

use std::collections::HashSet;
use std::path::PathBuf;

use super::Manager;
use crate::error::CoreResult;
use crate::model::SandboxRecord;

impl Manager {
    /// The root filesystem `r` runs: its template's revision that it was created from.
    pub(super) fn template_rootfs(&self, r: &SandboxRecord) -> PathBuf {
        self.templates.rootfs_at(&r.template, r.template_rev)
    }

    /// Delete the old template revisions no sandbox and no snapshot uses (at start, and after
    /// a build replaced a template). Returns how many went.
    pub async fn collect_template_revisions(&self) -> CoreResult<usize> {
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
