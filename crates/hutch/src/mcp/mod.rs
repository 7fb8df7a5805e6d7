//! `hutch mcp`: a Model Context Protocol server, so an agent can use sandboxes as tools
//! directly. It is a client of a running `hutch serve` (same address and key rules as the
//! CLI), on stdio by default or on Streamable HTTP (`--http ADDR`, each client with its own
//! Hutch key; see `http.rs`).
//!
//! A model drives it, so what the model gets is set by the operator: the network of the
//! sandboxes it creates (`--egress`, default `deny` with nothing allowed: `policy.rs`), their
//! default template, and the size of what a tool returns (`--max-output-bytes`: `output.rs`).
//! Every tool schema is strict (`schema.rs`). Sandboxes it creates are tagged
//! `created_by=hutch-mcp` and `mcp_session=<random>`, and the ephemeral ones are destroyed
//! when the session ends.

mod args;
mod code;
mod http;
mod output;
mod policy;
mod schema;
mod tools;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::Context;
use rmcp::ServiceExt;

use crate::client::Api;
use output::{DEFAULT_MAX_OUTPUT_BYTES, MIN_MAX_OUTPUT_BYTES};
pub use policy::EgressChoice;
use policy::NetworkCeiling;

/// `hutch mcp` flags.
#[derive(Debug, clap::Args)]
pub struct McpArgs {
    /// Network of the sandboxes the model creates, and the most it may ask for: `deny`
    /// (nothing out but `--allow` entries), `none` (loopback only) or `allow` (the internet).
    #[arg(long, value_enum, default_value = "deny")]
    pub egress: EgressChoice,
    /// A destination the model's sandboxes may reach: a domain, `*.suffix`, IPv4 address or
    /// CIDR (repeatable).
    #[arg(long = "allow", value_name = "DEST")]
    pub allow: Vec<String>,
    /// A destination they may never reach (repeatable; a model cannot remove it).
    #[arg(long = "deny", value_name = "DEST")]
    pub deny: Vec<String>,
    /// Template of sandboxes the model creates without naming one (default: the server's).
    #[arg(long, value_name = "NAME")]
    pub template: Option<String>,
    /// Most bytes one tool call returns; longer output keeps its head and tail, and the
    /// whole of it is saved in the sandbox under /tmp/hutch-mcp.
    #[arg(long, default_value_t = DEFAULT_MAX_OUTPUT_BYTES, value_name = "BYTES")]
    pub max_output_bytes: usize,
    /// Serve Streamable HTTP at this address (path `/mcp`) instead of stdio; every request
    /// needs a Hutch API key (`Authorization: Bearer …`), which the session then acts with.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
}

/// What the operator set, shared by every session.
#[derive(Debug)]
struct McpConfig {
    network: NetworkCeiling,
    template: Option<String>,
    max_output_bytes: usize,
}

/// A sandbox this session created.
#[derive(Debug, Clone)]
struct Owned {
    id: String,
    persistent: bool,
}

/// One MCP session: its Hutch client and the sandboxes it made.
struct Session {
    token: String,
    /// Set once: at start on stdio, at `initialize` on HTTP (the caller's key).
    api: OnceLock<Api>,
    owned: Mutex<Vec<Owned>>,
    /// Numbers the files cut output is saved to.
    saved_outputs: AtomicU64,
    /// Cleared when the Hutch server turns out to give sandboxes no network.
    server_networked: AtomicBool,
}

impl Session {
    fn lock_owned(&self) -> std::sync::MutexGuard<'_, Vec<Owned>> {
        self.owned.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take_ephemeral(&self) -> Vec<String> {
        let mut owned = self.lock_owned();
        let doomed = owned
            .iter()
            .filter(|o| !o.persistent)
            .map(|o| o.id.clone())
            .collect();
        owned.retain(|o| o.persistent);
        doomed
    }
}

impl Drop for Session {
    /// A session that ends without `serve`'s explicit cleanup (an HTTP session closed or
    /// dropped) destroys its ephemeral sandboxes in the background.
    fn drop(&mut self) {
        let doomed = self.take_ephemeral();
        let (Some(api), false) = (self.api.get().cloned(), doomed.is_empty()) else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(destroy(api, doomed));
        }
    }
}

async fn destroy(api: Api, ids: Vec<String>) {
    for id in ids {
        if let Err(e) = api
            .call(
                reqwest::Method::DELETE,
                &format!("/v1/sandboxes/{id}"),
                None,
            )
            .await
        {
            tracing::warn!(%id, "destroying an MCP session's sandbox: {e:#}");
        }
    }
}

/// State shared by the tools of one MCP session.
#[derive(Clone)]
pub struct HutchMcp {
    config: Arc<McpConfig>,
    session: Arc<Session>,
    tool_router: rmcp::handler::server::router::tool::ToolRouter<Self>,
}

/// Serve MCP (stdio, or HTTP with `--http`) until the client goes away, then clean up.
pub async fn serve(args: McpArgs, state_dir: &Path) -> anyhow::Result<()> {
    if args.max_output_bytes < MIN_MAX_OUTPUT_BYTES {
        anyhow::bail!("--max-output-bytes must be at least {MIN_MAX_OUTPUT_BYTES}");
    }
    let config = Arc::new(McpConfig {
        network: NetworkCeiling::new(args.egress, &args.allow, &args.deny)?,
        template: args.template,
        max_output_bytes: args.max_output_bytes,
    });
    if let Some(addr) = args.http {
        return http::serve(addr, config, Api::base_from_env()).await;
    }
    let api = Api::from_env(state_dir)?;
    let server = HutchMcp::new(config, Some(api));
    let cleanup = server.clone();
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .context("starting the MCP session")?;
    let result = running.waiting().await;
    cleanup.destroy_ephemeral().await;
    result.context("MCP session")?;
    Ok(())
}

impl HutchMcp {
    /// Destroy every ephemeral sandbox this session created.
    async fn destroy_ephemeral(&self) {
        let doomed = self.session.take_ephemeral();
        if let Some(api) = self.session.api.get() {
            destroy(api.clone(), doomed).await;
        }
    }
}
