//! The namespace jail (DESIGN.md §3).
//!
//! [`spawn`] builds one sandbox: an idmapped read-only bind of the template under a
//! per-sandbox overlay, a child cloned into new user/pid/mount/net/ipc/uts/cgroup namespaces
//! with its own uid range, cgroup limits, a pivoted root with masked `/proc` and a minimal
//! `/dev`, capabilities dropped, `no_new_privs`, Landlock and seccomp, and finally the agent
//! exec'd as PID 1 with its listening socket on fd [`AGENT_LISTEN_FD`].
//!
//! [`spawn`] forks: it must run in a single-threaded process. The `hutch` binary runs it in a
//! short-lived helper (`hutch __jail-spawn`, [`helper_main`]) that reads a [`JailSpec`] as JSON
//! on stdin and prints a [`SpawnedJail`] as JSON on stdout. The sandbox's init outlives the
//! helper (it is re-parented to the nearest subreaper, the server).
//!
//! [`destroy`], [`stop`], [`export_layer`] and the cgroup readers do not fork and are safe to
//! call from the server.
//!
//! [`exec_plan`] is the one primitive that does fork from the server: a program exec'd into
//! new namespaces after a list of steps prepared before the clone, run without allocating
//! (QEMU's jail is built on it).
//!
//! Layers, what each stops and how it is proven: `docs/isolation.md`.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod btrfs;
mod caps;
mod cgroup;
mod child;
pub mod exec_plan;
mod fsat;
mod helper;
mod host;
mod landlock;
mod layer;
pub mod mountinfo;
mod mounts;
mod procstat;
mod rootfs;
mod seccomp;
mod spawn;
mod spec;
mod sys;
mod teardown;
pub mod volume;
pub mod volume_check;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use cgroup::{
    cgroup_stats, create_process_cgroups, freeze, release_process_cgroups, sandbox_cgroups,
    set_process_cpu_limit, thaw, CgroupStats,
};
pub use helper::{helper_main, spawn_with_helper, HELPER_ARG};
pub use host::{find_program, host_report, HostCheck, HostReport};
pub use layer::{
    export_layer, flatten_layer, layer_usage, pack_layer, remove_layer, unpack_layer, LayerExport,
    LayerFlatten, LayerStats,
};
pub use procstat::{init_alive, start_time};
pub use spawn::spawn;
pub use spec::check_volume_target;
pub use teardown::{destroy, stop, Teardown};

/// Most read-only layers a sandbox may stack between its upper directory and its template.
pub const MAX_LAYERS: usize = 8;

pub use hutch_proto_consts::AGENT_LISTEN_FD;

mod hutch_proto_consts {
    /// Must equal `hutch_proto::AGENT_LISTEN_FD`.
    pub const AGENT_LISTEN_FD: i32 = 3;
}

/// Resource limits applied through cgroups. A zero means "no limit" for that resource.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Hard memory limit in bytes (RAM + swap).
    pub memory_bytes: u64,
    /// CPU bandwidth in thousandths of a CPU (1000 = one full core; at least 10 is applied).
    pub cpu_millis: u32,
    /// Maximum number of tasks (processes + threads).
    pub pids_max: u32,
    /// Size of the sandbox's `/tmp` tmpfs in bytes (also the size of `/dev/shm`). tmpfs pages
    /// are charged to the sandbox's memory limit as well.
    pub tmp_bytes: u64,
}

/// Everything needed to build one sandbox.
///
/// The directories on the way to `sandbox_dir` and `agent_binary` must be searchable by
/// other users (`o+x`): the sandbox's setup runs as its own unprivileged host uid.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JailSpec {
    /// Sandbox id (`sbx_…`); names the cgroups.
    pub id: String,
    /// The template's read-only root filesystem directory.
    pub template_rootfs: PathBuf,
    /// Per-sandbox directory owned by Hutch; `upper/`, `work/`, `lower/`, `merged/` and
    /// `agent.log` are created inside it. An existing `upper/` (e.g. restored from a snapshot)
    /// is used as is (it must already be owned by `uid_base`). Must not contain `,`, `:`, `\\`
    /// or whitespace (overlayfs options).
    pub sandbox_dir: PathBuf,
    /// First host uid/gid of the sandbox's range; root inside maps to it. At least 65536.
    pub uid_base: u32,
    /// Size of the range (65536).
    pub uid_count: u32,
    /// Host path of the static agent binary, bind-mounted read-only at
    /// `/.hutch/hutch-agent` inside the sandbox.
    pub agent_binary: PathBuf,
    /// Arguments passed to the agent after its path.
    pub agent_args: Vec<String>,
    /// Host path where the agent's unix socket is bound (mode 0600; a stale socket is
    /// replaced); the listening socket is passed to the agent as fd [`AGENT_LISTEN_FD`]. Keep
    /// it inside `sandbox_dir`: [`destroy`] deletes that directory, not the socket separately.
    pub agent_socket: PathBuf,
    /// Read-only layers stacked between `upper/` and the template, topmost first (a
    /// snapshot's files, see [`export_layer`]). Each holds 0-based ids like a template and is
    /// bound idmapped and read-only the same way, at `sandbox_dir/layer-N`. At most
    /// [`MAX_LAYERS`].
    #[serde(default)]
    pub layers: Vec<PathBuf>,
    /// Hostname inside the sandbox.
    pub hostname: String,
    /// Environment of the agent (and so the default of every exec).
    pub env: Vec<(String, String)>,
    /// cgroup limits.
    pub limits: Limits,
    /// Name of the parent cgroup under each hierarchy (e.g. `hutch`).
    pub cgroup_parent: String,
    /// A network namespace to join instead of creating a new one (a path such as
    /// `/proc/<pid>/fd/<fd>`, opened by the jail before it clones). It belongs to the host's
    /// user namespace, so root inside the sandbox holds no capability over it: its
    /// interfaces, addresses, routes and firewall are set up from outside. `None`: a new,
    /// empty namespace with only `lo`.
    #[serde(default)]
    pub netns: Option<PathBuf>,
    /// A file bound read-only at `/etc/resolv.conf` inside the sandbox.
    #[serde(default)]
    pub resolv_conf: Option<PathBuf>,
    /// Host directories (mounted volumes) bound inside the sandbox, idmapped into its uid
    /// range. At most [`MAX_VOLUMES`].
    #[serde(default)]
    pub volumes: Vec<VolumeBind>,
    /// Where the overlay's `upper` and `work` directories are, when not in `sandbox_dir`
    /// (`ns`: a btrfs subvolume with the sandbox's disk quota, see [`btrfs`]). Must be on one
    /// filesystem; kept by [`stop`] like `sandbox_dir/upper`.
    #[serde(default)]
    pub upper_dir: Option<PathBuf>,
}

/// Most volumes one sandbox may mount.
pub const MAX_VOLUMES: usize = 16;

/// One volume to bind into a sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeBind {
    /// Host directory (the volume's mounted filesystem, 0-based owners).
    pub source: PathBuf,
    /// Absolute path inside the sandbox (normalised: no `.`, `..` or empty components).
    pub target: String,
    /// Bound read-only.
    pub read_only: bool,
}

/// What [`spawn`] reports back.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SpawnedJail {
    /// Host pid of the sandbox's init (the agent).
    pub init_pid: i32,
    /// Start time of that pid (field 22 of `/proc/PID/stat`), to recognise it after a restart.
    pub init_start_time: u64,
    /// Every cgroup directory created for the sandbox.
    pub cgroups: Vec<PathBuf>,
    /// Milliseconds from the start of [`spawn`] until the agent was exec'd, for metrics.
    pub setup_ms: f64,
}

/// Errors of the jail.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// A system call failed.
    #[error("{op}: {source}")]
    Sys {
        /// What was being done.
        op: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The host lacks a feature the jail needs.
    #[error("host does not support {0}")]
    Unsupported(String),
    /// The child failed during in-namespace setup; the message comes from the child.
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    /// The helper's input or output was not valid.
    #[error("bad helper message: {0}")]
    Protocol(String),
    /// The spec is not acceptable; nothing was created.
    #[error("invalid jail spec: {0}")]
    InvalidSpec(String),
    /// A destructive step was refused because it could reach outside the sandbox.
    #[error("refusing to {0}")]
    Refused(String),
    /// Something did not happen in time.
    #[error("timed out waiting for {0}")]
    Timeout(String),
    /// A host command (`mkfs.*`) did not finish within its deadline and was killed.
    #[error("{0}")]
    HostCommand(#[from] hutch_host_command::HostCommandError),
    /// A volume's filesystem has damage that the check would not (or could not) repair.
    #[error(
        "the volume's filesystem is damaged{}: {report}",
        if *repairable { " beyond what a safe automatic check repairs" } else { " and e2fsck could not repair it" }
    )]
    VolumeDamaged {
        /// A full repair (`e2fsck -y`) may still fix it.
        repairable: bool,
        /// The last lines of e2fsck's report.
        report: String,
    },
}
