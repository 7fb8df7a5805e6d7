//! `hutch tenant create|ls|inspect|set|rm`: the tenants of a server (admin key).

use std::path::Path;

use anyhow::Context;
use reqwest::Method;
use serde_json::{json, Map, Value};

use super::output::{field, print_json, table};
use crate::client::{encode, Api};

/// A quota or default on the command line: a number, or `none` (no limit / no default).
#[derive(Debug, Clone, PartialEq)]
pub struct Limit(Value);

fn parse_limit(s: &str) -> Result<Limit, String> {
    if s == "none" {
        return Ok(Limit(Value::Null));
    }
    if let Ok(n) = s.parse::<u64>() {
        return Ok(Limit(n.into()));
    }
    match s.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 => Ok(Limit(json!(f))),
        _ => Err(format!("{s:?} is not a positive number or `none`")),
    }
}

/// Quotas, defaults and allowed templates of a tenant (`create` and `set`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SettingsArgs {
    /// Sandboxes running or paused at once.
    #[arg(long, value_parser = parse_limit)]
    max_sandboxes: Option<Limit>,
    /// Creates (forks included) in any hour.
    #[arg(long, value_parser = parse_limit)]
    max_creates_per_hour: Option<Limit>,
    /// CPUs of the running sandboxes together.
    #[arg(long, value_parser = parse_limit)]
    max_cpus: Option<Limit>,
    /// Memory of the running sandboxes together, in MiB.
    #[arg(long, value_parser = parse_limit)]
    max_memory_mib: Option<Limit>,
    /// Longest TTL of a sandbox (none may then be persistent).
    #[arg(long, value_parser = parse_limit)]
    max_ttl_seconds: Option<Limit>,
    /// Most CPUs of one sandbox.
    #[arg(long, value_parser = parse_limit)]
    max_sandbox_cpus: Option<Limit>,
    /// Most memory of one sandbox, in MiB.
    #[arg(long, value_parser = parse_limit)]
    max_sandbox_memory_mib: Option<Limit>,
    /// Largest disk of one sandbox, in MiB.
    #[arg(long, value_parser = parse_limit)]
    max_sandbox_disk_mib: Option<Limit>,
    /// What its sandboxes may spend per UTC day: cost micros through the server's rate
    /// card, CPU-seconds without one.
    #[arg(long, value_parser = parse_limit)]
    daily_budget: Option<Limit>,
    /// The same per UTC month.
    #[arg(long, value_parser = parse_limit)]
    monthly_budget: Option<Limit>,
    /// TTL of its sandboxes when a create leaves it out.
    #[arg(long, value_parser = parse_limit)]
    default_ttl_seconds: Option<Limit>,
    /// CPUs of its sandboxes when a create leaves them out.
    #[arg(long, value_parser = parse_limit)]
    default_cpus: Option<Limit>,
    /// Memory of its sandboxes when a create leaves it out, in MiB.
    #[arg(long, value_parser = parse_limit)]
    default_memory_mib: Option<Limit>,
    /// Disk of its sandboxes when a create leaves it out, in MiB.
    #[arg(long, value_parser = parse_limit)]
    default_disk_mib: Option<Limit>,
    /// Isolation of its sandboxes when a create leaves it out (`ns`, `vm`, `auto`, `none`).
    #[arg(long)]
    default_isolation: Option<String>,
    /// Egress of its sandboxes when a create leaves the network out (`allow`, `deny`,
    /// `none`; `unset` for the server's default).
    #[arg(long)]
    default_egress: Option<String>,
    /// Destinations its sandboxes reach by default (with `--default-egress deny`).
    #[arg(long = "default-allow")]
    default_allow: Vec<String>,
    /// A template its sandboxes may be created from (repeat; without any: all it sees).
    #[arg(long = "allow-template")]
    allow_templates: Vec<String>,
    /// Allow every template again (`set`).
    #[arg(long, conflicts_with = "allow_templates")]
    any_template: bool,
}

impl SettingsArgs {
    /// Apply these flags to a tenant's `quotas`, `defaults` and `allowed_templates`.
    fn apply(&self, quotas: &mut Map<String, Value>, defaults: &mut Map<String, Value>) {
        let set = |m: &mut Map<String, Value>, name: &str, v: &Option<Limit>| {
            if let Some(Limit(v)) = v {
                m.insert(name.into(), v.clone());
            }
        };
        set(quotas, "max_sandboxes", &self.max_sandboxes);
        set(quotas, "max_creates_per_hour", &self.max_creates_per_hour);
        set(quotas, "max_cpus", &self.max_cpus);
        set(quotas, "max_memory_mib", &self.max_memory_mib);
        set(quotas, "max_ttl_seconds", &self.max_ttl_seconds);
        set(quotas, "max_sandbox_cpus", &self.max_sandbox_cpus);
        set(
            quotas,
            "max_sandbox_memory_mib",
            &self.max_sandbox_memory_mib,
        );
        set(quotas, "max_sandbox_disk_mib", &self.max_sandbox_disk_mib);
        set(quotas, "daily_budget", &self.daily_budget);
        set(quotas, "monthly_budget", &self.monthly_budget);
        set(defaults, "ttl_seconds", &self.default_ttl_seconds);
        set(defaults, "cpus", &self.default_cpus);
        set(defaults, "memory_mib", &self.default_memory_mib);
        set(defaults, "disk_mib", &self.default_disk_mib);
        match self.default_isolation.as_deref() {
            Some("none") => {
                defaults.insert("isolation".into(), Value::Null);
            }
            Some(i) => {
                defaults.insert("isolation".into(), i.into());
            }
            None => {}
        }
        match self.default_egress.as_deref() {
            Some("unset") => {
                defaults.insert("network".into(), Value::Null);
            }
            Some(e) => {
                defaults.insert(
                    "network".into(),
                    json!({"egress": e, "allow": self.default_allow}),
                );
            }
            None => {}
        }
    }

    /// The `allowed_templates` these flags ask for (`None`: leave it as it is).
    fn allowed_templates(&self) -> Option<Value> {
        if self.any_template {
            Some(Value::Null)
        } else if self.allow_templates.is_empty() {
            None
        } else {
            Some(json!(self.allow_templates))
        }
    }
}

/// `hutch tenant …`.
#[derive(Debug, clap::Subcommand)]
pub enum TenantCommand {
    /// Make a tenant: `tenant create acme --max-sandboxes 10 --max-cpus 8`.
    Create {
        /// Its name (lowercase letters, digits, `-`, `_`).
        name: String,
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// List tenants.
    Ls,
    /// Show a tenant, with what its sandboxes use now.
    Inspect {
        /// Tenant name.
        name: String,
    },
    /// Change a tenant's quotas, defaults or templates (`none` removes a limit).
    Set {
        /// Tenant name.
        name: String,
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// Delete tenants and their keys (refused while they own sandboxes, snapshots, volumes
    /// or templates).
    Rm {
        /// Tenant names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

fn object(v: &Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap_or_default()
}

fn limit_cell(v: &Value) -> String {
    if v.is_null() {
        "-".into()
    } else {
        v.to_string()
    }
}

/// Run `hutch tenant …`.
pub async fn run(cmd: TenantCommand, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    match cmd {
        TenantCommand::Create { name, settings } => {
            let (mut quotas, mut defaults) = (Map::new(), Map::new());
            settings.apply(&mut quotas, &mut defaults);
            let mut body = json!({"name": name, "quotas": quotas, "defaults": defaults});
            if let Some(t) = settings.allowed_templates() {
                body["allowed_templates"] = t;
            }
            let v = api.call(Method::POST, "/v1/tenants", Some(&body)).await?;
            if json_out {
                print_json(&v);
            } else {
                println!("{}", field(&v, "name"));
            }
        }
        TenantCommand::Ls => {
            let v = api.call(Method::GET, "/v1/tenants", None).await?;
            if json_out {
                print_json(&v);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = v["tenants"]
                .as_array()
                .context("tenants")?
                .iter()
                .map(|t| {
                    let q = &t["quotas"];
                    vec![
                        field(t, "name").to_string(),
                        limit_cell(&q["max_sandboxes"]),
                        limit_cell(&q["max_cpus"]),
                        limit_cell(&q["max_memory_mib"]),
                        limit_cell(&q["max_creates_per_hour"]),
                        match t["allowed_templates"].as_array() {
                            Some(list) => list
                                .iter()
                                .filter_map(Value::as_str)
                                .collect::<Vec<_>>()
                                .join(","),
                            None => "any".into(),
                        },
                    ]
                })
                .collect();
            table(
                &[
                    "NAME",
                    "MAX_SANDBOXES",
                    "MAX_CPUS",
                    "MAX_MEMORY_MIB",
                    "CREATES/HOUR",
                    "TEMPLATES",
                ],
                &rows,
            );
        }
        TenantCommand::Inspect { name } => {
            let v = api
                .call(Method::GET, &format!("/v1/tenants/{}", encode(&name)), None)
                .await?;
            print_json(&v);
        }
        TenantCommand::Set { name, settings } => {
            let path = format!("/v1/tenants/{}", encode(&name));
            let current = api.call(Method::GET, &path, None).await?;
            let (mut quotas, mut defaults) =
                (object(&current["quotas"]), object(&current["defaults"]));
            settings.apply(&mut quotas, &mut defaults);
            let mut body = json!({"quotas": quotas, "defaults": defaults});
            if let Some(t) = settings.allowed_templates() {
                body["allowed_templates"] = t;
            }
            let v = api.call(Method::PATCH, &path, Some(&body)).await?;
            if json_out {
                print_json(&v);
            } else {
                println!("{}", field(&v, "name"));
            }
        }
        TenantCommand::Rm { names } => {
            for name in &names {
                api.call(
                    Method::DELETE,
                    &format!("/v1/tenants/{}", encode(name)),
                    None,
                )
                .await?;
                if json_out {
                    println!("{}", json!({"name": name, "deleted": true}));
                } else {
                    println!("{name}");
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_numbers_or_none_and_flags_fill_their_section() {
        assert_eq!(parse_limit("5"), Ok(Limit(json!(5))));
        assert_eq!(parse_limit("0.5"), Ok(Limit(json!(0.5))));
        assert_eq!(parse_limit("none"), Ok(Limit(Value::Null)));
        assert!(parse_limit("-1").is_err());
        let args = SettingsArgs {
            max_sandboxes: Some(Limit(json!(3))),
            max_cpus: Some(Limit(Value::Null)),
            default_egress: Some("deny".into()),
            default_allow: vec!["pypi.org".into()],
            ..SettingsArgs::default()
        };
        let mut quotas = object(&json!({"max_cpus": 2, "max_memory_mib": 512}));
        let mut defaults = Map::new();
        args.apply(&mut quotas, &mut defaults);
        assert_eq!(
            Value::Object(quotas),
            json!({"max_sandboxes": 3, "max_cpus": null, "max_memory_mib": 512})
        );
        assert_eq!(
            Value::Object(defaults),
            json!({"network": {"egress": "deny", "allow": ["pypi.org"]}})
        );
        assert_eq!(args.allowed_templates(), None);
    }
}
