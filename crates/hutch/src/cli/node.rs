//! `hutch node ls|cordon|uncordon|drain`: the nodes of a cluster (`docs/cluster.md`), through
//! any node's API with an admin key.

use std::path::Path;

use reqwest::Method;
use serde_json::Value;

use super::output::{print_json, table};
use crate::client::Api;

/// `hutch node …`.
#[derive(Debug, clap::Subcommand)]
pub enum NodeCommand {
    /// Every node: its state, epoch, heartbeat age, sandboxes and memory against capacity.
    Ls,
    /// Place no new sandboxes on the node; its own keep running.
    Cordon {
        /// The node's id.
        id: String,
    },
    /// Place sandboxes on the node again.
    Uncordon {
        /// The node's id.
        id: String,
    },
    /// Place nothing new on the node and hibernate its running sandboxes.
    Drain {
        /// The node's id.
        id: String,
    },
}

fn num(v: &Value) -> String {
    v.as_i64()
        .map(|n| n.to_string())
        .unwrap_or_else(|| "-".into())
}

fn print_nodes(nodes: &[Value]) {
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|n| {
            vec![
                n["id"].as_str().unwrap_or("-").to_string(),
                n["state"].as_str().unwrap_or("-").to_string(),
                n["role"].as_str().unwrap_or("-").to_string(),
                num(&n["epoch"]),
                format!("{} ms", num(&n["heartbeat_age_ms"])),
                format!(
                    "{}/{}",
                    num(&n["in_use"]["sandboxes"]),
                    num(&n["capacity"]["sandboxes"])
                ),
                format!(
                    "{}/{}",
                    num(&n["in_use"]["memory_mib"]),
                    num(&n["capacity"]["memory_mib"])
                ),
                n["advertise"].as_str().unwrap_or("-").to_string(),
            ]
        })
        .collect();
    table(
        &[
            "NODE",
            "STATE",
            "ROLE",
            "EPOCH",
            "HEARTBEAT",
            "SANDBOXES",
            "MEMORY MIB",
            "ADDRESS",
        ],
        &rows,
    );
}

/// Run `hutch node …`.
pub async fn run(cmd: NodeCommand, state_dir: &Path, json: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let (id, action) = match cmd {
        NodeCommand::Ls => {
            let v = api.call(Method::GET, "/v1/cluster/nodes", None).await?;
            if json {
                print_json(&v);
            } else {
                print_nodes(v["nodes"].as_array().map(Vec::as_slice).unwrap_or(&[]));
                // What a drain waits for before the node's hibernated sandboxes can move.
                if let Some(n) = v["pending_saves"].as_u64().filter(|n| *n > 0) {
                    println!(
                        "{}: {n} hibernated sandbox(es) not saved in the object store yet",
                        v["this_node"].as_str().unwrap_or("this node")
                    );
                }
            }
            return Ok(());
        }
        NodeCommand::Cordon { id } => (id, "cordon"),
        NodeCommand::Uncordon { id } => (id, "uncordon"),
        NodeCommand::Drain { id } => (id, "drain"),
    };
    let v = api
        .call(
            Method::POST,
            &format!("/v1/cluster/nodes/{id}/{action}"),
            None,
        )
        .await?;
    if json {
        print_json(&v);
    } else {
        print_nodes(std::slice::from_ref(&v));
    }
    Ok(())
}
