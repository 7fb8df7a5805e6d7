//! Command-line interface: argument definitions and dispatch.

mod audit;
mod code;
mod doctor;
mod files;
mod key;
mod lifecycle;
mod logs;
mod network;
mod node;
mod output;
mod ports;
mod process;
mod progress;
mod sandbox;
mod shell;
mod stream;
mod template;
mod template_build;
mod template_image;
mod template_start;
mod tenant;
mod usage;
mod volume;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::client::ApiFailure;

/// Hutch: isolated, disposable computers for AI agents.
#[derive(Debug, Parser)]
#[command(name = "hutch", version, about)]
pub struct Cli {
    /// State directory (server state, admin key, templates).
    #[arg(long, global = true, env = "HUTCH_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Print JSON instead of human output.
    #[arg(long, global = true)]
    pub json: bool,
    /// More logging.
    #[arg(long, short, global = true)]
    pub verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the API server.
    Serve(Box<crate::serve::ServeArgs>),
    /// Create a sandbox, run one command in it, print its output, destroy it.
    Run(sandbox::RunArgs),
    /// Create a sandbox and print its id.
    Create(sandbox::CreateArgs),
    /// Run a command in an existing sandbox (`-d`: start it detached, print its pid).
    Exec(sandbox::ExecArgs),
    /// List a sandbox's process handles (what `exec -d` and background execs started).
    Ps(process::PsArgs),
    /// Attach to a process handle: its output (what it wrote meanwhile first) until it exits.
    Attach(process::AttachArgs),
    /// Reach a process handle: `process send|close-stdin|signal|kill|resize ID PID|tag:NAME …`.
    #[command(subcommand)]
    Process(process::ProcessCommand),
    /// Run code in a stateful context of a `code-interpreter` sandbox (variables stay between
    /// calls): `run-code ID 'x = 1'`, `run-code ID -l bash -`, `run-code ID -f cell.py`.
    /// Images the code shows are saved to files.
    RunCode(code::RunCodeArgs),
    /// Open an interactive terminal in a sandbox.
    Shell(shell::ShellArgs),
    /// List sandboxes.
    Ls(sandbox::LsArgs),
    /// Print a sandbox's logs (agent on ns, console on vm); `-f` follows them.
    Logs(logs::LogsArgs),
    /// Show one sandbox.
    Inspect {
        /// Sandbox id.
        id: String,
    },
    /// Destroy sandboxes.
    Kill {
        /// Sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Copy a file or directory into or out of a sandbox, like `docker cp`: `cp LOCAL
    /// ID:/path`, `cp ID:/path LOCAL`; `-` is a tar stream on stdin or stdout.
    Cp(files::CpArgs),
    /// Forward a local TCP port to a port inside a sandbox: `port-forward ID PORT [LOCAL]`.
    PortForward(ports::PortForwardArgs),
    /// Show a sandbox's egress policy, or replace it at once (open connections it forbids
    /// are cut): `network ID --egress deny --allow pypi.org --allow '*.github.com'`.
    Network(network::NetworkArgs),
    /// Durable volumes: `volume create NAME --size-mib N`, `volume ls`, `volume rm ID`.
    #[command(subcommand)]
    Volume(volume::VolumeCommand),
    /// Build and list templates.
    #[command(subcommand)]
    Template(template::TemplateCommand),
    /// Tenants (admin key): `tenant create acme --max-sandboxes 10`, `tenant ls`,
    /// `tenant inspect acme`, `tenant set acme --max-cpus 8`, `tenant rm acme`.
    #[command(subcommand)]
    Tenant(tenant::TenantCommand),
    /// API keys: `key create --tenant acme --scope exec [--format e2b] [--daily-budget N]`,
    /// `key ls`, `key set key_… --daily-budget N`, `key revoke key_…`.
    #[command(subcommand)]
    Key(key::KeyCommand),
    /// Read the audit log: who changed what, which commands ran (`--tenant`, `--key`,
    /// `--sandbox`, `--since`, `--limit`).
    Audit(audit::AuditArgs),
    /// Metered usage and its cost: `usage --group-by tenant|key|sandbox|day --from T --to T`.
    Usage(usage::UsageArgs),
    /// The nodes of a cluster (admin key): `node ls`, `node cordon n2`, `node uncordon n2`,
    /// `node drain n2`.
    #[command(subcommand)]
    Node(node::NodeCommand),
    /// Explain what isolation this host supports and why.
    Doctor,
    /// Serve the Model Context Protocol on stdio, or Streamable HTTP with `--http`
    /// (sandboxes as tools for an agent; their network is `--egress deny` unless set).
    Mcp(crate::mcp::McpArgs),
    /// Freeze a sandbox: it uses no CPU until `resume`.
    Pause(lifecycle::IdArgs),
    /// Let a paused sandbox run again.
    Resume(lifecycle::IdArgs),
    /// Stop a sandbox and keep its state on disk (ns: files kept, processes end).
    Hibernate(lifecycle::IdArgs),
    /// Start a hibernated sandbox again (exec and file calls also do).
    Wake(lifecycle::IdArgs),
    /// Take a snapshot (`snapshot ID [--name N]`), list (`snapshot ls`) or delete (`snapshot rm`).
    Snapshot(lifecycle::SnapshotArgs),
    /// Create children of a sandbox (ns: files copied-on-write, fresh processes).
    Fork(lifecycle::ForkArgs),
    /// Run candidate commands each in a fork, keep the best: `explore ID -- CMD1 ::: CMD2`.
    Explore(lifecycle::ExploreArgs),
    /// Measure Hutch against baselines on this machine (starts its own server).
    Bench(crate::bench::BenchArgs),
}

/// Run the CLI; returns the process exit code.
pub async fn run(cli: Cli) -> i32 {
    let state_dir = cli
        .state_dir
        .clone()
        .unwrap_or_else(crate::paths::default_state_dir);
    let json = cli.json;
    let result = match cli.command {
        Command::Serve(args) => crate::serve::serve(*args, state_dir).await.map(|()| 0),
        Command::Run(args) => sandbox::run(args, &state_dir, json).await,
        Command::Create(args) => sandbox::create(args, &state_dir, json).await.map(|()| 0),
        Command::Exec(args) => sandbox::exec(args, &state_dir, json).await,
        Command::Ps(args) => process::ps(args, &state_dir, json).await.map(|()| 0),
        Command::Attach(args) => process::attach(args, &state_dir, json).await,
        Command::Process(cmd) => process::run(cmd, &state_dir, json).await.map(|()| 0),
        Command::RunCode(args) => code::run_code(args, &state_dir, json).await,
        Command::Shell(args) => shell::shell(args, &state_dir).await,
        Command::Ls(args) => sandbox::ls(args, &state_dir, json).await.map(|()| 0),
        Command::Logs(args) => logs::logs(args, &state_dir, json).await.map(|()| 0),
        Command::Inspect { id } => sandbox::inspect(&id, &state_dir, json).await.map(|()| 0),
        Command::Kill { ids } => sandbox::kill(&ids, &state_dir, json).await.map(|()| 0),
        Command::Cp(args) => files::cp(args, &state_dir, json).await.map(|()| 0),
        Command::PortForward(args) => ports::port_forward(args, &state_dir, json)
            .await
            .map(|()| 0),
        Command::Network(args) => network::network(args, &state_dir, json).await.map(|()| 0),
        Command::Volume(cmd) => volume::run(cmd, &state_dir, json).await.map(|()| 0),
        Command::Template(cmd) => template::run(cmd, &state_dir, json).await.map(|()| 0),
        Command::Tenant(cmd) => tenant::run(cmd, &state_dir, json).await.map(|()| 0),
        Command::Key(cmd) => key::run(cmd, &state_dir, json).await.map(|()| 0),
        Command::Audit(args) => audit::audit(args, &state_dir, json).await.map(|()| 0),
        Command::Usage(args) => usage::usage(args, &state_dir, json).await.map(|()| 0),
        Command::Node(cmd) => node::run(cmd, &state_dir, json).await.map(|()| 0),
        Command::Doctor => doctor::doctor(&state_dir, json).await,
        Command::Mcp(args) => crate::mcp::serve(args, &state_dir).await.map(|()| 0),
        Command::Pause(a) => lifecycle::action("pause", &a, &state_dir, json)
            .await
            .map(|()| 0),
        Command::Resume(a) => lifecycle::action("resume", &a, &state_dir, json)
            .await
            .map(|()| 0),
        Command::Hibernate(a) => lifecycle::action("hibernate", &a, &state_dir, json)
            .await
            .map(|()| 0),
        Command::Wake(a) => lifecycle::action("wake", &a, &state_dir, json)
            .await
            .map(|()| 0),
        Command::Snapshot(a) => lifecycle::snapshot(a, &state_dir, json).await.map(|()| 0),
        Command::Fork(a) => lifecycle::fork(a, &state_dir, json).await.map(|()| 0),
        Command::Explore(a) => lifecycle::explore(a, &state_dir, json).await.map(|()| 0),
        Command::Bench(args) => crate::bench::bench(args, state_dir).await.map(|()| 0),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            if json {
                let (code, status) = match e.downcast_ref::<ApiFailure>() {
                    Some(f) => (f.code.clone(), Some(f.status.as_u16())),
                    None => ("error".to_string(), None),
                };
                println!(
                    "{}",
                    serde_json::json!({"error": {"code": code, "status": status, "message": format!("{e:#}")}})
                );
            } else {
                eprintln!("hutch: {e:#}");
            }
            1
        }
    }
}
