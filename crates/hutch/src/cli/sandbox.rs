//! `run`, `create`, `exec`, `ls`, `inspect`, `kill`.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

use anyhow::{bail, Context};
use base64::Engine;
use reqwest::Method;
use serde_json::{json, Value};

use super::output::{field, print_json, table};
use super::stream::for_each_event;
use crate::client::Api;

/// Sandbox settings shared by `run` and `create`.
#[derive(Debug, clap::Args)]
pub struct SandboxOpts {
    /// Template name.
    #[arg(long, short)]
    template: Option<String>,
    /// `auto`, `ns` or `vm`.
    #[arg(long)]
    isolation: Option<String>,
    /// CPUs.
    #[arg(long)]
    cpus: Option<f64>,
    /// Memory limit in MiB.
    #[arg(long)]
    memory_mib: Option<u64>,
    /// TTL in seconds.
    #[arg(long)]
    ttl: Option<u64>,
    /// Environment `KEY=VALUE` (repeatable).
    #[arg(long = "env", short = 'e')]
    env: Vec<String>,
    /// Metadata `KEY=VALUE` (repeatable).
    #[arg(long = "meta")]
    meta: Vec<String>,
    /// Start from this snapshot's files instead of the bare template: its id (`snap_…`) or
    /// its name, if no other snapshot has that name.
    #[arg(long)]
    snapshot: Option<String>,
    /// Mount a volume: `VOLUME:/path[:ro]` (repeatable).
    #[arg(long = "volume", value_name = "VOL:/PATH[:ro]")]
    volumes: Vec<String>,
    /// Egress policy (default: the server's, `allow` when it gives sandboxes a network).
    #[command(flatten)]
    network: super::network::PolicyOpts,
}

fn pairs(items: &[String], what: &str) -> anyhow::Result<BTreeMap<String, String>> {
    items
        .iter()
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("{what} {s:?} must be KEY=VALUE"))
        })
        .collect()
}

impl SandboxOpts {
    fn body(&self, persistent: bool) -> anyhow::Result<Value> {
        let mut b = serde_json::Map::new();
        if let Some(t) = &self.template {
            b.insert("template".into(), json!(t));
        }
        if let Some(i) = &self.isolation {
            b.insert("isolation".into(), json!(i));
        }
        if let Some(c) = self.cpus {
            b.insert("cpus".into(), json!(c));
        }
        if let Some(m) = self.memory_mib {
            b.insert("memory_mib".into(), json!(m));
        }
        if let Some(t) = self.ttl {
            b.insert("ttl_seconds".into(), json!(t));
        }
        if persistent {
            b.insert("persistent".into(), json!(true));
        }
        if !self.env.is_empty() {
            b.insert("env".into(), json!(pairs(&self.env, "--env")?));
        }
        if !self.meta.is_empty() {
            b.insert("metadata".into(), json!(pairs(&self.meta, "--meta")?));
        }
        if let Some(s) = &self.snapshot {
            b.insert("snapshot".into(), json!(s));
        }
        if !self.volumes.is_empty() {
            let v: anyhow::Result<Vec<Value>> = self
                .volumes
                .iter()
                .map(|s| super::volume::parse_mount(s))
                .collect();
            b.insert("volumes".into(), Value::Array(v?));
        }
        if let Some(n) = self.network.body() {
            b.insert("network".into(), n);
        }
        Ok(Value::Object(b))
    }
}

/// How to run a command (shared by `run` and `exec`).
#[derive(Debug, clap::Args)]
pub struct CommandOpts {
    /// Run the command as one string under `/bin/sh -c`.
    #[arg(long)]
    sh: bool,
    /// Pass this process's stdin to the command.
    #[arg(long, short)]
    interactive: bool,
    /// Kill the command after this many seconds (default: no timeout, like `docker exec`;
    /// 0 also means none). When it fires, hutch says so on stderr.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// Working directory inside the sandbox.
    #[arg(long, short = 'w')]
    cwd: Option<String>,
    /// User inside the sandbox.
    #[arg(long, short)]
    user: Option<String>,
    /// The command.
    #[arg(trailing_var_arg = true, required = true, allow_hyphen_values = true)]
    cmd: Vec<String>,
}

impl CommandOpts {
    /// The exec request; `env` (`KEY=VALUE`s) is added to the sandbox's environment for this
    /// command only.
    fn body(&self, env: &[String]) -> anyhow::Result<Value> {
        let mut b = serde_json::Map::new();
        b.insert(
            "cmd".into(),
            if self.sh {
                json!(self.cmd.join(" "))
            } else {
                json!(self.cmd)
            },
        );
        // The server's default (60 s) suits API callers that must not hang; a person at a
        // terminal gets what they asked for, and Ctrl-C.
        b.insert("timeout_seconds".into(), json!(self.timeout.unwrap_or(0.0)));
        if !env.is_empty() {
            b.insert("env".into(), json!(pairs(env, "--env")?));
        }
        if let Some(c) = &self.cwd {
            b.insert("cwd".into(), json!(c));
        }
        if let Some(u) = &self.user {
            b.insert("user".into(), json!(u));
        }
        if self.interactive {
            let mut input = Vec::new();
            std::io::stdin()
                .read_to_end(&mut input)
                .context("reading stdin")?;
            b.insert(
                "stdin_b64".into(),
                json!(base64::engine::general_purpose::STANDARD.encode(input)),
            );
        }
        Ok(Value::Object(b))
    }
}

/// `hutch run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    sandbox: SandboxOpts,
    #[command(flatten)]
    command: CommandOpts,
}

/// `POST /v1/sandboxes`; unless the sandbox is asked to be `ns`, what a vm create waits for
/// on first use (kernel, image, bake) is shown on stderr meanwhile.
async fn create_showing_progress(
    api: &Api,
    sandbox: &SandboxOpts,
    persistent: bool,
) -> anyhow::Result<serde_json::Value> {
    let body = sandbox.body(persistent)?;
    let watcher = match sandbox.isolation.as_deref() {
        Some("ns") => None,
        _ => super::progress::watch(api).await,
    };
    let created = api.call(Method::POST, "/v1/sandboxes", Some(&body)).await;
    if let Some(w) = watcher {
        w.abort();
    }
    created
}

/// `hutch create`.
#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    sandbox: SandboxOpts,
    /// Never reap this sandbox.
    #[arg(long)]
    persistent: bool,
}

/// `hutch exec`.
#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// Sandbox id.
    id: String,
    /// Environment `KEY=VALUE` for this command (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Start the command as a process handle and print its pid: it runs on after hutch
    /// exits (`hutch ps`, `hutch attach`, `hutch process …`).
    #[arg(long, short = 'd')]
    detach: bool,
    /// With `-d`: a tag to find the process by (`tag:NAME`).
    #[arg(long, requires = "detach")]
    tag: Option<String>,
    #[command(flatten)]
    command: CommandOpts,
}

/// `hutch ls`.
#[derive(Debug, clap::Args)]
pub struct LsArgs {
    /// Only sandboxes in this state.
    #[arg(long)]
    state: Option<String>,
    /// Only sandboxes with this metadata `KEY=VALUE` (repeatable).
    #[arg(long = "meta")]
    meta: Vec<String>,
}

/// The bytes of a `stdout`/`stderr` event (`data`, or `data_b64`).
pub(super) fn decode_data(v: &Value) -> Vec<u8> {
    if let Some(s) = v.get("data").and_then(Value::as_str) {
        return s.as_bytes().to_vec();
    }
    v.get("data_b64")
        .and_then(Value::as_str)
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .unwrap_or_default()
}

/// Run a command in `id`: streamed to this terminal (human) or collected (JSON).
/// Returns the command's exit code.
async fn exec_in(
    api: &Api,
    id: &str,
    cmd: &CommandOpts,
    env: &[String],
    json_out: bool,
) -> anyhow::Result<i32> {
    let body = cmd.body(env)?;
    if json_out {
        let out = api
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                Some(&body),
            )
            .await?;
        print_json(&out);
        if out["timed_out"].as_bool() == Some(true) {
            eprintln!("{}", timed_out_message(cmd.timeout));
        }
        return Ok(out["exit_code"].as_i64().unwrap_or(1) as i32);
    }
    let resp = api
        .raw(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec/stream"),
            None,
            Some(&body),
        )
        .await?;
    let mut code: Option<i32> = None;
    let mut failure: Option<String> = None;
    for_each_event(resp, |ev| {
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
            "exit" => {
                if data["timed_out"].as_bool() == Some(true) {
                    eprintln!("{}", timed_out_message(cmd.timeout));
                }
                code = Some(data["exit_code"].as_i64().unwrap_or(1) as i32);
                return false;
            }
            "error" => {
                failure = Some(
                    data["message"]
                        .as_str()
                        .unwrap_or("exec failed")
                        .to_string(),
                );
                return false;
            }
            _ => {}
        }
        true
    })
    .await?;
    if let Some(f) = failure {
        bail!("{f}");
    }
    code.context("the stream ended before the command exited")
}

/// What stderr says when the server killed a command at its timeout.
fn timed_out_message(timeout: Option<f64>) -> String {
    match timeout {
        Some(t) => format!("hutch: the command was killed after {t} s (--timeout {t})"),
        None => "hutch: the command was killed at the server's timeout".to_string(),
    }
}

/// `hutch run`: create, run, print, destroy; exits with the command's code.
pub async fn run(args: RunArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<i32> {
    let api = Api::from_env(state_dir)?;
    let sb = create_showing_progress(&api, &args.sandbox, false).await?;
    let id = field(&sb, "id").to_string();
    let result = tokio::select! {
        r = exec_in(&api, &id, &args.command, &[], json_out) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    let killed = api
        .call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
        .await;
    if let Err(e) = killed {
        eprintln!("hutch: could not destroy sandbox {id}: {e:#}");
    }
    result
}

/// `hutch create`.
pub async fn create(args: CreateArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let sb = create_showing_progress(&api, &args.sandbox, args.persistent).await?;
    if json_out {
        print_json(&sb);
    } else {
        println!("{}", field(&sb, "id"));
    }
    Ok(())
}

/// `hutch exec`.
pub async fn exec(args: ExecArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<i32> {
    let api = Api::from_env(state_dir)?;
    if args.detach {
        let mut body = args.command.body(&args.env)?;
        body["background"] = json!(true);
        if let Some(tag) = &args.tag {
            body["tag"] = json!(tag);
        }
        let path = format!("/v1/sandboxes/{}/exec", args.id);
        let info = api.call(Method::POST, &path, Some(&body)).await?;
        if json_out {
            print_json(&info);
        } else {
            println!("{}", info["pid"]);
        }
        return Ok(0);
    }
    exec_in(&api, &args.id, &args.command, &args.env, json_out).await
}

/// `hutch ls`.
pub async fn ls(args: LsArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let mut query = Vec::new();
    if let Some(s) = &args.state {
        query.push(format!("state={}", crate::client::encode(s)));
    }
    for (k, v) in pairs(&args.meta, "--meta")? {
        query.push(format!(
            "metadata.{}={}",
            crate::client::encode(&k),
            crate::client::encode(&v)
        ));
    }
    let path = if query.is_empty() {
        "/v1/sandboxes".to_string()
    } else {
        format!("/v1/sandboxes?{}", query.join("&"))
    };
    let out = api.call(Method::GET, &path, None).await?;
    if json_out {
        print_json(&out);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = out["sandboxes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    vec![
                        field(s, "id").to_string(),
                        field(s, "template").to_string(),
                        field(s, "isolation").to_string(),
                        field(s, "state").to_string(),
                        field(s, "created_at").to_string(),
                        field(s, "expires_at").to_string(),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    table(
        &["ID", "TEMPLATE", "ISOLATION", "STATE", "CREATED", "EXPIRES"],
        &rows,
    );
    Ok(())
}

/// `hutch inspect`.
pub async fn inspect(id: &str, state_dir: &Path, _json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let mut sb = api
        .call(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await?;
    if let Ok(u) = api
        .call(Method::GET, &format!("/v1/sandboxes/{id}/usage"), None)
        .await
    {
        sb["usage"] = u["usage"].clone();
    }
    print_json(&sb);
    Ok(())
}

/// `hutch kill`.
pub async fn kill(ids: &[String], state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let mut failed = 0;
    for id in ids {
        match api
            .call(Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
            .await
        {
            Ok(_) if json_out => println!("{}", json!({"id": id, "killed": true})),
            Ok(_) => println!("{id}"),
            Err(e) => {
                failed += 1;
                eprintln!("hutch: {id}: {e:#}");
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} sandboxes could not be killed", ids.len());
    }
    Ok(())
}
