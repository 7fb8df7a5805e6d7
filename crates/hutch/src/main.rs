//! The `hutch` binary: `serve`, the CLI, and internal helpers.
//!
//! `anyhow` lives only here, at the edge; the library crates have typed errors.

mod bench;
mod cli;
mod client;
mod mcp;
mod paths;
mod serve;
mod serve_cluster;
mod serve_config;

use clap::Parser;

fn main() {
    // The jail helper forks: it must run before any thread (tokio runtime) exists.
    if std::env::args().nth(1).as_deref() == Some("__jail-spawn") {
        std::process::exit(hutch_core::host::jail_helper_main());
    }
    let raw = match serve_config::with_config_file(std::env::args_os().collect()) {
        Ok(raw) => raw,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    let args = cli::Cli::parse_from(raw);
    let filter = tracing_subscriber::EnvFilter::try_from_env("HUTCH_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(if args.verbose { "debug" } else { "info" })
    });
    // Colour only on a terminal: a log file or the journal gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("hutch: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(cli::run(args));
    std::process::exit(code);
}
