//! `hutch key create|ls|set|revoke`: API keys (a full or admin key).

use std::path::Path;

use anyhow::{bail, Context};
use reqwest::Method;
use serde_json::json;

use super::output::{field, print_json, table};
use crate::client::{encode, Api};

/// `hutch key …`.
#[derive(Debug, clap::Subcommand)]
pub enum KeyCommand {
    /// Make a key and print its secret (shown this once): `key create --tenant acme
    /// --scope exec --expires-in 7d`.
    Create {
        /// The tenant it acts for (a tenant's key: its own, the default).
        #[arg(long)]
        tenant: Option<String>,
        /// What it may do: `full`, `exec` (exec, files, terminals, code and ports on existing
        /// sandboxes), `read-only`, `admin`.
        #[arg(long, default_value = "full")]
        scope: String,
        /// A name for people.
        #[arg(long)]
        name: Option<String>,
        /// Limit it to sandboxes with this metadata (`KEY=VALUE`, repeat).
        #[arg(long = "selector")]
        selectors: Vec<String>,
        /// When it stops working: `90s`, `30m`, `12h`, `7d` or seconds.
        #[arg(long)]
        expires_in: Option<String>,
        /// The form of its secret: `hutch` (`hk_…`) or `e2b` (`e2b_` and hex, for E2B SDKs).
        #[arg(long, default_value = "hutch")]
        format: String,
        /// What the sandboxes it creates may spend per UTC day (cost micros through the
        /// rate card, CPU-seconds without one).
        #[arg(long)]
        daily_budget: Option<u64>,
        /// The same per UTC month.
        #[arg(long)]
        monthly_budget: Option<u64>,
    },
    /// Set a key's spending caps (both replaced; a cap left out is removed): `key set key_…
    /// --daily-budget 5000000`. No key changes its own.
    Set {
        /// Key id (`key_…`).
        id: String,
        /// Per UTC day.
        #[arg(long)]
        daily_budget: Option<u64>,
        /// Per UTC month.
        #[arg(long)]
        monthly_budget: Option<u64>,
    },
    /// List keys (never their secrets).
    Ls,
    /// Revoke keys by id: they stop working at once, and what they hold open is closed.
    Revoke {
        /// Key ids (`key_…`).
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

/// `90s`, `30m`, `12h`, `7d` or a number of seconds.
fn parse_duration(s: &str) -> anyhow::Result<u64> {
    let (number, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s[..i], c),
        _ => (s, 's'),
    };
    let n: u64 = number
        .parse()
        .with_context(|| format!("--expires-in {s:?}: a number and s, m, h or d"))?;
    let unit = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        other => bail!("--expires-in {s:?}: unit {other:?} is not s, m, h or d"),
    };
    Ok(n * unit)
}

/// Run `hutch key …`.
pub async fn run(cmd: KeyCommand, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    match cmd {
        KeyCommand::Create {
            tenant,
            scope,
            name,
            selectors,
            expires_in,
            format,
            daily_budget,
            monthly_budget,
        } => {
            let mut selector = serde_json::Map::new();
            for s in &selectors {
                let (k, v) = s
                    .split_once('=')
                    .with_context(|| format!("--selector {s:?} must be KEY=VALUE"))?;
                selector.insert(k.into(), v.into());
            }
            let mut body = json!({"scope": scope, "format": format, "selector": selector});
            if let Some(t) = tenant {
                body["tenant"] = t.into();
            }
            if let Some(n) = name {
                body["name"] = n.into();
            }
            if let Some(e) = expires_in {
                body["expires_in_seconds"] = parse_duration(&e)?.into();
            }
            body["daily_budget"] = daily_budget.into();
            body["monthly_budget"] = monthly_budget.into();
            let v = api.call(Method::POST, "/v1/keys", Some(&body)).await?;
            if json_out {
                print_json(&v);
            } else {
                println!("{}", field(&v, "secret"));
                eprintln!(
                    "{} ({}, {}): the secret is shown only now",
                    field(&v, "id"),
                    field(&v, "tenant"),
                    field(&v, "scope")
                );
            }
        }
        KeyCommand::Ls => {
            let v = api.call(Method::GET, "/v1/keys", None).await?;
            if json_out {
                print_json(&v);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = v["keys"]
                .as_array()
                .context("keys")?
                .iter()
                .map(|k| {
                    let selector = k["selector"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(a, b)| format!("{a}={}", b.as_str().unwrap_or_default()))
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .unwrap_or_default();
                    vec![
                        field(k, "id").to_string(),
                        field(k, "tenant").to_string(),
                        field(k, "scope").to_string(),
                        field(k, "prefix").to_string(),
                        field(k, "name").to_string(),
                        selector,
                        field(k, "expires_at").to_string(),
                        field(k, "last_used_at").to_string(),
                    ]
                })
                .collect();
            table(
                &[
                    "ID",
                    "TENANT",
                    "SCOPE",
                    "PREFIX",
                    "NAME",
                    "SELECTOR",
                    "EXPIRES",
                    "LAST_USED",
                ],
                &rows,
            );
        }
        KeyCommand::Set {
            id,
            daily_budget,
            monthly_budget,
        } => {
            let body = json!({"daily_budget": daily_budget, "monthly_budget": monthly_budget});
            let v = api
                .call(
                    Method::PATCH,
                    &format!("/v1/keys/{}", encode(&id)),
                    Some(&body),
                )
                .await?;
            if json_out {
                print_json(&v);
            } else {
                let cap = |name: &str| match &v[name] {
                    serde_json::Value::Null => "none".to_string(),
                    n => n.to_string(),
                };
                println!(
                    "{}: daily budget {}, monthly budget {}",
                    field(&v, "id"),
                    cap("daily_budget"),
                    cap("monthly_budget")
                );
            }
        }
        KeyCommand::Revoke { ids } => {
            for id in &ids {
                api.call(Method::DELETE, &format!("/v1/keys/{}", encode(id)), None)
                    .await?;
                if json_out {
                    println!("{}", json!({"id": id, "revoked": true}));
                } else {
                    println!("{id}");
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
    fn durations_take_a_unit() {
        assert_eq!(parse_duration("90").expect("seconds"), 90);
        assert_eq!(parse_duration("30m").expect("minutes"), 1800);
        assert_eq!(parse_duration("7d").expect("days"), 604_800);
        assert!(parse_duration("3w").is_err());
        assert!(parse_duration("h").is_err());
    }
}
