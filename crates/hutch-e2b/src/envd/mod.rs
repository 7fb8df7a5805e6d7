//! envd, the daemon E2B runs in each sandbox, served here from Hutch's agent: the Connect
//! RPCs `process.Process` (`process.rs`) and `filesystem.Filesystem` (`filesystem.rs`),
//! and the HTTP routes `/files` (`files.rs`), `/health`, `/metrics`, `/envs`.
//!
//! Every request but `GET /health` and signed `/files` URLs needs `X-Access-Token`: the
//! sandbox's access token (`E2bState::access_token`), which only its creator was given. The
//! user a request acts as is the `Authorization: Basic base64("<user>:")` header's (no
//! password, as envd); without one, the sandbox's default user (root).

mod files;
mod filesystem;
mod gzip;
mod process;
mod proto;

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use base64::Engine;
use hutch_core::exec::{Command, ExecCommand};

use crate::error::{E2bError, E2bResult};
use crate::target::{self, SandboxTarget};
use crate::E2bState;

pub use files::FileQuery;

/// envd's routes.
pub fn router(state: E2bState) -> Router<E2bState> {
    let rpc = Router::new()
        .route("/process.Process/{method}", post(process::rpc))
        .route("/filesystem.Filesystem/{method}", post(filesystem::rpc))
        .route("/metrics", get(metrics))
        .route("/envs", get(envs))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_token,
        ));
    Router::new()
        .merge(rpc)
        .route("/files", get(files::read).post(files::write))
        .route("/health", get(health))
        .layer(axum::middleware::from_fn_with_state(state, require_sandbox))
        .fallback(|uri: axum::http::Uri| async move {
            E2bError::not_found(format!("envd has no route {}", uri.path()))
        })
}

/// Compare two secrets in constant time (for their length).
pub fn same_secret(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An exec of `cmd` with nothing else set.
pub fn command(cmd: Command, timeout: Option<Duration>) -> ExecCommand {
    ExecCommand {
        cmd,
        env: BTreeMap::new(),
        cwd: None,
        user: None,
        stdin: None,
        timeout,
        background: false,
    }
}

/// Middleware: the named sandbox exists (else the SDKs' 502).
async fn require_sandbox(
    State(state): State<E2bState>,
    Extension(t): Extension<SandboxTarget>,
    req: Request,
    next: Next,
) -> Response {
    match target::existing(&state, &t).await {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// Middleware: `X-Access-Token` is the sandbox's.
async fn require_token(
    State(state): State<E2bState>,
    Extension(t): Extension<SandboxTarget>,
    req: Request,
    next: Next,
) -> Response {
    if has_token(&state, &t, req.headers()) {
        next.run(req).await
    } else {
        E2bError::unauthorized("missing or wrong X-Access-Token for this sandbox").into_response()
    }
}

/// Whether the request carries the sandbox's access token.
pub fn has_token(state: &E2bState, t: &SandboxTarget, headers: &axum::http::HeaderMap) -> bool {
    headers
        .get("x-access-token")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|given| same_secret(given.trim(), &state.access_token(&t.id)))
}

/// The user a request acts as (`Authorization: Basic base64("<user>:")`), if it names one.
#[derive(Debug, Clone)]
pub struct EnvdUser(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for EnvdUser {
    type Rejection = E2bError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let Some(value) = parts.headers.get(axum::http::header::AUTHORIZATION) else {
            return Ok(Self(None));
        };
        let bad = || E2bError::bad_request("Authorization must be Basic base64(\"<user>:\")");
        let text = value.to_str().map_err(|_| bad())?;
        let encoded = text.strip_prefix("Basic ").ok_or_else(bad)?;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|_| bad())?;
        let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
        let user = decoded.split_once(':').map_or(decoded.as_str(), |(u, _)| u);
        Ok(Self((!user.is_empty()).then(|| user.to_string())))
    }
}

/// The home directory of `user` (relative paths are resolved against it, as envd does).
pub fn home_of(user: Option<&str>) -> String {
    match user {
        None | Some("root") | Some("0") => "/root".to_string(),
        Some(u) => format!("/home/{u}"),
    }
}

/// `path` made absolute against the user's home.
pub fn absolute(path: &str, user: Option<&str>) -> E2bResult<String> {
    if path.contains('\0') {
        return Err(E2bError::bad_request("path must not contain NUL bytes"));
    }
    if path.starts_with('/') {
        Ok(path.to_string())
    } else if path.is_empty() {
        Ok(home_of(user))
    } else {
        Ok(format!("{}/{path}", home_of(user)))
    }
}

/// `GET /health` → 204.
async fn health() -> axum::http::StatusCode {
    axum::http::StatusCode::NO_CONTENT
}

/// `GET /metrics` → envd's metrics of the sandbox (the same sample as the control plane's).
async fn metrics(
    State(state): State<E2bState>,
    Extension(t): Extension<SandboxTarget>,
) -> E2bResult<Json<serde_json::Value>> {
    let s = crate::control::sample(&state, &t.id).await?;
    Ok(Json(serde_json::json!({
        "ts": s.time_ms / 1000,
        "cpu_count": s.cpu_count,
        "cpu_used_pct": s.cpu_used_pct,
        "mem_total": s.mem_total,
        "mem_used": s.mem_used,
        "mem_total_mib": s.mem_total >> 20,
        "mem_used_mib": s.mem_used >> 20,
        "disk_used": s.disk_used,
        "disk_total": s.disk_total,
    })))
}

/// `GET /envs` → the environment every process of the sandbox gets.
async fn envs(
    State(state): State<E2bState>,
    Extension(t): Extension<SandboxTarget>,
) -> E2bResult<Json<BTreeMap<String, String>>> {
    let out = state
        .app
        .manager
        .exec(
            &t.id,
            command(
                Command::Argv(vec!["env".into(), "-0".into()]),
                Some(Duration::from_secs(10)),
            ),
        )
        .await?;
    let bytes = out.stdout.to_vec();
    let envs = bytes
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    Ok(Json(envs))
}
