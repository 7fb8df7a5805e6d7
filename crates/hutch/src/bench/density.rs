//! Density: memory of idle sandboxes, as the proportional set size (PSS) of their processes,
//! and the host's memory growth while they exist.

use std::path::Path;

use hutch_core::config::proc_kib;

/// PSS in KiB of every process in the sandbox's cgroup (v1 `pids` or v2 hierarchy).
pub fn sandbox_pss_kib(id: &str) -> u64 {
    sandbox_kib(id, &["Pss"])
}

/// The sum of the `smaps_rollup` fields `keys` (KiB) over every process in the sandbox's
/// cgroup (v1 `pids` or v2 hierarchy).
pub fn sandbox_kib(id: &str, keys: &[&str]) -> u64 {
    let candidates = [
        format!("/sys/fs/cgroup/pids/hutch/{id}/cgroup.procs"),
        format!("/sys/fs/cgroup/hutch/{id}/cgroup.procs"),
    ];
    let Some(procs) = candidates
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
    else {
        return 0;
    };
    procs
        .lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .map(|pid| {
            let rollup = Path::new("/proc")
                .join(pid.to_string())
                .join("smaps_rollup");
            keys.iter()
                .map(|k| proc_kib(&rollup, k).unwrap_or(0))
                .sum::<u64>()
        })
        .sum()
}

/// `MemAvailable` in KiB.
pub fn mem_available_kib() -> u64 {
    proc_kib(Path::new("/proc/meminfo"), "MemAvailable").unwrap_or(0)
}
