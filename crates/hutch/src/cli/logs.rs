//! `hutch logs ID [-f] [--tail N] [--since T] [--source agent,console] [-t]`: a sandbox's
//! logs, like `docker logs` (see `docs/logs.md`).

use std::io::Write;
use std::path::Path;

use futures_util::StreamExt;

use crate::client::{encode, Api};

/// Arguments of `hutch logs`.
#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// Sandbox id.
    id: String,
    /// Keep printing lines as they are written, until the sandbox is gone (or Ctrl-C).
    #[arg(short, long)]
    follow: bool,
    /// Only the last N lines (of what was written before, with --follow).
    #[arg(long, value_name = "N")]
    tail: Option<usize>,
    /// Only lines written at or after this time: RFC 3339, Unix seconds, or a duration
    /// before now (90s, 10m, 2h, 1d). Only for logs whose lines carry times (agent).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Which logs, comma-separated: agent (ns), console (vm), start (the template's start
    /// command). Default: all the sandbox has.
    #[arg(long, value_name = "NAMES")]
    source: Option<String>,
    /// Prefix each line with its time.
    #[arg(short, long)]
    timestamps: bool,
}

fn path_of(args: &LogsArgs) -> String {
    let mut query = Vec::new();
    if args.follow {
        query.push("follow=true".to_string());
    }
    if args.timestamps {
        query.push("timestamps=true".to_string());
    }
    if let Some(n) = args.tail {
        query.push(format!("tail={n}"));
    }
    if let Some(t) = &args.since {
        query.push(format!("since={}", encode(t)));
    }
    if let Some(s) = &args.source {
        query.push(format!("source={}", encode(s)));
    }
    let mut path = format!("/v1/sandboxes/{}/logs", encode(&args.id));
    if !query.is_empty() {
        path.push('?');
        path.push_str(&query.join("&"));
    }
    path
}

/// `hutch logs`: text as the server writes it; with `--json`, one JSON object per line
/// (`{"source", "time", "text"}`).
pub async fn logs(args: LogsArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let path = path_of(&args);
    if json_out {
        let resp = api.get_streamed(&path, "text/event-stream").await?;
        return print_events(resp).await;
    }
    let mut body = api.get_streamed(&path, "text/plain").await?.bytes_stream();
    let mut out = std::io::stdout();
    while let Some(chunk) = body.next().await {
        out.write_all(&chunk?)?;
        out.flush()?;
    }
    Ok(())
}

/// Print the `data` of each `log` event of an SSE answer on a line of its own.
async fn print_events(resp: reqwest::Response) -> anyhow::Result<()> {
    let mut body = resp.bytes_stream();
    let mut pending = Vec::new();
    let mut event = String::new();
    let mut out = std::io::stdout();
    while let Some(chunk) = body.next().await {
        pending.extend_from_slice(&chunk?);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\r', '\n']);
            if let Some(name) = line.strip_prefix("event:") {
                event = name.trim().to_string();
            } else if let Some(data) = line.strip_prefix("data:") {
                if event == "log" {
                    writeln!(out, "{}", data.trim_start())?;
                    out.flush()?;
                }
            } else if line.is_empty() {
                event.clear();
            }
        }
    }
    Ok(())
}
