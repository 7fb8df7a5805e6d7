//! Usage metering seen from the manager: a sampler that turns each live sandbox's counters
//! into [`UsageInterval`]s every `Config::usage_interval`, the disk of snapshots, volumes and
//! hibernated sandboxes every `Config::disk_usage_interval`, and a last interval of a
//! sandbox as it hibernates or is deleted (so nothing between two samples is lost).
//!
//! A sandbox's interval runs from its previous reading (kept in memory and in the store,
//! `usage_meters`, so a restarted server picks up where the last one stopped) to now:
//! - CPU-seconds: the growth of its cgroup's CPU time (`ns`: the sandbox's cgroups; `vm`:
//!   QEMU's). A counter smaller than the reading is a new cgroup (a wake): all of it is new.
//! - memory GiB-seconds: the working set (`Usage::memory_working_set_bytes`) at both ends,
//!   averaged (trapezoids), times the interval's length.
//! - egress bytes: the growth of its network slot's counter of bytes out.
//!
//! Rows are appended to the store with the new readings in one transaction and, as JSON
//! lines, to the usage log (`Config::usage_log`). Spending caps are enforced after each
//! round (`manager/budget.rs`).

use std::collections::HashMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::Manager;
use crate::error::CoreResult;
use crate::ids::SandboxId;
use crate::model::{SandboxRecord, SandboxState};
use crate::store::usage::MeterReading;
use crate::store::{PageRequest, SandboxQuery};
use crate::tenant::TenantScope;
use crate::time::now_ms;
use crate::usage::{ResourceKind, UsageGroup, UsageInterval, UsageQuery, UsageTotals, GIB};

/// One sandbox's meter.
#[derive(Debug, Clone, Copy)]
enum Meter {
    /// Running or paused: its stored reading and the working set at that moment.
    Live {
        reading: MeterReading,
        working_set_bytes: Option<u64>,
    },
    /// Its last interval was taken (it is hibernating or being deleted): a round that
    /// listed it before must not start a new meter on the cgroup it still reads. Cleared by
    /// a wake ([`Manager::restart_meter`]) or once it is no longer live.
    Stopped,
}

/// The sampler's memory (see the module docs).
#[derive(Default)]
pub(super) struct Meters {
    live: Mutex<HashMap<SandboxId, Meter>>,
    /// When disk was last sampled.
    disk_at_ms: Mutex<Option<i64>>,
    /// The usage log, opened on first use.
    log: Mutex<Option<std::fs::File>>,
}

impl Meters {
    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Meter>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What one sample of a sandbox found.
struct Sample {
    cpu_ns: u64,
    working_set_bytes: u64,
    egress_bytes: u64,
}

impl Manager {
    /// The usage log's path.
    pub fn usage_log_path(&self) -> PathBuf {
        self.cfg
            .usage_log
            .clone()
            .unwrap_or_else(|| self.cfg.state_dir.join("usage.jsonl"))
    }

    /// Load the readings an earlier server left (server start).
    pub(super) async fn load_meters(&self) {
        match self.store.meter_readings().await {
            Ok(readings) => {
                let mut live = self.meters.live();
                for (id, reading) in readings {
                    live.insert(
                        id,
                        Meter::Live {
                            reading,
                            working_set_bytes: None,
                        },
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "reading the usage meters"),
        }
    }

    /// The sampler's loop: one round every `Config::usage_interval`, until the manager goes.
    pub(super) fn spawn_usage_sampler(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let interval = self.cfg.usage_interval;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(m) = weak.upgrade() else { break };
                m.sample_usage().await;
                m.enforce_budgets().await;
            }
        });
    }

    /// One round: every running or paused sandbox's interval, and disk when it is due.
    pub(super) async fn sample_usage(&self) {
        let mut records = Vec::new();
        for state in [SandboxState::Running, SandboxState::Paused] {
            let query = SandboxQuery {
                scope: TenantScope::All,
                state: Some(state),
                metadata: Default::default(),
            };
            match self
                .store
                .list_sandboxes(&query, &PageRequest::default())
                .await
            {
                Ok(page) => records.extend(page.items),
                Err(e) => {
                    tracing::warn!(error = %e, "usage: listing live sandboxes");
                    return;
                }
            }
        }
        let now = now_ms();
        let traffic = self.traffic_all();
        let mut intervals = Vec::new();
        let mut meters = Vec::new();
        for r in &records {
            let egress = traffic.get(r.id.as_str()).map(|t| t.bytes_out);
            if let Some((interval, reading)) = self.measure(r, now, egress, false) {
                intervals.extend(interval);
                meters.push((r.id.clone(), Some(reading)));
            }
        }
        // Meters of sandboxes no longer live (they died, or were deleted while a server was
        // down): forgotten.
        {
            let mut live = self.meters.live();
            let gone: Vec<SandboxId> = live
                .keys()
                .filter(|id| !records.iter().any(|r| &r.id == *id))
                .cloned()
                .collect();
            for id in gone {
                live.remove(&id);
                meters.push((id, None));
            }
        }
        if self.disk_sample_due(now) {
            intervals.extend(self.disk_intervals(now).await);
        }
        self.write_usage(intervals, meters).await;
    }

    /// The last interval of `r` as it hibernates or is deleted; its meter is forgotten (a
    /// wake starts a new one).
    pub(super) async fn meter_final(&self, r: &SandboxRecord) {
        if r.state == SandboxState::Pooled || (r.cgroups.is_empty() && r.init_pid.is_none()) {
            return;
        }
        let egress = self.traffic_all().get(r.id.as_str()).map(|t| t.bytes_out);
        let interval = self.measure(r, now_ms(), egress, true).and_then(|(i, _)| i);
        self.write_usage(interval.into_iter().collect(), vec![(r.id.clone(), None)])
            .await;
    }

    /// Let `r`'s meter start again from zero on its new cgroup (it woke).
    pub(super) fn restart_meter(&self, r: &SandboxRecord) {
        self.meters.live().remove(&r.id);
    }

    /// Start `r`'s meter at its counters now: what it used before is not its own (a warm
    /// guest's restore and warm-up, paid by the pool).
    pub(super) fn start_meter(&self, r: &SandboxRecord) {
        let Some(usage) = self.backend(r.isolation).ok().and_then(|b| b.usage(r)) else {
            return;
        };
        let egress_bytes = self
            .traffic_all()
            .get(r.id.as_str())
            .map_or(0, |t| t.bytes_out);
        self.meters.live().insert(
            r.id.clone(),
            Meter::Live {
                reading: MeterReading {
                    cpu_ns: usage.cpu_usage_ns,
                    egress_bytes,
                    at_ms: now_ms(),
                },
                working_set_bytes: Some(usage.memory_working_set_bytes),
            },
        );
    }

    /// Read `r`'s counters and make its interval since its last reading (`None` when its
    /// backend reads nothing, or its last interval was taken already). `last`: the sandbox is
    /// stopping: its meter is marked stopped.
    fn measure(
        &self,
        r: &SandboxRecord,
        now: i64,
        egress_bytes: Option<u64>,
        last: bool,
    ) -> Option<(Option<UsageInterval>, MeterReading)> {
        let backend = self.backend(r.isolation).ok()?;
        let interval_ms = i64::try_from(self.cfg.usage_interval.as_millis()).unwrap_or(i64::MAX);
        // The counters are read under the lock, so two readers (a round and a sandbox's last
        // interval) never both count from the same reading.
        let mut live = self.meters.live();
        let (prev, prev_working_set) = match live.get(&r.id) {
            Some(Meter::Stopped) => return None,
            Some(Meter::Live {
                reading,
                working_set_bytes,
            }) => (*reading, *working_set_bytes),
            // A new meter (a new sandbox, or one just woken) counts from zero, from when the
            // sandbox started: at most one interval ago.
            None => (
                MeterReading {
                    cpu_ns: 0,
                    egress_bytes: 0,
                    at_ms: r.created_at_ms.max(now - interval_ms),
                },
                Some(0),
            ),
        };
        let usage = backend.usage(r)?;
        let sample = Sample {
            cpu_ns: usage.cpu_usage_ns,
            working_set_bytes: usage.memory_working_set_bytes,
            egress_bytes: egress_bytes.unwrap_or(0),
        };
        // A counter below its reading belongs to a new cgroup: all of it is new.
        let grown = |now: u64, before: u64| now.checked_sub(before).unwrap_or(now);
        let cpu_ns = grown(sample.cpu_ns, prev.cpu_ns);
        let egress = grown(sample.egress_bytes, prev.egress_bytes);
        let seconds = (now - prev.at_ms).max(0) as f64 / 1000.0;
        let mean_bytes = match prev_working_set {
            Some(before) => (before as f64 + sample.working_set_bytes as f64) / 2.0,
            None => sample.working_set_bytes as f64,
        };
        let reading = MeterReading {
            cpu_ns: sample.cpu_ns,
            egress_bytes: sample.egress_bytes,
            at_ms: now,
        };
        let next = if last {
            Meter::Stopped
        } else {
            Meter::Live {
                reading,
                working_set_bytes: Some(sample.working_set_bytes),
            }
        };
        live.insert(r.id.clone(), next);
        drop(live);
        let totals = UsageTotals {
            cpu_seconds: cpu_ns as f64 / 1e9,
            memory_gib_seconds: mean_bytes / GIB * seconds,
            disk_gib_hours: 0.0,
            egress_bytes: egress,
        };
        let interval = (now > prev.at_ms && !totals.is_zero()).then(|| UsageInterval {
            kind: ResourceKind::Sandbox,
            resource: r.id.to_string(),
            tenant: r.tenant.clone(),
            key_id: r.created_by.clone(),
            start_ms: prev.at_ms,
            end_ms: now,
            usage: totals,
        });
        Some((interval, reading))
    }

    fn disk_sample_due(&self, now: i64) -> bool {
        let mut at = self
            .meters
            .disk_at_ms
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let every = i64::try_from(self.cfg.disk_usage_interval.as_millis()).unwrap_or(i64::MAX);
        match *at {
            None => {
                // The first round only starts the clock: disk is billed from here on.
                *at = Some(now);
                false
            }
            Some(t) if now - t >= every => true,
            Some(_) => false,
        }
    }

    /// The disk held since the last disk sample: snapshots (their size), volumes (their
    /// size) and hibernated sandboxes (what their state directory allocates).
    async fn disk_intervals(&self, now: i64) -> Vec<UsageInterval> {
        let since = {
            let mut at = self
                .meters
                .disk_at_ms
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let since = at.unwrap_or(now);
            *at = Some(now);
            since
        };
        let hours = (now - since).max(0) as f64 / 3_600_000.0;
        let gib_hours = |bytes: u64| bytes as f64 / GIB * hours;
        let mut out = Vec::new();
        let mut push = |kind, resource: String, tenant, key_id, bytes: u64| {
            if bytes > 0 && hours > 0.0 {
                out.push(UsageInterval {
                    kind,
                    resource,
                    tenant,
                    key_id,
                    start_ms: since,
                    end_ms: now,
                    usage: UsageTotals {
                        disk_gib_hours: gib_hours(bytes),
                        ..UsageTotals::default()
                    },
                });
            }
        };
        if let Ok(snapshots) = self.store.all_snapshots().await {
            for s in snapshots {
                push(
                    ResourceKind::Snapshot,
                    s.id.to_string(),
                    s.tenant_id.clone(),
                    None,
                    s.size_bytes,
                );
            }
        }
        if let Ok(volumes) = self.store.all_volumes().await {
            for v in volumes {
                push(
                    ResourceKind::Volume,
                    v.id.to_string(),
                    v.tenant.clone(),
                    None,
                    v.size_mib << 20,
                );
            }
        }
        let query = SandboxQuery {
            scope: TenantScope::All,
            state: Some(SandboxState::Hibernated),
            metadata: Default::default(),
        };
        if let Ok(page) = self
            .store
            .list_sandboxes(&query, &PageRequest::default())
            .await
        {
            let dirs: Vec<(SandboxRecord, PathBuf)> = page
                .items
                .into_iter()
                .map(|r| {
                    let dir = self.cfg.state_dir.join("sandboxes").join(r.id.as_str());
                    (r, dir)
                })
                .collect();
            let sized = super::blocking(move || {
                Ok(dirs
                    .into_iter()
                    .map(|(r, dir)| (r, allocated_bytes(&dir)))
                    .collect::<Vec<_>>())
            })
            .await
            .unwrap_or_default();
            for (r, bytes) in sized {
                push(
                    ResourceKind::Sandbox,
                    r.id.to_string(),
                    r.tenant.clone(),
                    r.created_by.clone(),
                    bytes,
                );
            }
        }
        out
    }

    /// Store `intervals` with `meters`, and append them to the usage log.
    async fn write_usage(
        &self,
        intervals: Vec<UsageInterval>,
        meters: Vec<(SandboxId, Option<MeterReading>)>,
    ) {
        if intervals.is_empty() && meters.is_empty() {
            return;
        }
        {
            // Written and counted in the spending caps' sums under one lock.
            let mut spent = self.spend.lock().await;
            match self.store.append_usage(&intervals, &meters).await {
                Ok(()) => spent.add(&intervals),
                Err(e) => {
                    tracing::warn!(intervals = intervals.len(), error = %e, "writing usage")
                }
            }
        }
        if intervals.is_empty() {
            return;
        }
        let mut text = String::new();
        for i in &intervals {
            text.push_str(&i.log_line());
            text.push('\n');
        }
        let path = self.usage_log_path();
        let mut log = self.meters.log.lock().unwrap_or_else(|p| p.into_inner());
        if log.is_none() {
            use std::os::unix::fs::OpenOptionsExt;
            match std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(f) => *log = Some(f),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "opening the usage log");
                    return;
                }
            }
        }
        if let Some(f) = log.as_mut() {
            if let Err(e) = f.write_all(text.as_bytes()) {
                tracing::warn!(path = %path.display(), error = %e, "appending to the usage log");
                *log = None;
            }
        }
    }

    /// The sums `query` asks for (what is stored: the current interval of each live
    /// sandbox comes with the next round).
    pub async fn usage_report(&self, query: &UsageQuery) -> CoreResult<Vec<UsageGroup>> {
        self.store.usage_groups(query).await
    }

    /// The rate card in force.
    pub fn rate_card(&self) -> Option<&crate::usage::RateCard> {
        self.cfg.rate_card.as_ref()
    }

    /// Prometheus counters of metered usage since the store began: one series per tenant
    /// (`per_tenant`, for admin scrapes of `/v1/metrics`: tenant names are not for the
    /// unauthenticated `/metrics`), else the server-wide sums.
    pub(super) async fn usage_metrics_text(&self, per_tenant: bool) -> String {
        use std::fmt::Write as _;
        let query = UsageQuery {
            group_by: if per_tenant {
                crate::usage::GroupBy::Tenant
            } else {
                crate::usage::GroupBy::Nothing
            },
            ..UsageQuery::since(TenantScope::All, i64::MIN)
        };
        let label = |g: &UsageGroup| {
            if per_tenant {
                format!("{{tenant=\"{}\"}}", g.key.as_deref().unwrap_or(""))
            } else {
                String::new()
            }
        };
        let groups = self.store.usage_groups(&query).await.unwrap_or_default();
        let mut text = String::new();
        type Series = (&'static str, &'static str, fn(&UsageTotals) -> f64);
        let series: [Series; 4] = [
            (
                "hutch_usage_cpu_seconds_total",
                "CPU-seconds sandboxes of a tenant used (metered).",
                |u| u.cpu_seconds,
            ),
            (
                "hutch_usage_memory_gib_seconds_total",
                "Working-set memory GiB-seconds sandboxes of a tenant held (metered).",
                |u| u.memory_gib_seconds,
            ),
            (
                "hutch_usage_disk_gib_hours_total",
                "Disk GiB-hours a tenant's snapshots, volumes and hibernated sandboxes held.",
                |u| u.disk_gib_hours,
            ),
            (
                "hutch_usage_egress_bytes_total",
                "Bytes sandboxes of a tenant sent out (metered).",
                |u| u.egress_bytes as f64,
            ),
        ];
        for (name, help, value) in series {
            let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} counter");
            if groups.is_empty() && !per_tenant {
                let _ = writeln!(text, "{name} 0");
            }
            for g in &groups {
                let _ = writeln!(text, "{name}{} {}", label(g), value(&g.usage));
            }
        }
        if let Some(card) = self.rate_card() {
            let name = "hutch_usage_cost_micros_total";
            let _ = writeln!(
                text,
                "# HELP {name} Cost of a tenant's usage through the rate card, in micro-units.\n# TYPE {name} counter"
            );
            for g in &groups {
                let _ = writeln!(text, "{name}{} {}", label(g), card.cost_micros(&g.usage));
            }
        }
        text
    }
}

/// Bytes the files under `dir` allocate (blocks, so sparse images count what they hold),
/// not following symlinks nor leaving its filesystem.
fn allocated_bytes(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return 0;
    };
    let dev = top.dev();
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.dev() != dev {
                continue;
            }
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                total += m.blocks() * 512;
            }
        }
    }
    total
}
