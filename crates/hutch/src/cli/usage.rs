//! `hutch usage`: metered usage (`GET /v1/usage`), summed and grouped, with its cost when
//! the server has a rate card.

use std::path::Path;

use anyhow::Context;
use reqwest::Method;
use serde_json::Value;

use super::output::{print_json, table};
use crate::client::{with_query, Api};

/// `hutch usage [--from T] [--to T] [--group-by sandbox|tenant|key|day] [--tenant T]
/// [--key ID] [--sandbox ID]`.
#[derive(Debug, clap::Args)]
pub struct UsageArgs {
    /// Intervals ending after this time (RFC 3339, or milliseconds since the epoch).
    #[arg(long)]
    from: Option<String>,
    /// Intervals ending at or before this time.
    #[arg(long)]
    to: Option<String>,
    /// One row per sandbox, tenant, key or day (UTC).
    #[arg(long, value_parser = ["sandbox", "tenant", "key", "day"])]
    group_by: Option<String>,
    /// Only this tenant's usage (admin key).
    #[arg(long)]
    tenant: Option<String>,
    /// Only the sandboxes this key (`key_…`) created.
    #[arg(long)]
    key: Option<String>,
    /// Only this sandbox.
    #[arg(long)]
    sandbox: Option<String>,
}

fn number(v: &Value, field: &str) -> String {
    match &v[field] {
        Value::Number(n) => match n.as_f64() {
            Some(x) if n.is_f64() => format!("{x:.3}"),
            _ => n.to_string(),
        },
        _ => "-".into(),
    }
}

fn row(label: String, v: &Value) -> Vec<String> {
    vec![
        label,
        number(v, "cpu_seconds"),
        number(v, "memory_gib_seconds"),
        number(v, "disk_gib_hours"),
        number(v, "egress_bytes"),
        number(v, "cost_micros"),
    ]
}

/// Run `hutch usage`.
pub async fn usage(args: UsageArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let group_by = args.group_by.clone();
    let path = with_query(
        "/v1/usage",
        [
            ("from", args.from),
            ("to", args.to),
            ("group_by", args.group_by),
            ("tenant", args.tenant),
            ("key_id", args.key),
            ("sandbox_id", args.sandbox),
        ],
    );
    let v = api.call(Method::GET, &path, None).await?;
    if json_out {
        print_json(&v);
        return Ok(());
    }
    let field = match group_by.as_deref() {
        Some("sandbox") => "sandbox_id",
        Some("tenant") => "tenant",
        Some("key") => "key_id",
        Some("day") => "day",
        _ => "",
    };
    let mut rows: Vec<Vec<String>> = v["groups"]
        .as_array()
        .context("groups")?
        .iter()
        .map(|g| {
            let label = g[field].as_str().unwrap_or("(none)").to_string();
            row(label, g)
        })
        .collect();
    rows.push(row("TOTAL".into(), &v["total"]));
    let head = if field.is_empty() { "" } else { field };
    table(
        &[
            &head.to_uppercase(),
            "CPU-S",
            "MEM-GIB-S",
            "DISK-GIB-H",
            "EGRESS-BYTES",
            "COST-MICROS",
        ],
        &rows,
    );
    Ok(())
}
