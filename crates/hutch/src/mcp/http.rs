//! `hutch mcp --http ADDR`: the MCP server on Streamable HTTP (path `/mcp`), for agents that
//! are not on this machine.
//!
//! Every request carries a Hutch API key (`Authorization: Bearer …`). The key is checked
//! against the Hutch server this MCP server talks to (an authenticated call with it; a good
//! answer is remembered under the key's SHA-256 for at most [`KEY_CHECK_TTL`], so a removed key
//! stops working here as soon as it does there), and a request without a valid one is
//! answered `401` before the MCP layer sees it. A session acts with the key that opened it
//! (its `initialize`), so a tenant's key sees only that tenant's sandboxes; a request naming
//! a session opened with another key is answered `404`, as an unknown session is.
//!
//! It listens only where told. On a loopback address the MCP layer also checks `Host` (DNS
//! rebinding); elsewhere it cannot know its public names and the key is the guard.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};

use super::{HutchMcp, McpConfig};
use crate::client::{Api, ApiFailure};

/// How long a key the Hutch server accepted is taken as good without asking again (the
/// server's own cache of checked keys is as long).
pub const KEY_CHECK_TTL: Duration = Duration::from_secs(5);

/// The MCP session header.
const SESSION_HEADER: &str = "mcp-session-id";

/// A Hutch client with the caller's key, put in each request's extensions for `initialize`.
#[derive(Clone)]
pub struct CallerApi(pub Api);

type KeyHash = [u8; 32];

/// Who may call: keys checked against the Hutch server, and which key opened each session.
struct Gate {
    base: String,
    checked: Mutex<HashMap<KeyHash, Instant>>,
    sessions: Mutex<HashMap<String, KeyHash>>,
}

/// Why a request is refused.
enum Refusal {
    NoKey,
    BadKey,
    Unreachable(String),
    ForeignSession,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, msg) = match self {
            Refusal::NoKey => (
                StatusCode::UNAUTHORIZED,
                "a Hutch API key is required: Authorization: Bearer <key>".to_string(),
            ),
            Refusal::BadKey => (
                StatusCode::UNAUTHORIZED,
                "the Hutch server does not accept this API key".to_string(),
            ),
            Refusal::Unreachable(why) => (
                StatusCode::BAD_GATEWAY,
                format!("cannot check the key with the Hutch server: {why}"),
            ),
            Refusal::ForeignSession => {
                (StatusCode::NOT_FOUND, "Not Found: Session not found".into())
            }
        };
        let mut r = (status, msg).into_response();
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Gate {
    /// A client with `key` if the Hutch server accepts it.
    async fn check(&self, key: &str) -> Result<(Api, KeyHash), Refusal> {
        let hash: KeyHash = Sha256::digest(key.as_bytes()).into();
        let api = Api::new(&self.base, key).map_err(|e| Refusal::Unreachable(format!("{e:#}")))?;
        let fresh = lock(&self.checked)
            .get(&hash)
            .is_some_and(|t| t.elapsed() < KEY_CHECK_TTL);
        if fresh {
            return Ok((api, hash));
        }
        match api.call(reqwest::Method::GET, "/v1/templates", None).await {
            Ok(_) => {
                let mut checked = lock(&self.checked);
                checked.retain(|_, t| t.elapsed() < KEY_CHECK_TTL);
                checked.insert(hash, Instant::now());
                Ok((api, hash))
            }
            Err(e) => match e.downcast_ref::<ApiFailure>() {
                Some(f) if f.status == StatusCode::UNAUTHORIZED => Err(Refusal::BadKey),
                _ => Err(Refusal::Unreachable(format!("{e:#}"))),
            },
        }
    }
}

async fn authenticate(State(gate): State<Arc<Gate>>, mut req: Request, next: Next) -> Response {
    let key = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_string);
    let Some(key) = key else {
        return Refusal::NoKey.into_response();
    };
    let (api, hash) = match gate.check(&key).await {
        Ok(ok) => ok,
        Err(r) => return r.into_response(),
    };
    let session = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(s) = &session {
        let owner = lock(&gate.sessions).get(s).copied();
        if owner.is_some_and(|o| o != hash) {
            return Refusal::ForeignSession.into_response();
        }
    }
    let closing = req.method() == axum::http::Method::DELETE;
    req.extensions_mut().insert(CallerApi(api));
    let resp = next.run(req).await;
    match &session {
        None => {
            if let Some(new) = resp
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
            {
                lock(&gate.sessions).insert(new.to_string(), hash);
            }
        }
        Some(s) if closing && resp.status().is_success() => {
            lock(&gate.sessions).remove(s);
        }
        Some(_) => {}
    }
    resp
}

/// Serve until SIGINT or SIGTERM.
pub async fn serve(addr: SocketAddr, config: Arc<McpConfig>, base: String) -> anyhow::Result<()> {
    let mut mcp_config = StreamableHttpServerConfig::default();
    if !addr.ip().is_loopback() {
        mcp_config = mcp_config.disable_allowed_hosts();
    }
    let sessions_end = mcp_config.cancellation_token.clone();
    let service = StreamableHttpService::new(
        move || Ok(HutchMcp::new(config.clone(), None)),
        Arc::new(LocalSessionManager::default()),
        mcp_config,
    );
    let gate = Arc::new(Gate {
        base,
        checked: Mutex::new(HashMap::new()),
        sessions: Mutex::new(HashMap::new()),
    });
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(gate, authenticate))
        .fallback(|| async { (StatusCode::NOT_FOUND, Body::from("MCP is served at /mcp")) });
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    let local = listener.local_addr().context("local address")?;
    println!("hutch mcp listening on http://{local}/mcp");
    tracing::info!(%local, "MCP on Streamable HTTP");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("install SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            // Open event streams would hold the shutdown: end every session.
            sessions_end.cancel();
        })
        .await
        .context("serving MCP over HTTP")
}
