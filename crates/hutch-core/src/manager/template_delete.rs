//! Deleting a template (`DELETE /v1/templates/{name}`): refused while anything still
//! stands on its root filesystem.
//!
//! A template's root is the lower layer of every sandbox created from it and of every
//! snapshot taken of one, so it may go only when none is left. Build cache snapshots
//! (`hutch-build`'s step results over the template) are a cache: they are deleted with it,
//! and a later build misses them and runs its steps again. Warm `vm` guests of the template
//! are retired like those of a rebuilt one.

use super::Manager;
use crate::error::{CoreError, CoreResult};
use crate::model::SandboxState;

/// Most users named in a refusal (the rest are counted).
const NAMED_USERS: usize = 10;

impl Manager {
    /// Delete template `name` (built-in names too: a server rebuilds `minimal` and `base`
    /// on its next start). `NotFound` when there is no such template; `Conflict` naming
    /// the sandboxes and snapshots that use it. A create racing with the delete may still
    /// find the template gone under it: it fails as for an unknown template.
    pub async fn delete_template(&self, name: &str) -> CoreResult<()> {
        if self.templates.get(name).is_none() {
            // A tenant's claim on a name whose first build never finished goes with it.
            if self.store.template_owner(name).await?.is_some() {
                self.store.forget_template(name).await?;
                return Ok(());
            }
            return Err(CoreError::NotFound(format!(
                "template {name:?} does not exist"
            )));
        }
        let build_snapshots = {
            let _snapshots = self.lock_snapshots().await;
            let sandboxes: Vec<String> = self
                .store
                .all_sandboxes()
                .await?
                .into_iter()
                .filter(|r| r.template == name && r.state != SandboxState::Pooled)
                .map(|r| r.id.to_string())
                .collect();
            let all = self.store.all_snapshots().await?;
            let snapshots: Vec<String> = all
                .iter()
                .filter(|s| s.template == name && !s.build && !s.hidden)
                .map(|s| s.id.to_string())
                .collect();
            if !sandboxes.is_empty() || !snapshots.is_empty() {
                return Err(CoreError::Conflict(in_use_message(
                    name, &sandboxes, &snapshots,
                )));
            }
            all.into_iter()
                .filter(|s| s.template == name && s.build)
                .collect::<Vec<_>>()
        };
        for s in build_snapshots {
            if let Err(e) = self.delete_build_snapshot(&s.id).await {
                tracing::warn!(snapshot = %s.id, template = name, error = %e, "deleting a build cache snapshot of a deleted template");
            }
        }
        let templates = self.templates.clone();
        let owned = name.to_string();
        let removed = super::blocking(move || Ok(templates.remove(&owned)?)).await?;
        if !removed {
            return Err(CoreError::NotFound(format!(
                "template {name:?} does not exist"
            )));
        }
        self.store.forget_template(name).await?;
        // Its warm guests no longer match a template build: they go.
        self.retire_warm().await;
        tracing::info!(template = name, "template deleted");
        self.collect_blobs().await;
        Ok(())
    }

    /// Delete the image blobs no template records any more (logged; a failure is only
    /// logged: the blobs stay for the next collection).
    pub async fn collect_blobs(&self) {
        let templates = self.templates.clone();
        match tokio::task::spawn_blocking(move || templates.collect_blobs()).await {
            Ok(Ok(sweep)) if sweep.removed > 0 => tracing::info!(
                blobs = sweep.removed,
                bytes = sweep.bytes,
                "removed image blobs no template uses"
            ),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "collecting image blobs"),
            Err(e) => tracing::warn!(error = %e, "collecting image blobs"),
        }
    }
}

/// `template "x" is in use by sandboxes sbx_a, sbx_b and snapshot snap_c: …`.
fn in_use_message(name: &str, sandboxes: &[String], snapshots: &[String]) -> String {
    let list = |one: &str, many: &str, ids: &[String]| -> Option<String> {
        if ids.is_empty() {
            return None;
        }
        let what = if ids.len() == 1 { one } else { many };
        let mut shown = ids
            .iter()
            .take(NAMED_USERS)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if ids.len() > NAMED_USERS {
            shown.push_str(&format!(" and {} more", ids.len() - NAMED_USERS));
        }
        Some(format!("{what} {shown}"))
    };
    let users: Vec<String> = [
        list("sandbox", "sandboxes", sandboxes),
        list("snapshot", "snapshots", snapshots),
    ]
    .into_iter()
    .flatten()
    .collect();
    format!(
        "template {name:?} is in use by {}: delete them first (DELETE /v1/sandboxes/{{id}}, DELETE /v1/snapshots/{{id}})",
        users.join(" and ")
    )
}

#[cfg(test)]
mod tests {
    use super::in_use_message;
    use crate::backend::fake::start_manager;
    use crate::error::CoreError;
    use crate::model::CreateSandbox;
    use crate::tenant::TenantScope;

    #[tokio::test]
    async fn a_template_in_use_is_kept_and_an_unused_one_deleted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mgr, _fake) = start_manager(dir.path()).await.expect("manager");
        let id = mgr
            .create(CreateSandbox::default())
            .await
            .expect("create")
            .id;
        let snap = mgr.snapshot(&id, Some("keep")).await.expect("snapshot");
        match mgr.delete_template("minimal").await {
            Err(CoreError::Conflict(m)) => {
                assert!(m.contains(&format!("sandbox {id}")), "{m}");
                assert!(m.contains(&format!("snapshot {}", snap.id)), "{m}");
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert!(mgr.templates().get("minimal").is_some(), "kept");
        mgr.kill(&id).await.expect("kill");
        match mgr.delete_template("minimal").await {
            Err(CoreError::Conflict(m)) => {
                assert!(!m.contains("by sandbox"), "{m}");
                assert!(m.contains(&format!("snapshot {}", snap.id)), "{m}");
            }
            other => panic!("expected a conflict over the snapshot, got {other:?}"),
        }
        mgr.delete_snapshot(&snap.id, &TenantScope::All)
            .await
            .expect("delete the snapshot");
        mgr.delete_template("minimal").await.expect("delete");
        assert!(mgr.templates().get("minimal").is_none(), "deleted");
        match mgr.delete_template("minimal").await {
            Err(CoreError::NotFound(m)) => {
                assert_eq!(m, "template \"minimal\" does not exist")
            }
            other => panic!("expected not found, got {other:?}"),
        }
    }

    #[test]
    fn the_refusal_names_the_users_and_counts_the_rest() {
        let one = in_use_message("web", &["sbx_a".into()], &[]);
        assert_eq!(
            one,
            "template \"web\" is in use by sandbox sbx_a: delete them first (DELETE /v1/sandboxes/{id}, DELETE /v1/snapshots/{id})"
        );
        let many: Vec<String> = (0..12).map(|i| format!("sbx_{i}")).collect();
        let text = in_use_message("web", &many, &["snap_x".into()]);
        assert!(
            text.contains("sandboxes sbx_0, sbx_1, sbx_2, sbx_3, sbx_4, sbx_5, sbx_6, sbx_7, sbx_8, sbx_9 and 2 more and snapshot snap_x"),
            "{text}"
        );
    }
}
