//! Hutch's HTTP API (see `docs/api.md` and `GET /v1/openapi.json`).
//!
//! Handlers parse and validate requests into the core's typed commands, call the
//! [`Manager`], and map results; statuses are chosen only in [`error::ApiError`].
//! [`app`] builds the router apart from any socket so tests can drive it directly.

pub mod audit;
pub mod auth;
mod browser;
pub mod build_context;
pub mod error;
mod extract;
mod key_cache;
mod preview;
pub mod proxy;
mod routes;
pub mod serve;

use std::sync::{Arc, Mutex};

use axum::routing::{any, get, post, put};
use axum::Router;
use hutch_build::{BuildSettings, Builder};
use hutch_core::Manager;

pub use auth::{AuthorizedSandbox, Caller};
pub use preview::{parse_host, preview_app, request_host, PreviewOrigin};
pub use routes::sandboxes::{url_pairs, validate_template_name};

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    /// The sandbox manager.
    pub manager: Arc<Manager>,
    keys: Arc<Mutex<key_cache::KeyCache>>,
    /// Fired when a key is revoked: its requests and streams end (`key_cache.rs`).
    revocations: Arc<key_cache::Revocations>,
    /// The preview origin, when `hutch serve` runs one (browser links point there).
    preview: Option<Arc<PreviewOrigin>>,
    connections: Arc<serve::connections::ConnectionStats>,
    /// Largest JSON request body, in bytes.
    json_body_limit: usize,
    /// Template builds from Dockerfiles.
    builder: Arc<Builder>,
    /// Who started each build the builder remembers (tenants see their own).
    build_owners: Arc<routes::templates::BuildOwners>,
    /// How big an uploaded build context may be.
    context_limits: build_context::ContextLimits,
    /// Whether the listeners serve TLS (`https` in the URLs the server hands out).
    tls: bool,
}

/// Default [`AppState::with_json_body_limit`]: 1 MiB.
pub const DEFAULT_JSON_BODY_LIMIT: usize = 1 << 20;

impl AppState {
    /// State over a started manager; template builds get [`default_build_settings`].
    pub fn new(manager: Arc<Manager>) -> Self {
        let builder = Builder::new(manager.clone(), default_build_settings(&manager));
        Self {
            manager,
            keys: Arc::new(Mutex::new(key_cache::KeyCache::default())),
            revocations: Arc::default(),
            preview: None,
            connections: Arc::default(),
            json_body_limit: DEFAULT_JSON_BODY_LIMIT,
            builder,
            build_owners: Arc::default(),
            context_limits: build_context::ContextLimits::default(),
            tls: false,
        }
    }

    /// The same state, giving build sandboxes `settings` (resources, network policy).
    pub fn with_build_settings(mut self, settings: BuildSettings) -> Self {
        self.builder = Builder::new(self.manager.clone(), settings);
        self
    }

    /// Answer build contexts over `limits` with 413.
    pub fn with_context_limits(mut self, limits: build_context::ContextLimits) -> Self {
        self.context_limits = limits;
        self
    }

    /// The template builder.
    pub fn builder(&self) -> &Arc<Builder> {
        &self.builder
    }

    /// The same state, handing out browser links to `preview` instead of the API origin.
    pub fn with_preview(mut self, preview: PreviewOrigin) -> Self {
        self.preview = Some(Arc::new(preview));
        self
    }

    /// The listeners serve TLS: URLs the server hands out (signed file URLs, browser links,
    /// upload links) say `https`.
    pub fn with_tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// The scheme of URLs pointing back at this server: `https` or `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }

    /// Answer JSON bodies larger than `bytes` with 413 (file uploads and streamed exec stdin
    /// are streamed, not limited by this).
    pub fn with_json_body_limit(mut self, bytes: usize) -> Self {
        self.json_body_limit = bytes.max(1);
        self
    }

    /// The largest JSON body accepted, in bytes.
    pub fn json_body_limit(&self) -> usize {
        self.json_body_limit
    }

    /// Counters of client connections, filled by [`serve::serve`] and shown in `/metrics`.
    pub fn connection_stats(&self) -> Arc<serve::connections::ConnectionStats> {
        Arc::clone(&self.connections)
    }
}

/// What build sandboxes get unless `hutch serve` says otherwise: the builder's defaults,
/// with no network at all when the manager runs without networking.
pub fn default_build_settings(manager: &Manager) -> BuildSettings {
    let mut settings = BuildSettings::default();
    if manager.config().network.is_none() {
        settings.network.egress = hutch_core::net::policy::Egress::None;
    }
    settings
}

/// The id a cluster's placement chose for the create it forwards here (a request extension
/// only the cluster's routing sets, from a node-to-node call: `hutch-cluster`).
#[derive(Debug, Clone)]
pub struct PlacedSandboxId(pub hutch_core::ids::SandboxId);

/// The whole API.
pub fn app(state: AppState) -> Router {
    use routes::{
        build_cache, build_logs, code, exec, files, files_url, files_watch, keys, lifecycle, logs,
        misc, network, ports, processes, pty, sandboxes, template_edit, templates, tenants,
        volumes,
    };
    let v1 = Router::new()
        .route("/v1/openapi.json", get(misc::openapi))
        .route("/v1/metrics", get(misc::metrics_per_sandbox))
        .route(
            "/v1/templates",
            get(templates::list).post(templates::create),
        )
        .route(
            "/v1/templates/{name}",
            get(templates::get)
                .delete(templates::delete)
                .patch(template_edit::patch),
        )
        .route(
            "/v1/templates/{name}/tags/{tag}",
            put(template_edit::put_tag).delete(template_edit::delete_tag),
        )
        .route("/v1/templates/{name}/builds", get(templates::list_builds))
        .route(
            "/v1/templates/{name}/builds/{id}",
            get(templates::get_build).delete(templates::cancel_build),
        )
        .route(
            "/v1/templates/{name}/builds/{id}/logs",
            get(build_logs::logs),
        )
        .route("/v1/build-cache", get(build_cache::usage))
        .route("/v1/build-cache/prune", post(build_cache::prune))
        .route("/v1/events", get(misc::events))
        .route("/v1/tenants", post(tenants::create).get(tenants::list))
        .route(
            "/v1/tenants/{name}",
            get(tenants::get)
                .patch(tenants::update)
                .delete(tenants::delete),
        )
        .route("/v1/keys", post(keys::create).get(keys::list))
        .route(
            "/v1/keys/{id}",
            get(keys::get).patch(keys::update).delete(keys::revoke),
        )
        .route("/v1/audit", get(routes::audit::list))
        .route("/v1/usage", get(routes::usage::report))
        .route(
            "/v1/sandboxes",
            post(sandboxes::create).get(sandboxes::list),
        )
        .route(
            "/v1/sandboxes/{id}",
            get(sandboxes::get)
                .delete(sandboxes::kill)
                .patch(sandboxes::update),
        )
        .route("/v1/sandboxes/{id}/usage", get(sandboxes::usage))
        .route("/v1/sandboxes/{id}/logs", get(logs::logs))
        .route("/v1/sandboxes/{id}/network", put(network::put_network))
        .route("/v1/volumes", post(volumes::create).get(volumes::list))
        .route(
            "/v1/volumes/{id}",
            get(volumes::get).delete(volumes::delete),
        )
        .route("/v1/volumes/{id}/check", post(volumes::check))
        .route("/v1/sandboxes/{id}/pause", post(lifecycle::pause))
        .route("/v1/sandboxes/{id}/resume", post(lifecycle::resume))
        .route("/v1/sandboxes/{id}/hibernate", post(lifecycle::hibernate))
        .route("/v1/sandboxes/{id}/wake", post(lifecycle::wake))
        .route("/v1/sandboxes/{id}/snapshots", post(lifecycle::snapshot))
        .route("/v1/sandboxes/{id}/fork", post(lifecycle::fork))
        .route("/v1/sandboxes/{id}/explore", post(lifecycle::explore))
        .route("/v1/snapshots", get(lifecycle::list_snapshots))
        .route(
            "/v1/snapshots/{id}",
            get(lifecycle::get_snapshot).delete(lifecycle::delete_snapshot),
        )
        .route("/v1/sandboxes/{id}/exec", post(exec::exec))
        .route("/v1/sandboxes/{id}/exec/stream", post(exec::exec_stream))
        .route("/v1/sandboxes/{id}/pty", get(pty::pty))
        .route(
            "/v1/sandboxes/{id}/processes",
            post(processes::start).get(processes::list),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{process}",
            get(processes::get).delete(processes::kill),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{process}/output",
            get(processes::output),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{process}/stdin",
            post(processes::stdin),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{process}/close-stdin",
            post(processes::close_stdin),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{process}/signal",
            post(processes::signal),
        )
        .route(
            "/v1/sandboxes/{id}/processes/{process}/resize",
            post(processes::resize),
        )
        .route("/v1/sandboxes/{id}/code", post(code::run_code))
        .route(
            "/v1/sandboxes/{id}/contexts",
            post(code::create_context).get(code::list_contexts),
        )
        .route(
            "/v1/sandboxes/{id}/contexts/{cid}",
            axum::routing::delete(code::delete_context),
        )
        .route(
            "/v1/sandboxes/{id}/contexts/{cid}/restart",
            post(code::restart_context),
        )
        .route("/v1/sandboxes/{id}/files/watch", get(files_watch::watch))
        .route(
            "/v1/sandboxes/{id}/files/watchers",
            post(files_watch::create_watcher),
        )
        .route(
            "/v1/sandboxes/{id}/files/watchers/{wid}",
            axum::routing::delete(files_watch::remove_watcher),
        )
        .route(
            "/v1/sandboxes/{id}/files/watchers/{wid}/events",
            get(files_watch::watcher_events),
        )
        .route("/v1/sandboxes/{id}/files/url", post(files_url::file_url))
        .route(
            "/v1/sandboxes/{id}/files/archive",
            get(files::read_archive).put(files::write_archive),
        )
        .route("/v1/sandboxes/{id}/files/list", get(files::list))
        .route("/v1/sandboxes/{id}/files/stat", get(files::stat))
        .route("/v1/sandboxes/{id}/files/mkdir", post(files::mkdir))
        .route("/v1/sandboxes/{id}/files/move", post(files::rename))
        .route("/v1/sandboxes/{id}/port-tokens", post(ports::port_token))
        .route("/v1/sandboxes/{id}/tunnel/{port}", get(ports::tunnel))
        // Authentication, permissions, the sandbox of `/v1/sandboxes/{id}/…` paths and
        // revocation, for every route above (`auth.rs`).
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_auth,
        ));
    // File reads and writes take the key, or a signed URL in place of it (`files_url`).
    let files_route = Router::new()
        .route(
            "/v1/sandboxes/{id}/files",
            get(files::read).put(files::write).delete(files::remove),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_auth_or_signed_url,
        ));
    // The port proxy authenticates itself: the key from the header, or a browser's sandbox
    // token (`browser`), which no other route takes.
    let port_proxy = Router::new()
        .route("/v1/sandboxes/{id}/ports/{port}", any(ports::proxy))
        .route("/v1/sandboxes/{id}/ports/{port}/", any(ports::proxy))
        .route("/v1/sandboxes/{id}/ports/{port}/{*path}", any(ports::proxy));
    Router::new()
        .route("/healthz", get(misc::healthz))
        .route("/metrics", get(misc::metrics))
        .merge(v1)
        .merge(files_route)
        .merge(port_proxy)
        .fallback(misc::not_found)
        // Every buffered body (JSON) is limited; file uploads, streamed exec stdin and the
        // port proxy take the body as a stream, which this does not limit.
        .layer(axum::extract::DefaultBodyLimit::max(state.json_body_limit))
        .with_state(state)
}
