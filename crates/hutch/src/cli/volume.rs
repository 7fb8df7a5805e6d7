//! `hutch volume create|ls|inspect|check|rm`: durable volumes.

use std::path::Path;

use anyhow::Context;
use reqwest::Method;
use serde_json::{json, Value};

use super::output::{field, print_json, table};
use crate::client::{encode, Api};

/// `hutch volume …`.
#[derive(Debug, clap::Subcommand)]
pub enum VolumeCommand {
    /// Create a volume: `volume create NAME --size-mib N`.
    Create {
        /// Name (unique per tenant).
        name: String,
        /// Size limit in MiB (writes beyond it fail with "no space left on device").
        #[arg(long, default_value_t = 1024)]
        size_mib: u64,
    },
    /// List volumes.
    Ls,
    /// Show one volume (id or name).
    Inspect {
        /// Volume id or name.
        id: String,
    },
    /// Check a detached volume's filesystem (e2fsck, jailed); `--repair` fixes everything
    /// it can (a vm guest's damage that the automatic check refused).
    Check {
        /// Volume id or name.
        id: String,
        /// Repair all damage (`e2fsck -y`); without it only what is safe (`e2fsck -p`).
        #[arg(long)]
        repair: bool,
    },
    /// Delete volumes and their data (refused while attached).
    Rm {
        /// Volume ids or names.
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

/// Parse `VOL:/path[:ro|:rw]` into a create body's volume entry.
pub fn parse_mount(s: &str) -> anyhow::Result<Value> {
    let mut parts = s.splitn(3, ':');
    let volume = parts.next().filter(|v| !v.is_empty());
    let path = parts.next().filter(|p| p.starts_with('/'));
    let (Some(volume), Some(path)) = (volume, path) else {
        anyhow::bail!("--volume {s:?} must be VOLUME:/path[:ro]");
    };
    let read_only = match parts.next() {
        None | Some("rw") => false,
        Some("ro") => true,
        Some(other) => anyhow::bail!("--volume {s:?}: mode {other:?} is not ro or rw"),
    };
    Ok(json!({"volume": volume, "path": path, "read_only": read_only}))
}

fn attached(v: &Value) -> String {
    v["attached"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    format!(
                        "{}:{}{}",
                        field(x, "sandbox"),
                        field(x, "path"),
                        if x["read_only"] == true { ":ro" } else { "" }
                    )
                })
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// Run `hutch volume …`.
pub async fn run(cmd: VolumeCommand, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    match cmd {
        VolumeCommand::Create { name, size_mib } => {
            let v = api
                .call(
                    Method::POST,
                    "/v1/volumes",
                    Some(&json!({"name": name, "size_mib": size_mib})),
                )
                .await?;
            if json_out {
                print_json(&v);
            } else {
                println!("{}", field(&v, "id"));
            }
        }
        VolumeCommand::Ls => {
            let v = api.call(Method::GET, "/v1/volumes", None).await?;
            if json_out {
                print_json(&v);
            } else {
                let rows: Vec<Vec<String>> = v["volumes"]
                    .as_array()
                    .context("volumes")?
                    .iter()
                    .map(|x| {
                        vec![
                            field(x, "id").to_string(),
                            field(x, "name").to_string(),
                            x["size_mib"].as_u64().unwrap_or(0).to_string(),
                            attached(x),
                        ]
                    })
                    .collect();
                table(&["ID", "NAME", "SIZE_MIB", "ATTACHED"], &rows);
            }
        }
        VolumeCommand::Inspect { id } => {
            let v = api
                .call(Method::GET, &format!("/v1/volumes/{}", encode(&id)), None)
                .await?;
            print_json(&v);
        }
        VolumeCommand::Check { id, repair } => {
            let v = api
                .call(
                    Method::POST,
                    &format!("/v1/volumes/{}/check", encode(&id)),
                    Some(&json!({"repair": repair})),
                )
                .await?;
            if json_out {
                print_json(&v);
            } else {
                println!(
                    "{}: {}",
                    field(&v, "id"),
                    if v["repaired"] == true {
                        "repaired"
                    } else {
                        "clean"
                    }
                );
            }
        }
        VolumeCommand::Rm { ids } => {
            for id in &ids {
                api.call(Method::DELETE, &format!("/v1/volumes/{}", encode(id)), None)
                    .await?;
                if json_out {
                    println!("{}", json!({"id": id, "deleted": true}));
                } else {
                    println!("{id}");
                }
            }
        }
    }
    Ok(())
}
