//! The `vm` backend: every sandbox is a QEMU `microvm` restored from its template's baked
//! snapshot (`hutch-vm`), with the agent as the guest's PID 1 on a virtio-serial port whose
//! host side is the sandbox's unix socket — so exec, PTY and file calls are the same as on
//! `ns`.
//!
//! Create: template image and bake from the cache (built on first use), a qcow2 overlay of
//! the bake's disk in the sandbox directory, a QEMU restored from the snapshot (RAM mapped
//! copy-on-write from the bake's memory file), then the identity call (hostname, host
//! entropy with a CRNG reseed, wall clock, environment). QEMU is left running detached: the
//! server watches its pid like an `ns` init and reaps it; a restarted server re-adopts it
//! by pid and start time.
//!
//! What the host keeps about each guest where its QEMU cannot reach it — the disk's backing
//! chain as the host made it, the console ring — is in `records.rs`.
//!
//! Pause/resume are QMP `stop`/`cont`. Without QEMU (or a disk tool, or the guest kernel)
//! every call is [`CoreError::VmUnavailable`] or [`CoreError::Vm`], answered 422.
//!
//! Every method blocks (the manager calls them on the blocking pool); async work (QMP, the
//! agent) runs with `Handle::block_on` on that thread.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hutch_proto::IdentityRequest;
use hutch_vm::accel::{self, AccelChoice};
use hutch_vm::assets::{AssetConfig, Assets};
use hutch_vm::qmp::Qmp;
use hutch_vm::{disk, snapshot, VmError};

mod capture;
mod fork_memory;
mod records;
mod resize;
mod share;
mod volumes;
mod warm;

use super::ns::UID_RANGE;
use super::{Backend, SnapshotTaken, Started, Usage};
use crate::config::Config;
use crate::error::{CoreError, CoreResult};
use crate::model::{Isolation, SandboxRecord};

/// How long a restored guest's agent may take to answer.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long QMP may take to answer one command.
const QMP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a killed QEMU may take to disappear.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// A vm snapshot's memory and device state, in its directory.
const SNAPSHOT_STATE: &str = "state";
/// A vm snapshot's disk (a copy of the sandbox's overlay, backed by the bake's disk).
const SNAPSHOT_DISK: &str = "disk.qcow2";
/// Where a hibernated guest's memory and device state are kept, in its directory.
const HIBERNATED: &str = "hibernated.state";
/// How long a hang-up waits for the agent to end its session before memory is saved.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(15);
/// Bound on saving a guest's memory (all of its RAM is written).
const SAVE_TIMEOUT: Duration = Duration::from_secs(120);
/// CPU an idle guest's QEMU uses under TCG (timer ticks, ~2 % measured), with margin.
const IDLE_TCG_NS_PER_SEC: u64 = 40_000_000;
/// Host entropy given to every restored guest.
const ENTROPY_BYTES: usize = 64;
/// Group of the vm QEMUs that may open template memory files (QEMU 7.2 opens them
/// read-write even to map them privately): just below the first sandbox's uid range
/// (uid slots start at 16).
pub const MEMORY_GID: u32 = 16 * UID_RANGE - 1;
/// The uid bakes run QEMU as (booting a template runs its programs): just below
/// [`MEMORY_GID`], outside every sandbox's range.
pub const BAKE_UID: u32 = MEMORY_GID - 1;
/// Memory QEMU itself may use beyond the guest's RAM (its own heap, TCG's code buffer).
const QEMU_OVERHEAD_MIB: u64 = 256;
/// Threads QEMU may run (vCPUs, I/O, RCU, migration).
const QEMU_PIDS_MAX: u32 = 64;

/// Told what a create is waiting for when it builds vm assets (kernel, image, bake).
pub type Progress = Arc<dyn Fn(&SandboxRecord, String) + Send + Sync>;

/// The microVM backend.
pub struct VmBackend {
    /// Sandbox networking: a networked guest gets a TAP on its slot.
    network: Option<hutch_net::Network>,
    /// Where slow first-use steps are announced (the manager's event bus).
    progress: Option<Progress>,
    cfg: Config,
    /// The cache, made with the accelerator chosen (bakes depend on it).
    assets: OnceLock<Arc<Assets>>,
    accel: OnceLock<AccelChoice>,
    qemu_version: OnceLock<Result<String, Arc<hutch_vm::qemu::QemuError>>>,
    /// Memory snapshots of running guests captured so far (`capture.rs`).
    snapshots_captured: std::sync::atomic::AtomicU64,
    /// Memory snapshots of running guests saved as a full stream (the fallback).
    snapshots_streamed: std::sync::atomic::AtomicU64,
}

impl VmBackend {
    /// The same backend giving networked guests a TAP on their slot.
    pub fn with_network(mut self, network: Option<hutch_net::Network>) -> Self {
        self.network = network;
        self
    }

    /// The same backend announcing slow first-use steps (building the guest kernel, a
    /// template's image, a bake) through `progress`.
    pub fn with_progress(mut self, progress: Progress) -> Self {
        self.progress = Some(progress);
        self
    }

    /// The guest's network settings and the TAP for QEMU, when `r` holds a slot.
    fn guest_network(
        &self,
        r: &SandboxRecord,
    ) -> CoreResult<Option<(hutch_proto::GuestNetwork, Arc<std::os::fd::OwnedFd>)>> {
        let (Some(net), Some(config)) = (&self.network, self.guest_config(r)?) else {
            return Ok(None);
        };
        let index = r.net_slot.unwrap_or_default();
        let tap = net
            .attach_tap(index, &r.id)
            .map_err(CoreError::net_host("the guest's network"))?;
        Ok(Some((config, Arc::new(tap))))
    }

    /// The address, gateway and resolver the agent gives the guest's NIC, when `r` holds a
    /// slot.
    fn guest_config(&self, r: &SandboxRecord) -> CoreResult<Option<hutch_proto::GuestNetwork>> {
        let (Some(net), Some(index)) = (&self.network, r.net_slot) else {
            return Ok(None);
        };
        let addrs = net
            .slot_addrs(index)
            .ok_or_else(|| CoreError::Internal(format!("slot {index} is outside the pool")))?;
        let (address, gateway, dns) = hutch_net::tap::guest_config(&addrs);
        Ok(Some(hutch_proto::GuestNetwork {
            interface: None,
            address,
            gateway: gateway.to_string(),
            nameservers: vec![dns.to_string()],
        }))
    }

    /// A backend using `cfg`'s paths; nothing is built or probed until first use.
    pub fn new(cfg: Config) -> Self {
        Self {
            network: None,
            progress: None,
            cfg,
            assets: OnceLock::new(),
            accel: OnceLock::new(),
            qemu_version: OnceLock::new(),
            snapshots_captured: Default::default(),
            snapshots_streamed: Default::default(),
        }
    }

    fn asset_config(&self, accel: hutch_vm::qemu::Accel) -> AssetConfig {
        AssetConfig {
            dir: self.cfg.vm_dir.clone(),
            qemu: self.cfg.qemu.clone(),
            agent: self.cfg.agent_binary.clone(),
            busybox: self.cfg.busybox.clone(),
            kernel_root: self.cfg.vm_kernel_root.clone(),
            accel,
            memory_group: Some(MEMORY_GID),
            bake_uid: Some(BAKE_UID),
        }
    }

    /// The cache (deciding KVM or TCG first: blocking, once).
    fn assets(&self) -> Arc<Assets> {
        self.assets
            .get_or_init(|| Arc::new(Assets::new(self.asset_config(self.accel().accel))))
            .clone()
    }

    /// Check QEMU is installed and new enough (once per process); returns its version.
    pub fn check(&self) -> CoreResult<String> {
        self.qemu_version
            .get_or_init(|| hutch_vm::qemu::check_version(&self.cfg.qemu).map_err(Arc::new))
            .clone()
            .map_err(CoreError::VmUnavailable)
    }

    /// The accelerator choice if it was made already ([`VmBackend::accel`]).
    pub fn accel_if_known(&self) -> Option<AccelChoice> {
        self.accel.get().cloned()
    }

    /// KVM or TCG, and why. Without hardware virtualization this is decided at once; with
    /// it a probe guest is booted once (blocking, seconds).
    pub fn accel(&self) -> AccelChoice {
        self.accel
            .get_or_init(|| {
                let host = accel::host_virt();
                if let Some(choice) = accel::choose_without_probe(&host) {
                    return choice;
                }
                let probe = self.probe_kvm().map_err(|e| e.to_string());
                accel::choose_after_probe(&host, probe)
            })
            .clone()
    }

    fn probe_kvm(&self) -> Result<(), VmError> {
        // Boot assets do not depend on the accelerator.
        let boot = Assets::new(self.asset_config(hutch_vm::qemu::Accel::Tcg)).boot()?;
        let dir = self
            .cfg
            .vm_dir
            .join(format!("probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|source| VmError::Io {
            what: format!("create {}", dir.display()),
            source,
        })?;
        let result = tokio::runtime::Handle::current().block_on(accel::probe_kvm(
            &boot,
            &self.cfg.qemu,
            &dir,
        ));
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.cfg.sandbox_dir(id)
    }

    /// Identity of a freshly restored guest: the sandbox's hostname and environment, host
    /// entropy (the agent reseeds the CRNG with it) and the wall clock.
    fn identity(r: &SandboxRecord) -> CoreResult<IdentityRequest> {
        let mut entropy = vec![0u8; ENTROPY_BYTES];
        getrandom::fill(&mut entropy)?;
        let mut env = std::collections::BTreeMap::new();
        env.insert(
            "PATH".to_string(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        );
        env.insert("LANG".to_string(), "C.UTF-8".to_string());
        env.insert("HUTCH_SANDBOX_ID".to_string(), r.id.clone());
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
    async fn restore(
        &self,
        r: &SandboxRecord,
        rootfs: &Path,
        woken: Option<PathBuf>,
        warm: bool,
    ) -> CoreResult<Started> {
        let (boot, image, mut snap) = self.bake_of(r, rootfs).await?;
        let woken_disk = woken.is_some();
        // In use: keep them from garbage collection (gc.rs).
        for used in [
            boot.vmlinux.parent(),
            Some(image.as_path()),
            snap.state.parent(),
        ] {
            used.map(hutch_vm::gc::touch);
        }
        let guest_net = self.guest_network(r)?;
        snap.config.tap = guest_net.as_ref().map(|(_, tap)| tap.clone());
        let volume_plan = volumes::plan(&self.cfg, r)?;
        snap.config.volumes = volume_plan.drives.clone();
        let t0 = std::time::Instant::now();
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
                std::fs::copy(from.join(SNAPSHOT_DISK), &overlay).map_err(CoreError::io(
                    "copy the snapshot disk",
                    from.join(SNAPSHOT_DISK),
                ))?;
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
                    .map_err(|e| CoreError::from(VmError::from(e)))?;
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
        .map_err(CoreError::from)?;
        let mut groups = vec![MEMORY_GID];
        if self.assets().config().accel == hutch_vm::qemu::Accel::Kvm {
            groups.extend(kvm_gid());
        }
        let jail = hutch_vm::qemu::QemuJail {
            uid,
            gid: uid,
            groups,
            cgroup_procs: cgroups.iter().map(|d| d.join("cgroup.procs")).collect(),
        };
        let prepared_ms = t0.elapsed().as_millis() as u64;
        let started = async {
            let placement = snapshot::Placement {
                dir: dir.clone(),
                root_disk: Some(root_disk),
                console: self.console(&r.id),
                jail: Some(jail),
            };
            let (mut guest, client, report) = snapshot::restore(&snap, placement, RESTORE_TIMEOUT)
                .await
                .map_err(CoreError::from)?;
            // On failure from here on, dropping `guest` kills QEMU.
            let mut identity = Self::identity(r)?;
            identity.network = guest_net.filter(|_| !warm).map(|(n, _)| n);
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
                    .map_err(CoreError::qmp("growing the disk"))?;
                identity.root_disk_bytes = Some(bytes);
            }
            let identifying = std::time::Instant::now();
            client
                .identity(&identity)
                .await
                .map_err(CoreError::guest_setup("identity of the restored guest"))?;
            let identity_ms = identifying.elapsed().as_millis() as u64;
            if warm {
                hutch_vm::snapshot::run_first_programs(&client).await;
                // Through the restore's own QMP connection (QEMU serves one at a time).
                guest
                    .qmp
                    .stop()
                    .await
                    .map_err(CoreError::qmp("pausing the warm guest"))?;
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
            Ok((pid, start, client))
        }
        .await;
        match started {
            Ok((init_pid, init_start_time, client)) => Ok(Started {
                init_pid,
                init_start_time,
                cgroups,
                agent: Some(client),
                disk_mib: Some(disk_mib),
            }),
            Err(e) => {
                if let Err(c) = hutch_jail::release_process_cgroups(&r.id, &cgroups) {
                    tracing::error!(id = %r.id, error = %c, "releasing QEMU cgroups after a failed create");
                }
                Err(e)
            }
        }
    }

    /// Stop the guest and write its RAM and device state to a new file `path` (left stopped;
    /// the stream is loadable into a shared memory file too, `hutch_vm::share`).
    async fn stop_and_save(&self, r: &SandboxRecord, path: &Path) -> CoreResult<()> {
        // Perhaps in QEMU's directory (hibernation): never through a link it planted.
        let file = hutch_vm::qemu::create_fresh(path).map_err(CoreError::io("create", path))?;
        self.qmp_within(r, SAVE_TIMEOUT, async |q| {
            use std::os::fd::AsFd;
            q.stop().await?;
            q.ignore_shared(false).await?;
            q.getfd("save", file.as_fd()).await?;
            q.migrate("fd:save").await?;
            q.wait_migration(SAVE_TIMEOUT).await
        })
        .await
    }

    /// Save the running guest's memory and device state to `saved` (hibernation).
    async fn save_memory(&self, r: &SandboxRecord, saved: &Path) -> CoreResult<()> {
        let tmp = saved.with_extension("tmp");
        if let Err(e) = self.stop_and_save(r, &tmp).await {
            let _ = std::fs::remove_file(&tmp);
            // Let the guest run on; the manager reports the failure.
            let _ = self.qmp(r, async |q| q.cont().await).await;
            return Err(e);
        }
        std::fs::rename(&tmp, saved).map_err(CoreError::io("rename", saved))
    }

    async fn qmp(
        &self,
        r: &SandboxRecord,
        f: impl AsyncFnOnce(&mut Qmp) -> Result<(), hutch_vm::qmp::QmpError>,
    ) -> CoreResult<()> {
        self.qmp_within(r, QMP_TIMEOUT, f).await
    }

    async fn qmp_within(
        &self,
        r: &SandboxRecord,
        limit: Duration,
        f: impl AsyncFnOnce(&mut Qmp) -> Result<(), hutch_vm::qmp::QmpError>,
    ) -> CoreResult<()> {
        let socket = self.dir(&r.id).join("qmp.sock");
        let mut qmp = Qmp::connect(&socket, QMP_TIMEOUT)
            .await
            .map_err(CoreError::qmp("QMP"))?;
        tokio::time::timeout(limit, f(&mut qmp))
            .await
            .map_err(|_| CoreError::SandboxFailed("QMP did not answer".into()))?
            .map_err(CoreError::qmp("QMP"))
    }
}

/// What identifies one build of a template's root: a rebuild makes a new directory.
fn template_stamp(rootfs: &Path) -> CoreResult<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(rootfs).map_err(CoreError::io("read the template root", rootfs))?;
    Ok(format!(
        "{}:{}:{}.{}",
        m.dev(),
        m.ino(),
        m.mtime(),
        m.mtime_nsec()
    ))
}

/// The sandbox's directory, mode 0700, owned by its QEMU's uid (QEMU creates its sockets
/// and console log there).
fn create_private_dir(dir: &Path, uid: u32) -> CoreResult<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(CoreError::io("create", dir)(e)),
    }
    give_to(dir, uid, 0o700)
}

/// Make `path` owned by `uid:uid` with `mode`.
fn give_to(path: &Path, uid: u32, mode: u32) -> CoreResult<()> {
    use std::os::unix::fs::PermissionsExt;
    std::os::unix::fs::chown(path, Some(uid), Some(uid))
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)))
        .map_err(CoreError::io("chown", path))
}

/// The group owning `/dev/kvm`, so a jailed QEMU can open it.
fn kvm_gid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/dev/kvm").ok().map(|m| m.gid())
}

/// SIGKILL `pid` if it is still the process that started at `start`, and wait until it is
/// gone (reaped by us when it is our child, else by its parent).
fn kill_and_wait(pid: i32, start: u64) -> CoreResult<()> {
    if !hutch_jail::init_alive(pid, start) && hutch_jail::start_time(pid) != Some(start) {
        return Ok(());
    }
    // SAFETY: kill takes a pid and a signal; the pid was checked to be our QEMU (same start
    // time) just above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let deadline = std::time::Instant::now() + EXIT_TIMEOUT;
    loop {
        // Reap it if it is our child (no effect otherwise).
        // SAFETY: waitpid with WNOHANG on a pid; the status pointer may be null.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        if hutch_jail::start_time(pid) != Some(start) {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(CoreError::Internal(format!(
                "QEMU (pid {pid}) did not exit after SIGKILL"
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `VmRSS` and CPU time of a process from `/proc`.
fn proc_usage(pid: i32) -> Option<(u64, u64)> {
    let rss_kib = crate::config::proc_kib(Path::new(&format!("/proc/{pid}/status")), "VmRSS")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are at 11 and 12 counting from field 3.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some((rss_kib * 1024, ticks * (1_000_000_000 / hz)))
}

impl Backend for VmBackend {
    fn isolation(&self) -> Isolation {
        Isolation::Vm
    }

    fn create(&self, record: &SandboxRecord, rootfs: &Path) -> CoreResult<Started> {
        self.check()?;
        let handle = tokio::runtime::Handle::current();
        let started = handle.block_on(self.restore(record, rootfs, None, false));
        if started.is_err() {
            // Whatever the failed restore left (its QEMU is killed on drop) goes too.
            let _ = std::fs::remove_dir_all(self.dir(&record.id));
            let _ = self.remove_records(&record.id);
        }
        started
    }

    fn destroy(&self, r: &SandboxRecord) -> CoreResult<()> {
        if let (Some(pid), Some(start)) = (r.init_pid, r.init_start_time) {
            kill_and_wait(pid, start)?;
        }
        let cgroups: Vec<PathBuf> = r.cgroups.iter().map(PathBuf::from).collect();
        hutch_jail::release_process_cgroups(&r.id, &cgroups).map_err(CoreError::from)?;
        // Only files here (overlay, sockets, logs): no mounts to cross.
        match std::fs::remove_dir_all(self.dir(&r.id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(CoreError::io("remove", self.dir(&r.id))(e))
            }
            _ => {}
        }
        self.remove_records(&r.id)
    }

    fn adopt(&self, r: &SandboxRecord) {
        self.adopt_console(r);
    }

    fn agent_socket(&self, id: &str) -> PathBuf {
        self.dir(id).join("agent.sock")
    }

    fn alive(&self, r: &SandboxRecord) -> bool {
        match (r.init_pid, r.init_start_time) {
            (Some(pid), Some(start)) => hutch_jail::init_alive(pid, start),
            _ => false,
        }
    }

    fn usage(&self, r: &SandboxRecord) -> Option<Usage> {
        if !r.cgroups.is_empty() {
            let dirs: Vec<PathBuf> = r.cgroups.iter().map(PathBuf::from).collect();
            let s = hutch_jail::cgroup_stats(&dirs);
            return Some(Usage {
                memory_bytes: s.memory_bytes,
                memory_limit_bytes: s.memory_limit_bytes,
                oom_kills: s.oom_kills,
                cpu_usage_ns: s.cpu_usage_ns,
                pids: s.pids_current,
            });
        }
        let pid = r.init_pid?;
        let (memory_bytes, cpu_usage_ns) = proc_usage(pid)?;
        Some(Usage {
            memory_bytes,
            memory_limit_bytes: r.memory_mib << 20,
            oom_kills: 0,
            cpu_usage_ns,
            pids: 1,
        })
    }

    fn pause(&self, r: &SandboxRecord) -> CoreResult<()> {
        tokio::runtime::Handle::current().block_on(self.qmp(r, async |q| q.stop().await))
    }

    fn resume(&self, r: &SandboxRecord) -> CoreResult<()> {
        tokio::runtime::Handle::current().block_on(self.qmp(r, async |q| q.cont().await))
    }

    fn hibernate(&self, r: &SandboxRecord) -> CoreResult<()> {
        let saved = self.dir(&r.id).join(HIBERNATED);
        // With the state already saved this only cleans up (an interrupted wake, a restart).
        if !saved.is_file() {
            if !self.alive(r) {
                return Err(CoreError::SandboxFailed(format!(
                    "the VM of sandbox {} stopped before its memory could be saved",
                    r.id
                )));
            }
            tokio::runtime::Handle::current().block_on(self.save_memory(r, &saved))?;
        }
        if let (Some(pid), Some(start)) = (r.init_pid, r.init_start_time) {
            kill_and_wait(pid, start)?;
        }
        let cgroups: Vec<PathBuf> = r.cgroups.iter().map(PathBuf::from).collect();
        hutch_jail::release_process_cgroups(&r.id, &cgroups).map_err(CoreError::from)
    }

    fn wake(&self, r: &SandboxRecord, rootfs: &Path) -> CoreResult<Started> {
        self.check()?;
        let saved = self.dir(&r.id).join(HIBERNATED);
        if !saved.is_file() {
            return Err(CoreError::SandboxFailed(format!(
                "sandbox {} has no saved memory to wake from",
                r.id
            )));
        }
        // Whatever an interrupted wake left running goes first.
        self.hibernate(r)?;
        let started = tokio::runtime::Handle::current().block_on(self.restore(
            r,
            rootfs,
            Some(saved.clone()),
            false,
        ))?;
        if let Err(e) = std::fs::remove_file(&saved) {
            tracing::warn!(id = %r.id, error = %e, "removing the hibernated state");
        }
        Ok(started)
    }

    fn snapshot(&self, r: &SandboxRecord, dir: &Path) -> CoreResult<SnapshotTaken> {
        self.memory_snapshot(r, dir, false)
    }

    fn fork_snapshot(&self, r: &SandboxRecord, dir: &Path) -> CoreResult<SnapshotTaken> {
        // Its shared memory on tmpfs (capture.rs): it lives only as long as the children.
        self.memory_snapshot(r, dir, true)
    }

    fn remove_snapshot(&self, dir: &Path) -> CoreResult<()> {
        self.remove_shared_memory(dir)?;
        // Only our files and the manifest: no mounts in it.
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(CoreError::io("remove", dir)(e))
            }
            _ => Ok(()),
        }
    }

    fn idle_cpu_ns_per_sec(&self) -> u64 {
        // An idle guest's QEMU uses ~2 % of a core under TCG (measured), little under KVM.
        match self.accel_if_known().map(|c| c.accel) {
            Some(hutch_vm::qemu::Accel::Kvm) => 0,
            _ => IDLE_TCG_NS_PER_SEC,
        }
    }

    fn live_fork(&self) -> bool {
        true
    }

    fn quiesce(&self, r: &SandboxRecord, hang_up: Box<dyn FnOnce() + Send>) {
        let socket = self.dir(&r.id).join("qmp.sock");
        let waited = tokio::runtime::Handle::current().block_on(async {
            let mut qmp = Qmp::connect(&socket, QMP_TIMEOUT).await?;
            qmp.clear_events().await?;
            let since = std::time::SystemTime::now();
            hang_up();
            qmp.wait_port_closed(
                hutch_vm::qemu::AGENT_PORT_ID,
                "agent",
                since,
                QUIESCE_TIMEOUT,
            )
            .await
        });
        match waited {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(id = %r.id, "the agent kept its session after the hang-up (a client still connected?)")
            }
            Err(e) => {
                tracing::warn!(id = %r.id, error = %e, "waiting for the agent to end its session")
            }
        }
    }

    fn exit_reason(&self, r: &SandboxRecord, status: &str) -> String {
        let console = self.console_tail(r);
        let panic = console
            .lines()
            .find(|l| l.contains("Kernel panic"))
            .map(|l| format!(": {}", l.trim()))
            .unwrap_or_default();
        let oom = self.usage(r).is_some_and(|u| u.oom_kills > 0);
        if oom {
            return format!(
                "the sandbox's VM (QEMU) was killed by the host: its memory limit ({} MiB guest + {QEMU_OVERHEAD_MIB} MiB) was exceeded",
                r.memory_mib
            );
        }
        format!("the sandbox's VM (QEMU) exited unexpectedly ({status}){panic}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_change_with_the_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::create_dir(&a).expect("mkdir");
        std::fs::create_dir(&b).expect("mkdir");
        assert_eq!(template_stamp(&a).ok(), template_stamp(&a).ok());
        assert_ne!(template_stamp(&a).ok(), template_stamp(&b).ok());
        assert!(template_stamp(&dir.path().join("c")).is_err());
    }

    #[test]
    fn usage_of_this_process() {
        let (rss, _cpu) = proc_usage(std::process::id() as i32).expect("own usage");
        assert!(rss > 0);
        assert!(proc_usage(-1).is_none());
    }
}
