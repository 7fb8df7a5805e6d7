//! Isolation backends: how a sandbox's processes are contained.
//!
//! A backend builds and tears down the container of one sandbox and says where its agent's
//! byte stream is. Everything above the stream (exec, PTY, files) is backend-independent:
//! it is the agent protocol.
//!
//! Backend calls block (they mount, fork helpers, wait for cgroups to empty, copy files); the
//! manager runs them on the blocking pool.
//!
//! Lifecycle operations beyond create/destroy (pause, hibernate, snapshot) go through the same
//! trait, so the `vm` backend can give them their full meaning (memory saved with the disk)
//! while `ns` gives the filesystem-level one (see `docs/lifecycle.md`).

pub mod ns;
pub mod vm;

use std::path::{Path, PathBuf};

use crate::error::CoreResult;
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
}

/// Resource usage of one sandbox.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Usage {
    /// Memory in use (bytes).
    pub memory_bytes: u64,
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

/// One isolation backend.
pub trait Backend: Send + Sync {
    /// Which isolation this backend provides.
    fn isolation(&self) -> Isolation;
    /// Build and start the sandbox described by `record` from the template root `rootfs`.
    fn create(&self, record: &SandboxRecord, rootfs: &Path) -> CoreResult<Started>;
    /// Kill everything and release every host resource; idempotent.
    fn destroy(&self, record: &SandboxRecord) -> CoreResult<()>;
    /// Host path of the unix socket that carries the agent stream.
    fn agent_socket(&self, id: &str) -> PathBuf;
    /// Whether the sandbox's init is still the process we started.
    fn alive(&self, record: &SandboxRecord) -> bool;
    /// Current resource usage.
    fn usage(&self, record: &SandboxRecord) -> Option<Usage>;
    /// Stop every process of the sandbox from running (no CPU) without losing anything.
    fn pause(&self, record: &SandboxRecord) -> CoreResult<()>;
    /// Let a paused sandbox run again.
    fn resume(&self, record: &SandboxRecord) -> CoreResult<()>;
    /// Give back the sandbox's CPU and memory and keep its state on disk (`ns`: processes are
    /// stopped, files kept). Idempotent: also cleans up after an interrupted [`Backend::wake`].
    fn hibernate(&self, record: &SandboxRecord) -> CoreResult<()>;
    /// Start a hibernated sandbox again from its state on disk.
    fn wake(&self, record: &SandboxRecord, rootfs: &Path) -> CoreResult<Started>;
    /// Write a snapshot of the sandbox into `dir` (a new, empty directory). A running sandbox
    /// is frozen while its state is read, so the snapshot is consistent.
    fn snapshot(&self, record: &SandboxRecord, dir: &Path) -> CoreResult<SnapshotTaken>;
    /// [`Backend::snapshot`] for a fork: the snapshot lives only as long as the fork's
    /// children (a backend may keep it where it is cheaper to make and cannot outlive a
    /// reboot).
    fn fork_snapshot(&self, record: &SandboxRecord, dir: &Path) -> CoreResult<SnapshotTaken> {
        self.snapshot(record, dir)
    }
    /// Delete a snapshot's directory.
    fn remove_snapshot(&self, dir: &Path) -> CoreResult<()>;
    /// Whether forks can carry memory and running processes (`live`), not only files.
    fn live_fork(&self) -> bool;
    /// End the server's agent session before the sandbox's memory is saved (hibernation,
    /// a memory snapshot): `hang_up` drops the server's connection; a backend that saves
    /// memory waits until the agent has ended that session and waits for a new host, so no
    /// copy of the memory is caught mid-session. Blocking.
    fn quiesce(&self, _record: &SandboxRecord, hang_up: Box<dyn FnOnce() + Send>) {
        hang_up();
    }
    /// CPU time per second the sandbox uses while nothing runs in it (a VM's timer ticks
    /// under TCG), not counted as activity by idle hibernation.
    fn idle_cpu_ns_per_sec(&self) -> u64 {
        0
    }
    /// Take back a sandbox whose init survived a server restart (`vm`: drain its console
    /// again). Called on the runtime, before its init is watched.
    fn adopt(&self, _record: &SandboxRecord) {}
    /// The logs the backend keeps about the sandbox (`GET /v1/sandboxes/{id}/logs`).
    fn log_files(&self, _record: &SandboxRecord) -> Vec<crate::logs::LogFile> {
        Vec::new()
    }
    /// Why the sandbox died, given how its init exited (`status`), for its `error` field.
    fn exit_reason(&self, _record: &SandboxRecord, status: &str) -> String {
        format!("the sandbox's init (agent) exited unexpectedly ({status})")
    }
}
