//! An E2B-compatible API over Hutch, so that agents written against E2B's published SDKs
//! (`e2b`, `e2b-code-interpreter`, the `e2b` npm package) run on a self-hosted Hutch by
//! changing environment variables (`docs/e2b.md`).
//!
//! `hutch serve --e2b-listen ADDR` serves [`router`] on a listener of its own. One URL is
//! both `E2B_API_URL` and `E2B_SANDBOX_URL`: a request is for a sandbox's data plane when it
//! names one, by the `E2b-Sandbox-Id` (and `E2b-Sandbox-Port`) headers the SDKs send, or by
//! a host `<port>-<sandbox id>.<domain>`; every other request is for the control plane.
//! - **Control plane** (`control/`): E2B's REST API (`X-API-Key`) onto Hutch's manager.
//! - **envd, port 49983** (`envd/`): the in-sandbox daemon's Connect RPCs (`process.Process`,
//!   `filesystem.Filesystem`) and its HTTP routes (`/files`, `/health`, `/metrics`,
//!   `/envs`), served by this process from Hutch's agent: nothing of E2B runs inside.
//! - **Code interpreter, port 49999** (`interp.rs`): `/execute` and `/contexts` onto Hutch's
//!   code contexts.
//! - **Any other port**: Hutch's port proxy to the service in the sandbox.
//!
//! The adapter translates; Hutch's core gains nothing E2B-only.

pub mod connect;
mod control;
mod envd;
pub mod error;
mod interp;
mod target;

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hutch_core::ids::SandboxId;
use hutch_core::tenant::keys::Permission;
use hutch_server::error::ApiError;
use hutch_server::{AppState, Caller};
use tower::ServiceExt;

pub use crate::control::template_name;
use crate::error::{E2bError, E2bResult};
pub use crate::target::SandboxTarget;

/// The envd version reported to the SDKs. It turns on the SDK features Hutch implements:
/// the stdin flag (0.3.0), the default user chosen by the server (0.4.0), octet-stream
/// uploads (0.5.7), file metadata (0.6.2) and entries in watch events (0.6.3); not
/// network-mount watches (0.6.4).
pub const ENVD_VERSION: &str = "0.6.3";
/// envd's port: the SDKs send it in `E2b-Sandbox-Port` for every envd call.
pub const ENVD_PORT: u16 = 49983;
/// The code interpreter's port.
pub const INTERP_PORT: u16 = 49999;

/// What a request is for, as a cluster routes it (`hutch-cluster`'s E2B routing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteTarget {
    /// A create (`POST /sandboxes`, `/v2/sandboxes`): placed.
    Create,
    /// One sandbox: its data plane, a signed file URL of it, or a control-plane call on it
    /// (`/sandboxes/{id}…`): served by the node that runs it.
    Sandbox(SandboxId),
    /// Anything else: any node answers (every node reads the same database).
    Any,
}

/// Serve a request on this node.
pub type ServeHere =
    Box<dyn FnOnce(Request) -> futures_util::future::BoxFuture<'static, Response> + Send>;

/// How a cluster routes the adapter's requests: [`ClusterRoute::route`] serves the request
/// with `here`, or forwards it to the node that should serve it.
pub trait ClusterRoute: Send + Sync {
    /// Route `request`, which is for `target`.
    fn route(
        &self,
        target: RouteTarget,
        request: Request,
        here: ServeHere,
    ) -> futures_util::future::BoxFuture<'static, Response>;
}

/// The sandbox a control-plane path names (`/sandboxes/{id}…`, `/v2/sandboxes/{id}…`), if
/// any.
fn control_sandbox(path: &str) -> Option<SandboxId> {
    let rest = path
        .strip_prefix("/v2/sandboxes/")
        .or_else(|| path.strip_prefix("/sandboxes/"))?;
    rest.split('/').next()?.parse().ok()
}

/// How the adapter is reached.
#[derive(Debug, Clone)]
pub struct E2bConfig {
    /// The domain of host-form sandbox URLs, `<port>-<sandbox id>.<domain>`.
    pub domain: String,
    /// The listener's port as clients reach it (part of the `domain` handed to SDKs, so
    /// that `get_host(port)` names a host that reaches this listener).
    pub port: u16,
}

/// State of every handler.
#[derive(Clone)]
pub struct E2bState {
    /// Hutch's API state (manager, key cache, port proxy).
    pub app: AppState,
    /// How the adapter is reached.
    pub cfg: Arc<E2bConfig>,
    /// Template builds named by `POST /v3/templates`.
    builds: Arc<control::E2bBuilds>,
}

impl E2bState {
    /// The envd access token of sandbox `id`: what `X-Access-Token` must carry, and the key
    /// of signed file URLs. Derived from the server's secret, so nothing is stored.
    pub fn access_token(&self, id: &SandboxId) -> String {
        self.app
            .manager
            .sandbox_tokens()
            .derive("e2b-envd", id.as_str())
    }

    /// The `domain` handed to SDKs in create and connect answers.
    pub fn public_domain(&self) -> String {
        format!("{}:{}", self.cfg.domain, self.cfg.port)
    }

    /// The caller of a control-plane request: `X-API-Key` (E2B's) or `Authorization: Bearer`
    /// (Hutch's), either holding a Hutch API key.
    pub async fn caller(&self, headers: &HeaderMap) -> E2bResult<Caller> {
        let key = api_key(headers).ok_or_else(|| {
            E2bError::unauthorized("missing API key: set E2B_API_KEY to a Hutch API key")
        })?;
        // Hutch's own check (unknown, revoked and expired keys are 401; an admin key may
        // act for a tenant with `X-Hutch-Tenant`). E2B has no scoped keys, and its routes
        // both read and change: the E2B API takes full and admin keys only.
        let caller = self.app.caller(key, headers).await?;
        if !caller.permits(Permission::Manage) {
            return Err(E2bError::Hutch(ApiError::forbidden(format!(
                "the E2B API takes full or admin keys; this key is {}",
                caller.key.scope.as_str()
            ))));
        }
        Ok(caller)
    }
}

/// The API key of a control-plane request: `X-API-Key` (E2B's) or `Authorization: Bearer`
/// (Hutch's).
pub fn api_key(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            headers
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        })
        .map(str::trim)
}

/// A stream of what a task sends: `f` runs on its own with the sending half (a queue of
/// `capacity`) and ends when it returns or when the stream is dropped (its sends fail).
pub(crate) fn task_stream<T, F, Fut>(
    capacity: usize,
    f: F,
) -> tokio_stream::wrappers::ReceiverStream<T>
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Sender<T>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(capacity);
    tokio::spawn(f(tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// The adapter's whole router.
pub fn router(app: AppState, cfg: E2bConfig) -> Router {
    router_routed(app, cfg, None)
}

/// [`router`], each request first routed by `cluster` (when given) to the node that serves
/// it.
pub fn router_routed(
    app: AppState,
    cfg: E2bConfig,
    cluster: Option<Arc<dyn ClusterRoute>>,
) -> Router {
    let state = E2bState {
        app,
        cfg: Arc::new(cfg),
        builds: Arc::default(),
    };
    let control = control::router().with_state(state.clone());
    let envd = envd::router(state.clone()).with_state(state.clone());
    let interp = interp::router(state.clone()).with_state(state.clone());
    let dispatch = tower::service_fn(move |request: Request| {
        let (state, control, envd, interp, cluster) = (
            state.clone(),
            control.clone(),
            envd.clone(),
            interp.clone(),
            cluster.clone(),
        );
        async move {
            let target = match target::of_request(&state, &request) {
                Ok(t) => t,
                Err(e) => return Ok::<Response, Infallible>(e.into_response()),
            };
            let target = match target {
                Some(t) => Some(t),
                None => target::signed_file_url(&state, &request.uri().clone()).await,
            };
            let routed = target.as_ref().map(|t| t.id.clone());
            let here: ServeHere = Box::new(move |mut request: Request| {
                Box::pin(async move {
                    let Some(target) = target else {
                        return control
                            .oneshot(request)
                            .await
                            .unwrap_or_else(|e| match e {});
                    };
                    let port = target.port;
                    request.extensions_mut().insert(target);
                    let served = match port {
                        ENVD_PORT => envd.oneshot(request).await,
                        INTERP_PORT => interp.oneshot(request).await,
                        _ => Ok(target::proxy_port(&state, request).await),
                    };
                    served.unwrap_or_else(|e| match e {})
                })
            });
            let Some(cluster) = cluster else {
                return Ok(here(request).await);
            };
            let route = match routed {
                Some(id) => RouteTarget::Sandbox(id),
                None => {
                    let path = request.uri().path();
                    let creates = request.method() == axum::http::Method::POST
                        && matches!(path, "/sandboxes" | "/v2/sandboxes");
                    match (creates, control_sandbox(path)) {
                        (true, _) => RouteTarget::Create,
                        (false, Some(id)) => RouteTarget::Sandbox(id),
                        (false, None) => RouteTarget::Any,
                    }
                }
            };
            Ok(cluster.route(route, request, here).await)
        }
    });
    Router::new()
        .fallback_service(dispatch)
        .layer(axum::extract::DefaultBodyLimit::disable())
}
