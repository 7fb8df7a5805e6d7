//! Configuration of the manager, resolved by the binary from flags and the host.

use std::path::PathBuf;
use std::time::Duration;

/// How the manager runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// Root of Hutch's state: `state.db`, `sandboxes/`, `snapshots/`, `admin.key`.
    pub state_dir: PathBuf,
    /// Where templates live (default `<state_dir>/templates`).
    pub templates_dir: PathBuf,
    /// The `hutch` executable, run as `hutch __jail-spawn` to build each `ns` sandbox.
    pub hutch_exe: PathBuf,
    /// The static `hutch-agent` binary mounted into every sandbox.
    pub agent_binary: PathBuf,
    /// Template used when a create names none.
    pub default_template: String,
    /// TTL when a create gives none.
    pub default_ttl_seconds: u64,
    /// Largest TTL a client may ask for.
    pub max_ttl_seconds: u64,
    /// How often the reaper looks for expired sandboxes.
    pub reaper_interval: Duration,
    /// How often the host is compared with the records while the server runs (what no
    /// record owns is removed: `manager/reconcile.rs`); it is also done at start and stop.
    pub reconcile_interval: Duration,
    /// Per-stream cap of collected exec output.
    pub output_cap_bytes: usize,
    /// Server-wide budget of collected exec output held in memory (`output.rs`): past it
    /// collectors wait, one exec at a time overdrawing by at most its cap.
    pub exec_output_budget_bytes: usize,
    /// Execs (collected, streamed, PTY) running at once in one sandbox; more are refused.
    pub max_execs_per_sandbox: usize,
    /// Name of Hutch's parent cgroup in every hierarchy.
    pub cgroup_parent: String,
    /// Largest CPU count one sandbox may ask for.
    pub max_cpus: f64,
    /// Largest memory one sandbox may ask for.
    pub max_memory_mib: u64,
    /// Largest pids limit one sandbox may ask for.
    pub max_pids: u32,
    /// Default exec timeout when the request gives none.
    pub default_exec_timeout: Duration,
    /// Sandbox networking (`None`: every sandbox has loopback only).
    pub network: Option<hutch_net::NetConfig>,
    /// Cache of the `vm` backend: guest kernel, initramfs, template images, bakes
    /// (default `<state_dir>/vm`; may be shared by several servers).
    pub vm_dir: PathBuf,
    /// The QEMU binary of the `vm` backend.
    pub qemu: PathBuf,
    /// A static busybox for the guest initramfs.
    pub busybox: PathBuf,
    /// An unpacked Debian kernel package to boot instead of fetching one.
    pub vm_kernel_root: Option<PathBuf>,
    /// Warm `vm` guests kept ready per template and guest shape once one was asked for
    /// (`manager/warm.rs`; 0: every create restores on demand).
    pub vm_warm: usize,
    /// How memory snapshots of running `vm` guests (named ones and live forks) are taken.
    pub vm_snapshot: VmSnapshotMethod,
    /// Most bytes of a `vm` guest's serial console the host keeps (its ring,
    /// `hutch_vm::console`); older output is dropped.
    pub vm_console_bytes: u64,
    /// Size of the btrfs image `<state_dir>/layers.btrfs` holding `ns` sandboxes' upper
    /// layers, one subvolume each limited to its `disk_mib`, allocated on the state disk when
    /// made (`None`: [`crate::state_disk::default_pool_bytes`]; `Some(0)`: no image,
    /// `disk_mib` not enforced on `ns`).
    pub ns_disk_pool_bytes: Option<u64>,
    /// The host-wide directory of uid slot claims shared by every server on the host
    /// (`uid_slots.rs`; default `/run/hutch/uid-slots`, so claims last one boot).
    pub uid_slots_dir: PathBuf,
    /// How many uid slots (ranges of 65,536 ids) sandboxes may use: slots `16..16 + N`,
    /// at most [`MAX_UID_SLOTS`].
    pub uid_slots: u32,
    /// How often live sandboxes' usage is sampled (`manager/usage.rs`).
    pub usage_interval: Duration,
    /// How often the disk of snapshots, volumes and hibernated sandboxes is sampled.
    pub disk_usage_interval: Duration,
    /// The append-only usage log (`None`: `<state_dir>/usage.jsonl`).
    pub usage_log: Option<PathBuf>,
    /// Prices turning usage into cost (`None`: budgets count CPU-seconds).
    pub rate_card: Option<crate::usage::RateCard>,
    /// What happens to the running sandboxes of whoever reached a spending cap.
    pub budget_action: BudgetAction,
}

/// What a spending cap does to running sandboxes (`hutch serve --budget-action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BudgetAction {
    /// Hibernate them: their state is kept on disk and they hold no CPU or memory.
    #[default]
    Hibernate,
    /// Pause them: frozen in memory, resumed at once.
    Pause,
}

/// Default of [`Config::usage_interval`].
pub const DEFAULT_USAGE_INTERVAL: Duration = Duration::from_secs(5);
/// Default of [`Config::disk_usage_interval`].
pub const DEFAULT_DISK_USAGE_INTERVAL: Duration = Duration::from_secs(60);

/// First uid slot handed out (slot × 65536 = uid base): keeps clear of host users.
pub const MIN_UID_SLOT: u32 = 16;
/// Most uid slots: 16..60000 keeps every uid below 2^32.
pub const MAX_UID_SLOTS: u32 = 60_000 - MIN_UID_SLOT;
/// Default of [`Config::uid_slots_dir`].
pub const DEFAULT_UID_SLOTS_DIR: &str = "/run/hutch/uid-slots";
/// Default of [`Config::vm_console_bytes`]: the console ring kept per `vm` guest.
pub const DEFAULT_VM_CONSOLE_BYTES: u64 = hutch_vm::console::DEFAULT_CAP_BYTES;

/// How a memory snapshot of a running `vm` guest is taken (`backend/vm/capture.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmSnapshotMethod {
    /// Device state saved alone, RAM copied out of QEMU; a full stream if that fails.
    Capture,
    /// Always a full migration stream to a file, loaded into a shared memory file (slower;
    /// for hosts where capturing misbehaves).
    Stream,
}

impl Config {
    /// Defaults for a state directory, with host limits read from the machine.
    pub fn new(state_dir: PathBuf, hutch_exe: PathBuf, agent_binary: PathBuf) -> Self {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get() as f64)
            .unwrap_or(1.0);
        Self {
            templates_dir: state_dir.join("templates"),
            vm_dir: state_dir.join("vm"),
            state_dir,
            hutch_exe,
            agent_binary,
            default_template: "base".into(),
            default_ttl_seconds: 300,
            max_ttl_seconds: 7 * 24 * 3600,
            reaper_interval: Duration::from_secs(1),
            reconcile_interval: Duration::from_secs(60),
            output_cap_bytes: 16 << 20,
            exec_output_budget_bytes: 256 << 20,
            max_execs_per_sandbox: 32,
            cgroup_parent: "hutch".into(),
            max_cpus: cpus,
            max_memory_mib: host_memory_mib().max(64),
            max_pids: 32_768,
            default_exec_timeout: Duration::from_secs(60),
            network: None,
            qemu: PathBuf::from("qemu-system-x86_64"),
            busybox: PathBuf::from("/bin/busybox"),
            vm_kernel_root: None,
            vm_warm: 0,
            vm_snapshot: VmSnapshotMethod::Capture,
            vm_console_bytes: DEFAULT_VM_CONSOLE_BYTES,
            ns_disk_pool_bytes: None,
            uid_slots_dir: PathBuf::from(DEFAULT_UID_SLOTS_DIR),
            uid_slots: MAX_UID_SLOTS,
            usage_interval: DEFAULT_USAGE_INTERVAL,
            disk_usage_interval: DEFAULT_DISK_USAGE_INTERVAL,
            usage_log: None,
            rate_card: None,
            budget_action: BudgetAction::Hibernate,
        }
    }

    /// The btrfs image holding `ns` sandboxes' upper layers.
    pub fn disk_pool_image(&self) -> PathBuf {
        self.state_dir.join("layers.btrfs")
    }

    /// Where [`Config::disk_pool_image`] is mounted (a subvolume per `ns` sandbox).
    pub fn disk_pool_dir(&self) -> PathBuf {
        self.state_dir.join("layers")
    }

    /// Directory of one sandbox's files.
    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.state_dir.join("sandboxes").join(id)
    }

    /// Directory of every snapshot (mode 0700: snapshots hold files owned by host ids
    /// 0-65535, setuid ones included).
    pub fn snapshots_dir(&self) -> PathBuf {
        self.state_dir.join("snapshots")
    }

    /// Directory of one snapshot.
    pub fn snapshot_dir(&self, id: &str) -> PathBuf {
        self.snapshots_dir().join(id)
    }

    /// Directory of volume `id`: `disk.ext4` (the image) and `mnt/` (where it is mounted
    /// while a sandbox uses it).
    pub fn volume_dir(&self, id: &str) -> PathBuf {
        self.state_dir.join("volumes").join(id)
    }
}

/// The number after `key` in a `/proc` file of `Key:  value kB` lines (`/proc/meminfo`,
/// `/proc/PID/smaps_rollup`, …), if the file and the key are there.
pub fn proc_kib(path: &std::path::Path, key: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    })
}

/// Total memory of the host in MiB (from /proc/meminfo), 0 if unknown.
pub fn host_memory_mib() -> u64 {
    proc_kib(std::path::Path::new("/proc/meminfo"), "MemTotal").unwrap_or(0) / 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_kib_reads_the_exact_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("smaps_rollup");
        std::fs::write(&path, "Rss:   900 kB\nPss_Anon:  7 kB\nPss:   321 kB\n").expect("write");
        assert_eq!(proc_kib(&path, "Pss"), Some(321));
        assert_eq!(proc_kib(&path, "Rss"), Some(900));
        assert_eq!(proc_kib(&path, "Swap"), None);
        assert_eq!(proc_kib(&dir.path().join("missing"), "Pss"), None);
        assert!(host_memory_mib() > 0);
    }
}
