//! Durable volumes: an ext4 image each (its size is the hard limit), mounted on the host
//! while a sandbox that holds processes uses it, bound idmapped into those sandboxes. Data
//! outlives sandboxes and server restarts. A volume is attached read-write to one sandbox or
//! read-only to many; one that is attached cannot be deleted (409).

use std::collections::BTreeSet;
use std::sync::Arc;

use hutch_jail::volume as vol;
use hutch_jail::volume_check as vol_check;
use hutch_proto::client::AgentClient;

use super::{blocking, Manager};
use crate::backend::VolumeAccess;
use crate::error::{CoreError, CoreResult};
use crate::ids;
use crate::model::{Isolation, SandboxRecord, SandboxState};
use crate::store::{Page, PageRequest};
use crate::tenant::{Tenant, TenantScope};
use crate::volume::{VolumeAttachment, VolumeMount, VolumeRecord, VolumeView};

/// Largest volume (1 TiB; the image is sparse).
const MAX_VOLUME_MIB: u64 = 1 << 20;
/// Smallest volume ext4 accepts comfortably.
const MIN_VOLUME_MIB: u64 = 4;
/// How long a `vm` guest may take to flush its volumes before it is stopped anyway.
const VOLUME_SYNC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Mount a volume's image on the host for `ns` sandboxes, checking it first when a `vm` guest
/// may have crafted it (see [`hutch_jail::volume_check`]).
fn mount_on_host(
    id: &str,
    image: &std::path::Path,
    mnt: &std::path::Path,
    read_only: bool,
) -> CoreResult<()> {
    if !vol::is_mounted(mnt).map_err(CoreError::Volume)? && vol_check::needs_check(image) {
        let t0 = std::time::Instant::now();
        let report = vol_check::check_untrusted_image(image, vol_check::CheckMode::Preen)
            .map_err(|e| match e {
                hutch_jail::JailError::VolumeDamaged { .. } => CoreError::Conflict(format!(
                    "volume {id}: {e} (a vm guest wrote it last); repair it with `hutch volume check {id} --repair` (POST /v1/volumes/{id}/check {{\"repair\": true}}) or delete it"
                )),
                e => CoreError::Volume(e),
            })?;
        tracing::info!(volume = %id, repaired = report.repaired, ms = t0.elapsed().as_millis() as u64, "checked a volume a vm guest wrote before mounting it on the host");
    }
    vol::mount_image(image, mnt, read_only).map_err(CoreError::Volume)
}

/// What `POST /v1/volumes/{id}/check` found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VolumeCheckView {
    /// The volume.
    pub id: String,
    /// The check changed the filesystem.
    pub repaired: bool,
    /// The last lines of e2fsck's report.
    pub report: String,
}

/// The states in which a sandbox holds its volumes (counts for exclusivity and deletion).
const HOLDING: [SandboxState; 4] = [
    SandboxState::Starting,
    SandboxState::Running,
    SandboxState::Paused,
    SandboxState::Hibernated,
];
/// The states in which a sandbox has its volumes mounted on the host.
const MOUNTING: [SandboxState; 3] = [
    SandboxState::Starting,
    SandboxState::Running,
    SandboxState::Paused,
];

impl Manager {
    async fn volume_record(&self, key: &str, scope: &TenantScope) -> CoreResult<VolumeRecord> {
        let found = self.store.find_volume(key, scope).await?;
        found.ok_or_else(|| CoreError::NotFound(format!("volume {key} does not exist")))
    }

    async fn attachments(&self, id: &str) -> CoreResult<Vec<VolumeAttachment>> {
        Ok(self
            .store
            .sandboxes_with_volume(id, &HOLDING)
            .await?
            .into_iter()
            .flat_map(|r| {
                r.volumes
                    .iter()
                    .filter(|m| m.volume == id)
                    .map(|m| VolumeAttachment {
                        sandbox: r.id.to_string(),
                        path: m.path.clone(),
                        read_only: m.read_only,
                    })
                    .collect::<Vec<_>>()
            })
            .collect())
    }

    async fn volume_view(&self, v: &VolumeRecord) -> CoreResult<VolumeView> {
        let mnt = self.cfg.volume_dir(&v.id).join("mnt");
        let used_bytes = match vol::is_mounted(&mnt) {
            Ok(true) => vol::usage(&mnt).ok().map(|(used, _)| used),
            _ => None,
        };
        Ok(VolumeView {
            id: v.id.clone(),
            name: v.name.clone(),
            size_mib: v.size_mib,
            created_at: crate::time::rfc3339(v.created_at_ms),
            used_bytes,
            attached: self.attachments(&v.id).await?,
        })
    }

    /// Create a volume of `size_mib` MiB named `name` for `tenant`.
    pub async fn create_volume(
        self: &Arc<Self>,
        name: &str,
        size_mib: u64,
        tenant: Option<Tenant>,
    ) -> CoreResult<VolumeView> {
        let ok_name = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
            && !name.starts_with('.')
            && !name.starts_with("vol_");
        if !ok_name {
            return Err(CoreError::InvalidArgument(format!(
                "volume name {name:?} must be 1-64 characters of [A-Za-z0-9_.-], not starting with '.' or 'vol_'"
            )));
        }
        if !(MIN_VOLUME_MIB..=MAX_VOLUME_MIB).contains(&size_mib) {
            return Err(CoreError::InvalidArgument(format!(
                "size_mib must be between {MIN_VOLUME_MIB} and {MAX_VOLUME_MIB}, got {size_mib}"
            )));
        }
        self.check_state_disk("create a volume")?;
        let _guard = self.lock_snapshots().await;
        if self.store.volume_name_taken(name, tenant.as_ref()).await? {
            return Err(CoreError::Conflict(format!(
                "a volume named {name:?} exists"
            )));
        }
        let record = VolumeRecord {
            id: ids::new_volume_id(),
            name: name.to_string(),
            size_mib,
            created_at_ms: crate::time::now_ms(),
            tenant,
        };
        let dir = self.cfg.volume_dir(&record.id);
        std::fs::create_dir_all(&dir).map_err(CoreError::io("create", &dir))?;
        if let Err(e) = vol::create_image(&dir.join("disk.ext4"), size_mib) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(CoreError::Volume(e));
        }
        crate::crash_points::crash_point("volume.image_made");
        if let Err(e) = self.store.insert_volume(&record).await {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        self.events.publish(
            "volume.created",
            &record.id,
            record.tenant.as_ref().map(|t| t.as_str().to_string()),
            Some(format!("{name}, {size_mib} MiB")),
        );
        self.volume_view(&record).await
    }

    /// One page of the volumes `scope` may see, oldest first.
    pub async fn list_volumes(
        &self,
        scope: &TenantScope,
        page: &PageRequest,
    ) -> CoreResult<Page<VolumeView>> {
        let found = self.store.list_volumes(scope, page).await?;
        let mut items = Vec::with_capacity(found.items.len());
        for v in &found.items {
            items.push(self.volume_view(v).await?);
        }
        Ok(Page {
            items,
            next: found.next,
        })
    }

    /// One volume (by id or name).
    pub async fn get_volume(&self, key: &str, scope: &TenantScope) -> CoreResult<VolumeView> {
        self.volume_view(&self.volume_record(key, scope).await?)
            .await
    }

    /// 409 naming the sandboxes that hold volume `id`, with `then` saying what to do.
    async fn refuse_attached(&self, id: &str, then: &str) -> CoreResult<()> {
        let users: BTreeSet<String> = self
            .attachments(id)
            .await?
            .into_iter()
            .map(|a| a.sandbox)
            .collect();
        if users.is_empty() {
            return Ok(());
        }
        Err(CoreError::Conflict(format!(
            "volume {id} is attached to {}: {then}",
            users.into_iter().collect::<Vec<_>>().join(", ")
        )))
    }

    /// Check a volume's filesystem (`e2fsck -f`, jailed; with `repair`, fixing everything it
    /// can) while no sandbox has it; 409 while attached, or when damage is left.
    pub async fn check_volume(
        self: &Arc<Self>,
        key: &str,
        scope: &TenantScope,
        repair: bool,
    ) -> CoreResult<VolumeCheckView> {
        let v = self.volume_record(key, scope).await?;
        let guard = self.lock_snapshots().await;
        self.refuse_attached(&v.id, "a check needs it detached")
            .await?;
        let mgr = self.clone();
        blocking(move || {
            let _guard = guard;
            let dir = mgr.cfg.volume_dir(&v.id);
            let (image, mnt) = (dir.join("disk.ext4"), dir.join("mnt"));
            vol::unmount_image(&mnt)
                .and_then(|()| vol::wait_released(&image))
                .map_err(CoreError::Volume)?;
            let mode = if repair {
                vol_check::CheckMode::Repair
            } else {
                vol_check::CheckMode::Preen
            };
            let report =
                vol_check::check_untrusted_image(&image, mode).map_err(CoreError::Volume)?;
            Ok(VolumeCheckView {
                id: v.id.to_string(),
                repaired: report.repaired,
                report: report.output,
            })
        })
        .await
    }

    /// Delete a volume and its data; 409 while any sandbox has it.
    pub async fn delete_volume(self: &Arc<Self>, key: &str, scope: &TenantScope) -> CoreResult<()> {
        let v = self.volume_record(key, scope).await?;
        let _guard = self.lock_snapshots().await;
        self.refuse_attached(&v.id, "kill those sandboxes first")
            .await?;
        let dir = self.cfg.volume_dir(&v.id);
        let mnt = dir.join("mnt");
        vol::unmount_image_discarding(&mnt).map_err(CoreError::Volume)?;
        if vol::is_mounted(&mnt).map_err(CoreError::Volume)? {
            return Err(CoreError::Internal(format!(
                "volume {} is still mounted at {}",
                v.id,
                mnt.display()
            )));
        }
        self.store.delete_volume(&v.id).await?;
        let image = dir.join("disk.ext4");
        // The record is gone: what is left is files, removed best effort but never silently
        // (the marker a vm guest's read-write attachment left used to keep the directory).
        let gone = |r: std::io::Result<()>| match r {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.to_string()),
            _ => Ok(()),
        };
        let removed = [
            gone(std::fs::remove_file(&image)),
            vol_check::forget_guest_written(&image).map_err(|e| e.to_string()),
            gone(std::fs::remove_dir(&mnt)),
            gone(std::fs::remove_dir(&dir)),
        ];
        for e in removed.into_iter().filter_map(Result::err) {
            tracing::warn!(volume = %v.id, dir = %dir.display(), error = %e, "volume files left behind");
        }
        self.events.publish(
            "volume.deleted",
            &v.id,
            v.tenant.as_ref().map(|t| t.as_str().to_string()),
            None,
        );
        Ok(())
    }

    /// Validate a create's volume list: volumes exist (for the tenant), paths are valid and
    /// distinct; names become ids.
    pub(super) async fn resolve_volume_mounts(
        &self,
        wanted: &[VolumeMount],
        scope: &TenantScope,
        isolation: Isolation,
    ) -> CoreResult<Vec<VolumeMount>> {
        let most = self.backend(isolation)?.capabilities().volume_slots;
        if wanted.len() > most {
            return Err(CoreError::InvalidArgument(format!(
                "at most {most} volumes per {} sandbox",
                isolation.as_str()
            )));
        }
        let mut paths = BTreeSet::new();
        let mut out = Vec::with_capacity(wanted.len());
        for m in wanted {
            hutch_jail::check_volume_target(&m.path)
                .map_err(|e| CoreError::InvalidArgument(e.to_string()))?;
            if !paths.insert(m.path.clone()) {
                return Err(CoreError::InvalidArgument(format!(
                    "two volumes at {}",
                    m.path
                )));
            }
            let v = self.volume_record(&m.volume, scope).await?;
            if out.iter().any(|o: &VolumeMount| v.id == o.volume) {
                return Err(CoreError::InvalidArgument(format!(
                    "volume {} is listed twice",
                    v.id
                )));
            }
            out.push(VolumeMount {
                volume: v.id.into(),
                path: m.path.clone(),
                read_only: m.read_only,
            });
        }
        Ok(out)
    }

    /// Refuse `r`'s volumes when another sandbox holds one read-write, or holds one at all
    /// when `r` wants it read-write. Call under the snapshots lock, before inserting `r`.
    pub(super) async fn check_volume_exclusive(&self, r: &SandboxRecord) -> CoreResult<()> {
        for m in &r.volumes {
            let others = self.attachments(&m.volume).await?;
            if let Some(w) = others.iter().find(|a| !a.read_only) {
                return Err(CoreError::Conflict(format!(
                    "volume {} is attached read-write to {}",
                    m.volume, w.sandbox
                )));
            }
            if !m.read_only {
                if let Some(a) = others.first() {
                    return Err(CoreError::Conflict(format!(
                        "volume {} is attached (read-only) to {}: attach it read-only, or kill that sandbox",
                        m.volume, a.sandbox
                    )));
                }
            }
        }
        Ok(())
    }

    /// Make `r`'s volumes ready for its backend (blocking). Mounted on the host
    /// ([`VolumeAccess::HostMount`], `ns`): each is mounted (read-only when attached
    /// read-only; an already mounted one is kept). A block device
    /// ([`VolumeAccess::BlockDevice`], `vm`): QEMU opens the image itself, so one attached
    /// read-write must have no host filesystem left.
    pub(super) fn mount_volumes(&self, r: &SandboxRecord) -> CoreResult<()> {
        if r.volumes.is_empty() {
            return Ok(());
        }
        let access = self.backend(r.isolation)?.capabilities().volume_access;
        for m in &r.volumes {
            let dir = self.cfg.volume_dir(&m.volume);
            let (image, mnt) = (dir.join("disk.ext4"), dir.join("mnt"));
            match access {
                VolumeAccess::HostMount => mount_on_host(&m.volume, &image, &mnt, m.read_only)?,
                VolumeAccess::BlockDevice if m.read_only => {}
                // The guest gets raw block access: from here on the image is untrusted input
                // to the host kernel until checked.
                VolumeAccess::BlockDevice => vol::unmount_image(&mnt)
                    .and_then(|()| vol::wait_released(&image))
                    .and_then(|()| vol_check::mark_guest_written(&image))
                    .map_err(CoreError::Volume)?,
            }
        }
        Ok(())
    }

    /// Flush a `vm` guest's page cache to its read-write volumes' images before its memory
    /// is saved or its QEMU killed (a guest keeps written data in memory for up to 30 s).
    /// A paused guest is let run for it (it is about to go).
    pub(super) async fn sync_volumes(&self, r: &SandboxRecord, client: &AgentClient) {
        let Ok(backend) = self.backend(r.isolation) else {
            return;
        };
        let writable = backend.capabilities().volume_access == VolumeAccess::BlockDevice
            && r.volumes.iter().any(|m| !m.read_only);
        if !writable || client.is_closed() {
            return;
        }
        if r.state == SandboxState::Paused {
            let resumed = backend.resume(r).await;
            if let Err(e) = resumed {
                tracing::warn!(id = %r.id, error = %e, "resuming a paused guest to flush its volumes");
                return;
            }
        }
        match tokio::time::timeout(VOLUME_SYNC_TIMEOUT, client.sync()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(id = %r.id, error = %e, "syncing the guest's volumes"),
            Err(_) => tracing::warn!(id = %r.id, "syncing the guest's volumes timed out"),
        }
    }

    /// Unmount volumes no sandbox with processes uses any more (the unmounts on the blocking
    /// pool).
    pub(super) async fn unmount_unused_volumes(&self) {
        let Ok(in_use) = self.store.volumes_in_use(&MOUNTING).await else {
            return;
        };
        let in_use: BTreeSet<String> = in_use.into_iter().collect();
        let Ok(volumes) = self.store.all_volumes().await else {
            return;
        };
        let unused: Vec<(String, std::path::PathBuf)> = volumes
            .into_iter()
            .filter(|v| !in_use.contains(v.id.as_str()))
            .map(|v| {
                let mnt = self.cfg.volume_dir(&v.id).join("mnt");
                (v.id.into(), mnt)
            })
            .collect();
        let _ = blocking(move || {
            for (id, mnt) in unused {
                if let Err(e) = vol::unmount_image(&mnt) {
                    tracing::warn!(volume = %id, error = %e, "unmounting an unused volume");
                }
            }
            Ok(())
        })
        .await;
    }

    /// [`Manager::unmount_unused_volumes`] at server start.
    pub(super) async fn release_volumes(self: &Arc<Self>) {
        self.unmount_unused_volumes().await;
    }
}
