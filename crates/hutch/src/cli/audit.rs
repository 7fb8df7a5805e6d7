//! `hutch audit`: read the audit log (a full or admin key).

use std::path::Path;

use anyhow::Context;
use reqwest::Method;

use super::output::{field, print_json, table};
use crate::client::{with_query, Api};

/// `hutch audit [--tenant T] [--key ID] [--sandbox ID] [--since T] [--until T] [--limit N]`.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    /// Only this tenant's entries (admin key).
    #[arg(long)]
    tenant: Option<String>,
    /// Only this key's (`key_…`).
    #[arg(long)]
    key: Option<String>,
    /// Only those on this sandbox.
    #[arg(long)]
    sandbox: Option<String>,
    /// From this time on (RFC 3339, or milliseconds since the epoch).
    #[arg(long)]
    since: Option<String>,
    /// Before this time.
    #[arg(long)]
    until: Option<String>,
    /// At most this many entries (oldest first); the next page's cursor is printed after.
    #[arg(long)]
    limit: Option<u32>,
    /// Start after this cursor (from a previous page).
    #[arg(long)]
    cursor: Option<String>,
}

/// Run `hutch audit`.
pub async fn audit(args: AuditArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let path = with_query(
        "/v1/audit",
        [
            ("tenant", args.tenant),
            ("key_id", args.key),
            ("sandbox_id", args.sandbox),
            ("since", args.since),
            ("until", args.until),
            ("limit", args.limit.map(|n| n.to_string())),
            ("cursor", args.cursor),
        ],
    );
    let v = api.call(Method::GET, &path, None).await?;
    if json_out {
        print_json(&v);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = v["entries"]
        .as_array()
        .context("entries")?
        .iter()
        .map(|e| {
            let argv = e["argv"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .unwrap_or_default();
            vec![
                field(e, "at").to_string(),
                field(e, "tenant").to_string(),
                field(e, "key_id").to_string(),
                format!("{} {}", field(e, "method"), field(e, "path")),
                e["status"]
                    .as_u64()
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
                argv,
            ]
        })
        .collect();
    table(&["AT", "TENANT", "KEY", "CALL", "STATUS", "ARGV"], &rows);
    if let Some(next) = v["next_cursor"].as_str() {
        eprintln!("more: hutch audit --cursor {next}");
    }
    Ok(())
}
