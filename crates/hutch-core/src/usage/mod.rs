//! Usage metering: what each sandbox used, interval by interval, kept after it is gone.
//!
//! The manager samples every live sandbox every `--usage-interval-seconds`
//! (`manager/usage.rs`): CPU time from its cgroup (`ns`; QEMU's cgroup for `vm`), its
//! working-set memory (cgroup memory minus the reclaimable file cache) integrated over the
//! interval, and the bytes it sent out; at a lower rate the disk its snapshots, volumes and
//! hibernated state hold. Each interval of each sandbox becomes one [`UsageInterval`]: a row
//! of the state store (`UsageStore`) and a line of the append-only usage log
//! (`<state>/usage.jsonl`, [`UsageInterval::log_line`]). `GET /v1/usage` sums the rows
//! ([`UsageQuery`], [`GroupBy`]); a [`RateCard`] turns sums into cost.
//!
//! - [`rates`]: the rate card and the budget unit spending caps are counted in.

pub mod rates;

use serde::Serialize;

pub use self::rates::{BudgetUnit, RateCard};
use crate::ids::KeyId;
use crate::tenant::{Tenant, TenantScope};

/// Bytes in a GiB.
pub const GIB: f64 = (1u64 << 30) as f64;

/// What a usage row is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResourceKind {
    /// A sandbox (CPU, memory, egress; the disk of its hibernated state).
    Sandbox,
    /// A snapshot's disk.
    Snapshot,
    /// A volume's disk.
    Volume,
}

impl ResourceKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sandbox => "sandbox",
            Self::Snapshot => "snapshot",
            Self::Volume => "volume",
        }
    }

    /// The kind a stored name names.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "sandbox" => Some(Self::Sandbox),
            "snapshot" => Some(Self::Snapshot),
            "volume" => Some(Self::Volume),
            _ => None,
        }
    }
}

/// The sums of usage a row, a group or a budget counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct UsageTotals {
    /// CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Working-set memory integrated over time, in GiB-seconds.
    pub memory_gib_seconds: f64,
    /// Disk held integrated over time, in GiB-hours.
    pub disk_gib_hours: f64,
    /// Bytes sent out of the sandbox.
    pub egress_bytes: u64,
}

impl UsageTotals {
    /// Both added.
    pub fn plus(self, o: &Self) -> Self {
        Self {
            cpu_seconds: self.cpu_seconds + o.cpu_seconds,
            memory_gib_seconds: self.memory_gib_seconds + o.memory_gib_seconds,
            disk_gib_hours: self.disk_gib_hours + o.disk_gib_hours,
            egress_bytes: self.egress_bytes + o.egress_bytes,
        }
    }

    /// Whether nothing was used.
    pub fn is_zero(&self) -> bool {
        self.cpu_seconds == 0.0
            && self.memory_gib_seconds == 0.0
            && self.disk_gib_hours == 0.0
            && self.egress_bytes == 0
    }
}

/// One interval of one resource's usage: a row of the store and a line of the log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsageInterval {
    /// What it is about.
    pub kind: ResourceKind,
    /// Its id (`sbx_…`, `snap_…`, `vol_…`).
    pub resource: String,
    /// Whose it is (`None`: an admin's of no tenant).
    pub tenant: Option<Tenant>,
    /// The key that created the sandbox (`None`: not known, or not a sandbox).
    pub key_id: Option<KeyId>,
    /// Where the interval starts (ms since the epoch).
    pub start_ms: i64,
    /// Where it ends.
    pub end_ms: i64,
    /// What was used in it.
    pub usage: UsageTotals,
}

impl UsageInterval {
    /// Its line in the usage log (JSON, no newline): the format a billing system reads,
    /// documented in `docs/usage.md`.
    pub fn log_line(&self) -> String {
        serde_json::json!({
            "v": 1,
            "kind": self.kind.as_str(),
            "id": self.resource,
            "tenant": self.tenant,
            "key_id": self.key_id,
            "start": crate::time::rfc3339(self.start_ms),
            "end": crate::time::rfc3339(self.end_ms),
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "cpu_seconds": self.usage.cpu_seconds,
            "memory_gib_seconds": self.usage.memory_gib_seconds,
            "disk_gib_hours": self.usage.disk_gib_hours,
            "egress_bytes": self.usage.egress_bytes,
        })
        .to_string()
    }
}

/// How `GET /v1/usage` groups its sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupBy {
    /// One sum for everything selected.
    #[default]
    Nothing,
    /// Per sandbox (and per snapshot and volume).
    Sandbox,
    /// Per tenant.
    Tenant,
    /// Per key that created the sandboxes.
    Key,
    /// Per UTC day (of each interval's end).
    Day,
}

impl GroupBy {
    /// The query parameter's value.
    pub fn parse(s: &str) -> crate::error::CoreResult<Self> {
        match s {
            "sandbox" => Ok(Self::Sandbox),
            "tenant" => Ok(Self::Tenant),
            "key" => Ok(Self::Key),
            "day" => Ok(Self::Day),
            _ => Err(crate::error::CoreError::InvalidArgument(format!(
                "group_by must be one of sandbox, tenant, key or day, got {s:?}"
            ))),
        }
    }

    /// Its name in answers (`None` for no grouping).
    pub fn as_str(self) -> Option<&'static str> {
        match self {
            Self::Nothing => None,
            Self::Sandbox => Some("sandbox"),
            Self::Tenant => Some("tenant"),
            Self::Key => Some("key"),
            Self::Day => Some("day"),
        }
    }
}

/// Which usage rows a sum counts: those whose interval ends in `(from_ms, to_ms]`.
#[derive(Debug, Clone)]
pub struct UsageQuery {
    /// Whose (a tenant's key: its tenant's only).
    pub scope: TenantScope,
    /// After this time (ms; `None`: from the first).
    pub from_ms: Option<i64>,
    /// Up to this time (ms; `None`: up to now).
    pub to_ms: Option<i64>,
    /// Only the sandboxes this key created.
    pub key_id: Option<KeyId>,
    /// Only this resource (`sbx_…`).
    pub resource: Option<String>,
    /// How to group.
    pub group_by: GroupBy,
}

impl UsageQuery {
    /// Everything `scope` sees in `(from_ms, now]`, one sum.
    pub fn since(scope: TenantScope, from_ms: i64) -> Self {
        Self {
            scope,
            from_ms: Some(from_ms),
            to_ms: None,
            key_id: None,
            resource: None,
            group_by: GroupBy::Nothing,
        }
    }
}

/// One group of a usage answer.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageGroup {
    /// The group's key: a sandbox id, a tenant, a key id or a day (`2026-05-20`); `None`
    /// without grouping, or for rows of no tenant or key.
    pub key: Option<String>,
    /// For `group_by=sandbox`: what the resource is.
    pub kind: Option<ResourceKind>,
    /// The sums.
    pub usage: UsageTotals,
    /// Intervals summed.
    pub intervals: u64,
}

/// Midnight UTC of the day `ms` falls in, and of the first of its month (ms since the epoch):
/// where daily and monthly budgets start.
pub fn day_and_month_start(ms: i64) -> (i64, i64) {
    const DAY_MS: i64 = 86_400_000;
    let day = ms.div_euclid(DAY_MS);
    let (y, m, _) = civil_from_days(day);
    (day * DAY_MS, days_from_civil(y, m, 1) * DAY_MS)
}

/// Howard Hinnant's `civil_from_days`: the (year, month, day) of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The inverse: days since 1970-01-01 of a civil date.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn day_and_month_starts_are_utc_midnights() {
        // 2026-12-02T13:45:14Z
        let ms = 1_796_219_114_000;
        let (day, month) = day_and_month_start(ms);
        assert_eq!(crate::time::rfc3339(day), "2026-12-02T00:00:00.000Z");
        assert_eq!(crate::time::rfc3339(month), "2026-12-01T00:00:00.000Z");
        let (day, month) = day_and_month_start(951_782_400_000 + 3_600_000); // 2000-02-29T01:00Z
        assert_eq!(crate::time::rfc3339(day), "2000-02-29T00:00:00.000Z");
        assert_eq!(crate::time::rfc3339(month), "2000-02-01T00:00:00.000Z");
    }

    #[test]
    fn group_by_names_are_checked() {
        assert_eq!(GroupBy::parse("day").expect("day"), GroupBy::Day);
        assert_eq!(
            GroupBy::parse("week").expect_err("week").to_string(),
            "group_by must be one of sandbox, tenant, key or day, got \"week\""
        );
    }
}
