//! What the agent remembers between requests: its environment, the identity the host gave
//! it, which execs are running (for `POST /v1/signal`) and its process handles.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crate::cgroups::ExecCgroups;
use crate::reaper::Reaper;

/// Shared state of the agent; one per process.
#[derive(Debug)]
pub struct Agent {
    /// The one reaper of the process.
    pub reaper: Arc<Reaper>,
    /// The agent's own environment, the base of every exec's.
    pub agent_env: Vec<(String, String)>,
    /// The open-files limit the agent started with; children get it back.
    pub nofile: Option<libc::rlimit>,
    /// The agent's effective uid.
    pub euid: u32,
    /// A cgroup per exec (`vm` guests: the agent is init), to count OOM kills.
    pub exec_cgroups: Option<ExecCgroups>,
    /// The sandbox's start command, once started.
    pub service: crate::service::ServiceSlot,
    /// Process handles, live and recently exited.
    pub processes: Arc<crate::process::ProcessTable>,
    identity_env: RwLock<BTreeMap<String, String>>,
    running: Mutex<HashSet<u32>>,
}

impl Agent {
    /// State for a new agent process.
    pub fn new(
        reaper: Arc<Reaper>,
        agent_env: Vec<(String, String)>,
        nofile: Option<libc::rlimit>,
        euid: u32,
    ) -> Self {
        Self {
            reaper,
            agent_env,
            nofile,
            euid,
            exec_cgroups: None,
            service: crate::service::ServiceSlot::default(),
            processes: Arc::default(),
            identity_env: RwLock::default(),
            running: Mutex::default(),
        }
    }

    /// The same agent putting every exec into a cgroup of its own.
    pub fn with_exec_cgroups(mut self, cgroups: Option<ExecCgroups>) -> Self {
        self.exec_cgroups = cgroups;
        self
    }

    /// The environment set by the last identity call.
    pub fn identity_env(&self) -> BTreeMap<String, String> {
        self.identity_env
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Replace the identity environment.
    pub fn set_identity_env(&self, env: BTreeMap<String, String>) {
        *self
            .identity_env
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = env;
    }

    /// Record a running exec until the returned guard is dropped.
    pub fn register_exec(self: &Arc<Self>, pid: u32) -> RunningExec {
        self.running_set().insert(pid);
        RunningExec {
            agent: Arc::clone(self),
            pid,
        }
    }

    /// Whether `pid` is an exec of ours that has not exited yet.
    pub fn is_running(&self, pid: u32) -> bool {
        self.running_set().contains(&pid)
    }

    fn running_set(&self) -> MutexGuard<'_, HashSet<u32>> {
        // Single inserts and removes cannot leave the set inconsistent.
        self.running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A running exec's entry; removed when dropped.
#[derive(Debug)]
pub struct RunningExec {
    agent: Arc<Agent>,
    pid: u32,
}

impl Drop for RunningExec {
    fn drop(&mut self) {
        self.agent.running_set().remove(&self.pid);
    }
}
