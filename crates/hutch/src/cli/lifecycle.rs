//! `pause`, `resume`, `hibernate`, `wake`, `snapshot` (take, `ls`, `rm`), `fork`, `explore`.

use std::path::Path;

use anyhow::bail;
use reqwest::Method;
use serde_json::{json, Value};

use super::output::{field, print_json, table};
use crate::client::Api;

/// A sandbox id.
#[derive(Debug, clap::Args)]
pub struct IdArgs {
    /// Sandbox id.
    pub id: String,
}

/// `hutch snapshot ID [--name N]`, `hutch snapshot ls`, `hutch snapshot rm SNAP…`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    command: Option<SnapshotCommand>,
    /// Sandbox to snapshot (running or hibernated).
    id: Option<String>,
    /// Name of the snapshot (default: its id). `create --snapshot NAME` finds it by a
    /// unique name.
    #[arg(long, short)]
    name: Option<String>,
}

#[derive(Debug, clap::Subcommand)]
enum SnapshotCommand {
    /// List snapshots.
    Ls,
    /// Delete snapshots (refused while sandboxes created from them exist).
    Rm {
        /// Snapshot ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

/// `hutch fork`.
#[derive(Debug, clap::Args)]
pub struct ForkArgs {
    /// Sandbox to fork (running or hibernated).
    id: String,
    /// Number of children (1-16).
    #[arg(long, short = 'n', default_value_t = 1)]
    count: u32,
    /// `disk` (files; every backend) or `live` (memory and processes; vm only).
    #[arg(long, default_value = "disk")]
    mode: String,
}

/// `hutch explore`.
#[derive(Debug, clap::Args)]
pub struct ExploreArgs {
    /// Sandbox to explore from (running or hibernated).
    id: String,
    /// A candidate shell command (repeatable).
    #[arg(long = "cmd")]
    cmds: Vec<String>,
    /// Seconds each command may run.
    #[arg(long)]
    timeout: Option<f64>,
    /// Score by the first capture group of this regex on stdout (default: 1 for exit 0).
    #[arg(long)]
    score_regex: Option<String>,
    /// Candidate commands after `--`, separated by `:::`.
    #[arg(last = true, allow_hyphen_values = true)]
    words: Vec<String>,
}

/// Options of `hutch explore` (and global ones) that, written after `--`, would silently
/// become words of the last command.
const EXPLORE_OPTIONS: &[&str] = &[
    "--timeout",
    "--score-regex",
    "--cmd",
    "--json",
    "--state-dir",
];

impl ExploreArgs {
    /// Every candidate as a shell string: the `--cmd`s, then the `:::`-separated groups.
    /// Refused when a word after `--` is one of explore's own options: `explore ID -- a :::
    /// b --timeout 3` almost surely meant the timeout for explore, not for `b`.
    fn commands(&self) -> anyhow::Result<Vec<String>> {
        let misplaced: Vec<&str> = self
            .words
            .iter()
            .filter_map(|w| {
                let name = w.split_once('=').map_or(w.as_str(), |(name, _)| name);
                EXPLORE_OPTIONS.contains(&name).then_some(name)
            })
            .collect();
        if !misplaced.is_empty() {
            bail!(
                "{} after `--` would be part of a candidate command: put explore's options before `--` (hutch explore ID --timeout 3 -- CMD1 ::: CMD2), or pass such a command whole with --cmd 'CMD {}'",
                misplaced.join(", "),
                misplaced[0]
            );
        }
        let mut out = self.cmds.clone();
        for group in self.words.split(|w| w == ":::") {
            if !group.is_empty() {
                out.push(group.join(" "));
            }
        }
        Ok(out)
    }
}

/// `hutch pause|resume|hibernate|wake ID`.
pub async fn action(
    verb: &str,
    args: &IdArgs,
    state_dir: &Path,
    json_out: bool,
) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let v = api
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{}/{verb}", args.id),
            None,
        )
        .await?;
    if json_out {
        print_json(&v);
    } else if let Some(ms) = v.get("woke_in_ms").and_then(Value::as_u64) {
        println!(
            "{} {} (woke in {ms} ms)",
            field(&v, "id"),
            field(&v, "state")
        );
    } else {
        println!("{} {}", field(&v, "id"), field(&v, "state"));
    }
    Ok(())
}

/// `hutch snapshot …`.
pub async fn snapshot(args: SnapshotArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    match (args.command, args.id) {
        (Some(SnapshotCommand::Ls), _) => {
            let v = api.call(Method::GET, "/v1/snapshots", None).await?;
            if json_out {
                print_json(&v);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = v["snapshots"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|s| {
                            vec![
                                field(s, "id").to_string(),
                                field(s, "name").to_string(),
                                field(s, "kind").to_string(),
                                field(s, "sandbox_id").to_string(),
                                s["size_bytes"].as_u64().unwrap_or(0).to_string(),
                                s["used_by"].as_array().map_or(0, Vec::len).to_string(),
                                field(s, "created_at").to_string(),
                            ]
                        })
                        .collect()
                })
                .unwrap_or_default();
            table(
                &["ID", "NAME", "KIND", "FROM", "BYTES", "USED BY", "CREATED"],
                &rows,
            );
        }
        (Some(SnapshotCommand::Rm { ids }), _) => {
            let mut failed = 0;
            for id in &ids {
                match api
                    .call(Method::DELETE, &format!("/v1/snapshots/{id}"), None)
                    .await
                {
                    Ok(_) if json_out => println!("{}", json!({"id": id, "deleted": true})),
                    Ok(_) => println!("{id}"),
                    Err(e) => {
                        failed += 1;
                        eprintln!("hutch: {id}: {e:#}");
                    }
                }
            }
            if failed > 0 {
                bail!("{failed} of {} snapshots could not be deleted", ids.len());
            }
        }
        (None, Some(id)) => {
            let body = match &args.name {
                Some(name) => json!({ "name": name }),
                None => json!({}),
            };
            let v = api
                .call(
                    Method::POST,
                    &format!("/v1/sandboxes/{id}/snapshots"),
                    Some(&body),
                )
                .await?;
            if json_out {
                print_json(&v);
            } else {
                println!("{}", field(&v, "id"));
            }
        }
        (None, None) => bail!(
            "usage: hutch snapshot ID [--name NAME] | hutch snapshot ls | hutch snapshot rm SNAP…"
        ),
    }
    Ok(())
}

/// `hutch fork ID --count N`: prints the children's ids.
pub async fn fork(args: ForkArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let v = api
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{}/fork", args.id),
            Some(&json!({ "count": args.count, "mode": args.mode })),
        )
        .await?;
    if json_out {
        print_json(&v);
    } else {
        for s in v["sandboxes"].as_array().into_iter().flatten() {
            println!("{}", field(s, "id"));
        }
    }
    Ok(())
}

/// `hutch explore ID -- CMD1 ::: CMD2 …`: a table of outcomes, then the winner.
pub async fn explore(args: ExploreArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let commands = args.commands()?;
    if commands.is_empty() {
        bail!(
            "give candidate commands: hutch explore ID -- CMD1 ::: CMD2, or --cmd CMD (repeatable)"
        );
    }
    let mut body = json!({ "commands": commands, "keep": "winner" });
    if let Some(t) = args.timeout {
        body["timeout_seconds"] = json!(t);
    }
    if let Some(r) = &args.score_regex {
        body["score_regex"] = json!(r);
    }
    let api = Api::from_env(state_dir)?;
    let v = api
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{}/explore", args.id),
            Some(&body),
        )
        .await?;
    if json_out {
        print_json(&v);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = v["outcomes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            let index = o["index"].as_u64().unwrap_or(0) as usize;
            vec![
                index.to_string(),
                o["exit_code"]
                    .as_i64()
                    .map_or("-".to_string(), |c| c.to_string()),
                format!("{}", o["score"].as_f64().unwrap_or(0.0)),
                if o["kept"].as_bool() == Some(true) {
                    field(o, "sandbox_id").to_string()
                } else {
                    "(destroyed)".to_string()
                },
                commands.get(index).cloned().unwrap_or_default(),
            ]
        })
        .collect();
    table(&["#", "EXIT", "SCORE", "SANDBOX", "COMMAND"], &rows);
    let w = &v["winner"];
    println!(
        "winner: #{} in {} (score {})",
        w["index"].as_u64().unwrap_or(0),
        field(w, "sandbox_id"),
        w["score"].as_f64().unwrap_or(0.0)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explore_commands_split_on_triple_colons() {
        let a = ExploreArgs {
            id: "sbx_x".into(),
            cmds: vec!["make".into()],
            timeout: None,
            score_regex: None,
            words: ["pytest", "-x", ":::", "ls", ":::"]
                .map(String::from)
                .to_vec(),
        };
        assert_eq!(
            a.commands().expect("no misplaced options"),
            ["make", "pytest -x", "ls"]
        );
    }

    #[test]
    fn explore_options_after_the_commands_are_refused_by_name() {
        let a = ExploreArgs {
            id: "sbx_x".into(),
            cmds: vec!["pytest --timeout 3".into()],
            timeout: None,
            score_regex: None,
            words: ["a", ":::", "b", "--timeout", "3", "--score-regex=x"]
                .map(String::from)
                .to_vec(),
        };
        let e = a.commands().expect_err("misplaced options").to_string();
        assert!(
            e.starts_with(
                "--timeout, --score-regex after `--` would be part of a candidate command"
            ),
            "{e}"
        );
    }
}
