//! Restoring a guest: the path of every create, wake and warm guest.
//!
//! A restore is prepared on the blocking pool (the guest's TAP, its directory and records,
//! the overlay of its disk — a copy of a snapshot's, or a qcow2 overlay over the bake's —,
//! its volume slots and its QEMU's cgroups), then QEMU is restored from the bake's (or the
//! snapshot's, or the hibernated) memory and the agent gets the sandbox's identity. A failure
//! after the cgroups were made gives them back; QEMU is killed when its guest is dropped.

use std::path::{Path, PathBuf};
use std::time::Instant;

use hutch_proto::IdentityRequest;
use hutch_vm::disk::{self, RootDisk};
use hutch_vm::snapshot::{self, Snapshot};

use super::{
    create_private_dir, give_to, kvm_gid, resize, volumes, VmBackend, ENTROPY_BYTES, MEMORY_GID,
    QEMU_OVERHEAD_MIB, QEMU_PIDS_MAX, RESTORE_TIMEOUT, SNAPSHOT_DISK, SNAPSHOT_STATE,
};
use crate::backend::ns::UID_RANGE;
use crate::backend::{blocking, Started};
use crate::error::{CoreError, CoreResult};
use crate::model::SandboxRecord;

/// Everything made on the host for one restore before QEMU starts.
struct Prepared {
    /// The bake's (or the saved) state, with this guest's TAP, volumes and memory file.
    snap: Snapshot,
    /// The guest's network settings (its TAP is in `snap`).
    guest_net: Option<hutch_proto::GuestNetwork>,
    /// What the agent mounts and detaches.
    volume_plan: volumes::Plan,
    /// The sandbox's directory (QEMU's sockets and console).
    dir: PathBuf,
    /// Its root disk, chain as the host made it.
    root_disk: RootDisk,
    /// Bytes to grow the disk to once the guest runs.
    grow: Option<u64>,
    /// The disk size the sandbox really gets.
    disk_mib: u64,
    /// QEMU's cgroups.
    cgroups: Vec<PathBuf>,
    /// QEMU's jail.
    jail: hutch_vm::qemu::QemuJail,
    /// When preparing started.
    t0: Instant,
}

impl VmBackend {
    /// Identity of a freshly restored guest: the sandbox's hostname and environment, host
    /// entropy (the agent reseeds the CRNG with it) and the wall clock.
    pub(super) fn identity(r: &SandboxRecord) -> CoreResult<IdentityRequest> {
        let mut entropy = vec![0u8; ENTROPY_BYTES];
        getrandom::fill(&mut entropy)
            .map_err(|e| CoreError::Internal(format!("host entropy: {e}")))?;
        let mut env = std::collections::BTreeMap::new();
        env.insert(
            "PATH".to_string(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        );
        env.insert("LANG".to_string(), "C.UTF-8".to_string());
        env.insert("HUTCH_SANDBOX_ID".to_string(), r.id.to_string());
        env.extend(r.env.clone());
        Ok(IdentityRequest {
            hostname: Some(r.id.replace('_', "-")),
            env,
            entropy,
            unix_time_ms: Some(crate::time::now_ms().max(0) as u64),
            ..IdentityRequest::default()
        })
    }

    /// Start the sandbox's guest: from the template's bake onto a new overlay (`woken:
    /// None`, a create), or from the memory it was hibernated with onto its kept overlay.
    ///
    /// A `warm` guest (for the pool, `warm.rs`) gets the record's identity without its
    /// network, runs the first programs once and is left paused.
    pub(super) async fn restore(
        &self,
        r: &SandboxRecord,
        rootfs: &Path,
        woken: Option<PathBuf>,
        warm: bool,
    ) -> CoreResult<Started> {
        let (boot, image, snap) = self.bake_of(r, rootfs).await?;
        let kvm = self.assets().await.config().accel == hutch_vm::qemu::Accel::Kvm;
        let woken_disk = woken.is_some();
        let prepared = {
            let (this, rec) = (self.clone(), r.clone());
            blocking(move || {
                // In use: keep them from garbage collection (gc.rs).
                for used in [
                    boot.vmlinux.parent(),
                    Some(image.as_path()),
                    snap.state.parent(),
                ] {
                    used.map(hutch_vm::gc::touch);
                }
                this.prepare_restore(&rec, snap, woken, kvm)
            })
            .await?
        };
        let cgroups = prepared.cgroups.clone();
        match self.run_restored(r, prepared, woken_disk, warm).await {
            Ok(started) => Ok(started),
            Err(e) => {
                let id = r.id.clone();
                let released = blocking(move || {
                    hutch_jail::release_process_cgroups(&id, &cgroups)
                        .map_err(|e| CoreError::Internal(format!("QEMU cgroups: {e}")))
                })
                .await;
                if let Err(c) = released {
                    tracing::error!(id = %r.id, error = %c, "releasing QEMU cgroups after a failed create");
                }
                Err(e)
            }
        }
    }

    /// The host side of a restore (blocking): TAP, directory, disk, volumes, cgroups.
    fn prepare_restore(
        &self,
        r: &SandboxRecord,
        mut snap: Snapshot,
        woken: Option<PathBuf>,
        kvm: bool,
    ) -> CoreResult<Prepared> {
        let woken_disk = woken.is_some();
        let guest_net = self.guest_network(r)?;
        snap.config.tap = guest_net.as_ref().map(|(_, tap)| tap.clone());
        let volume_plan = volumes::plan(&self.cfg, r)?;
        snap.config.volumes = volume_plan.drives.clone();
        let t0 = Instant::now();
        let dir = self.dir(&r.id);
        let uid = r.uid_slot * UID_RANGE;
        create_private_dir(&dir, uid)?;
        self.create_records_dir(&r.id)?;
        volumes::grant(&volume_plan, uid)?;
        let overlay = dir.join("disk.qcow2");
        // The disk's chain comes from the host's records, never from the overlay's header
        // (records.rs).
        let root_disk = match (woken, &r.layer) {
            // Same command line (devices, memory file); all of the guest's RAM and device
            // state come from the saved stream, its disk is its own overlay as it was.
            (Some(saved), _) => {
                snap.state = saved;
                snap.ram_in_memory_file = false;
                self.recorded_disk(&r.id, &overlay)?
            }
            // From a vm snapshot (or as a fork child): its memory, and a private copy of its
            // disk (the snapshot directory is root-only; the copy holds only the blocks the
            // sandbox had written, backed by the bake's disk).
            (None, Some(layer)) => {
                let from = self.cfg.snapshot_dir(layer);
                match hutch_vm::share::shared_dir(&from) {
                    // Its RAM in a shared memory file, mapped copy-on-write (share.rs).
                    Some(shared) => {
                        hutch_vm::gc::touch(&shared);
                        snap.config.memory_file = shared.join("memory");
                        snap.config.huge_page_align = self.on_fork_memory(&shared);
                        snap.state = shared.join("state");
                    }
                    None => {
                        snap.state = from.join(SNAPSHOT_STATE);
                        snap.ram_in_memory_file = false;
                    }
                }
                let disk = self.snapshot_disk(&from, &overlay)?;
                std::fs::copy(from.join(SNAPSHOT_DISK), &overlay).map_err(|e| {
                    CoreError::Internal(format!("copy the disk of snapshot {layer}: {e}"))
                })?;
                give_to(&overlay, uid, 0o600)?;
                self.record_disk(&r.id, &disk)?;
                disk
            }
            (None, None) => {
                let base = snap
                    .config
                    .root_disk
                    .as_ref()
                    .ok_or_else(|| CoreError::Internal("bake without a root disk".into()))?;
                let disk = base
                    .overlay_at(&overlay)
                    .map_err(|e| CoreError::from(hutch_vm::VmError::from(e)))?;
                give_to(&overlay, uid, 0o600)?;
                self.record_disk(&r.id, &disk)?;
                disk
            }
        };
        // A woken guest keeps its disk as it was; others grow to `disk_mib` (resize.rs).
        let (grow, disk_mib) = match (woken_disk, disk::qcow2_virtual_size(&overlay)) {
            (false, Some(current)) => resize::plan(r.disk_mib, current),
            _ => (None, r.disk_mib),
        };
        let cgroups = hutch_jail::create_process_cgroups(
            &self.cfg.cgroup_parent,
            &r.id,
            &hutch_jail::Limits {
                memory_bytes: (r.memory_mib + QEMU_OVERHEAD_MIB) << 20,
                cpu_millis: (r.cpus * 1000.0).round() as u32,
                pids_max: QEMU_PIDS_MAX,
                tmp_bytes: 0,
            },
        )
        .map_err(|e| CoreError::Internal(format!("cgroups for QEMU: {e}")))?;
        let mut groups = vec![MEMORY_GID];
        if kvm {
            groups.extend(kvm_gid());
        }
        let jail = hutch_vm::qemu::QemuJail {
            uid,
            gid: uid,
            groups,
            cgroup_procs: cgroups.iter().map(|d| d.join("cgroup.procs")).collect(),
        };
        Ok(Prepared {
            snap,
            guest_net: guest_net.map(|(n, _)| n),
            volume_plan,
            dir,
            root_disk,
            grow,
            disk_mib,
            cgroups,
            jail,
            t0,
        })
    }

    /// Restore QEMU over what [`VmBackend::prepare_restore`] made and give the agent its
    /// identity.
    async fn run_restored(
        &self,
        r: &SandboxRecord,
        p: Prepared,
        woken_disk: bool,
        warm: bool,
    ) -> CoreResult<Started> {
        let Prepared {
            snap,
            guest_net,
            volume_plan,
            dir,
            root_disk,
            grow,
            disk_mib,
            cgroups,
            jail,
            t0,
        } = p;
        let prepared_ms = t0.elapsed().as_millis() as u64;
        let placement = snapshot::Placement {
            dir,
            root_disk: Some(root_disk),
            console: self.console(&r.id),
            jail: Some(jail),
        };
        let (mut guest, client, report) = snapshot::restore(&snap, placement, RESTORE_TIMEOUT)
            .await
            .map_err(CoreError::from)?;
        // On failure from here on, dropping `guest` kills QEMU.
        crate::crash_points::crash_point("vm.restore.qemu_running");
        let mut identity = Self::identity(r)?;
        identity.network = guest_net.filter(|_| !warm);
        // A woken guest has its volumes mounted already (they are in its memory).
        if !woken_disk {
            identity.unmount = volume_plan.unmount;
            identity.volumes = volume_plan.mount;
        }
        if let Some(bytes) = grow {
            guest
                .qmp
                .block_resize(resize::ROOT_DRIVE, bytes)
                .await
                .map_err(|e| CoreError::SandboxFailed(format!("growing the disk: {e}")))?;
            identity.root_disk_bytes = Some(bytes);
        }
        let identifying = Instant::now();
        client.identity(&identity).await.map_err(|e| {
            CoreError::SandboxFailed(format!("identity of the restored guest: {e}"))
        })?;
        let identity_ms = identifying.elapsed().as_millis() as u64;
        let mut service_ready = false;
        if warm {
            hutch_vm::snapshot::run_first_programs(&client).await;
            // The start command's ready check, off the create's path (the bake has the
            // service up): a claim then only confirms it still runs. One that does not pass
            // here (it may need the network a warm guest lacks) is left to the claim.
            if let Some(spec) = r.start.as_ref().filter(|s| s.ready.is_some()) {
                service_ready = hutch_proto::client::service::start_and_wait(&client, spec)
                    .await
                    .inspect_err(|e| tracing::debug!(id = %r.id, error = %e, "the ready check did not pass in the warm guest; its claim runs it"))
                    .is_ok();
            }
            // Through the restore's own QMP connection (QEMU serves one at a time).
            guest
                .qmp
                .stop()
                .await
                .map_err(|e| CoreError::SandboxFailed(format!("pausing the warm guest: {e}")))?;
        }
        let pid = guest.detach() as i32;
        let start = hutch_jail::start_time(pid).ok_or_else(|| {
            CoreError::SandboxFailed(format!("QEMU (pid {pid}) exited right after the restore"))
        })?;
        tracing::debug!(
            id = %r.id,
            pid,
            prepared_ms,
            qmp_ready_ms = report.qmp_ready.as_millis() as u64,
            running_ms = report.resumed.as_millis() as u64,
            first_reply_ms = report.to_first_reply.as_millis() as u64,
            identity_ms,
            total_ms = t0.elapsed().as_millis() as u64,
            "vm restored (times from the start of the overlay; QEMU times from its spawn)"
        );
        Ok(Started {
            init_pid: pid,
            init_start_time: start,
            cgroups,
            agent: Some(client),
            disk_mib: Some(disk_mib),
            service_ready,
        })
    }
}
