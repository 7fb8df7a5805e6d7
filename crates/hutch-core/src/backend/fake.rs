//! A fake [`Backend`] for tests that need no root (feature `testing`, and every unit test of
//! this crate): a sandbox is an agent task of the test process ([`agent`]) on a unix socket
//! in a directory of the test's, with no namespace, mount or cgroup. It records every call,
//! and can be told to fail an operation, so the manager's state machine and the HTTP API
//! are driven in-process.
//!
//! Its "init" is the test process itself (a pid that is always alive and never exits);
//! whether a sandbox is alive is whether its agent task runs.

mod agent;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::task::JoinHandle;

use super::{Backend, Capabilities, SnapshotTaken, Started, Usage, VolumeAccess};
use crate::error::{CoreError, CoreResult};
use crate::model::{Isolation, SandboxRecord};
use crate::snapshot::SnapshotKind;

/// An operation of the backend, as recorded and as told to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// [`Backend::create`].
    Create,
    /// [`Backend::destroy`].
    Destroy,
    /// [`Backend::pause`].
    Pause,
    /// [`Backend::resume`].
    Resume,
    /// [`Backend::hibernate`].
    Hibernate,
    /// [`Backend::wake`].
    Wake,
    /// [`Backend::snapshot`] and [`Backend::fork_snapshot`].
    Snapshot,
    /// [`Backend::remove_snapshot`].
    RemoveSnapshot,
}

/// One recorded call: the operation and the sandbox (or snapshot directory) it was for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// What was called.
    pub operation: Operation,
    /// The sandbox id, or the snapshot directory's name.
    pub target: String,
}

#[derive(Default)]
struct FakeState {
    calls: Vec<Call>,
    failing: HashSet<Operation>,
    /// Running agents, by sandbox id.
    agents: HashMap<String, JoinHandle<()>>,
}

/// The fake backend. Clones share their state.
#[derive(Clone)]
pub struct FakeBackend {
    isolation: Isolation,
    capabilities: Capabilities,
    /// Where the agents' sockets are.
    dir: PathBuf,
    state: Arc<Mutex<FakeState>>,
}

impl FakeBackend {
    /// A fake of `isolation` with its agents' sockets in `dir` (which must exist and stay
    /// short enough for a socket path), able to do what an `ns` backend can.
    pub fn new(isolation: Isolation, dir: &Path) -> Self {
        Self {
            isolation,
            capabilities: Capabilities {
                live_fork: false,
                memory_snapshots: false,
                volume_slots: 8,
                volume_access: VolumeAccess::HostMount,
                warm_pool: false,
                portable_hibernation: false,
            },
            dir: dir.to_path_buf(),
            state: Arc::default(),
        }
    }

    /// The same fake declaring `capabilities`.
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Make `operation` fail (with [`CoreError::SandboxFailed`]) until [`Self::succeed`].
    pub fn fail(&self, operation: Operation) {
        self.lock().failing.insert(operation);
    }

    /// Let `operation` succeed again.
    pub fn succeed(&self, operation: Operation) {
        self.lock().failing.remove(&operation);
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// The operations called for sandbox `id`, in order.
    pub fn operations_on(&self, id: &str) -> Vec<Operation> {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.target == id)
            .map(|c| c.operation)
            .collect()
    }

    /// Sandboxes whose agent runs now.
    pub fn running(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.lock().agents.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Stop the agent of sandbox `id` as if its container had died.
    pub fn crash(&self, id: &str) {
        if let Some(task) = self.lock().agents.remove(id) {
            task.abort();
        }
    }

    /// Record a call; fail it if told to.
    fn call(&self, operation: Operation, target: &str) -> CoreResult<()> {
        let mut state = self.lock();
        state.calls.push(Call {
            operation,
            target: target.to_string(),
        });
        if state.failing.contains(&operation) {
            return Err(CoreError::SandboxFailed(format!(
                "the fake backend was told to fail {operation:?}"
            )));
        }
        Ok(())
    }

    fn start_agent(&self, r: &SandboxRecord) -> CoreResult<Started> {
        let task = agent::serve(&self.agent_socket(&r.id), r.id.replace('_', "-"))
            .map_err(|e| CoreError::Internal(format!("the fake agent's socket: {e}")))?;
        if let Some(old) = self.lock().agents.insert(r.id.to_string(), task) {
            old.abort();
        }
        let pid = std::process::id() as i32;
        Ok(Started {
            agent: None,
            init_pid: pid,
            init_start_time: hutch_jail::start_time(pid).unwrap_or_default(),
            cgroups: Vec::new(),
            disk_mib: None,
            service_ready: false,
        })
    }

    fn stop_agent(&self, id: &str) {
        self.crash(id);
        let _ = std::fs::remove_file(self.agent_socket(id));
    }
}

impl Drop for FakeState {
    fn drop(&mut self) {
        for task in self.agents.values() {
            task.abort();
        }
    }
}

#[async_trait::async_trait]
impl Backend for FakeBackend {
    fn isolation(&self) -> Isolation {
        self.isolation
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    async fn create(&self, r: &SandboxRecord, _rootfs: &Path) -> CoreResult<Started> {
        self.call(Operation::Create, &r.id)?;
        self.start_agent(r)
    }

    async fn destroy(&self, r: &SandboxRecord) -> CoreResult<()> {
        self.call(Operation::Destroy, &r.id)?;
        self.stop_agent(&r.id);
        Ok(())
    }

    fn agent_socket(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.sock"))
    }

    fn alive(&self, r: &SandboxRecord) -> bool {
        self.lock().agents.contains_key(r.id.as_str())
    }

    fn usage(&self, r: &SandboxRecord) -> Option<Usage> {
        Some(Usage {
            memory_limit_bytes: r.memory_mib << 20,
            pids: 1,
            ..Usage::default()
        })
    }

    async fn pause(&self, r: &SandboxRecord) -> CoreResult<()> {
        self.call(Operation::Pause, &r.id)
    }

    async fn resume(&self, r: &SandboxRecord) -> CoreResult<()> {
        self.call(Operation::Resume, &r.id)
    }

    async fn hibernate(&self, r: &SandboxRecord) -> CoreResult<()> {
        self.call(Operation::Hibernate, &r.id)?;
        self.stop_agent(&r.id);
        Ok(())
    }

    async fn wake(&self, r: &SandboxRecord, _rootfs: &Path) -> CoreResult<Started> {
        self.call(Operation::Wake, &r.id)?;
        self.start_agent(r)
    }

    async fn snapshot(&self, r: &SandboxRecord, _dir: &Path) -> CoreResult<SnapshotTaken> {
        self.call(Operation::Snapshot, &r.id)?;
        Ok(SnapshotTaken {
            kind: if self.capabilities.memory_snapshots {
                SnapshotKind::Memory
            } else {
                SnapshotKind::Filesystem
            },
            size_bytes: 0,
            files: 0,
        })
    }

    async fn remove_snapshot(&self, dir: &Path) -> CoreResult<()> {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.call(Operation::RemoveSnapshot, &name)?;
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CoreError::Internal(
                format!("remove {}: {e}", dir.display()),
            )),
            _ => Ok(()),
        }
    }
}

/// A manager over a [`FakeBackend`] of isolation `ns` (also what `auto` means), with its
/// state, claims and agent sockets under `dir` and one ready template, `minimal` (64 MiB,
/// 1 CPU), as the default. Needs no root: nothing is mounted and no namespace is made.
pub async fn start_manager(dir: &Path) -> CoreResult<(Arc<crate::Manager>, FakeBackend)> {
    start_manager_with(dir, None).await
}

/// [`start_manager`] with the fake declaring `capabilities` (`None`: those of `ns`).
pub async fn start_manager_with(
    dir: &Path,
    capabilities: Option<Capabilities>,
) -> CoreResult<(Arc<crate::Manager>, FakeBackend)> {
    let io = |what: &str, e: std::io::Error| CoreError::Internal(format!("{what}: {e}"));
    let state = dir.join("state");
    let template = state.join("templates").join("minimal");
    std::fs::create_dir_all(template.join("rootfs")).map_err(|e| io("template", e))?;
    let info = serde_json::json!({
        "format": 1,
        "recipe": "fake",
        "name": "minimal",
        "ready": true,
        "isolations": ["ns"],
        "size_bytes": 0,
        "created_at": "2025-05-20T12:00:00Z",
        "description": "an empty root for the fake backend",
        "defaults": {"cpus": 1.0, "memory_mib": 64, "disk_mib": 64, "pids_max": 64}
    });
    std::fs::write(template.join("template.json"), info.to_string())
        .map_err(|e| io("template.json", e))?;
    let agents = dir.join("agents");
    std::fs::create_dir_all(&agents).map_err(|e| io("agents", e))?;
    let mut cfg = crate::Config::new(state, PathBuf::from("/nonexistent/hutch"), PathBuf::new());
    cfg.uid_slots_dir = dir.join("uid-slots");
    cfg.default_template = "minimal".into();
    let mut fake = FakeBackend::new(Isolation::Ns, &agents);
    if let Some(capabilities) = capabilities {
        fake = fake.with_capabilities(capabilities);
    }
    let backend: Arc<dyn Backend> = Arc::new(fake.clone());
    let manager = crate::Manager::start_with(
        cfg,
        Box::new(move |_, _, _| super::Backends::new(vec![backend], Isolation::Ns)),
    )
    .await?;
    Ok((manager, fake))
}
