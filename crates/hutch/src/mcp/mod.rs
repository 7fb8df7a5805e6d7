//! `hutch mcp`: a Model Context Protocol server on stdio, so an agent can use sandboxes as
//! tools directly. It is a client of a running `hutch serve` (same address and key rules as
//! the CLI). Sandboxes it creates are tagged `created_by=hutch-mcp` and
//! `mcp_session=<random>`, and the ephemeral ones are destroyed when the session ends.

mod tools;

use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use rmcp::ServiceExt;

use crate::client::Api;

/// A sandbox this session created.
#[derive(Debug, Clone)]
struct Owned {
    id: String,
    persistent: bool,
}

/// State shared by the tools of one MCP session.
#[derive(Clone)]
pub struct HutchMcp {
    api: Api,
    session: String,
    owned: Arc<Mutex<Vec<Owned>>>,
    tool_router: rmcp::handler::server::router::tool::ToolRouter<Self>,
}

/// Serve MCP on stdin/stdout until the client goes away, then clean up.
pub async fn serve(state_dir: &Path) -> anyhow::Result<()> {
    let api = Api::from_env(state_dir)?;
    let server = HutchMcp::new(api);
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
    fn lock_owned(&self) -> std::sync::MutexGuard<'_, Vec<Owned>> {
        self.owned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Destroy every ephemeral sandbox this session created.
    async fn destroy_ephemeral(&self) {
        let doomed: Vec<String> = self
            .lock_owned()
            .iter()
            .filter(|o| !o.persistent)
            .map(|o| o.id.clone())
            .collect();
        for id in doomed {
            let _ = self
                .api
                .call(
                    reqwest::Method::DELETE,
                    &format!("/v1/sandboxes/{id}"),
                    None,
                )
                .await;
        }
    }
}
