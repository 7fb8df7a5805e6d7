//! Isolation backends: how a sandbox's processes are contained.
//!
//! A backend builds and tears down the container of one sandbox and says where its agent's
//! byte stream is. Everything above the stream (exec, PTY, files) is backend-independent:
//! it is the agent protocol.
//!
//! [`Backend`] is the only way the manager reaches a backend: an async trait, one
//! implementation per [`Isolation`], held in [`Backends`]. What differs between backends is
//! either a method or a [`Capabilities`] flag the backend declares (live fork, memory
//! snapshots, volume slots and how volumes reach the sandbox, the warm pool), so the manager
//! never names a backend, and "not supported on this backend" is answered in one place
//! ([`not_supported`]). Blocking work (mounts, copies, waiting for cgroups to empty) runs
//! inside the backend on the blocking pool ([`blocking`]); the manager only awaits.
//!
//! Lifecycle operations beyond create/destroy (pause, hibernate, snapshot) go through the same
//! trait, so the `vm` backend can give them their full meaning (memory saved with the disk)
//! while `ns` gives the filesystem-level one (see `docs/lifecycle.md`).

#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod ns;
pub mod vm;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hutch_proto::client::AgentClient;

use crate::error::{CoreError, CoreResult};
use crate::model::{Isolation, SandboxRecord};
use crate::snapshot::SnapshotKind;

/// What a backend reports after building a sandbox.
#[derive(Debug, Clone)]
pub struct Started {
    /// A connection to the agent the backend already made (`vm`: the restore's own), or
    /// `None` for the manager to connect to [`Backend::agent_socket`].
    pub agent: Option<hutch_proto::client::AgentClient>,
    /// Host pid of the sandbox's init.
    pub init_pid: i32,
    /// Its start time (to recognise the pid after a restart).
    pub init_start_time: u64,
    /// cgroup directories to read usage from.
    pub cgroups: Vec<PathBuf>,
    /// The disk size the sandbox really got, when it differs from its `disk_mib` (`vm`: a
    /// root disk is never smaller than its template image).
    pub disk_mib: Option<u64>,
    /// A warm guest's start command passed its ready check before the guest was paused
    /// ([`Backend::create_warm`]): its claim need not run the check again.
    pub service_ready: bool,
}

/// Resource usage of one sandbox.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Usage {
    /// Memory in use (bytes).
    pub memory_bytes: u64,
    /// The part of it the sandbox really uses: without the file cache the kernel may drop
    /// at once (`ns`: cgroup memory minus inactive file pages; `vm`: QEMU's, the same way,
    /// or its resident set). What usage metering bills.
    pub memory_working_set_bytes: u64,
    /// Memory limit (bytes).
    pub memory_limit_bytes: u64,
    /// OOM kills so far.
    pub oom_kills: u64,
    /// CPU time used (ns).
    pub cpu_usage_ns: u64,
    /// Tasks running.
    pub pids: u64,
}

/// What [`Backend::snapshot`] wrote.
#[derive(Debug, Clone)]
pub struct SnapshotTaken {
    /// Filesystem only (`ns`) or memory too (`vm`).
    pub kind: SnapshotKind,
    /// Bytes of file data in it.
    pub size_bytes: u64,
    /// Regular files in it.
    pub files: u64,
}

/// What a `hibernated` record is on the host ([`Backend::recover_hibernated`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hibernation {
    /// Its state is kept (`ns`: its files; `vm`: its memory too): a wake starts it again.
    Kept,
    /// It never stopped: the hibernation saved nothing and its processes are alive, so it
    /// is `running` again.
    StillRunning,
    /// What a wake needs is gone: the sandbox is `failed` with this reason.
    Lost(String),
}

/// How a sandbox's volumes reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeAccess {
    /// The server mounts each volume's filesystem on the host and the backend binds it into
    /// the sandbox (`ns`).
    HostMount,
    /// The sandbox gets the raw image as a block device and mounts it itself (`vm`): one
    /// attached read-write has no host filesystem left, is untrusted to the host kernel until
    /// checked, and the guest must flush its page cache before it stops.
    BlockDevice,
}

/// What a backend can do beyond the operations every backend has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Forks can carry memory and running processes (`"mode": "live"`), not only files.
    pub live_fork: bool,
    /// Snapshots hold the sandbox's memory: the server's agent session is ended first, so no
    /// copy of the memory is caught mid-session ([`Backend::quiesce`]).
    pub memory_snapshots: bool,
    /// Most volumes one sandbox may have.
    pub volume_slots: usize,
    /// How volumes reach the sandbox.
    pub volume_access: VolumeAccess,
    /// Sandboxes can be restored ahead of time into a pool and claimed by a create
    /// ([`Backend::create_warm`], [`Backend::claim_warm`]).
    pub warm_pool: bool,
    /// A hibernated sandbox's state can be written into one archive and started from it on
    /// another host ([`Backend::export_hibernated`], [`Backend::import_hibernated`]).
    pub portable_hibernation: bool,
}

/// The error for a `feature` the `backend` does not have (422).
pub fn not_supported(backend: Isolation, feature: &'static str) -> CoreError {
    CoreError::NotSupported { backend, feature }
}

/// Run blocking host work (mounts, copies, waits for cgroups) on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> CoreResult<T> + Send + 'static,
) -> CoreResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CoreError::Internal(format!("blocking task: {e}")))?
}

/// One isolation backend.
///
/// Methods that touch the host are async and do their blocking work on the blocking pool;
/// the few plain ones (`alive`, `usage`, `agent_socket`, ...) only read `/proc` or `/sys`.
#[async_trait::async_trait]
pub trait Backend: Send + Sync {
    /// Which isolation this backend provides.
    fn isolation(&self) -> Isolation;
    /// What it can do beyond the common operations.
    fn capabilities(&self) -> Capabilities;
    /// Whether it can run sandboxes on this host (`vm`: QEMU is installed and new enough);
    /// the error says why not.
    fn available(&self) -> CoreResult<()> {
        Ok(())
    }
    /// Whether `"isolation": "auto"` picks this backend (`vm`: where KVM works).
    fn preferred_by_auto(&self) -> bool {
        false
    }
    /// Work done once in the background after the server starts (`vm`: decide KVM or TCG,
    /// collect unused assets).
    async fn prepare(&self) {}
    /// Refuse a new sandbox this backend could never serve as described (`ns`: a `disk_mib`
    /// larger than its disk pool), before anything is made for it.
    async fn admit(&self, _record: &SandboxRecord) -> CoreResult<()> {
        Ok(())
    }
    /// The largest `disk_mib` [`Backend::admit`] takes (`ns`: its disk pool's size), when
    /// there is one.
    async fn max_disk_mib(&self) -> CoreResult<Option<u64>> {
        Ok(None)
    }
    /// Build and start the sandbox described by `record` from the template root `rootfs`.
    async fn create(&self, record: &SandboxRecord, rootfs: &Path) -> CoreResult<Started>;
    /// Kill everything and release every host resource; idempotent.
    async fn destroy(&self, record: &SandboxRecord) -> CoreResult<()>;
    /// Host path of the unix socket that carries the agent stream.
    fn agent_socket(&self, id: &str) -> PathBuf;
    /// Whether the sandbox's init is still the process we started.
    fn alive(&self, record: &SandboxRecord) -> bool;
    /// Current resource usage.
    fn usage(&self, record: &SandboxRecord) -> Option<Usage>;
    /// Stop every process of the sandbox from running (no CPU) without losing anything.
    async fn pause(&self, record: &SandboxRecord) -> CoreResult<()>;
    /// Let a paused sandbox run again.
    async fn resume(&self, record: &SandboxRecord) -> CoreResult<()>;
    /// Give back the sandbox's CPU and memory and keep its state on disk (`ns`: processes are
    /// stopped, files kept). Idempotent: also cleans up after an interrupted [`Backend::wake`].
    async fn hibernate(&self, record: &SandboxRecord) -> CoreResult<()>;
    /// Start a hibernated sandbox again from its state on disk. What the wake started from
    /// is kept until [`Backend::forget_hibernation`]: a crash before the sandbox is recorded
    /// running leaves it hibernated with its state, never with none.
    async fn wake(&self, record: &SandboxRecord, rootfs: &Path) -> CoreResult<Started>;
    /// The woken sandbox is recorded running: drop the state its wake started from.
    async fn forget_hibernation(&self, _record: &SandboxRecord) {}
    /// Write a snapshot of the sandbox into `dir` (a new, empty directory). A running sandbox
    /// is frozen while its state is read, so the snapshot is consistent.
    async fn snapshot(&self, record: &SandboxRecord, dir: &Path) -> CoreResult<SnapshotTaken>;
    /// [`Backend::snapshot`] for a fork: the snapshot lives only as long as the fork's
    /// children (a backend may keep it where it is cheaper to make and cannot outlive a
    /// reboot).
    async fn fork_snapshot(&self, record: &SandboxRecord, dir: &Path) -> CoreResult<SnapshotTaken> {
        self.snapshot(record, dir).await
    }
    /// Delete a snapshot's directory.
    async fn remove_snapshot(&self, dir: &Path) -> CoreResult<()>;
    /// Write everything hibernated sandbox `record` kept into one new archive at `archive`,
    /// self-contained (its template aside) and independent of this host's ids
    /// ([`Capabilities::portable_hibernation`]); returns the archive's size.
    async fn export_hibernated(&self, _record: &SandboxRecord, _archive: &Path) -> CoreResult<u64> {
        Err(not_supported(
            self.isolation(),
            "moving hibernated sandboxes between hosts",
        ))
    }
    /// Unpack an archive [`Backend::export_hibernated`] wrote (on any host) into `dir`, a new
    /// empty directory, as a snapshot that sandboxes are created from.
    async fn import_hibernated(&self, _archive: &Path, _dir: &Path) -> CoreResult<SnapshotTaken> {
        Err(not_supported(
            self.isolation(),
            "moving hibernated sandboxes between hosts",
        ))
    }
    /// End the server's agent session before the sandbox's memory is saved (hibernation,
    /// a memory snapshot): `hang_up` drops the server's connection; a backend that saves
    /// memory waits until the agent has ended that session and waits for a new host, so no
    /// copy of the memory is caught mid-session.
    async fn quiesce(&self, _record: &SandboxRecord, hang_up: Box<dyn FnOnce() + Send>) {
        hang_up();
    }
    /// CPU time per second the sandbox uses while nothing runs in it (a VM's timer ticks
    /// under TCG), not counted as activity by idle hibernation.
    fn idle_cpu_ns_per_sec(&self) -> u64 {
        0
    }
    /// Finish or undo what operations a crash of an earlier server interrupted left on the
    /// host outside any sandbox (`vm`: the shared memory of snapshots never taken). Called
    /// once at start, before sandboxes are re-adopted and before any request.
    async fn recover(&self) {}
    /// Ids of the sandboxes this backend has something of on the host in this server's state
    /// (a directory, records, a disk-pool subvolume), named by a record or not: what the
    /// reconciliation at start compares with the records (blocking reads of directories).
    fn host_sandbox_ids(&self) -> Vec<String> {
        Vec::new()
    }
    /// Kill and remove whatever sandbox `id`, which no record names, left on the host: its
    /// processes (found by its cgroups, `<hierarchy>/<cgroup_parent>/<id>`), cgroups, mounts
    /// and directories. Idempotent.
    async fn remove_orphan(&self, _id: &str) -> CoreResult<()> {
        Ok(())
    }
    /// Remove the files sandbox `id` left here when it moved to another node
    /// (`crate::handoff`): only files — it stopped when it hibernated, and a cgroup of its
    /// name may be the sandbox running again on another node of this host. Idempotent.
    async fn remove_moved(&self, id: &str) -> CoreResult<()> {
        self.remove_orphan(id).await
    }
    /// Take back a sandbox whose init survived a server restart, in the state its record
    /// says: a `running` one runs (a snapshot or a pause the crash interrupted may have left
    /// it frozen: `ns` thaws its cgroup, `vm` continues its guest), a `paused` one is frozen
    /// (`vm` also drains its console again). Called before its init is watched.
    async fn adopt(&self, _record: &SandboxRecord) -> CoreResult<()> {
        Ok(())
    }
    /// What a `hibernated` record is on the host after a server restart or a hibernation
    /// that failed, once whatever an interrupted hibernation or wake left is cleaned up
    /// ([`Backend::hibernate`]): still hibernated with its state, still running (its
    /// hibernation saved nothing and its processes live on: `vm`), or lost for good.
    async fn recover_hibernated(&self, record: &SandboxRecord) -> Hibernation {
        if let Err(e) = self.hibernate(record).await {
            tracing::error!(id = %record.id, error = %e, "cleaning up a hibernated sandbox");
        }
        Hibernation::Kept
    }
    /// The logs the backend keeps about the sandbox (`GET /v1/sandboxes/{id}/logs`).
    fn log_files(&self, _record: &SandboxRecord) -> Vec<crate::logs::LogFile> {
        Vec::new()
    }
    /// Whether the sandbox's init died of the sandbox's own memory limit (`ns`: the agent is
    /// in the sandbox's cgroup), reported as the sandbox running out of memory.
    fn init_oom_killed(&self, _record: &SandboxRecord) -> bool {
        false
    }
    /// Why the sandbox died, given how its init exited (`status`), for its `error` field.
    fn exit_reason(&self, _record: &SandboxRecord, status: &str) -> String {
        format!("the sandbox's init (agent) exited unexpectedly ({status})")
    }
    /// The backend's own lines of Prometheus text for `/metrics` (each ends with a newline).
    fn metrics_text(&self) -> String {
        String::new()
    }
    /// Give back host resources no sandbox needs any more (server shutdown: `ns` unmounts an
    /// empty disk pool, `vm` the fork memory tmpfs).
    async fn release(&self) {}
    /// What makes pooled sandboxes of a template interchangeable beyond its name and the
    /// sandbox's shape: the build of its root (`None` without a warm pool).
    fn template_build(&self, _rootfs: &Path) -> Option<String> {
        None
    }
    /// Restore a sandbox for the warm pool ([`Capabilities::warm_pool`]).
    async fn create_warm(&self, _record: &SandboxRecord, _rootfs: &Path) -> CoreResult<Started> {
        Err(not_supported(self.isolation(), "the warm pool"))
    }
    /// Make a pooled sandbox the one `record` describes ([`Capabilities::warm_pool`]).
    async fn claim_warm(&self, _record: &SandboxRecord, _agent: &AgentClient) -> CoreResult<()> {
        Err(not_supported(self.isolation(), "the warm pool"))
    }
}

/// The backends of one server, by the isolation each provides.
#[derive(Clone)]
pub struct Backends {
    by_isolation: HashMap<Isolation, Arc<dyn Backend>>,
    /// Which one `"isolation": "auto"` gets when no backend asks for it.
    fallback: Isolation,
}

impl Backends {
    /// The backends `backends` (one per isolation; a later one replaces an earlier one of the
    /// same isolation), with `fallback` for `auto` when none prefers itself.
    pub fn new(backends: Vec<Arc<dyn Backend>>, fallback: Isolation) -> Self {
        Self {
            by_isolation: backends.into_iter().map(|b| (b.isolation(), b)).collect(),
            fallback,
        }
    }

    /// The backend of `isolation`, or 422 when this server has none.
    pub fn get(&self, isolation: Isolation) -> CoreResult<Arc<dyn Backend>> {
        self.by_isolation
            .get(&isolation)
            .cloned()
            .ok_or_else(|| not_supported(isolation, "running sandboxes"))
    }

    /// Every backend.
    pub fn all(&self) -> impl Iterator<Item = &Arc<dyn Backend>> {
        self.by_isolation.values()
    }

    /// What `"isolation": "auto"` means now: a backend that prefers itself, else the
    /// fallback.
    pub fn auto(&self) -> Isolation {
        let mut preferred: Vec<Isolation> = self
            .all()
            .filter(|b| b.preferred_by_auto())
            .map(|b| b.isolation())
            .collect();
        preferred.sort_by_key(|i| i.as_str());
        preferred.first().copied().unwrap_or(self.fallback)
    }
}
