//! Prometheus metrics of the manager, rendered as text exposition format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Upper bounds (seconds) of the create-latency histogram buckets.
const CREATE_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Debug, Default)]
struct Histogram {
    counts: [u64; CREATE_BUCKETS.len()],
    sum: f64,
    total: u64,
}

/// Counters and histograms updated by the manager.
#[derive(Debug, Default)]
pub struct Metrics {
    create_latency: Mutex<Histogram>,
    /// Execs started (including streams and PTYs).
    pub execs: AtomicU64,
    /// Execs that ended by their timeout.
    pub exec_timeouts: AtomicU64,
    /// Sandboxes created successfully.
    pub creates: AtomicU64,
    /// Creates that failed.
    pub create_failures: AtomicU64,
    /// Sandboxes reaped by TTL.
    pub expired: AtomicU64,
    /// Sandboxes whose init died unexpectedly.
    pub failures: AtomicU64,
    /// OOM kills observed.
    pub oom_kills: AtomicU64,
    /// What the reconciliation at start removed, by kind.
    pub reconciled: Reconciled,
}

/// What the reconciliation at start removed (`hutch_reconciled_total{kind}`).
#[derive(Debug, Default)]
pub struct Reconciled {
    /// Creates (and fork children) an earlier server never answered: record still
    /// `starting`, removed with whatever they made.
    pub interrupted_creates: AtomicU64,
    /// Children of a fork (or explore) an earlier server never answered: running, but no
    /// client has their ids.
    pub fork_children: AtomicU64,
    /// Sandboxes no record names that had something on the host (processes, cgroups,
    /// mounts, directories).
    pub orphans: AtomicU64,
    /// Volume directories (images) no record names: a volume create cut before its record.
    pub orphan_volumes: AtomicU64,
}

impl Reconciled {
    fn render(&self, out: &mut String) {
        out.push_str("# HELP hutch_reconciled_total What the server removed at start because an interrupted operation left it and no client could use it: creates never answered, children of forks never answered, sandboxes on the host and volume images no record names.\n# TYPE hutch_reconciled_total counter\n");
        for (kind, v) in [
            ("interrupted_create", &self.interrupted_creates),
            ("fork_child", &self.fork_children),
            ("orphan", &self.orphans),
            ("orphan_volume", &self.orphan_volumes),
        ] {
            let _ = writeln!(
                out,
                "hutch_reconciled_total{{kind=\"{kind}\"}} {}",
                v.load(Ordering::Relaxed)
            );
        }
    }
}

impl Metrics {
    /// Record one successful create's latency.
    pub fn observe_create(&self, seconds: f64) {
        let mut h = self
            .create_latency
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for (i, bound) in CREATE_BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                h.counts[i] += 1;
            }
        }
        h.sum += seconds;
        h.total += 1;
        self.creates.fetch_add(1, Ordering::Relaxed);
    }

    /// Render with the current per-state gauge values.
    pub fn render(&self, states: &[(&str, u64)]) -> String {
        let mut out = String::new();
        out.push_str("# HELP hutch_sandboxes Sandboxes by state.\n# TYPE hutch_sandboxes gauge\n");
        for (state, n) in states {
            let _ = writeln!(out, "hutch_sandboxes{{state=\"{state}\"}} {n}");
        }
        let h = self
            .create_latency
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        out.push_str("# HELP hutch_sandbox_create_seconds Time from create request to a ready agent.\n# TYPE hutch_sandbox_create_seconds histogram\n");
        for (i, bound) in CREATE_BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "hutch_sandbox_create_seconds_bucket{{le=\"{bound}\"}} {}",
                h.counts[i]
            );
        }
        let _ = writeln!(
            out,
            "hutch_sandbox_create_seconds_bucket{{le=\"+Inf\"}} {}",
            h.total
        );
        let _ = writeln!(out, "hutch_sandbox_create_seconds_sum {}", h.sum);
        let _ = writeln!(out, "hutch_sandbox_create_seconds_count {}", h.total);
        drop(h);
        for (name, help, v) in [
            (
                "hutch_execs_total",
                "Commands started in sandboxes.",
                &self.execs,
            ),
            (
                "hutch_exec_timeouts_total",
                "Commands killed by their timeout.",
                &self.exec_timeouts,
            ),
            (
                "hutch_sandbox_creates_total",
                "Sandboxes created.",
                &self.creates,
            ),
            (
                "hutch_sandbox_create_failures_total",
                "Sandbox creates that failed.",
                &self.create_failures,
            ),
            (
                "hutch_sandbox_expired_total",
                "Sandboxes reaped by TTL.",
                &self.expired,
            ),
            (
                "hutch_sandbox_failures_total",
                "Sandboxes whose init died unexpectedly.",
                &self.failures,
            ),
            (
                "hutch_oom_kills_total",
                "Processes killed for exceeding a sandbox memory limit.",
                &self.oom_kills,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        self.reconciled.render(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::default();
        m.observe_create(0.003);
        m.observe_create(0.2);
        let text = m.render(&[("running", 2)]);
        assert!(text.contains("hutch_sandboxes{state=\"running\"} 2"));
        assert!(text.contains("hutch_sandbox_create_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("hutch_sandbox_create_seconds_bucket{le=\"0.25\"} 2"));
        assert!(text.contains("hutch_sandbox_create_seconds_count 2"));
    }
}
