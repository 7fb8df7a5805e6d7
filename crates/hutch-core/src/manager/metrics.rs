//! The Prometheus text of `/metrics`: the counters of [`crate::metrics`], sandboxes by state,
//! the warm pool, the exec output budget, the state disk, pending TTL refreshes, each
//! backend's own lines and network traffic.

use super::Manager;
use crate::error::CoreResult;
use crate::model::SandboxState;

impl Manager {
    /// Prometheus text.
    ///
    /// `per_sandbox`: include the series labelled with sandbox ids (for authenticated
    /// scrapes); without it, their server-wide sums (safe to serve without a key: no ids,
    /// bounded cardinality).
    pub async fn metrics_text(&self, per_sandbox: bool) -> CoreResult<String> {
        let counts = self.store.count_by_state().await?;
        let states: Vec<(&str, u64)> = SandboxState::ALL
            .iter()
            .map(|s| {
                (
                    s.as_str(),
                    counts
                        .iter()
                        .find(|(c, _)| c == s)
                        .map(|(_, n)| *n)
                        .unwrap_or(0),
                )
            })
            .collect();
        let mut text = self.metrics.render(&states);
        {
            use std::fmt::Write as _;
            let _ = writeln!(
                text,
                "# HELP hutch_vm_warm_guests Warm vm guests ready to become sandboxes.\n# TYPE hutch_vm_warm_guests gauge\nhutch_vm_warm_guests {}",
                self.warm.len()
            );
            let budget = &self.output_budget;
            let _ = writeln!(
                text,
                "# HELP hutch_exec_output_budget_bytes Memory collected exec output may hold (hutch serve --exec-output-budget-mib).\n# TYPE hutch_exec_output_budget_bytes gauge\nhutch_exec_output_budget_bytes {}\n# HELP hutch_exec_output_buffered_bytes Collected exec output held now.\n# TYPE hutch_exec_output_buffered_bytes gauge\nhutch_exec_output_buffered_bytes {}\n# HELP hutch_exec_output_buffered_peak_bytes Most collected exec output held at once since start.\n# TYPE hutch_exec_output_buffered_peak_bytes gauge\nhutch_exec_output_buffered_peak_bytes {}\n# HELP hutch_exec_output_waits_total Execs whose output reading waited for the budget.\n# TYPE hutch_exec_output_waits_total counter\nhutch_exec_output_waits_total {}",
                budget.limit(),
                budget.used(),
                budget.peak(),
                budget.waits()
            );
            if let Some((free, total)) = crate::state_disk::space(&self.cfg.state_dir) {
                let _ = writeln!(
                    text,
                    "# HELP hutch_state_disk_free_bytes Free bytes on the state disk (the filesystem of the state directory).\n# TYPE hutch_state_disk_free_bytes gauge\nhutch_state_disk_free_bytes {free}\n# HELP hutch_state_disk_reserve_bytes Free bytes the server keeps for itself: below them a create, snapshot, fork or volume is 507 no_space.\n# TYPE hutch_state_disk_reserve_bytes gauge\nhutch_state_disk_reserve_bytes {}",
                    crate::state_disk::reserve_bytes(total)
                );
            }
            let _ = writeln!(
                text,
                "# HELP hutch_ttl_refreshes_pending Sandboxes whose TTL refresh is kept in memory, not yet written to the store.\n# TYPE hutch_ttl_refreshes_pending gauge\nhutch_ttl_refreshes_pending {}",
                self.refreshes.len()
            );
        }
        for backend in self.backends.all() {
            text.push_str(&backend.metrics_text());
        }
        text.push_str(&self.usage_metrics_text(per_sandbox).await);
        if let Some(net) = &self.network {
            use std::fmt::Write as _;
            let c = net.slot_counts();
            let _ = writeln!(
                text,
                "# HELP hutch_network_slots Network slots (a veth, a namespace and a /30 each) by state: used by running or paused sandboxes (hibernated ones hold none), warm (built ahead of creates), free (left in the address pool).\n# TYPE hutch_network_slots gauge\nhutch_network_slots{{state=\"used\"}} {}\nhutch_network_slots{{state=\"warm\"}} {}\nhutch_network_slots{{state=\"free\"}} {}",
                c.used, c.warm, c.free
            );
        }
        let traffic = self.traffic_all();
        if self.network.is_some() && !per_sandbox {
            use std::fmt::Write as _;
            let (bytes, conns) = traffic.values().fold((0u64, 0u64), |(b, c), t| {
                (b + t.bytes_out, c + t.connections_out)
            });
            let _ = writeln!(text, "# HELP hutch_network_bytes_out Bytes all live sandboxes sent out (per sandbox: GET /v1/metrics with a key).\n# TYPE hutch_network_bytes_out gauge\nhutch_network_bytes_out {bytes}\n# HELP hutch_network_connections_out Connections (and UDP flows) all live sandboxes opened out.\n# TYPE hutch_network_connections_out gauge\nhutch_network_connections_out {conns}");
        }
        if self.network.is_some() && per_sandbox {
            use std::fmt::Write as _;
            let mut ids: Vec<_> = traffic.keys().collect();
            ids.sort();
            let _ = writeln!(text, "# HELP hutch_sandbox_network_bytes_out Bytes a sandbox sent out (IP packets leaving its interface).\n# TYPE hutch_sandbox_network_bytes_out counter");
            for id in &ids {
                let _ = writeln!(
                    text,
                    "hutch_sandbox_network_bytes_out{{sandbox=\"{id}\"}} {}",
                    traffic[*id].bytes_out
                );
            }
            let _ = writeln!(text, "# HELP hutch_sandbox_network_connections_out Connections (and UDP flows) a sandbox opened out.\n# TYPE hutch_sandbox_network_connections_out counter");
            for id in &ids {
                let _ = writeln!(
                    text,
                    "hutch_sandbox_network_connections_out{{sandbox=\"{id}\"}} {}",
                    traffic[*id].connections_out
                );
            }
        }
        Ok(text)
    }
}
