//! Process handles (`docs/processes.md`): `ps`, `attach`, and the `process` group (`send`,
//! `close-stdin`, `signal`, `kill`, `resize`). `exec -d` starts one (`sandbox.rs`).
//!
//! A process is named as the API names it: its pid, or `tag:NAME`.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::{bail, Context};
use reqwest::Method;
use serde_json::{json, Value};

use super::output::{print_json, table};
use super::sandbox::decode_data;
use super::stream::for_each_event;
use crate::client::Api;

/// `hutch ps`.
#[derive(Debug, clap::Args)]
pub struct PsArgs {
    /// Sandbox id.
    id: String,
}

/// `hutch attach`.
#[derive(Debug, clap::Args)]
pub struct AttachArgs {
    /// Sandbox id.
    id: String,
    /// The process: its pid or `tag:NAME`.
    process: String,
    /// Only what the process writes from now on (by default what it wrote while nobody was
    /// attached comes first, as far as its 1 MiB ring per stream reaches back).
    #[arg(long)]
    no_replay: bool,
}

/// `hutch process …`.
#[derive(Debug, clap::Subcommand)]
pub enum ProcessCommand {
    /// Write to a process's stdin: `process send ID PROC TEXT`, or `-` for this stdin.
    Send {
        /// Sandbox id.
        id: String,
        /// The process: its pid or `tag:NAME`.
        process: String,
        /// What to write (`-`: read it from stdin). No newline is added.
        data: String,
    },
    /// Close a process's stdin (a terminal gets ^D).
    CloseStdin {
        /// Sandbox id.
        id: String,
        /// The process: its pid or `tag:NAME`.
        process: String,
    },
    /// Send a signal to a process's group: a number or a name (TERM, INT, HUP, KILL…).
    Signal {
        /// Sandbox id.
        id: String,
        /// The process: its pid or `tag:NAME`.
        process: String,
        /// The signal.
        signal: String,
    },
    /// Kill a process (SIGKILL to its group).
    Kill {
        /// Sandbox id.
        id: String,
        /// The process: its pid or `tag:NAME`.
        process: String,
    },
    /// Resize a process's terminal.
    Resize {
        /// Sandbox id.
        id: String,
        /// The process: its pid or `tag:NAME`.
        process: String,
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
}

/// `/v1/sandboxes/{id}/processes/{process}{rest}`, the process percent-encoded.
fn process_path(id: &str, process: &str, rest: &str) -> String {
    format!(
        "/v1/sandboxes/{id}/processes/{}{rest}",
        crate::client::encode(process).replace('/', "%2F")
    )
}

/// `hutch ps`: the sandbox's process handles.
pub async fn ps(args: PsArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let out = api
        .call(
            Method::GET,
            &format!("/v1/sandboxes/{}/processes", args.id),
            None,
        )
        .await?;
    if json_out {
        print_json(&out);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = out["processes"]
        .as_array()
        .map(|list| list.iter().map(ps_row).collect())
        .unwrap_or_default();
    table(
        &["PID", "TAG", "STATE", "EXIT", "STARTED", "COMMAND"],
        &rows,
    );
    Ok(())
}

fn ps_row(p: &Value) -> Vec<String> {
    let exit = &p["exit"];
    let exit = match (exit["signal"].as_i64(), exit["exit_code"].as_i64()) {
        _ if exit.is_null() => "-".to_string(),
        (_, Some(code)) if exit["timed_out"] == true => format!("{code} (timed out)"),
        (Some(signal), _) => format!("signal {signal}"),
        (None, Some(code)) => code.to_string(),
        (None, None) => "?".to_string(),
    };
    let cmd = p["cmd"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    vec![
        p["pid"].to_string(),
        p["tag"].as_str().unwrap_or("-").to_string(),
        p["state"].as_str().unwrap_or("-").to_string(),
        exit,
        p["started_at"].as_str().unwrap_or("-").to_string(),
        cmd,
    ]
}

/// `hutch attach`: the process's output on this terminal until it exits; exits with its code.
/// Ctrl-C detaches (the process runs on).
pub async fn attach(args: AttachArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<i32> {
    let api = Api::from_env(state_dir)?;
    let query = if args.no_replay { "?replay=false" } else { "" };
    let path = process_path(&args.id, &args.process, &format!("/output{query}"));
    let accept = if json_out {
        "application/x-ndjson"
    } else {
        "text/event-stream"
    };
    let resp = api.get_streamed(&path, accept).await?;
    if json_out {
        // The NDJSON events as they come, one per line.
        let mut body = resp.bytes_stream();
        let mut code = None;
        let mut out = std::io::stdout().lock();
        let mut pending = Vec::new();
        while let Some(chunk) = futures_util::StreamExt::next(&mut body).await {
            let chunk = chunk?;
            out.write_all(&chunk)?;
            out.flush()?;
            pending.extend_from_slice(&chunk);
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let event: Value = serde_json::from_slice(&line).unwrap_or(Value::Null);
                if event["event"] == "exit" {
                    code = event["exit_code"].as_i64();
                }
            }
        }
        return Ok(code.unwrap_or(1) as i32);
    }
    let mut code: Option<i32> = None;
    let mut failure: Option<String> = None;
    let relay = for_each_event(resp, |ev| {
        let data: Value = serde_json::from_str(&ev.data).unwrap_or(Value::Null);
        match ev.event.as_str() {
            "stdout" => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(&decode_data(&data));
                let _ = out.flush();
            }
            "stderr" => {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(&decode_data(&data));
                let _ = err.flush();
            }
            "missed" => eprintln!(
                "hutch: {} bytes of stdout and {} of stderr were written before what the process kept",
                data["stdout"], data["stderr"]
            ),
            "exit" => {
                code = Some(data["exit_code"].as_i64().unwrap_or(1) as i32);
                return false;
            }
            "error" => {
                failure = Some(data["message"].as_str().unwrap_or("attach failed").to_string());
                return false;
            }
            _ => {}
        }
        true
    });
    tokio::select! {
        r = relay => r?,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("hutch: detached; the process runs on");
            return Ok(130);
        }
    }
    if let Some(f) = failure {
        bail!("{f}");
    }
    code.context("the stream ended before the process exited")
}

/// `hutch process …`.
pub async fn run(cmd: ProcessCommand, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let (path, body) = match &cmd {
        ProcessCommand::Send { id, process, data } => {
            let bytes = if data == "-" {
                let mut input = Vec::new();
                std::io::stdin()
                    .read_to_end(&mut input)
                    .context("reading stdin")?;
                input
            } else {
                data.clone().into_bytes()
            };
            let path = process_path(id, process, "/stdin");
            api.raw(Method::POST, &path, Some(bytes.into()), None)
                .await?;
            return done(json_out);
        }
        ProcessCommand::CloseStdin { id, process } => {
            (process_path(id, process, "/close-stdin"), None)
        }
        ProcessCommand::Signal {
            id,
            process,
            signal,
        } => {
            let signal = match signal.parse::<i64>() {
                Ok(n) => json!(n),
                Err(_) => json!(signal),
            };
            (
                process_path(id, process, "/signal"),
                Some(json!({ "signal": signal })),
            )
        }
        ProcessCommand::Kill { id, process } => {
            api.call(Method::DELETE, &process_path(id, process, ""), None)
                .await?;
            return done(json_out);
        }
        ProcessCommand::Resize {
            id,
            process,
            cols,
            rows,
        } => (
            process_path(id, process, "/resize"),
            Some(json!({"cols": cols, "rows": rows})),
        ),
    };
    api.call(Method::POST, &path, body.as_ref()).await?;
    done(json_out)
}

fn done(json_out: bool) -> anyhow::Result<()> {
    if json_out {
        print_json(&json!({"ok": true}));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_are_named_in_one_path_segment() {
        assert_eq!(
            process_path("sbx_a", "tag:web/1 x", "/output"),
            "/v1/sandboxes/sbx_a/processes/tag%3Aweb%2F1%20x/output"
        );
        assert_eq!(
            process_path("sbx_a", "42", ""),
            "/v1/sandboxes/sbx_a/processes/42"
        );
    }

    #[test]
    fn ps_rows_say_how_a_process_ended() {
        let running = json!({"pid": 7, "tag": "w", "state": "running", "cmd": ["sleep", "9"],
            "started_at": "t"});
        assert_eq!(ps_row(&running), ["7", "w", "running", "-", "t", "sleep 9"]);
        let killed = json!({"pid": 8, "state": "exited", "cmd": [], "exit": {"exit_code": 143,
            "signal": 15, "timed_out": false}});
        assert_eq!(ps_row(&killed)[3], "signal 15");
        let timed_out = json!({"pid": 9, "state": "exited", "cmd": [], "exit": {"exit_code": 124,
            "signal": 9, "timed_out": true}});
        assert_eq!(ps_row(&timed_out)[3], "124 (timed out)");
    }
}
