//! `hutch network ID …`: show or replace a sandbox's egress policy.

use std::path::Path;

use reqwest::Method;
use serde_json::{json, Value};

use super::output::print_json;
use crate::client::Api;

/// Egress policy flags, shared by `run`, `create` and `network`.
#[derive(Debug, Clone, clap::Args, Default)]
pub struct PolicyOpts {
    /// Default for destinations no list names: `allow`, `deny` or `none` (loopback only).
    #[arg(long)]
    pub egress: Option<String>,
    /// Always reachable: an IPv4 address, CIDR, domain or `*.suffix` (repeatable).
    #[arg(long = "allow", value_name = "DEST")]
    pub allow: Vec<String>,
    /// Unreachable unless also allowed (repeatable).
    #[arg(long = "deny", value_name = "DEST")]
    pub deny: Vec<String>,
}

impl PolicyOpts {
    /// The `network` object, or `None` when no flag was given.
    pub fn body(&self) -> Option<Value> {
        if self.egress.is_none() && self.allow.is_empty() && self.deny.is_empty() {
            return None;
        }
        let mut b = serde_json::Map::new();
        if let Some(e) = &self.egress {
            b.insert("egress".into(), json!(e));
        }
        b.insert("allow".into(), json!(self.allow));
        b.insert("deny".into(), json!(self.deny));
        Some(Value::Object(b))
    }
}

/// `hutch network ID [--egress E] [--allow D]… [--deny D]…`.
#[derive(Debug, clap::Args)]
pub struct NetworkArgs {
    /// Sandbox id.
    pub id: String,
    /// The new policy (replaces the whole policy; without flags the current one is shown).
    #[command(flatten)]
    pub policy: PolicyOpts,
}

fn describe(n: &Value) -> String {
    let list = |k: &str| {
        n[k].as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default()
    };
    let mut s = format!("egress={}", n["egress"].as_str().unwrap_or("?"));
    for k in ["allow", "deny"] {
        let l = list(k);
        if !l.is_empty() {
            s.push_str(&format!(" {k}={l}"));
        }
    }
    if let Some(a) = n["address"].as_str() {
        s.push_str(&format!(" address={a}"));
    }
    for k in ["connections_out", "bytes_out"] {
        if let Some(v) = n[k].as_u64() {
            s.push_str(&format!(" {k}={v}"));
        }
    }
    s
}

/// Run `hutch network`.
pub async fn network(args: NetworkArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let path = format!("/v1/sandboxes/{}", args.id);
    let v = match args.policy.body() {
        Some(body) => {
            api.call(Method::PUT, &format!("{path}/network"), Some(&body))
                .await?
        }
        None => api.call(Method::GET, &path, None).await?,
    };
    if json_out {
        print_json(&v["network"]);
    } else {
        println!("{} {}", args.id, describe(&v["network"]));
    }
    Ok(())
}
