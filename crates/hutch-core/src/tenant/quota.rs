//! What a tenant uses and the check of one operation against its [`Quotas`].
//!
//! The check is pure: the manager (`manager/quota.rs`) gathers the tenant's use under its
//! lock (the store's counts plus the operations admitted and not finished yet) and asks
//! here whether what the operation adds fits. A refusal is a [`QuotaExceeded`]: which quota,
//! its limit, what was in use, and a sentence saying what to do (answered 429).

use std::fmt;

use serde::Serialize;

use super::settings::Quotas;
use super::Tenant;

/// The name of one quota, as in [`Quotas`]' fields and the 429's `quota`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaName {
    /// [`Quotas::max_sandboxes`].
    MaxSandboxes,
    /// [`Quotas::max_creates_per_hour`].
    MaxCreatesPerHour,
    /// [`Quotas::max_cpus`].
    MaxCpus,
    /// [`Quotas::max_memory_mib`].
    MaxMemoryMib,
    /// [`Quotas::max_ttl_seconds`].
    MaxTtlSeconds,
    /// [`Quotas::max_sandbox_cpus`].
    MaxSandboxCpus,
    /// [`Quotas::max_sandbox_memory_mib`].
    MaxSandboxMemoryMib,
    /// [`Quotas::max_sandbox_disk_mib`].
    MaxSandboxDiskMib,
    /// [`Quotas::daily_budget`] (or a key's).
    DailyBudget,
    /// [`Quotas::monthly_budget`] (or a key's).
    MonthlyBudget,
    /// A sandbox's own `max_cost_micros`.
    MaxCostMicros,
}

impl QuotaName {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxSandboxes => "max_sandboxes",
            Self::MaxCreatesPerHour => "max_creates_per_hour",
            Self::MaxCpus => "max_cpus",
            Self::MaxMemoryMib => "max_memory_mib",
            Self::MaxTtlSeconds => "max_ttl_seconds",
            Self::MaxSandboxCpus => "max_sandbox_cpus",
            Self::MaxSandboxMemoryMib => "max_sandbox_memory_mib",
            Self::MaxSandboxDiskMib => "max_sandbox_disk_mib",
            Self::DailyBudget => "daily_budget",
            Self::MonthlyBudget => "monthly_budget",
            Self::MaxCostMicros => "max_cost_micros",
        }
    }
}

/// A quantity a quota counts: a whole number, or CPUs (which may be fractions).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Amount {
    /// Sandboxes, creates, MiB, seconds.
    Count(u64),
    /// CPUs.
    Cpus(f64),
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Count(n) => write!(f, "{n}"),
            // Sums of fractions (0.1 + 0.2) are shown rounded, as a person wrote them.
            Self::Cpus(c) => write!(f, "{}", (c * 1000.0).round() / 1000.0),
        }
    }
}

/// An operation refused by a quota (429 `quota_exceeded`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct QuotaExceeded {
    /// Whose quota.
    pub tenant: Tenant,
    /// Which quota.
    pub quota: QuotaName,
    /// Its limit.
    pub limit: Amount,
    /// What was in use before the operation (per-sandbox limits: what was asked; `None` for
    /// a persistent sandbox under a TTL limit).
    pub used: Option<Amount>,
    /// What a person reads.
    pub message: String,
}

/// What one tenant's sandboxes use now, as far as quotas count.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TenantUsage {
    /// Sandboxes starting, running or paused.
    pub sandboxes: u64,
    /// CPUs of the sandboxes starting or running.
    pub cpus: f64,
    /// Memory limits of the sandboxes starting or running, in MiB.
    pub memory_mib: u64,
    /// Creates in the last hour.
    pub creates_last_hour: u64,
}

/// What an operation adds to its tenant's use: a create adds a sandbox, its CPUs and
/// memory, and a create; a wake the same without the create; a resume its CPUs and memory.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Footprint {
    /// Sandboxes that become starting, running or paused.
    pub sandboxes: u64,
    /// CPUs that start running.
    pub cpus: f64,
    /// Memory that starts running, in MiB.
    pub memory_mib: u64,
    /// Creates.
    pub creates: u64,
}

impl TenantUsage {
    /// This use with `f` added.
    pub fn plus(self, f: &Footprint) -> Self {
        Self {
            sandboxes: self.sandboxes + f.sandboxes,
            cpus: self.cpus + f.cpus,
            memory_mib: self.memory_mib + f.memory_mib,
            creates_last_hour: self.creates_last_hour + f.creates,
        }
    }
}

/// Rounding slack for sums of fractional CPUs.
const CPU_EPSILON: f64 = 1e-9;

impl Quotas {
    /// Whether `adding` fits next to `usage` under the aggregate quotas of `tenant`.
    pub fn check_usage(
        &self,
        tenant: &Tenant,
        usage: &TenantUsage,
        adding: &Footprint,
    ) -> Result<(), QuotaExceeded> {
        let refuse = |quota, limit, used: Amount, what: String| QuotaExceeded {
            tenant: tenant.clone(),
            quota,
            limit,
            used: Some(used),
            message: format!(
                "quota {} of tenant {tenant} reached: {what}; ask an admin to raise it \
                 (PATCH /v1/tenants/{tenant})",
                QuotaName::as_str(quota)
            ),
        };
        if let Some(max) = self.max_sandboxes {
            if adding.sandboxes > 0 && usage.sandboxes + adding.sandboxes > max {
                return Err(refuse(
                    QuotaName::MaxSandboxes,
                    Amount::Count(max),
                    Amount::Count(usage.sandboxes),
                    format!(
                        "{} of {max} sandboxes are running or paused (hibernate or delete one first)",
                        usage.sandboxes
                    ),
                ));
            }
        }
        if let Some(max) = self.max_creates_per_hour {
            if adding.creates > 0 && usage.creates_last_hour + adding.creates > max {
                return Err(refuse(
                    QuotaName::MaxCreatesPerHour,
                    Amount::Count(max),
                    Amount::Count(usage.creates_last_hour),
                    format!(
                        "{} of {max} creates in the last hour",
                        usage.creates_last_hour
                    ),
                ));
            }
        }
        if let Some(max) = self.max_cpus {
            if adding.cpus > 0.0 && usage.cpus + adding.cpus > max + CPU_EPSILON {
                return Err(refuse(
                    QuotaName::MaxCpus,
                    Amount::Cpus(max),
                    Amount::Cpus(usage.cpus),
                    format!(
                        "running sandboxes use {} of {max} CPUs and this needs {} more",
                        Amount::Cpus(usage.cpus),
                        Amount::Cpus(adding.cpus)
                    ),
                ));
            }
        }
        if let Some(max) = self.max_memory_mib {
            if adding.memory_mib > 0 && usage.memory_mib + adding.memory_mib > max {
                return Err(refuse(
                    QuotaName::MaxMemoryMib,
                    Amount::Count(max),
                    Amount::Count(usage.memory_mib),
                    format!(
                        "running sandboxes use {} of {max} MiB and this needs {} MiB more",
                        usage.memory_mib, adding.memory_mib
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether one sandbox of `tenant` with these resources fits the per-sandbox limits.
    pub fn check_size(
        &self,
        tenant: &Tenant,
        cpus: f64,
        memory_mib: u64,
        disk_mib: u64,
    ) -> Result<(), QuotaExceeded> {
        let refuse = |quota, limit: Amount, asked: Amount, field: &str| QuotaExceeded {
            tenant: tenant.clone(),
            quota,
            limit,
            used: Some(asked),
            message: format!(
                "quota {} of tenant {tenant}: a sandbox may have at most {limit} {field}, \
                 this one asks for {asked}",
                QuotaName::as_str(quota)
            ),
        };
        if let Some(max) = self.max_sandbox_cpus.filter(|m| cpus > m + CPU_EPSILON) {
            return Err(refuse(
                QuotaName::MaxSandboxCpus,
                Amount::Cpus(max),
                Amount::Cpus(cpus),
                "cpus",
            ));
        }
        if let Some(max) = self.max_sandbox_memory_mib.filter(|m| memory_mib > *m) {
            return Err(refuse(
                QuotaName::MaxSandboxMemoryMib,
                Amount::Count(max),
                Amount::Count(memory_mib),
                "memory_mib",
            ));
        }
        if let Some(max) = self.max_sandbox_disk_mib.filter(|m| disk_mib > *m) {
            return Err(refuse(
                QuotaName::MaxSandboxDiskMib,
                Amount::Count(max),
                Amount::Count(disk_mib),
                "disk_mib",
            ));
        }
        Ok(())
    }

    /// Whether a sandbox of `tenant` may live `ttl_seconds` (`persistent`: for ever).
    pub fn check_ttl(
        &self,
        tenant: &Tenant,
        ttl_seconds: u64,
        persistent: bool,
    ) -> Result<(), QuotaExceeded> {
        let Some(max) = self.max_ttl_seconds else {
            return Ok(());
        };
        let quota = QuotaName::MaxTtlSeconds;
        if persistent {
            return Err(QuotaExceeded {
                tenant: tenant.clone(),
                quota,
                limit: Amount::Count(max),
                used: None,
                message: format!(
                    "quota max_ttl_seconds of tenant {tenant}: sandboxes live at most {max} s, \
                     so none may be persistent"
                ),
            });
        }
        if ttl_seconds > max {
            return Err(QuotaExceeded {
                tenant: tenant.clone(),
                quota,
                limit: Amount::Count(max),
                used: Some(Amount::Count(ttl_seconds)),
                message: format!(
                    "quota max_ttl_seconds of tenant {tenant}: ttl_seconds may be at most {max}, \
                     got {ttl_seconds}"
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acme() -> Tenant {
        Tenant::new("acme")
    }

    #[test]
    fn aggregate_quotas_refuse_the_operation_that_would_pass_them() {
        let q = Quotas {
            max_sandboxes: Some(5),
            max_cpus: Some(1.0),
            ..Quotas::default()
        };
        let create = Footprint {
            sandboxes: 1,
            cpus: 0.1,
            memory_mib: 256,
            creates: 1,
        };
        let four = TenantUsage {
            sandboxes: 4,
            cpus: 0.4,
            ..TenantUsage::default()
        };
        q.check_usage(&acme(), &four, &create)
            .expect("the fifth fits");
        let five = four.plus(&create);
        let e = q.check_usage(&acme(), &five, &create).expect_err("sixth");
        assert_eq!(e.quota, QuotaName::MaxSandboxes);
        assert_eq!(
            (e.limit, e.used),
            (Amount::Count(5), Some(Amount::Count(5)))
        );
        assert_eq!(
            e.message,
            "quota max_sandboxes of tenant acme reached: 5 of 5 sandboxes are running or paused \
             (hibernate or delete one first); ask an admin to raise it (PATCH /v1/tenants/acme)"
        );
        // Ten sandboxes of 0.1 CPU fill 1 CPU exactly, whatever the float sum says.
        let tenth = (0..9).fold(TenantUsage::default(), |u, _| u.plus(&create));
        let q = Quotas {
            max_cpus: Some(1.0),
            ..Quotas::default()
        };
        q.check_usage(&acme(), &tenth, &create)
            .expect("the tenth fits");
        let e = q
            .check_usage(&acme(), &tenth.plus(&create), &create)
            .expect_err("the eleventh does not");
        assert_eq!(e.quota, QuotaName::MaxCpus);
        assert!(
            e.message
                .contains("use 1 of 1 CPUs and this needs 0.1 more"),
            "{}",
            e.message
        );
        // A resume adds no sandbox: the sandbox count does not refuse it.
        let resume = Footprint {
            cpus: 0.1,
            ..Footprint::default()
        };
        let full = Quotas {
            max_sandboxes: Some(1),
            ..Quotas::default()
        };
        full.check_usage(&acme(), &five, &resume)
            .expect("a paused sandbox already counts");
        assert_eq!(
            serde_json::to_value(Amount::Cpus(0.5)).expect("json"),
            serde_json::json!(0.5)
        );
        assert_eq!(
            serde_json::to_value(Amount::Count(5)).expect("json"),
            serde_json::json!(5)
        );
    }

    #[test]
    fn per_sandbox_limits_name_what_was_asked() {
        let q = Quotas {
            max_ttl_seconds: Some(3600),
            max_sandbox_memory_mib: Some(512),
            ..Quotas::default()
        };
        q.check_ttl(&acme(), 3600, false).expect("at the limit");
        let e = q.check_ttl(&acme(), 7200, false).expect_err("over");
        assert_eq!(e.used, Some(Amount::Count(7200)));
        let e = q.check_ttl(&acme(), 60, true).expect_err("persistent");
        assert_eq!((e.quota, e.used), (QuotaName::MaxTtlSeconds, None));
        q.check_size(&acme(), 8.0, 512, 1 << 20).expect("fits");
        let e = q.check_size(&acme(), 1.0, 1024, 1).expect_err("memory");
        assert_eq!(
            e.message,
            "quota max_sandbox_memory_mib of tenant acme: a sandbox may have at most 512 \
             memory_mib, this one asks for 1024"
        );
    }
}
