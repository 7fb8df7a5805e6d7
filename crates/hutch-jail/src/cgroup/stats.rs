//! Reading a sandbox's resource usage from its cgroups (v1 and v2 file formats).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Resource usage of one sandbox, read from its cgroups. Counters the host does not provide
/// read as 0 (or `None` where absence is meaningful).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupStats {
    /// Memory charged to the sandbox now, in bytes (v1 `memory.usage_in_bytes`, v2
    /// `memory.current`).
    pub memory_bytes: u64,
    /// The working set in bytes: the memory charged minus the file cache the kernel may
    /// reclaim at once (`memory.stat` `inactive_file`; v1 `total_inactive_file`), what
    /// container runtimes call the working set and what usage metering bills.
    pub memory_working_set_bytes: u64,
    /// The memory limit in bytes; 0 when unlimited.
    pub memory_limit_bytes: u64,
    /// Highest memory use seen, in bytes (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`),
    /// when the kernel provides it.
    pub memory_peak_bytes: Option<u64>,
    /// Tasks killed by the OOM killer inside the sandbox (v1 `memory.oom_control`, v2
    /// `memory.events`, field `oom_kill`). In v1 the OOM killer kills one task, not the group.
    pub oom_kills: u64,
    /// CPU time used, in nanoseconds (v1 `cpuacct.usage`, v2 `cpu.stat` `usage_usec`).
    pub cpu_usage_ns: u64,
    /// Tasks (processes and threads) in the sandbox now (`pids.current`).
    pub pids_current: u64,
}

/// Limits at or above this are the kernel's "unlimited" (v1 reports `PAGE_COUNTER_MAX` pages).
const UNLIMITED_FLOOR: u64 = 1 << 62;

/// The value of `key` in a flat keyed file (`oom_kill 3`, `usage_usec 123`, `frozen 1`).
pub(crate) fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next()? == key).then_some(())?;
        it.next()?.parse().ok()
    })
}

/// A limit file's value: `max` or a huge number mean unlimited (`None`).
pub(crate) fn limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|v| *v < UNLIMITED_FLOOR)
}

fn read(dir: &Path, file: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(file)).ok()
}

fn read_u64(dir: &Path, file: &str) -> Option<u64> {
    read(dir, file)?.trim().parse().ok()
}

/// Read the usage of a sandbox from its cgroup directories (as returned in
/// [`crate::SpawnedJail::cgroups`]). Missing directories or files read as zero.
pub fn cgroup_stats(cgroups: &[PathBuf]) -> CgroupStats {
    let mut s = CgroupStats::default();
    let mut have_cpuacct = false;
    for d in cgroups {
        if let Some(v) = read_u64(d, "memory.usage_in_bytes") {
            s.memory_bytes = v;
            let stat = read(d, "memory.stat").unwrap_or_default();
            let inactive = keyed(&stat, "total_inactive_file")
                .or_else(|| keyed(&stat, "inactive_file"))
                .unwrap_or(0);
            s.memory_working_set_bytes = v.saturating_sub(inactive);
            s.memory_limit_bytes = read(d, "memory.limit_in_bytes")
                .and_then(|t| limit(&t))
                .unwrap_or(0);
            s.memory_peak_bytes = read_u64(d, "memory.max_usage_in_bytes");
            s.oom_kills = read(d, "memory.oom_control")
                .and_then(|t| keyed(&t, "oom_kill"))
                .unwrap_or(0);
        } else if let Some(v) = read_u64(d, "memory.current") {
            s.memory_bytes = v;
            let inactive = read(d, "memory.stat")
                .and_then(|t| keyed(&t, "inactive_file"))
                .unwrap_or(0);
            s.memory_working_set_bytes = v.saturating_sub(inactive);
            s.memory_limit_bytes = read(d, "memory.max").and_then(|t| limit(&t)).unwrap_or(0);
            s.memory_peak_bytes = read_u64(d, "memory.peak");
            s.oom_kills = read(d, "memory.events")
                .and_then(|t| keyed(&t, "oom_kill"))
                .unwrap_or(0);
        }
        if let Some(v) = read_u64(d, "cpuacct.usage") {
            s.cpu_usage_ns = v;
            have_cpuacct = true;
        } else if !have_cpuacct {
            if let Some(us) = read(d, "cpu.stat").and_then(|t| keyed(&t, "usage_usec")) {
                s.cpu_usage_ns = us.saturating_mul(1000);
            }
        }
        if let Some(v) = read_u64(d, "pids.current") {
            s.pids_current = v;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_keyed_files() {
        let oom_control = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(keyed(oom_control, "oom_kill"), Some(2));
        assert_eq!(keyed(oom_control, "oom"), None);
        let events = "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(keyed(events, "oom_kill"), Some(1));
        let cpu_stat = "usage_usec 1234\nuser_usec 1000\n";
        assert_eq!(keyed(cpu_stat, "usage_usec"), Some(1234));
        assert_eq!(keyed("populated 1\nfrozen 0\n", "frozen"), Some(0));
    }

    #[test]
    fn parses_limits() {
        assert_eq!(limit("max\n"), None);
        assert_eq!(limit("9223372036854771712\n"), None);
        assert_eq!(limit("67108864\n"), Some(64 << 20));
        assert_eq!(limit("garbage"), None);
    }

    #[test]
    fn reads_fake_v1_and_v2_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let mem = tmp.path().join("memory");
        let acct = tmp.path().join("cpuacct");
        let pids = tmp.path().join("pids");
        let v2 = tmp.path().join("v2");
        for d in [&mem, &acct, &pids, &v2] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(mem.join("memory.usage_in_bytes"), "1000\n").unwrap();
        std::fs::write(mem.join("memory.limit_in_bytes"), "4096\n").unwrap();
        std::fs::write(mem.join("memory.max_usage_in_bytes"), "2000\n").unwrap();
        std::fs::write(
            mem.join("memory.oom_control"),
            "oom_kill_disable 0\noom_kill 3\n",
        )
        .unwrap();
        std::fs::write(
            mem.join("memory.stat"),
            "cache 300\ninactive_file 100\ntotal_inactive_file 250\n",
        )
        .unwrap();
        std::fs::write(acct.join("cpuacct.usage"), "555\n").unwrap();
        std::fs::write(pids.join("pids.current"), "4\n").unwrap();
        // The hybrid unified dir has cpu.stat too; cpuacct wins.
        std::fs::write(v2.join("cpu.stat"), "usage_usec 9\n").unwrap();
        let s = cgroup_stats(&[mem, acct, pids, v2.clone()]);
        assert_eq!(
            s,
            CgroupStats {
                memory_bytes: 1000,
                // The hierarchical inactive file pages are reclaimable.
                memory_working_set_bytes: 750,
                memory_limit_bytes: 4096,
                memory_peak_bytes: Some(2000),
                oom_kills: 3,
                cpu_usage_ns: 555,
                pids_current: 4,
            }
        );

        std::fs::write(v2.join("memory.current"), "77\n").unwrap();
        std::fs::write(v2.join("memory.max"), "max\n").unwrap();
        std::fs::write(v2.join("memory.stat"), "anon 50\ninactive_file 20\n").unwrap();
        std::fs::write(v2.join("memory.events"), "oom 2\noom_kill 2\n").unwrap();
        std::fs::write(v2.join("pids.current"), "1\n").unwrap();
        let s = cgroup_stats(&[v2]);
        assert_eq!(s.memory_bytes, 77);
        assert_eq!(s.memory_working_set_bytes, 57);
        assert_eq!(s.memory_limit_bytes, 0);
        assert_eq!(s.memory_peak_bytes, None);
        assert_eq!(s.oom_kills, 2);
        assert_eq!(s.cpu_usage_ns, 9000);
        assert_eq!(s.pids_current, 1);
    }
}
