//! The sandbox as the manager knows it: its state machine, its record, and typed commands.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::SandboxId;
use crate::tenant::Tenant;

/// The metadata key the API shows a sandbox's tenant as.
pub const TENANT_KEY: &str = "tenant_id";

/// Lifecycle states. See `can_*` for what each allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Being created.
    Starting,
    /// Running; accepts exec and file calls.
    Running,
    /// Frozen (no CPU); only resume and kill are allowed.
    Paused,
    /// State on disk, no process running; woken by the next call.
    Hibernated,
    /// Stopped on purpose.
    Stopped,
    /// Died or could not be created; see `error`.
    Failed,
    /// Its node was declared dead (cluster mode, `docs/cluster.md`): its processes are gone
    /// or being killed, and it can never run again; see `error`.
    Lost,
    /// A warm `vm` guest waiting in the pool to become a sandbox (`manager/warm.rs`): never
    /// shown by the API, not in [`SandboxState::ALL`].
    Pooled,
}

impl SandboxState {
    /// Every state, for metrics.
    pub const ALL: [SandboxState; 7] = [
        Self::Starting,
        Self::Running,
        Self::Paused,
        Self::Hibernated,
        Self::Stopped,
        Self::Failed,
        Self::Lost,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Hibernated => "hibernated",
            Self::Stopped => "stopped",
            Self::Failed => "failed",
            Self::Lost => "lost",
            Self::Pooled => "pooled",
        }
    }

    /// Parse a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Exec, PTY and file calls (a hibernated sandbox is woken first).
    pub fn can_use(self) -> bool {
        self == Self::Running
    }

    /// Freezing it.
    pub fn can_pause(self) -> bool {
        self == Self::Running
    }

    /// Thawing it.
    pub fn can_resume(self) -> bool {
        self == Self::Paused
    }

    /// Stopping its processes and keeping its state on disk.
    pub fn can_hibernate(self) -> bool {
        self == Self::Running
    }

    /// Starting it again from its state on disk (explicitly or by the next exec/file call).
    pub fn can_wake(self) -> bool {
        self == Self::Hibernated
    }

    /// Taking a snapshot of it, forking it, exploring from it. A hibernated sandbox's state is
    /// on disk and needs no waking for that.
    pub fn can_snapshot(self) -> bool {
        matches!(self, Self::Running | Self::Hibernated)
    }

    /// Whether the sandbox holds host resources (processes, mounts, cgroups).
    pub fn holds_resources(self) -> bool {
        matches!(
            self,
            Self::Starting | Self::Running | Self::Paused | Self::Pooled
        )
    }

    /// Whether the sandbox keeps files on disk (its upper layer, and so the snapshot it was
    /// created from).
    pub fn holds_disk(self) -> bool {
        self.holds_resources() || self == Self::Hibernated
    }

    /// What a client should do instead, for the 409 of a call this state refuses.
    pub fn hint(self, id: &str) -> String {
        match self {
            Self::Paused => format!(
                "only resume, kill, get and list are allowed on a paused sandbox (POST /v1/sandboxes/{id}/resume)"
            ),
            Self::Hibernated => format!(
                "wake it first (POST /v1/sandboxes/{id}/wake; exec and file calls wake it by themselves)"
            ),
            Self::Starting => "wait until it is running".into(),
            Self::Failed | Self::Stopped => "it cannot run again: create a new sandbox".into(),
            Self::Lost => format!(
                "its node was declared dead and it cannot run again: delete it (DELETE /v1/sandboxes/{id}) and create a new sandbox"
            ),
            Self::Running | Self::Pooled => String::new(),
        }
    }
}

/// Isolation backend of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// Hardened Linux namespaces.
    Ns,
    /// A microVM (not available yet).
    Vm,
}

impl Isolation {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ns => "ns",
            Self::Vm => "vm",
        }
    }
}

/// What a client asked for: `auto` is resolved by the manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum IsolationRequest {
    /// `vm` where hardware virtualization works, `ns` elsewhere.
    #[default]
    Auto,
    /// Namespaces.
    Ns,
    /// MicroVM.
    Vm,
}

/// A validated create command.
#[derive(Debug, Clone, Default)]
pub struct CreateSandbox {
    /// Template name (default `base`).
    pub template: Option<String>,
    /// Requested isolation.
    pub isolation: IsolationRequest,
    /// TTL in seconds (default from config).
    pub ttl_seconds: Option<u64>,
    /// Never reaped.
    pub persistent: bool,
    /// Owner (`None`: an admin's sandbox without a tenant).
    pub tenant: Option<Tenant>,
    /// Free-form string metadata (without `tenant_id`: that is [`CreateSandbox::tenant`]).
    pub metadata: BTreeMap<String, String>,
    /// Environment of every exec.
    pub env: BTreeMap<String, String>,
    /// CPUs (may be fractional, e.g. 0.5).
    pub cpus: Option<f64>,
    /// Memory limit.
    pub memory_mib: Option<u64>,
    /// Disk size (recorded; enforcement is a later issue).
    pub disk_mib: Option<u64>,
    /// Tasks limit.
    pub pids_max: Option<u32>,
    /// Network policy as given (validated by the manager).
    pub network: Option<hutch_net::policy::PolicySpec>,
    /// Start from this snapshot's files instead of the bare template (`snap_…`).
    pub snapshot: Option<String>,
    /// Hibernate after this many seconds without API calls or CPU use (0 or `None`: never).
    pub idle_hibernate_seconds: Option<u64>,
    /// Volumes to mount (`volume` is an id or a name).
    pub volumes: Vec<crate::volume::VolumeMount>,
    /// The API key creating it (its usage counts against the key's budgets).
    pub created_by: Option<crate::ids::KeyId>,
    /// Hibernate it once its metered cost reaches this (needs a rate card).
    pub max_cost_micros: Option<u64>,
    /// The id to give it (`None`: a new one). Only a cluster's placement sets it: it chose
    /// the id when it reserved room for the sandbox, so that the reservation and the record
    /// are counted once (`docs/cluster.md`).
    pub id: Option<crate::ids::SandboxId>,
}

/// A validated update (`PATCH`).
#[derive(Debug, Clone, Default)]
pub struct UpdateSandbox {
    /// New TTL (also refreshes the expiry).
    pub ttl_seconds: Option<u64>,
    /// New persistence flag.
    pub persistent: Option<bool>,
    /// Metadata keys to set (replaces the whole map when given; without `tenant_id`).
    pub metadata: Option<BTreeMap<String, String>>,
    /// New owner (`Some(None)`: none), for an admin's metadata naming a `tenant_id`.
    pub tenant: Option<Option<Tenant>>,
    /// New idle-hibernation delay (0 turns it off).
    pub idle_hibernate_seconds: Option<u64>,
}

/// One sandbox's row in the state database.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SandboxRecord {
    /// `sbx_…`.
    pub id: SandboxId,
    /// Template name.
    pub template: String,
    /// Backend.
    pub isolation: Isolation,
    /// Current state.
    pub state: SandboxState,
    /// Owner (`None`: an admin's sandbox without a tenant). Stored by the store as a column
    /// of its own, not in the serialized record; the API shows it as `metadata.tenant_id`.
    #[serde(default, skip_serializing)]
    pub tenant: Option<Tenant>,
    /// Metadata (without `tenant_id`: that is [`SandboxRecord::tenant`]).
    pub metadata: BTreeMap<String, String>,
    /// Environment.
    pub env: BTreeMap<String, String>,
    /// CPUs.
    pub cpus: f64,
    /// Memory limit in MiB.
    pub memory_mib: u64,
    /// Disk in MiB.
    pub disk_mib: u64,
    /// Tasks limit.
    pub pids_max: u32,
    /// TTL in seconds.
    pub ttl_seconds: u64,
    /// Persistent sandboxes are never reaped.
    pub persistent: bool,
    /// Creation time (ms since epoch).
    pub created_at_ms: i64,
    /// Expiry (ms since epoch); ignored when persistent.
    pub expires_at_ms: i64,
    /// Index of the uid range (uid base = index × 65536).
    pub uid_slot: u32,
    /// Host pid of the sandbox's init, when running.
    pub init_pid: Option<i32>,
    /// Start time of that pid, to recognise it after a restart.
    pub init_start_time: Option<u64>,
    /// cgroup directories.
    pub cgroups: Vec<String>,
    /// Why the sandbox failed.
    pub error: Option<String>,
    /// Its network policy and address (`None` in records older than networking: loopback
    /// only).
    pub network: Option<crate::sandbox_network::SandboxNetwork>,
    /// The snapshot whose files sit between this sandbox's upper layer and its template
    /// (named, or the hidden one of a fork); it is kept while this sandbox holds disk.
    #[serde(default)]
    pub layer: Option<String>,
    /// The named snapshot it was created from.
    #[serde(default)]
    pub snapshot: Option<String>,
    /// The sandbox it was forked from.
    #[serde(default)]
    pub forked_from: Option<String>,
    /// Hibernate after this many seconds of inactivity.
    #[serde(default)]
    pub idle_hibernate_seconds: Option<u64>,
    /// Last API call on it (ms since epoch; 0 for records written before this field).
    #[serde(default)]
    pub last_used_ms: i64,
    /// The network slot it holds (`None`: loopback only, or none held right now).
    #[serde(default)]
    pub net_slot: Option<u32>,
    /// Volumes mounted in it.
    #[serde(default)]
    pub volumes: Vec<crate::volume::VolumeMount>,
    /// The start command its template gave it when it was created (and its ready check):
    /// run by its agent at every start (create, wake; a `vm` guest restored from a snapshot
    /// taken with it up keeps it running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<hutch_proto::ServiceSpec>,
    /// The revision of its template it was made from (`None`: records made before
    /// revisions, which follow the current one): a rebuild never changes what it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_rev: Option<u64>,
    /// Working directory and user of its commands that name neither (its template's
    /// `WORKDIR` and `USER`, kept through snapshots and forks).
    #[serde(default, skip_serializing_if = "hutch_proto::ExecDefaults::is_empty")]
    pub exec_defaults: hutch_proto::ExecDefaults,
    /// The API key that created it (usage metering and key budgets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<crate::ids::KeyId>,
    /// Its own spending cap, in cost micros (`manager/budget.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_micros: Option<u64>,
    /// Its hibernated state as kept where every node reaches it (`handoff.rs`): set once
    /// uploaded, dropped when it runs again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_state: Option<crate::handoff::SavedState>,
    /// The key its hibernated state is being saved under, until the save is recorded in
    /// `saved_state` (`handoff.rs`): a save that finishes for an older hibernation is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saving: Option<String>,
    /// It moved to this node from another and has not run here yet (`handoff.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival: Option<crate::handoff::Arrival>,
}

/// The sandbox object of the API.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SandboxView {
    /// `sbx_…`.
    pub id: SandboxId,
    /// Template name.
    pub template: String,
    /// The template's revision it runs (absent for sandboxes made before revisions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template_rev: Option<u64>,
    /// `ns` or `vm`.
    pub isolation: Isolation,
    /// State name.
    pub state: SandboxState,
    /// Metadata.
    pub metadata: BTreeMap<String, String>,
    /// CPUs.
    pub cpus: f64,
    /// Memory limit in MiB.
    pub memory_mib: u64,
    /// Disk in MiB.
    pub disk_mib: u64,
    /// Tasks limit.
    pub pids_max: u32,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339, null when persistent.
    pub expires_at: Option<String>,
    /// TTL refreshed by every call.
    pub ttl_seconds: u64,
    /// Never reaped.
    pub persistent: bool,
    /// Network policy, address and traffic.
    pub network: crate::sandbox_network::NetworkView,
    /// Why it failed, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The named snapshot it was created from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// The sandbox it was forked from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<String>,
    /// Seconds of inactivity after which it hibernates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_hibernate_seconds: Option<u64>,
    /// Volumes mounted in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::volume::VolumeMount>,
    /// Its spending cap in cost micros: it hibernates once its metered cost reaches it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_micros: Option<u64>,
}

/// Whole vCPUs of a vm guest given `cpus` (a fraction of a CPU is one vCPU, its bandwidth
/// limited by the cgroup).
pub fn vcpus(cpus: f64) -> u32 {
    cpus.ceil().max(1.0) as u32
}

impl SandboxRecord {
    /// The API view of this record (its tenant shown as the `tenant_id` metadata key).
    pub fn view(&self) -> SandboxView {
        let mut metadata = self.metadata.clone();
        if let Some(t) = &self.tenant {
            metadata.insert(TENANT_KEY.into(), t.as_str().to_string());
        }
        SandboxView {
            id: self.id.clone(),
            template: self.template.clone(),
            template_rev: self.template_rev,
            isolation: self.isolation,
            state: self.state,
            metadata,
            cpus: self.cpus,
            memory_mib: self.memory_mib,
            disk_mib: self.disk_mib,
            pids_max: self.pids_max,
            created_at: crate::time::rfc3339(self.created_at_ms),
            expires_at: (!self.persistent).then(|| crate::time::rfc3339(self.expires_at_ms)),
            ttl_seconds: self.ttl_seconds,
            persistent: self.persistent,
            network: self
                .network
                .clone()
                .unwrap_or_else(crate::sandbox_network::SandboxNetwork::loopback_only)
                .into(),
            error: self.error.clone(),
            snapshot: self.snapshot.clone(),
            forked_from: self.forked_from.clone(),
            idle_hibernate_seconds: self.idle_hibernate_seconds,
            volumes: self.volumes.clone(),
            max_cost_micros: self.max_cost_micros,
        }
    }

    /// The name of the tenant it belongs to (for events).
    pub fn tenant(&self) -> Option<String> {
        self.tenant.as_ref().map(|t| t.as_str().to_string())
    }

    /// When it was last used (ms since epoch).
    pub fn last_used(&self) -> i64 {
        self.last_used_ms.max(self.created_at_ms)
    }
}

/// Filter for listing.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only this state.
    pub state: Option<SandboxState>,
    /// Every pair must match (`tenant_id` matches the tenant).
    pub metadata: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as the versions before the typed network policy stored it (the policy as a
    /// JSON value with the slot's address) loads, and saves back as the same JSON.
    #[test]
    fn records_stored_with_a_json_network_load() {
        let stored = serde_json::json!({
            "id": "sbx_0123456789abcdef0123",
            "template": "base",
            "isolation": "ns",
            "state": "running",
            "metadata": {"tenant_id": "t1"},
            "env": {},
            "cpus": 1.0,
            "memory_mib": 512,
            "disk_mib": 2048,
            "pids_max": 512,
            "ttl_seconds": 300,
            "persistent": false,
            "created_at_ms": 1_700_000_000_000_i64,
            "expires_at_ms": 1_700_000_300_000_i64,
            "uid_slot": 17,
            "init_pid": 4242,
            "init_start_time": 99,
            "cgroups": ["/sys/fs/cgroup/hutch/sbx_0123456789abcdef0123"],
            "error": null,
            "network": {
                "egress": "deny",
                "allow": ["203.0.113.0/24", "pypi.org"],
                "deny": [],
                "address": "10.200.0.10"
            },
            "layer": null,
            "snapshot": null,
            "forked_from": null,
            "idle_hibernate_seconds": null,
            "last_used_ms": 1_700_000_000_500_i64,
            "net_slot": 4,
            "volumes": []
        });
        let r: SandboxRecord = serde_json::from_value(stored.clone()).expect("loads");
        let network = r.network.as_ref().expect("a network");
        assert_eq!(network.policy.egress, hutch_net::policy::Egress::Deny);
        assert_eq!(
            network.policy.to_spec().allow,
            ["203.0.113.0/24", "pypi.org"]
        );
        assert_eq!(
            network.address,
            Some(std::net::Ipv4Addr::new(10, 200, 0, 10))
        );
        assert_eq!(serde_json::to_value(&r).expect("saves"), stored);
        let view = serde_json::to_value(r.view()).expect("a view");
        assert_eq!(view["network"], stored["network"]);

        // Records from before networking had none: loopback only.
        let mut old = stored;
        old["network"] = serde_json::Value::Null;
        let r: SandboxRecord = serde_json::from_value(old).expect("loads");
        assert!(r.network.is_none());
        let view = serde_json::to_value(r.view()).expect("a view");
        assert_eq!(view["network"]["egress"], "none");
    }

    #[test]
    fn state_names_round_trip_and_guard() {
        for s in SandboxState::ALL {
            assert_eq!(SandboxState::parse(s.as_str()), Some(s));
        }
        assert!(SandboxState::Running.can_use());
        assert!(!SandboxState::Paused.can_use());
        assert!(!SandboxState::Failed.holds_resources());
        let allowed = |f: fn(SandboxState) -> bool| {
            SandboxState::ALL
                .into_iter()
                .filter(|s| f(*s))
                .map(SandboxState::as_str)
                .collect::<Vec<_>>()
        };
        assert_eq!(allowed(SandboxState::can_pause), ["running"]);
        assert_eq!(allowed(SandboxState::can_resume), ["paused"]);
        assert_eq!(allowed(SandboxState::can_hibernate), ["running"]);
        assert_eq!(allowed(SandboxState::can_wake), ["hibernated"]);
        assert_eq!(
            allowed(SandboxState::can_snapshot),
            ["running", "hibernated"]
        );
        assert_eq!(
            allowed(SandboxState::holds_disk),
            ["starting", "running", "paused", "hibernated"]
        );
        assert!(SandboxState::Paused
            .hint("sbx_a")
            .contains("/v1/sandboxes/sbx_a/resume"));
    }
}
