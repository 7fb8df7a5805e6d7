//! A tenant's record: its quotas, the defaults its sandboxes get when a create leaves a
//! setting out, and the templates it may create sandboxes from.
//!
//! Stored as one JSON document per tenant (`tenants.settings`, `store/sqlite/tenancy.rs`);
//! every field has a default, so a record written by an older version reads as one with
//! nothing set. `None` everywhere means "no limit" or "the server's default".

use serde::{Deserialize, Deserializer, Serialize};

use super::Tenant;
use crate::error::{CoreError, CoreResult};
use crate::model::IsolationRequest;
use hutch_net::policy::PolicySpec;

/// Most templates a tenant's allow-list may name.
pub const MAX_ALLOWED_TEMPLATES: usize = 256;

/// Limits on what one tenant's sandboxes may use together and each on its own. A limit
/// left out (`null`) is no limit. Checked by `tenant::quota`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Quotas {
    /// Sandboxes running or paused at once (starting ones count as running).
    pub max_sandboxes: Option<u64>,
    /// Creates (forks and explore children included) in any hour.
    pub max_creates_per_hour: Option<u64>,
    /// CPUs of the running sandboxes together (`cpus` of each, fractions included).
    pub max_cpus: Option<f64>,
    /// Memory limits of the running sandboxes together, in MiB.
    pub max_memory_mib: Option<u64>,
    /// Longest TTL a sandbox may have; with it set, no sandbox may be persistent.
    pub max_ttl_seconds: Option<u64>,
    /// Most CPUs one sandbox may have.
    pub max_sandbox_cpus: Option<f64>,
    /// Most memory one sandbox may have, in MiB.
    pub max_sandbox_memory_mib: Option<u64>,
    /// Largest disk one sandbox may have, in MiB.
    pub max_sandbox_disk_mib: Option<u64>,
    /// What its sandboxes may spend per UTC day: cost micros through the rate card, or
    /// CPU-seconds on a server without one (`manager/budget.rs`).
    pub daily_budget: Option<u64>,
    /// The same per UTC calendar month.
    pub monthly_budget: Option<u64>,
}

impl Quotas {
    /// Check every limit is a sensible number (CPUs finite and positive, counts at least 1
    /// where 0 would forbid everything by accident: say so with a message instead).
    pub fn validate(&self) -> CoreResult<()> {
        for (name, cpus) in [
            ("max_cpus", self.max_cpus),
            ("max_sandbox_cpus", self.max_sandbox_cpus),
        ] {
            if let Some(c) = cpus.filter(|c| !c.is_finite() || *c <= 0.0) {
                return Err(CoreError::InvalidArgument(format!(
                    "quotas.{name} must be a positive number of CPUs, got {c}"
                )));
            }
        }
        for (name, n) in [
            ("max_memory_mib", self.max_memory_mib),
            ("max_ttl_seconds", self.max_ttl_seconds),
            ("max_sandbox_memory_mib", self.max_sandbox_memory_mib),
            ("max_sandbox_disk_mib", self.max_sandbox_disk_mib),
        ] {
            if n == Some(0) {
                return Err(CoreError::InvalidArgument(format!(
                    "quotas.{name} must be at least 1 (leave it out for no limit)"
                )));
            }
        }
        Ok(())
    }
}

/// What a tenant's sandboxes get when their create request leaves a setting out (the
/// server's and the template's defaults apply to what this leaves out too).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxDefaults {
    /// Egress policy (`{"egress", "allow", "deny"}`).
    pub network: Option<PolicySpec>,
    /// TTL in seconds.
    pub ttl_seconds: Option<u64>,
    /// Isolation (`ns`, `vm` or `auto`).
    pub isolation: Option<IsolationRequest>,
    /// CPUs.
    pub cpus: Option<f64>,
    /// Memory limit in MiB.
    pub memory_mib: Option<u64>,
    /// Disk size in MiB.
    pub disk_mib: Option<u64>,
}

impl SandboxDefaults {
    /// Check the numbers (the network policy is checked by the manager, which knows whether
    /// this server gives sandboxes a network).
    pub fn validate(&self) -> CoreResult<()> {
        if let Some(c) = self.cpus.filter(|c| !c.is_finite() || *c <= 0.0) {
            return Err(CoreError::InvalidArgument(format!(
                "defaults.cpus must be a positive number, got {c}"
            )));
        }
        for (name, n) in [
            ("ttl_seconds", self.ttl_seconds),
            ("memory_mib", self.memory_mib),
            ("disk_mib", self.disk_mib),
        ] {
            if n == Some(0) {
                return Err(CoreError::InvalidArgument(format!(
                    "defaults.{name} must be at least 1 (leave it out for the server's default)"
                )));
            }
        }
        Ok(())
    }
}

/// The settings of a tenant an admin chooses.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantSettings {
    /// Its quotas.
    pub quotas: Quotas,
    /// Defaults of its sandboxes.
    pub defaults: SandboxDefaults,
    /// The only templates its sandboxes may be created from (`None`: any it can see).
    pub allowed_templates: Option<Vec<String>>,
}

impl TenantSettings {
    /// Check every part.
    pub fn validate(&self) -> CoreResult<()> {
        self.quotas.validate()?;
        self.defaults.validate()?;
        if let Some(names) = &self.allowed_templates {
            if names.len() > MAX_ALLOWED_TEMPLATES {
                return Err(CoreError::InvalidArgument(format!(
                    "allowed_templates may name at most {MAX_ALLOWED_TEMPLATES} templates"
                )));
            }
            for name in names {
                hutch_template::validate_name(name)
                    .map_err(|e| CoreError::InvalidArgument(format!("allowed_templates: {e}")))?;
            }
        }
        Ok(())
    }

    /// Whether sandboxes of this tenant may be created from `template`.
    pub fn allows_template(&self, template: &str) -> bool {
        self.allowed_templates
            .as_ref()
            .is_none_or(|names| names.iter().any(|n| n == template))
    }
}

/// A tenant as stored and shown.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantRecord {
    /// Its name (the `tenant` of its keys and records).
    pub name: Tenant,
    /// What an admin set.
    #[serde(flatten)]
    pub settings: TenantSettings,
    /// When it was created (ms since the epoch).
    pub created_at_ms: i64,
}

/// A change to a tenant (`PATCH /v1/tenants/{name}`): each part given replaces that part
/// whole; a part left out stays as it was (`allowed_templates: null` allows every template).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantUpdate {
    /// New quotas.
    pub quotas: Option<Quotas>,
    /// New defaults.
    pub defaults: Option<SandboxDefaults>,
    /// New allow-list (`Some(None)`: none).
    #[serde(default, deserialize_with = "present")]
    pub allowed_templates: Option<Option<Vec<String>>>,
}

impl TenantUpdate {
    /// `settings` with this change applied.
    pub fn apply(&self, settings: &TenantSettings) -> TenantSettings {
        TenantSettings {
            quotas: self
                .quotas
                .clone()
                .unwrap_or_else(|| settings.quotas.clone()),
            defaults: self
                .defaults
                .clone()
                .unwrap_or_else(|| settings.defaults.clone()),
            allowed_templates: match &self.allowed_templates {
                Some(list) => list.clone(),
                None => settings.allowed_templates.clone(),
            },
        }
    }
}

/// A field that is present (`null` included) is `Some`: tells `null` from left out.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_read_from_partial_json_and_bad_numbers_are_told() {
        let s: TenantSettings =
            serde_json::from_str(r#"{"quotas": {"max_sandboxes": 5}}"#).expect("parses");
        assert_eq!(s.quotas.max_sandboxes, Some(5));
        assert_eq!(s.defaults, SandboxDefaults::default());
        assert!(s.allows_template("anything"));
        let e = serde_json::from_str::<TenantSettings>(r#"{"quotas": {"max_sandbox": 5}}"#)
            .expect_err("unknown field");
        assert!(e.to_string().contains("unknown field `max_sandbox`"), "{e}");
        let bad = TenantSettings {
            quotas: Quotas {
                max_cpus: Some(-1.0),
                ..Quotas::default()
            },
            ..TenantSettings::default()
        };
        assert_eq!(
            bad.validate().expect_err("negative").to_string(),
            "quotas.max_cpus must be a positive number of CPUs, got -1"
        );
        let bad = TenantSettings {
            allowed_templates: Some(vec!["../x".into()]),
            ..TenantSettings::default()
        };
        assert!(bad
            .validate()
            .expect_err("bad name")
            .to_string()
            .starts_with("allowed_templates: invalid template name"));
    }

    #[test]
    fn an_update_replaces_only_the_parts_it_names() {
        let before = TenantSettings {
            quotas: Quotas {
                max_sandboxes: Some(3),
                ..Quotas::default()
            },
            defaults: SandboxDefaults {
                ttl_seconds: Some(60),
                ..SandboxDefaults::default()
            },
            allowed_templates: Some(vec!["base".into()]),
        };
        let u: TenantUpdate =
            serde_json::from_str(r#"{"quotas": {"max_cpus": 2}}"#).expect("parses");
        let after = u.apply(&before);
        assert_eq!(after.quotas.max_sandboxes, None, "quotas replaced whole");
        assert_eq!(after.quotas.max_cpus, Some(2.0));
        assert_eq!(after.defaults, before.defaults);
        assert_eq!(after.allowed_templates, before.allowed_templates);
        let u: TenantUpdate =
            serde_json::from_str(r#"{"allowed_templates": null}"#).expect("parses");
        assert_eq!(u.apply(&before).allowed_templates, None, "null clears");
        assert!(!before.allows_template("minimal"));
    }
}
