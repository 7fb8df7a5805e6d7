//! `/v1/templates`: list, get and delete templates; build one from a Dockerfile and a build
//! context (`POST /v1/templates` with a tar body), and watch or cancel its builds. The
//! build log is `routes/build_logs.rs`; the builds themselves are `hutch-build`'s.
//!
//! A template an admin key builds (or the operator, on the host) is shared by every
//! tenant; one a tenant's key builds is private to that tenant: other tenants neither list
//! it nor get it nor create from it (404, as for an unknown one). Template names are one
//! namespace: a tenant cannot build under a shared name or another tenant's (409). The
//! build's sandboxes belong to the caller's tenant, and only that tenant (and admin keys)
//! see the build. A tenant deletes its own templates; shared ones only admin keys.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use hutch_build::{BuildRequest, BuildView, ImageBuild, RegistryAccess, SandboxResources};
use hutch_core::tenant::Tenant;
use hutch_proto::{Command, ReadyProbe, ServiceSpec};
use serde::Deserialize;

use super::sandboxes::url_pairs;
use crate::build_context::{self, ContextLimits};
use crate::error::{ApiError, ApiResult};
use crate::extract::Caller;
use crate::AppState;

/// Who started each build the builder still remembers: `bld_…` → (template, tenant; `None`
/// for an admin key's).
#[derive(Debug, Default)]
pub struct BuildOwners {
    builds: Mutex<HashMap<String, (String, Option<Tenant>)>>,
}

impl BuildOwners {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, Option<Tenant>)>> {
        self.builds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record a started build, forgetting the builds the builder forgot.
    fn record(&self, state: &AppState, view: &BuildView, tenant: Option<Tenant>) {
        let mut builds = self.lock();
        builds.retain(|id, (template, _)| state.builder.get(template, id).is_ok());
        builds.insert(view.id.clone(), (view.template.clone(), tenant));
    }

    /// Whether `caller` may see build `id`.
    fn visible(&self, caller: &Caller, id: &str) -> bool {
        caller.admin
            || self
                .lock()
                .get(id)
                .is_some_and(|(_, t)| t.as_ref() == Some(&caller.tenant))
    }
}

/// The query of `POST /v1/templates` with a build context.
#[derive(Debug, Default, PartialEq)]
struct BuildQuery {
    name: String,
    /// `name=web:v2`: the tag the build's revision gets.
    tag: Option<String>,
    dockerfile: Option<String>,
    target: Option<String>,
    no_cache: bool,
    build_args: BTreeMap<String, String>,
    resources: SandboxResources,
    /// Plain-HTTP registries for the `FROM` images (`insecure_registry=`, repeatable).
    insecure_registries: Vec<String>,
    /// `image_archive=true`: the body is an image archive, not a build context.
    image_archive: bool,
    /// `image_tag=`: which image of the archive.
    image_tag: Option<String>,
    /// `start=` (JSON): the start command of an image archive's template.
    start: Option<ServiceSpec>,
    /// `force=true`: unpack the image again.
    force: bool,
}

/// A number query parameter within `range`.
fn parse_number<T>(key: &str, value: &str, range: std::ops::RangeInclusive<T>) -> ApiResult<T>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    value
        .parse::<T>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "{key} must be a number from {} to {}, got {value:?}",
                range.start(),
                range.end()
            ))
        })
}

fn parse_bool(key: &str, value: &str) -> ApiResult<bool> {
    match value {
        "true" | "1" | "" => Ok(true),
        "false" | "0" => Ok(false),
        other => Err(ApiError::bad_request(format!(
            "{key} must be true or false, got {other:?}"
        ))),
    }
}

/// `name=&dockerfile=&target=&no_cache=&build_arg=K=V…` (`build_arg` repeatable), and the
/// template's default sandbox resources `cpus=&memory_mib=&disk_mib=`.
fn parse_build_query(raw: Option<&str>) -> ApiResult<BuildQuery> {
    let mut q = BuildQuery::default();
    let mut name = None;
    for (k, v) in url_pairs(raw.unwrap_or("")) {
        match k.as_str() {
            "name" => name = Some(v),
            "dockerfile" => q.dockerfile = Some(v),
            "target" => q.target = Some(v),
            "no_cache" => q.no_cache = parse_bool("no_cache", &v)?,
            "cpus" => q.resources.cpus = Some(parse_number("cpus", &v, SandboxResources::CPUS)?),
            "memory_mib" => {
                let mib = parse_number("memory_mib", &v, SandboxResources::MEMORY_MIB)?;
                q.resources.memory_mib = Some(mib);
            }
            "disk_mib" => {
                let mib = parse_number("disk_mib", &v, SandboxResources::DISK_MIB)?;
                q.resources.disk_mib = Some(mib);
            }
            "insecure_registry" => q.insecure_registries.push(registry_host(&v)?),
            "image_archive" => q.image_archive = parse_bool("image_archive", &v)?,
            "image_tag" => q.image_tag = Some(v),
            "force" => q.force = parse_bool("force", &v)?,
            "start" => {
                let spec = serde_json::from_str(&v).map_err(|e| {
                    ApiError::bad_request(format!("start must be a start command as JSON: {e}"))
                })?;
                q.start = Some(check_start(spec)?);
            }
            "build_arg" => {
                let (key, value) = v.split_once('=').ok_or_else(|| {
                    ApiError::bad_request(format!("build_arg must be KEY=VALUE, got {v:?}"))
                })?;
                if key.is_empty() || key.contains('\0') || value.contains('\0') {
                    return Err(ApiError::bad_request(format!(
                        "build_arg must be KEY=VALUE with a non-empty KEY and no NUL byte, got {v:?}"
                    )));
                }
                q.build_args.insert(key.to_string(), value.to_string());
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter {other:?}; use name=, dockerfile=, target=, no_cache=, build_arg=KEY=VALUE, cpus=, memory_mib=, disk_mib=, insecure_registry=, or for an image archive image_archive=true, image_tag=, start=, force="
                )))
            }
        }
    }
    let name = name.ok_or_else(|| {
        ApiError::bad_request(
            "name= is required: the template to build (POST /v1/templates?name=NAME)",
        )
    })?;
    (q.name, q.tag) = split_tag(&name)?;
    if let Some(path) = &q.dockerfile {
        if path.is_empty() || path.starts_with('/') || path.contains('\0') {
            return Err(ApiError::bad_request(format!(
                "dockerfile must be a relative path in the build context, got {path:?}"
            )));
        }
    }
    if q.target.as_deref() == Some("") {
        return Err(ApiError::bad_request("target must name a stage"));
    }
    let dockerfile_only =
        q.dockerfile.is_some() || q.target.is_some() || q.no_cache || !q.build_args.is_empty();
    let archive_only = q.image_tag.is_some() || q.start.is_some() || q.force;
    if q.image_archive && dockerfile_only {
        return Err(ApiError::bad_request(
            "dockerfile=, target=, no_cache= and build_arg= are for Dockerfile builds, not image_archive=true",
        ));
    }
    if !q.image_archive && archive_only {
        return Err(ApiError::bad_request(
            "image_tag=, start= and force= go with image_archive=true (a Dockerfile's CMD and HEALTHCHECK give its start command)",
        ));
    }
    Ok(q)
}

/// `web` or `web:v2` (the template, and the tag its new revision gets), both checked.
fn split_tag(name: &str) -> ApiResult<(String, Option<String>)> {
    let (name, tag) = match name.split_once(':') {
        Some((n, t)) => (n, Some(t)),
        None => (name, None),
    };
    hutch_template::validate_name(name)?;
    if let Some(tag) = tag {
        hutch_template::validate_tag(tag)?;
    }
    Ok((name.to_string(), tag.map(String::from)))
}

/// A registry as `insecure_registries` names it: `host` or `host:port`.
fn registry_host(v: &str) -> ApiResult<String> {
    let ok = !v.is_empty()
        && v.len() <= 255
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'));
    if ok {
        Ok(v.to_string())
    } else {
        Err(ApiError::bad_request(format!(
            "an insecure registry is a host or host:port, got {v:?}"
        )))
    }
}

/// A start command given through the API, checked as the CLI checks its options.
pub(crate) fn check_start(spec: ServiceSpec) -> ApiResult<ServiceSpec> {
    let empty = match &spec.cmd {
        Command::Shell(s) => s.trim().is_empty(),
        Command::Argv(argv) => argv.is_empty() || argv[0].is_empty(),
    };
    if empty {
        return Err(ApiError::bad_request("the start command must not be empty"));
    }
    if let Some(ready) = &spec.ready {
        if ready.probe == ReadyProbe::Port(0) {
            return Err(ApiError::bad_request("a ready port is between 1 and 65535"));
        }
        if ready.timeout_ms < 1000 || ready.interval_ms == 0 || ready.attempt_timeout_ms == 0 {
            return Err(ApiError::bad_request(
                "a ready check needs timeout_ms of at least 1000 and non-zero interval_ms and attempt_timeout_ms",
            ));
        }
    }
    Ok(spec)
}

/// Credentials for the registries of a build: the `X-Hutch-Registry-Auth: USER:PASSWORD`
/// header (a Dockerfile build's `FROM` images), or an image body's `registry_auth`.
fn registry_credentials(text: Option<&str>) -> ApiResult<Option<hutch_template::Credentials>> {
    text.map(|t| {
        hutch_template::Credentials::parse(t)
            .map_err(|_| ApiError::bad_request("registry credentials are USER:PASSWORD"))
    })
    .transpose()
}

fn header_credentials(headers: &HeaderMap) -> ApiResult<Option<hutch_template::Credentials>> {
    match headers.get(REGISTRY_AUTH_HEADER) {
        None => Ok(None),
        Some(v) => {
            registry_credentials(Some(v.to_str().map_err(|_| {
                ApiError::bad_request(format!("{REGISTRY_AUTH_HEADER} must be text"))
            })?))
        }
    }
}

/// The header that carries registry credentials with a build context.
pub const REGISTRY_AUTH_HEADER: &str = "x-hutch-registry-auth";

/// The header (repeatable) that carries one secret of a Dockerfile build:
/// `id=<base64 of the value>`, for `RUN --mount=type=secret,id=…`.
pub const BUILD_SECRET_HEADER: &str = "x-hutch-build-secret";

/// The build's secrets from its [`BUILD_SECRET_HEADER`]s.
fn header_secrets(headers: &HeaderMap) -> ApiResult<hutch_build::BuildSecrets> {
    use base64::Engine as _;
    let mut secrets = hutch_build::BuildSecrets::default();
    // Repeated headers, or one with comma-separated entries (as proxies may merge them;
    // base64 has no commas).
    let entries = headers
        .get_all(BUILD_SECRET_HEADER)
        .iter()
        .map(|v| v.to_str().ok())
        .collect::<Option<Vec<&str>>>()
        .ok_or_else(|| ApiError::bad_request(format!("{BUILD_SECRET_HEADER} must be text")))?;
    for entry in entries.iter().flat_map(|v| v.split(',')) {
        let Some((id, encoded)) = entry.trim().split_once('=') else {
            return Err(ApiError::bad_request(format!(
                "{BUILD_SECRET_HEADER} must be ID=BASE64"
            )));
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|_| {
                ApiError::bad_request(format!(
                    "{BUILD_SECRET_HEADER} for {id:?}: the value is not base64"
                ))
            })?;
        secrets
            .insert(id.trim(), bytes)
            .map_err(|e| ApiError::bad_request(format!("{BUILD_SECRET_HEADER}: {e}")))?;
    }
    Ok(secrets)
}

/// The JSON form of `POST /v1/templates`: a template from an image in a registry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ImageBody {
    name: String,
    from_image: String,
    registry_auth: Option<String>,
    #[serde(default)]
    insecure_registries: Vec<String>,
    start: Option<ServiceSpec>,
    #[serde(default)]
    force: bool,
    cpus: Option<f64>,
    memory_mib: Option<u64>,
    disk_mib: Option<u64>,
}

impl ImageBody {
    /// The checked build request (its `context_dir` is set once the build's directory is
    /// made).
    fn request(self, caller: &Caller) -> ApiResult<BuildRequest> {
        let (name, tag) = split_tag(&self.name)?;
        if self.from_image.is_empty() || self.from_image.len() > 4096 {
            return Err(ApiError::bad_request(
                "from_image must name an image (registry.example:5000/team/app:1)",
            ));
        }
        if hutch_template::is_local_reference(&self.from_image) {
            return Err(ApiError::bad_request(format!(
                "{} names a file on the server; upload the image instead: POST /v1/templates?name={}&image_archive=true with the archive (docker save, or a tar of an OCI layout) as the body, as `hutch template build {} --from-image {}` does",
                self.from_image, name, name, self.from_image
            )));
        }
        let mut resources = SandboxResources::default();
        if let Some(cpus) = self.cpus {
            resources.cpus = Some(in_range("cpus", cpus, SandboxResources::CPUS)?);
        }
        if let Some(mib) = self.memory_mib {
            resources.memory_mib = Some(in_range("memory_mib", mib, SandboxResources::MEMORY_MIB)?);
        }
        if let Some(mib) = self.disk_mib {
            resources.disk_mib = Some(in_range("disk_mib", mib, SandboxResources::DISK_MIB)?);
        }
        let insecure = self
            .insecure_registries
            .iter()
            .map(|h| registry_host(h))
            .collect::<ApiResult<Vec<_>>>()?;
        Ok(BuildRequest {
            template: name,
            tag,
            context_dir: PathBuf::new(),
            dockerfile: String::new(),
            build_args: BTreeMap::new(),
            secrets: Default::default(),
            target: None,
            no_cache: false,
            tenant: caller.owner(),
            sandbox_resources: resources,
            registry: RegistryAccess {
                credentials: registry_credentials(self.registry_auth.as_deref())?,
                insecure_registries: insecure,
                operator: caller.admin,
            },
            image: Some(ImageBuild {
                reference: self.from_image,
                local: None,
                start: self.start.map(check_start).transpose()?,
                force: self.force,
            }),
        })
    }
}

fn in_range<T>(key: &str, value: T, range: std::ops::RangeInclusive<T>) -> ApiResult<T>
where
    T: PartialOrd + std::fmt::Display + Copy,
{
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(ApiError::bad_request(format!(
            "{key} must be a number from {} to {}, got {value}",
            range.start(),
            range.end()
        )))
    }
}

/// What the body of `POST /v1/templates` is, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyKind {
    Json,
    Context,
}

fn body_kind(headers: &HeaderMap) -> ApiResult<BodyKind> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    match ct.as_deref() {
        Some("application/json") => Ok(BodyKind::Json),
        None
        | Some(
            "application/x-tar" | "application/tar" | "application/gzip" | "application/x-gzip"
            | "application/octet-stream",
        ) => Ok(BodyKind::Context),
        Some(other) => Err(ApiError::unsupported_media_type(format!(
            "POST /v1/templates takes a build context as a tar stream (Content-Type: application/x-tar, \
             optionally gzip-compressed) or an image as JSON (Content-Type: application/json), not {other}"
        ))),
    }
}

/// A template as the API shows it: its description, and `tenant` when it is private.
pub(crate) fn template_view(
    state: &AppState,
    t: &hutch_core::manager::VisibleTemplate,
) -> serde_json::Value {
    let mut v = serde_json::to_value(&t.info).unwrap_or_default();
    if let Some(m) = v.as_object_mut() {
        if let Some(tenant) = &t.tenant {
            m.insert("tenant".into(), tenant.as_str().into());
        }
        let tags = state.manager.templates().tags(&t.info.name);
        if !tags.is_empty() {
            m.insert("tags".into(), serde_json::json!(tags));
        }
    }
    v
}

/// `GET /v1/templates`: the shared ones and the caller's tenant's own.
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<impl IntoResponse> {
    let templates: Vec<serde_json::Value> = state
        .manager
        .visible_templates(&caller.scope())
        .await?
        .iter()
        .map(|t| template_view(&state, t))
        .collect();
    Ok(Json(serde_json::json!({ "templates": templates })))
}

/// `POST /v1/templates?name=…` with a build context (tar, optionally gzip), or with an
/// image archive (`image_archive=true`), or a JSON body naming an image in a registry →
/// 202 with the build.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    if body_kind(&headers)? == BodyKind::Json {
        if raw.as_deref().is_some_and(|r| !r.is_empty()) {
            return Err(ApiError::bad_request(
                "an image build is all in its JSON body: no query parameters",
            ));
        }
        let bytes = axum::body::to_bytes(body, state.json_body_limit())
            .await
            .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        let image: ImageBody = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
        let mut request = image.request(&caller)?;
        let build_dir = new_build_dir(&state).await?;
        request.context_dir = build_dir.join("context");
        return start_build(&state, request, build_dir).await;
    }
    let q = parse_build_query(raw.as_deref())?;
    let credentials = header_credentials(&headers)?;
    let secrets = header_secrets(&headers)?;
    let limits = state.context_limits;
    if let Err(e) = check_declared_length(&headers, &limits) {
        return Ok(closing(e));
    }
    let build_dir = new_build_dir(&state).await?;
    let context_dir = build_dir.join("context");
    let gzip = build_context::gzip_declared(&headers);
    if let Err(e) = build_context::receive(body, context_dir.clone(), gzip, limits).await {
        remove_dir(build_dir).await;
        return Ok(closing(e.into()));
    }
    let image = q.image_archive.then(|| ImageBuild {
        reference: match &q.image_tag {
            Some(tag) => format!("upload:{tag}"),
            None => "upload".into(),
        },
        local: Some(hutch_template::LocalImage {
            path: context_dir.clone(),
            tag: q.image_tag.clone(),
        }),
        start: q.start.clone(),
        force: true,
    });
    let request = BuildRequest {
        template: q.name.clone(),
        tag: q.tag.clone(),
        context_dir,
        dockerfile: q.dockerfile.unwrap_or_else(|| "Dockerfile".into()),
        build_args: q.build_args,
        secrets,
        target: q.target,
        no_cache: q.no_cache,
        tenant: caller.owner(),
        sandbox_resources: q.resources,
        registry: RegistryAccess {
            credentials,
            insecure_registries: q.insecure_registries,
            operator: caller.admin,
        },
        image,
    };
    start_build(&state, request, build_dir).await
}

/// Claim the template's name for the caller's tenant and start the build → 202.
async fn start_build(
    state: &AppState,
    request: BuildRequest,
    build_dir: PathBuf,
) -> ApiResult<Response> {
    let tenant = request.tenant.clone();
    if let Err(e) = state
        .manager
        .claim_template_for_build(&request.template, tenant.as_ref())
        .await
    {
        remove_dir(build_dir).await;
        return Err(e.into());
    }
    let view = match state.builder.start(request).await {
        Ok(view) => view,
        Err(e) => {
            remove_dir(build_dir).await;
            return Err(e.into());
        }
    };
    state.build_owners.record(state, &view, tenant);
    tracing::info!(build = %view.id, template = %view.template, "template build started");
    let location = format!("/v1/templates/{}/builds/{}", view.template, view.id);
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(view),
    )
        .into_response())
}

/// An error answered before the whole body was read: the connection is closed after it
/// (`Connection: close`), so a client does not send its next request on a connection
/// whose unread body the server drops.
fn closing(e: ApiError) -> Response {
    let mut response = e.into_response();
    response.headers_mut().insert(
        header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

/// 413 before reading anything when `Content-Length` is already over the limit.
fn check_declared_length(headers: &HeaderMap, limits: &ContextLimits) -> Result<(), ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(n) if n > limits.max_bytes => Err(build_context::ContextError::TooLarge {
            limit: limits.max_bytes,
        }
        .into()),
        _ => Ok(()),
    }
}

/// `<state>/builds/<random>/`, private; empty ones left by finished builds (the builder
/// deletes their `context/`) are swept first.
async fn new_build_dir(state: &AppState) -> ApiResult<PathBuf> {
    let builds = state.manager.config().state_dir.join("builds");
    let dir = builds.join(hutch_core::ids::random_token(16));
    let made = dir.clone();
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&builds)?;
        if let Ok(entries) = std::fs::read_dir(&builds) {
            for entry in entries.flatten() {
                // Only empty directories go: a running build's holds its context.
                let _ = std::fs::remove_dir(entry.path());
            }
        }
        std::fs::DirBuilder::new().mode(0o700).create(&made)
    })
    .await
    .map_err(|e| ApiError::from(hutch_core::CoreError::Task(e)))?
    .map_err(|e| ApiError::from(hutch_core::CoreError::io("create", &dir)(e)))?;
    Ok(dir)
}

async fn remove_dir(dir: PathBuf) {
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
}

/// 404 for template `name`, saying a build of it runs when `caller` may see that build.
pub(crate) fn unknown_template(state: &AppState, caller: &Caller, name: &str) -> ApiError {
    let running = state
        .builder
        .list(name)
        .into_iter()
        .any(|b| !b.status.is_done() && state.build_owners.visible(caller, &b.id));
    let hint = if running {
        format!(" (a build of it is running: GET /v1/templates/{name}/builds)")
    } else {
        String::new()
    };
    ApiError::not_found(format!("template {name:?} does not exist{hint}"))
}

/// `GET /v1/templates/{name}` (404 for another tenant's, as for an unknown one).
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    shown(&state, &caller, &name).await.map(Json)
}

/// Template `name` as `GET` shows it to `caller` (404 when it may not see it).
pub(crate) async fn shown(
    state: &AppState,
    caller: &Caller,
    name: &str,
) -> ApiResult<serde_json::Value> {
    match state
        .manager
        .visible_template(name, &caller.scope())
        .await?
    {
        Some(t) => Ok(template_view(state, &t)),
        None => Err(unknown_template(state, caller, name)),
    }
}

/// `DELETE /v1/templates/{name}` → 204: a tenant's own private template, or (admin keys)
/// any.
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    may_change(&state, &caller, &name, "delete").await?;
    if let Some(running) = state
        .builder
        .list(&name)
        .into_iter()
        .find(|b| !b.status.is_done())
    {
        return Err(ApiError::conflict(format!(
            "template {name:?} is being built ({}): cancel the build first (DELETE /v1/templates/{name}/builds/{})",
            running.id, running.id
        )));
    }
    state.manager.delete_template(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Whether `caller` may `what` (delete, change) template `name`: a tenant its own private
/// templates, admin keys any (404 for another tenant's, as for an unknown one).
pub(crate) async fn may_change(
    state: &AppState,
    caller: &Caller,
    name: &str,
    what: &str,
) -> ApiResult<()> {
    if caller.admin {
        return Ok(());
    }
    match state.manager.template_owner(name).await? {
        Some(t) if t == caller.tenant => Ok(()),
        Some(_) => Err(unknown_template(state, caller, name)),
        None if state.manager.templates().get(name).is_none() => {
            Err(unknown_template(state, caller, name))
        }
        None => Err(ApiError::forbidden(format!(
            "this template is shared by every tenant: only an admin key may {what} it"
        ))),
    }
}

/// `GET /v1/templates/{name}/builds` → `{"builds": [...]}`, oldest first (the ones this
/// server remembers, that the caller may see).
pub async fn list_builds(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let builds: Vec<BuildView> = state
        .builder
        .list(&name)
        .into_iter()
        .filter(|b| state.build_owners.visible(&caller, &b.id))
        .collect();
    if builds.is_empty()
        && state
            .manager
            .visible_template(&name, &caller.scope())
            .await?
            .is_none()
    {
        return Err(unknown_template(&state, &caller, &name));
    }
    Ok(Json(serde_json::json!({ "builds": builds })))
}

/// The build `id` of `name`, if the caller may see it (404 otherwise, as for an unknown id).
pub(crate) fn visible_build(
    state: &AppState,
    caller: &Caller,
    name: &str,
    id: &str,
) -> ApiResult<BuildView> {
    let view = state.builder.get(name, id)?;
    if !state.build_owners.visible(caller, id) {
        return Err(ApiError::not_found(format!(
            "template {name:?} has no build {id}"
        )));
    }
    Ok(view)
}

/// `GET /v1/templates/{name}/builds/{id}`.
pub async fn get_build(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    Ok(Json(visible_build(&state, &caller, &name, &id)?))
}

/// `DELETE /v1/templates/{name}/builds/{id}` → 200 with the build: its running step is
/// killed with its sandbox and the template stays as it was (a finished build is left as
/// it is).
pub async fn cancel_build(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((name, id)): Path<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    visible_build(&state, &caller, &name, &id)?;
    Ok(Json(state.builder.cancel(&name, &id)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_secrets_come_from_repeated_or_merged_headers() {
        let mut headers = HeaderMap::new();
        headers.append(BUILD_SECRET_HEADER, "a=aGk=".parse().expect("value"));
        headers.append(BUILD_SECRET_HEADER, "b=eA==, c=".parse().expect("value"));
        let secrets = header_secrets(&headers).expect("parses");
        assert_eq!(secrets.get("a"), Some(&b"hi"[..]));
        assert_eq!(secrets.get("b"), Some(&b"x"[..]));
        assert_eq!(secrets.get("c"), Some(&b""[..]));
        let mut bad = HeaderMap::new();
        bad.append(BUILD_SECRET_HEADER, "novalue".parse().expect("value"));
        assert!(header_secrets(&bad).is_err());
        let mut bad = HeaderMap::new();
        bad.append(BUILD_SECRET_HEADER, "a/b=aGk=".parse().expect("value"));
        assert!(header_secrets(&bad).is_err());
    }

    #[test]
    fn build_queries_parse_and_bad_ones_are_told_why() {
        let q = parse_build_query(Some(
            "name=web&dockerfile=docker%2FDockerfile&target=run&no_cache=true&build_arg=A%3D1&build_arg=B=x%3Dy&cpus=1.5&memory_mib=1024",
        ))
        .expect("parses");
        assert_eq!(
            q,
            BuildQuery {
                name: "web".into(),
                dockerfile: Some("docker/Dockerfile".into()),
                target: Some("run".into()),
                no_cache: true,
                build_args: [("A".into(), "1".into()), ("B".into(), "x=y".into())].into(),
                resources: SandboxResources {
                    cpus: Some(1.5),
                    memory_mib: Some(1024),
                    disk_mib: None,
                },
                ..BuildQuery::default()
            }
        );
        let archive = parse_build_query(Some(
            "name=web&image_archive=true&image_tag=1&start=%7B%22cmd%22%3A%22httpd%22%7D&insecure_registry=reg%3A5000",
        ))
        .expect("parses");
        assert!(archive.image_archive);
        assert_eq!(archive.image_tag.as_deref(), Some("1"));
        assert_eq!(
            archive.start.map(|s| s.cmd),
            Some(Command::Shell("httpd".into()))
        );
        assert_eq!(archive.insecure_registries, ["reg:5000"]);
        let message = |raw: &str| parse_build_query(Some(raw)).expect_err("refused").message;
        assert_eq!(
            message("dockerfile=x"),
            "name= is required: the template to build (POST /v1/templates?name=NAME)"
        );
        assert_eq!(
            message("name=web&build_arg=NOVALUE"),
            "build_arg must be KEY=VALUE, got \"NOVALUE\""
        );
        assert_eq!(
            message("name=web&no_cache=maybe"),
            "no_cache must be true or false, got \"maybe\""
        );
        assert_eq!(
            message("name=web&memory_mib=lots"),
            "memory_mib must be a number from 16 to 1048576, got \"lots\""
        );
        assert_eq!(
            message("name=web&cpus=0"),
            "cpus must be a number from 0.05 to 256, got \"0\""
        );
        assert_eq!(
            message("name=web&dockerfile=/etc/passwd"),
            "dockerfile must be a relative path in the build context, got \"/etc/passwd\""
        );
        assert!(message("name=Web").starts_with("invalid template name `Web`"));
        assert!(message("name=web&tag=1").starts_with("unknown query parameter \"tag\""));
        assert!(
            message("name=web&image_tag=1").starts_with("image_tag=, start= and force= go with")
        );
        assert!(message("name=web&image_archive=1&target=x").contains("not image_archive=true"));
        assert_eq!(
            message("name=web&image_archive=1&start=%7B%22cmd%22%3A%22%20%22%7D"),
            "the start command must not be empty"
        );
        assert!(message("name=web&insecure_registry=a%2Fb").starts_with("an insecure registry is"));
    }

    #[test]
    fn bodies_are_told_apart_by_content_type() {
        let with = |ct: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(ct) = ct {
                h.insert(header::CONTENT_TYPE, ct.parse().expect("header"));
            }
            body_kind(&h).map_err(|e| e.status)
        };
        assert_eq!(
            with(Some("application/json; charset=utf-8")),
            Ok(BodyKind::Json)
        );
        assert_eq!(with(Some("application/x-tar")), Ok(BodyKind::Context));
        assert_eq!(with(Some("application/gzip")), Ok(BodyKind::Context));
        assert_eq!(with(None), Ok(BodyKind::Context));
        assert_eq!(
            with(Some("text/plain")),
            Err(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        );
    }
}
