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
//! Pause/resume are QMP `stop`/`cont`; hibernation saves the guest's memory next to its
//! disk; snapshots are memory snapshots (`capture.rs`); the restore path of create, wake and
//! warm guests is `restore.rs`.
//!
//! [`VmBackend`] is a cheap handle (clones share one [`VmState`]): QMP and the agent are
//! awaited, and host work that blocks (copies, `qemu-img`, killing QEMU and waiting for it,
//! cgroups) runs on the blocking pool with a clone of the handle.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hutch_proto::client::AgentClient;
use hutch_vm::accel::{self, AccelChoice};
use hutch_vm::assets::{AssetConfig, Assets};
use hutch_vm::qmp::Qmp;

mod capture;
mod fork_memory;
mod orphans;
mod records;
mod resize;
mod restore;
mod share;
mod volumes;
mod warm;

use super::ns::UID_RANGE;
use super::{
    blocking, Backend, Capabilities, Hibernation, SnapshotTaken, Started, Usage, VolumeAccess,
};
use crate::config::Config;
use crate::error::{CoreError, CoreResult};
use crate::model::{Isolation, SandboxRecord, SandboxState};

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

/// The microVM backend: a cheap handle on its [`VmState`].
#[derive(Clone)]
pub struct VmBackend {
    state: Arc<VmState>,
}

impl std::ops::Deref for VmBackend {
    type Target = VmState;

    fn deref(&self) -> &VmState {
        &self.state
    }
}

/// What every clone of one [`VmBackend`] shares.
pub struct VmState {
    /// Sandbox networking: a networked guest gets a TAP on its slot.
    network: Option<hutch_net::Network>,
    /// Where slow first-use steps are announced (the manager's event bus).
    progress: Option<Progress>,
    cfg: Config,
    /// The cache, made with the accelerator chosen (bakes depend on it).
    assets: OnceLock<Arc<Assets>>,
    accel: tokio::sync::OnceCell<AccelChoice>,
    qemu_version: OnceLock<Result<String, Arc<hutch_vm::qemu::QemuError>>>,
    /// Memory snapshots of running guests captured so far (`capture.rs`).
    snapshots_captured: std::sync::atomic::AtomicU64,
    /// Memory snapshots of running guests saved as a full stream (the fallback).
    snapshots_streamed: std::sync::atomic::AtomicU64,
    /// Paused guests re-adopted after a restart: their agent may still hold the session of
    /// the server that died, which only a running guest can end ([`VmBackend::resume`]).
    stale_sessions: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl VmBackend {
    /// A backend using `cfg`'s paths, giving networked guests a TAP on their slot of
    /// `network`, and announcing slow first-use steps (building the guest kernel, a
    /// template's image, a bake) through `progress`. Nothing is built or probed until first
    /// use.
    pub fn new(
        cfg: Config,
        network: Option<hutch_net::Network>,
        progress: Option<Progress>,
    ) -> Self {
        Self {
            state: Arc::new(VmState {
                network,
                progress,
                cfg,
                assets: OnceLock::new(),
                accel: tokio::sync::OnceCell::new(),
                qemu_version: OnceLock::new(),
                snapshots_captured: Default::default(),
                snapshots_streamed: Default::default(),
                stale_sessions: Default::default(),
            }),
        }
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

    /// The cache (deciding KVM or TCG first, once).
    async fn assets(&self) -> Arc<Assets> {
        if let Some(assets) = self.assets.get() {
            return assets.clone();
        }
        let accel = self.accel().await.accel;
        self.assets
            .get_or_init(|| Arc::new(Assets::new(self.asset_config(accel))))
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
    /// it a probe guest is booted once (seconds).
    pub async fn accel(&self) -> AccelChoice {
        self.accel
            .get_or_init(|| async {
                let host = accel::host_virt();
                if let Some(choice) = accel::choose_without_probe(&host) {
                    return choice;
                }
                let probe = self.probe_kvm().await;
                accel::choose_after_probe(&host, probe)
            })
            .await
            .clone()
    }

    async fn probe_kvm(&self) -> Result<(), String> {
        // Boot assets do not depend on the accelerator.
        let config = self.asset_config(hutch_vm::qemu::Accel::Tcg);
        let dir = self
            .cfg
            .vm_dir
            .join(format!("probe-{}", std::process::id()));
        let made = dir.clone();
        let boot = tokio::task::spawn_blocking(move || {
            let boot = Assets::new(config).boot().map_err(|e| e.to_string())?;
            std::fs::create_dir_all(&made)
                .map_err(|e| format!("create {}: {e}", made.display()))?;
            Ok::<_, String>(boot)
        })
        .await
        .map_err(|e| e.to_string())??;
        let result = accel::probe_kvm(&boot, &self.cfg.qemu, &dir)
            .await
            .map_err(|e| e.to_string());
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&dir)).await;
        result
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.cfg.sandbox_dir(id)
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

    /// Remove the memory and device state `r` was hibernated with (it runs again).
    fn remove_hibernated_state(&self, r: &SandboxRecord) {
        let saved = self.dir(&r.id).join(HIBERNATED);
        match std::fs::remove_file(&saved) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(id = %r.id, error = %e, "removing the hibernated state")
            }
            _ => {}
        }
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
        std::fs::rename(&tmp, saved).map_err(CoreError::io("rename", saved))?;
        crate::crash_points::crash_point("vm.hibernate.memory_saved");
        Ok(())
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

/// End the session the agent of guest `id` (running, on QMP `q`) may still hold with a
/// server that died while the guest was stopped: the guest never heard of that hang-up, so
/// its agent would keep the session and the next host would talk into it, never answered
/// (a new host's requests reach the old session: it may answer one, then stall). A
/// connection opened and closed at once makes the agent end it; this waits until it has.
/// Where no session was held, nothing closes and the wait runs its whole
/// [`QUIESCE_TIMEOUT`]: the price of never guessing wrong (rare: only a guest stopped when
/// its server died pays it, once).
async fn end_stale_session(
    q: &mut Qmp,
    id: &str,
    agent: &Path,
) -> Result<(), hutch_vm::qmp::QmpError> {
    q.clear_events().await?;
    let since = std::time::SystemTime::now();
    drop(tokio::net::UnixStream::connect(agent).await);
    let port = hutch_vm::qemu::AGENT_PORT_ID;
    if !q
        .wait_port_closed(port, "agent", since, QUIESCE_TIMEOUT)
        .await?
    {
        tracing::warn!(%id, "the agent of a continued guest kept its old session");
    }
    Ok(())
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

impl VmBackend {
    /// Kill the guest's QEMU and wait until it is gone, then give back its cgroups (blocking).
    fn stop_qemu(&self, r: &SandboxRecord) -> CoreResult<()> {
        if let (Some(pid), Some(start)) = (r.init_pid, r.init_start_time) {
            kill_and_wait(pid, start)?;
        }
        // The recorded cgroups, and those a QEMU started for this sandbox joined before its
        // record said so (a crash between its start and the record): killing what is in
        // them kills that QEMU too.
        let mut cgroups: Vec<PathBuf> = r.cgroups.iter().map(PathBuf::from).collect();
        for dir in hutch_jail::sandbox_cgroups(&self.cfg.cgroup_parent, &r.id) {
            if !cgroups.contains(&dir) {
                cgroups.push(dir);
            }
        }
        hutch_jail::release_process_cgroups(&r.id, &cgroups)
            .map_err(|e| CoreError::Internal(format!("QEMU cgroups: {e}")))
    }

    /// Run `f` on the blocking pool with a clone of this handle and of `r`.
    async fn run<T: Send + 'static>(
        &self,
        r: &SandboxRecord,
        f: impl FnOnce(&VmBackend, &SandboxRecord) -> CoreResult<T> + Send + 'static,
    ) -> CoreResult<T> {
        let (this, r) = (self.clone(), r.clone());
        blocking(move || f(&this, &r)).await
    }
}

#[async_trait::async_trait]
impl Backend for VmBackend {
    fn isolation(&self) -> Isolation {
        Isolation::Vm
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            live_fork: true,
            memory_snapshots: true,
            volume_slots: hutch_vm::qemu::VOLUME_SLOTS,
            volume_access: VolumeAccess::BlockDevice,
            warm_pool: true,
            portable_hibernation: false,
        }
    }

    fn available(&self) -> CoreResult<()> {
        self.check().map(drop)
    }

    fn preferred_by_auto(&self) -> bool {
        // `auto` picks vm only where KVM works (a probe guest booted); under TCG guest code
        // runs ~15x slower, so those hosts get ns.
        matches!(
            self.accel_if_known().map(|c| c.accel),
            Some(hutch_vm::qemu::Accel::Kvm)
        ) && self.check().is_ok()
    }

    async fn prepare(&self) {
        // Decide KVM or TCG (a probe guest may boot); until then `auto` means ns.
        let this = self.clone();
        let installed = blocking(move || this.check()).await;
        if installed.is_ok() {
            let choice = self.accel().await;
            tracing::info!(accel = ?choice.accel, why = %choice.why, "vm acceleration");
        }
        let this = self.clone();
        let _ = blocking(move || {
            this.collect_garbage();
            Ok(())
        })
        .await;
    }

    async fn create(&self, record: &SandboxRecord, rootfs: &Path) -> CoreResult<Started> {
        self.check()?;
        let started = self.restore(record, rootfs, None, false).await;
        if started.is_err() {
            // Whatever the failed restore left (its QEMU is killed on drop) goes too.
            let _ = self
                .run(record, |this, r| {
                    let _ = std::fs::remove_dir_all(this.dir(&r.id));
                    this.remove_records(&r.id)
                })
                .await;
        }
        started
    }

    async fn destroy(&self, r: &SandboxRecord) -> CoreResult<()> {
        self.run(r, |this, r| {
            this.stop_qemu(r)?;
            // Only files here (overlay, sockets, logs): no mounts to cross.
            match std::fs::remove_dir_all(this.dir(&r.id)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(CoreError::Internal(format!(
                        "remove {}: {e}",
                        this.dir(&r.id).display()
                    )))
                }
                _ => {}
            }
            this.remove_records(&r.id)
        })
        .await
    }

    async fn recover(&self) {
        let this = self.clone();
        let _ = blocking(move || {
            this.sweep_interrupted_shared();
            Ok(())
        })
        .await;
    }

    fn host_sandbox_ids(&self) -> Vec<String> {
        self.ids_on_host()
    }

    async fn remove_orphan(&self, id: &str) -> CoreResult<()> {
        let (this, id) = (self.clone(), id.to_string());
        blocking(move || this.remove_orphan_now(&id)).await
    }

    async fn adopt(&self, r: &SandboxRecord) -> CoreResult<()> {
        self.adopt_console(r);
        // A crash between a wake's record and `forget_hibernation` leaves the state it woke
        // from: stale now, and a next hibernation must save afresh, not keep it.
        self.remove_hibernated_state(r);
        // A snapshot stops a running guest while it copies its memory, a pause stops it
        // before its record says so: a crash in between leaves the guest out of step.
        let paused = r.state == SandboxState::Paused;
        let (id, agent) = (r.id.clone(), self.agent_socket(&r.id));
        self.qmp_within(r, QUIESCE_TIMEOUT + QMP_TIMEOUT, async |q| {
            let status = q.status().await?;
            match (paused, status.as_str()) {
                (true, running) => {
                    // Its agent may hold the dead server's session: ended when it resumes.
                    self.stale_sessions
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id.to_string());
                    match running {
                        "running" => q.stop().await,
                        _ => Ok(()),
                    }
                }
                (false, "running") => Ok(()),
                (false, _) => {
                    q.cont().await?;
                    end_stale_session(q, &id, &agent).await
                }
            }
        })
        .await
    }

    async fn recover_hibernated(&self, r: &SandboxRecord) -> Hibernation {
        let saved = self.dir(&r.id).join(HIBERNATED);
        if saved.is_file() {
            // Its memory is saved: only what an interrupted wake started goes.
            if let Err(e) = self.hibernate(r).await {
                tracing::error!(id = %r.id, error = %e, "cleaning up a hibernated sandbox");
            }
            return Hibernation::Kept;
        }
        if !self.alive(r) {
            return Hibernation::Lost(
                "its memory was never saved: the VM stopped while it was being hibernated".into(),
            );
        }
        // The hibernation stopped before its memory was saved (a crash, a failed save): the
        // guest is still there, stopped or saving. It runs on.
        let resumed = self
            .qmp_within(r, SAVE_TIMEOUT, async |q| {
                q.cancel_migration(SAVE_TIMEOUT).await?;
                q.cont().await
            })
            .await;
        let _ = std::fs::remove_file(saved.with_extension("tmp"));
        match resumed {
            Ok(()) => Hibernation::StillRunning,
            Err(e) => {
                tracing::error!(id = %r.id, error = %e, "continuing a VM whose hibernation was interrupted");
                Hibernation::Lost(format!(
                    "its hibernation was interrupted before its memory was saved, and its VM could not run again: {e}"
                ))
            }
        }
    }

    fn log_files(&self, r: &SandboxRecord) -> Vec<crate::logs::LogFile> {
        let console = self.console_log_file(&r.id);
        let mut logs = vec![console.clone()];
        if r.start.is_some() {
            // The guest agent's lines on the console carry its time.
            logs.push(crate::logs::LogFile {
                source: crate::logs::LogSource::Start,
                timestamped: true,
                lines: crate::logs::LineFilter::Service,
                ..console
            });
        }
        logs
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
                memory_working_set_bytes: s.memory_working_set_bytes,
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
            memory_working_set_bytes: memory_bytes,
            memory_limit_bytes: r.memory_mib << 20,
            oom_kills: 0,
            cpu_usage_ns,
            pids: 1,
        })
    }

    async fn pause(&self, r: &SandboxRecord) -> CoreResult<()> {
        self.qmp(r, async |q| q.stop().await).await
    }

    async fn resume(&self, r: &SandboxRecord) -> CoreResult<()> {
        let stale = self
            .stale_sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(r.id.as_str());
        let agent = self.agent_socket(&r.id);
        self.qmp_within(r, QUIESCE_TIMEOUT + QMP_TIMEOUT, async |q| {
            q.cont().await?;
            if stale {
                end_stale_session(q, &r.id, &agent).await
            } else {
                Ok(())
            }
        })
        .await
    }

    async fn hibernate(&self, r: &SandboxRecord) -> CoreResult<()> {
        let saved = self.dir(&r.id).join(HIBERNATED);
        // With the state already saved this only cleans up (an interrupted wake, a restart).
        if !saved.is_file() {
            if !self.alive(r) {
                return Err(CoreError::SandboxFailed(format!(
                    "the VM of sandbox {} stopped before its memory could be saved",
                    r.id
                )));
            }
            self.save_memory(r, &saved).await?;
        }
        self.run(r, |this, r| this.stop_qemu(r)).await
    }

    async fn wake(&self, r: &SandboxRecord, rootfs: &Path) -> CoreResult<Started> {
        self.check()?;
        let saved = self.dir(&r.id).join(HIBERNATED);
        if !saved.is_file() {
            return Err(CoreError::FilesLost(format!(
                "its saved memory is gone ({} is missing)",
                saved.display()
            )));
        }
        // Whatever an interrupted wake left running goes first.
        self.hibernate(r).await?;
        // The saved state stays until the manager has recorded the guest running
        // (`forget_hibernation`): a crash in between finds the sandbox hibernated with it.
        self.restore(r, rootfs, Some(saved), false).await
    }

    async fn forget_hibernation(&self, r: &SandboxRecord) {
        self.remove_hibernated_state(r);
    }

    async fn snapshot(&self, r: &SandboxRecord, dir: &Path) -> CoreResult<SnapshotTaken> {
        self.memory_snapshot(r, dir, false).await
    }

    async fn fork_snapshot(&self, r: &SandboxRecord, dir: &Path) -> CoreResult<SnapshotTaken> {
        // Its shared memory on tmpfs (capture.rs): it lives only as long as the children.
        self.memory_snapshot(r, dir, true).await
    }

    async fn remove_snapshot(&self, dir: &Path) -> CoreResult<()> {
        let (this, dir) = (self.clone(), dir.to_path_buf());
        blocking(move || {
            this.remove_shared_memory(&dir)?;
            // Only our files and the manifest: no mounts in it.
            match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CoreError::Internal(
                    format!("remove {}: {e}", dir.display()),
                )),
                _ => Ok(()),
            }
        })
        .await
    }

    fn idle_cpu_ns_per_sec(&self) -> u64 {
        // An idle guest's QEMU uses ~2 % of a core under TCG (measured), little under KVM.
        match self.accel_if_known().map(|c| c.accel) {
            Some(hutch_vm::qemu::Accel::Kvm) => 0,
            _ => IDLE_TCG_NS_PER_SEC,
        }
    }

    async fn quiesce(&self, r: &SandboxRecord, hang_up: Box<dyn FnOnce() + Send>) {
        let socket = self.dir(&r.id).join("qmp.sock");
        let waited = async {
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
        }
        .await;
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

    fn metrics_text(&self) -> String {
        let (captured, streamed) = self.memory_snapshot_counts();
        format!(
            "# HELP hutch_vm_memory_snapshots_total Memory snapshots of running vm guests (named snapshots and live forks), by how they were taken: captured (RAM copied out of QEMU) or stream (the fallback: a full migration stream).\n# TYPE hutch_vm_memory_snapshots_total counter\nhutch_vm_memory_snapshots_total{{method=\"captured\"}} {captured}\nhutch_vm_memory_snapshots_total{{method=\"stream\"}} {streamed}\n"
        )
    }

    async fn release(&self) {
        let this = self.clone();
        let _ = blocking(move || {
            this.release_fork_memory();
            Ok(())
        })
        .await;
    }

    fn template_build(&self, rootfs: &Path) -> Option<String> {
        template_stamp(rootfs).ok()
    }

    async fn create_warm(&self, record: &SandboxRecord, rootfs: &Path) -> CoreResult<Started> {
        self.restore_warm(record, rootfs).await
    }

    async fn claim_warm(&self, record: &SandboxRecord, agent: &AgentClient) -> CoreResult<()> {
        self.claim_warm_guest(record, agent).await
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
