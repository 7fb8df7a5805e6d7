//! Named snapshots: take, list, get, delete; and the reference counting that keeps a
//! snapshot while sandboxes created from it hold disk.
//!
//! A snapshot is written into `<state>/snapshots/.tmp-<id>/` and renamed to `<id>/` once
//! complete, then recorded; a crash leaves only `.tmp-*` directories, which the next start
//! removes together with directories no record names and hidden (fork) snapshots no sandbox
//! uses any more.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use super::{wrong_state, Manager};
use crate::error::{CoreError, CoreResult};
use crate::ids::{self, SandboxId, SnapshotId};
use crate::model::SandboxRecord;
use crate::snapshot::{valid_name, SnapshotDefaults, SnapshotRecord, SnapshotView};
use crate::store::{Page, PageRequest};
use crate::tenant::TenantScope;
use crate::time::now_ms;

/// Prefix of snapshots being written.
const TMP_PREFIX: &str = ".tmp-";

/// Create the snapshots directory, readable by root only: snapshots hold files owned by host
/// ids 0-65535, setuid ones included.
/// Create `dir` (if missing) as a directory only root may enter (0700).
pub(super) fn prepare_dir(dir: &Path) -> CoreResult<()> {
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
        .map_err(CoreError::io("create", dir))
}

fn visible(s: &SnapshotRecord, scope: &TenantScope, include_hidden: bool) -> bool {
    (include_hidden || !s.hidden) && scope.allows(s.tenant_id.as_ref())
}

impl Manager {
    /// Take a snapshot of a running or hibernated sandbox, named `name` (without one, it is
    /// named by its own id). Names need not be unique; a create that names an ambiguous one
    /// is refused ([`Manager::resolve_snapshot`]).
    pub async fn snapshot(
        self: &Arc<Self>,
        id: &SandboxId,
        name: Option<&str>,
    ) -> CoreResult<SnapshotView> {
        if let Some(name) = name.filter(|n| !valid_name(n)) {
            return Err(CoreError::InvalidArgument(format!(
                "snapshot name {name:?} must be 1-64 characters of [A-Za-z0-9._-]"
            )));
        }
        self.load(id).await?;
        let _op = self.op_lock(id).await;
        let r = self.touch(id).await?;
        if !r.state.can_snapshot() {
            return Err(wrong_state(&r, Some("snapshot")));
        }
        self.check_state_disk("take a snapshot")?;
        let s = self.take_snapshot(&r, name, false).await?;
        Ok(s.view(Vec::new()))
    }

    /// Snapshot `r` (its transition lock held and its state checked) and record it, named
    /// `name` or else by its id.
    pub(super) async fn take_snapshot(
        &self,
        r: &SandboxRecord,
        name: Option<&str>,
        hidden: bool,
    ) -> CoreResult<SnapshotRecord> {
        self.take_snapshot_as(r, name, hidden, false).await
    }

    /// [`Manager::take_snapshot`], as a build cache entry when `build` (hidden, and kept).
    pub(super) async fn take_snapshot_as(
        &self,
        r: &SandboxRecord,
        name: Option<&str>,
        hidden: bool,
        build: bool,
    ) -> CoreResult<SnapshotRecord> {
        let t0 = std::time::Instant::now();
        let sid = ids::new_snapshot_id();
        let name = name.unwrap_or(&sid);
        let backend = self.backend(r.isolation)?;
        let tmp = self.snapshot_tmp_dir(&sid)?;
        if backend.capabilities().memory_snapshots {
            // A memory snapshot must not catch the agent mid-session with this server: hang
            // up first (the next call reconnects), so restored copies wait for a new host.
            let quiescing = std::time::Instant::now();
            self.hang_up_agent(backend.clone(), r).await;
            tracing::debug!(id = %r.id, ms = quiescing.elapsed().as_millis() as u64, "snapshot: agent quiesced");
        }
        let taken = match hidden && !build {
            true => backend.fork_snapshot(r, &tmp).await,
            false => backend.snapshot(r, &tmp).await,
        };
        let record = self
            .keep_snapshot(r, (&sid, name), (hidden, build), taken, &tmp)
            .await?;
        tracing::info!(id = %r.id, snapshot = %sid, hidden, bytes = record.size_bytes, ms = t0.elapsed().as_millis() as u64, "snapshot taken");
        self.events.publish(
            "sandbox.snapshotted",
            &r.id,
            r.tenant(),
            Some(if hidden {
                format!("{sid} (for a fork)")
            } else {
                sid.to_string()
            }),
        );
        Ok(record)
    }

    /// A new, empty directory for snapshot `sid` to be written into (renamed into place by
    /// [`Manager::keep_snapshot`]).
    pub(super) fn snapshot_tmp_dir(&self, sid: &SnapshotId) -> CoreResult<std::path::PathBuf> {
        let tmp = self.cfg.snapshots_dir().join(format!("{TMP_PREFIX}{sid}"));
        std::fs::create_dir(&tmp)
            .map_err(|e| CoreError::Internal(format!("create {}: {e}", tmp.display())))?;
        Ok(tmp)
    }

    /// Record what `taken` wrote into `tmp` as snapshot `sid` (named `name`) of `r`, and move
    /// it into place; on any failure (`taken`'s own included) nothing of it is left.
    pub(super) async fn keep_snapshot(
        &self,
        r: &SandboxRecord,
        (sid, name): (&SnapshotId, &str),
        (hidden, build): (bool, bool),
        taken: CoreResult<crate::backend::SnapshotTaken>,
        tmp: &Path,
    ) -> CoreResult<SnapshotRecord> {
        let backend = self.backend(r.isolation)?;
        let dir = self.cfg.snapshot_dir(sid);
        let record = match taken.and_then(|taken| {
            let record = SnapshotRecord {
                id: sid.clone(),
                name: name.to_string(),
                sandbox_id: r.id.to_string(),
                kind: taken.kind,
                isolation: r.isolation,
                template: r.template.clone(),
                template_created_at: self
                    .templates
                    .get_at(&r.template, r.template_rev)
                    .and_then(|t| t.created_at),
                template_rev: r.template_rev,
                size_bytes: taken.size_bytes,
                files: taken.files,
                created_at_ms: now_ms(),
                tenant_id: r.tenant.clone(),
                hidden,
                build,
                defaults: SnapshotDefaults {
                    cpus: r.cpus,
                    memory_mib: r.memory_mib,
                    disk_mib: r.disk_mib,
                    pids_max: r.pids_max,
                    env: r.env.clone(),
                    exec: r.exec_defaults.clone(),
                },
            };
            let manifest =
                serde_json::to_vec_pretty(&record.manifest()).map_err(CoreError::Encode)?;
            std::fs::write(tmp.join("snapshot.json"), manifest)
                .and_then(|()| std::fs::rename(tmp, &dir))
                .map_err(CoreError::io("store the snapshot in", &dir))?;
            crate::crash_points::crash_point("snapshot.written");
            Ok(record)
        }) {
            Ok(record) => self.store.insert_snapshot(&record).await.map(|()| record),
            Err(e) => Err(e),
        };
        match record {
            Ok(rec) => Ok(rec),
            Err(e) => {
                for d in [tmp, dir.as_path()] {
                    if let Err(c) = backend.remove_snapshot(d).await {
                        tracing::error!(dir = %d.display(), error = %c, "removing a failed snapshot");
                    }
                }
                Err(e)
            }
        }
    }

    /// The record of snapshot `id` if `scope` may see it.
    pub(super) async fn snapshot_record(
        &self,
        id: &SnapshotId,
        scope: &TenantScope,
        include_hidden: bool,
    ) -> CoreResult<SnapshotRecord> {
        let missing = || CoreError::NotFound(format!("snapshot {id} does not exist"));
        self.store
            .get_snapshot(id)
            .await?
            .filter(|s| visible(s, scope, include_hidden))
            .ok_or_else(missing)
    }

    /// The id of the snapshot `scope` names `name_or_id`: a snapshot id as it is, else the
    /// one visible snapshot of that name. None → 404; several → 409 listing their ids, so the
    /// caller can pick one.
    pub async fn resolve_snapshot(
        &self,
        name_or_id: &str,
        scope: &TenantScope,
    ) -> CoreResult<String> {
        if let Ok(id) = name_or_id.parse::<SnapshotId>() {
            return Ok(self.snapshot_record(&id, scope, false).await?.id.into());
        }
        let named: Vec<String> = self
            .store
            .snapshots_named(name_or_id, scope)
            .await?
            .into_iter()
            .map(|s| s.id.into())
            .collect();
        match named.as_slice() {
            [] => Err(CoreError::NotFound(format!(
                "no snapshot is named {name_or_id:?} (GET /v1/snapshots lists them)"
            ))),
            [id] => Ok(id.clone()),
            ids => Err(CoreError::Conflict(format!(
                "{} snapshots are named {name_or_id:?}: {}; give the id of the one you mean",
                ids.len(),
                ids.join(", ")
            ))),
        }
    }

    /// Sandboxes that hold disk and were created from snapshot `id` (an indexed lookup).
    pub(super) async fn users_of(&self, id: &str) -> CoreResult<Vec<String>> {
        Ok(self
            .store
            .sandboxes_on_layer(id)
            .await?
            .into_iter()
            .filter(|r| r.state.holds_disk())
            .map(|r| r.id.into())
            .collect())
    }

    /// One snapshot, if `scope` may see it.
    pub async fn get_snapshot(
        &self,
        id: &SnapshotId,
        scope: &TenantScope,
    ) -> CoreResult<SnapshotView> {
        let s = self.snapshot_record(id, scope, false).await?;
        Ok(s.view(self.users_of(id).await?))
    }

    /// One page of the snapshots `scope` may see, oldest first (fork snapshots are not
    /// listed).
    pub async fn list_snapshots(
        &self,
        scope: &TenantScope,
        page: &PageRequest,
    ) -> CoreResult<Page<SnapshotView>> {
        let found = self.store.list_snapshots(scope, page).await?;
        let mut items = Vec::with_capacity(found.items.len());
        for s in found.items {
            let users = self.users_of(&s.id).await?;
            items.push(s.view(users));
        }
        Ok(Page {
            items,
            next: found.next,
        })
    }

    /// Delete a snapshot; refused (409) while sandboxes created from it hold disk.
    pub async fn delete_snapshot(&self, id: &SnapshotId, scope: &TenantScope) -> CoreResult<()> {
        let s = self.snapshot_record(id, scope, false).await?;
        {
            let _snapshots = self.lock_snapshots().await;
            let users = self.users_of(id).await?;
            if !users.is_empty() {
                return Err(CoreError::Conflict(format!(
                    "snapshot {id} is used by sandbox{} {}: delete {} first",
                    if users.len() == 1 { "" } else { "es" },
                    users.join(", "),
                    if users.len() == 1 { "it" } else { "them" },
                )));
            }
            self.store.delete_snapshot(id).await?;
        }
        self.remove_snapshot_dir(&s).await
    }

    pub(super) async fn remove_snapshot_dir(&self, s: &SnapshotRecord) -> CoreResult<()> {
        let backend = self.backend(s.isolation)?;
        backend.remove_snapshot(&self.cfg.snapshot_dir(&s.id)).await
    }

    /// A sandbox stopped holding disk: delete its snapshot if that was a fork's hidden one and
    /// nothing else uses it.
    pub(super) async fn release_layer(&self, layer: Option<&str>) {
        // A layer that is no snapshot id names no snapshot record.
        let Some(Ok(id)) = layer.map(str::parse::<SnapshotId>) else {
            return;
        };
        let id = &id;
        let s = {
            let _snapshots = self.lock_snapshots().await;
            let s = match self.store.get_snapshot(id).await {
                Ok(Some(s)) if s.hidden && !s.build => s,
                _ => return,
            };
            match self.users_of(id).await {
                Ok(users) if users.is_empty() => {}
                _ => return,
            }
            if let Err(e) = self.store.delete_snapshot(id).await {
                tracing::error!(snapshot = %id, error = %e, "forgetting a fork's snapshot");
                return;
            }
            s
        };
        if let Err(e) = self.remove_snapshot_dir(&s).await {
            tracing::error!(snapshot = %id, error = %e, "removing a fork's snapshot");
        }
    }

    /// After a start: remove unfinished snapshot directories, directories no record names, and
    /// fork snapshots nothing uses.
    pub(super) async fn sweep_snapshots(&self) {
        let Ok(records) = self.store.all_snapshots().await else {
            return;
        };
        for s in records.iter().filter(|s| s.hidden && !s.build) {
            self.release_layer(Some(&s.id)).await;
        }
        let Ok(entries) = std::fs::read_dir(self.cfg.snapshots_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let known = records.iter().any(|s| s.id == name);
            if known || !(name.starts_with(TMP_PREFIX) || ids::is_snapshot_id(&name)) {
                continue;
            }
            let path = entry.path();
            tracing::warn!(dir = %path.display(), "removing an unfinished or unrecorded snapshot");
            // A finished one says whose it is (a vm snapshot has shared memory elsewhere).
            let isolation = std::fs::read(path.join("snapshot.json"))
                .ok()
                .and_then(|m| serde_json::from_slice::<serde_json::Value>(&m).ok())
                .and_then(|m| m["isolation"].as_str().map(String::from));
            let isolation = match isolation.as_deref() {
                Some("vm") => crate::model::Isolation::Vm,
                _ => crate::model::Isolation::Ns,
            };
            let Ok(backend) = self.backend(isolation) else {
                continue;
            };
            if let Err(e) = backend.remove_snapshot(&path).await {
                tracing::error!(error = %e, "removing a stray snapshot directory");
            }
        }
    }
}
