//! `hutch-agent`: PID 1 inside every Hutch sandbox.
//!
//! It serves the agent protocol (`hutch_proto`, documented in `docs/agent-protocol.md`) on
//! the stream the backend gives it, runs processes and PTYs, moves files, and reaps every
//! orphan of the sandbox. It is built as a static binary so it runs in any template.
//!
//! Runtime: one tokio `current_thread` runtime (an idle agent costs little memory) plus the
//! blocking pool for file I/O. The agent never exits because of a request or a connection.

mod cgroups;
mod cli;
mod error;
mod exec;
mod fdio;
mod files;
mod http;
mod identity;
mod log;
mod netconf;
mod passwd;
mod process;
mod pty;
mod reaper;
mod rootfs;
mod server;
mod service;
mod state;
mod sys;
mod tunnel;
mod volumes;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::cli::{Cli, Serve};
use crate::log::log;
use crate::reaper::Reaper;
use crate::state::Agent;

/// How long an idle blocking-pool thread lingers before exiting.
const BLOCKING_THREAD_KEEP_ALIVE: Duration = Duration::from_secs(5);
/// Most threads doing blocking work (disk I/O, reading `/etc/passwd`) at once. Every job on
/// them is short (one chunk of a transfer at most), so more would only cost memory.
const MAX_BLOCKING_THREADS: usize = 64;

fn main() -> ExitCode {
    match cli::parse(std::env::args_os().skip(1)) {
        Ok(Cli::Serve(serve)) => run(serve),
        Ok(Cli::Version) => {
            println!(
                "hutch-agent {} (protocol {})",
                env!("CARGO_PKG_VERSION"),
                hutch_proto::PROTOCOL_VERSION
            );
            ExitCode::SUCCESS
        }
        Ok(Cli::Help) => {
            println!("{}", cli::USAGE);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hutch-agent: {e}\n{}", cli::USAGE);
            ExitCode::from(2)
        }
    }
}

fn run(Serve { listeners, root }: Serve) -> ExitCode {
    // Before anything opens an fd: pipes must never land on 0, 1 or 2.
    sys::ensure_std_fds();
    sys::set_umask(0o022);
    let pid = sys::getpid();
    let guest_init = root.is_some();
    if let Some(root) = root {
        if pid != 1 {
            log!("--root is only for the guest's init (pid 1); refusing to chroot as pid {pid}");
            return ExitCode::from(2);
        }
        if let Err(e) = sys::chroot(&root) {
            log!("cannot chroot into {}: {e}", root.display());
            return ExitCode::FAILURE;
        }
    }
    // Before the agent holds anything worth stealing (environment, keys of exec requests).
    if let Err(e) = sys::make_non_dumpable() {
        log!("cannot make the agent non-dumpable: {e}");
        return ExitCode::FAILURE;
    }
    if pid != 1 {
        if let Err(e) = sys::become_subreaper() {
            log!("cannot become a child subreaper ({e}); orphans will not be reaped by the agent");
        }
    }
    // A vm guest's init: every exec gets a cgroup, which counts its OOM kills.
    let exec_cgroups = guest_init
        .then(|| {
            cgroups::ExecCgroups::setup()
                .inspect_err(|e| log!("no exec cgroups, OOM kills are not reported: {e}"))
                .ok()
        })
        .flatten();
    let nofile = sys::raise_nofile_limit();
    let agent_env: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_keep_alive(BLOCKING_THREAD_KEEP_ALIVE)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            log!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let reaper = Reaper::start()?;
        let agent = Arc::new(
            Agent::new(reaper, agent_env, nofile, sys::geteuid()).with_exec_cgroups(exec_cgroups),
        );
        log!(
            "hutch-agent {} starting as pid {pid}",
            env!("CARGO_PKG_VERSION")
        );
        server::serve(agent, listeners).await
    });
    match result {
        Ok(never) => match never {},
        Err(e) => {
            log!("cannot serve: {e}");
            ExitCode::FAILURE
        }
    }
}
