//! Who is calling and what they may do: every `/v1/` route behind [`require_auth`] runs its
//! handler only after these checks, in this order, all in this one middleware:
//!
//! 1. **Authentication**: `Authorization: Bearer <key>` ([`AppState::authenticate`]): an
//!    unknown, revoked or expired key is 401. An admin key may act for one tenant with
//!    `X-Hutch-Tenant: NAME` (it then sees and makes only that tenant's records).
//! 2. **Permission**: each route needs a [`Permission`] ([`required_permission`], from the
//!    route's template and method); a key whose scope lacks it is 403. A new route gets
//!    `Read` for `GET` and `Manage` for anything else unless listed.
//! 3. **The sandbox of the path**: on every route under `/v1/sandboxes/{id}`, the id is
//!    parsed and checked against the caller's tenant and selector before the handler runs
//!    (another tenant's sandbox is 404 with the words of an unknown one). The handler takes
//!    the checked id as an [`AuthorizedSandbox`]; a route under that path cannot skip the
//!    check, whatever its handler extracts.
//! 4. **Revocation**: the request, and the body of its answer (SSE, downloads), end when
//!    the key is revoked or expires; WebSocket bridges wait on [`Caller::revoked`] too.
//! 5. **Audit**: a call that changes something, or opens a terminal or tunnel, is noted in
//!    the audit log when it ends (`audit.rs`; written in batches by the manager).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hutch_core::ids::SandboxId;
use hutch_core::tenant::keys::{KeyRecord, Permission};
use hutch_core::tenant::{Tenant, TenantScope};
use hutch_core::CoreError;
use tokio::sync::watch;

use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// The header an admin key names the tenant it acts for with.
pub const TENANT_HEADER: &str = "x-hutch-tenant";

/// What ends a key's requests and streams: its revocation, or its expiry.
#[derive(Debug, Clone)]
pub struct Revocation {
    rx: watch::Receiver<bool>,
    expires_at_ms: Option<i64>,
}

impl Revocation {
    /// Resolves when the key is revoked or expires (never, for a key that does neither).
    pub async fn wait(mut self) {
        let expiry = async {
            match self.expires_at_ms {
                Some(at) => {
                    let left = at.saturating_sub(hutch_core::time::now_ms());
                    let left = u64::try_from(left).unwrap_or(0);
                    tokio::time::sleep(std::time::Duration::from_millis(left)).await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        let revoked = async {
            // A closed channel is a key whose channel went: treat as revoked.
            let _ = self.rx.wait_for(|revoked| *revoked).await;
        };
        tokio::select! {
            () = expiry => {}
            () = revoked => {}
        }
    }
}

/// The authenticated caller, placed in request extensions by [`require_auth`].
#[derive(Debug, Clone)]
pub struct Caller {
    /// The tenant this request acts for: the key's, or the one an admin key names in
    /// `X-Hutch-Tenant` (an admin key acting for no tenant: `admin`).
    pub tenant: Tenant,
    /// Whether the request sees every tenant's records: an admin key not acting for one.
    pub admin: bool,
    /// The key.
    pub key: Arc<KeyRecord>,
    revocation: Revocation,
}

impl Caller {
    /// Whose records this caller may see: its tenant's, or every tenant's for an admin key.
    pub fn scope(&self) -> TenantScope {
        TenantScope::of(&self.tenant, self.admin)
    }

    /// The tenant what this caller makes belongs to (`None`: an admin's, of no tenant).
    pub fn owner(&self) -> Option<Tenant> {
        (!self.admin).then(|| self.tenant.clone())
    }

    /// Whether the key has permission `p`.
    pub fn permits(&self, p: Permission) -> bool {
        self.key.scope.allows(p)
    }

    /// Resolves when the key is revoked or expires: a stream or WebSocket of this caller
    /// ends then.
    pub fn revoked(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.revocation.clone().wait()
    }

    /// What ends this caller's streams.
    pub fn revocation(&self) -> Revocation {
        self.revocation.clone()
    }

    /// Whether a sandbox with `metadata` is within the key's selector.
    pub fn selects(&self, metadata: &std::collections::BTreeMap<String, String>) -> bool {
        self.key.selects(metadata)
    }
}

/// A sandbox the caller may reach, checked by [`require_auth`] from the route's `{id}`
/// before the handler runs. Handlers of routes under `/v1/sandboxes/{id}` take it instead
/// of the raw path parameter.
#[derive(Debug, Clone)]
pub struct AuthorizedSandbox {
    /// The sandbox.
    pub id: SandboxId,
}

impl<S: Send + Sync> FromRequestParts<S> for AuthorizedSandbox {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Self>().cloned().ok_or_else(|| {
            ApiError::from(CoreError::Internal(
                "this route is not under /v1/sandboxes/{id}, where sandboxes are checked".into(),
            ))
        })
    }
}

/// The permission a route needs, from its template (`/v1/sandboxes/{id}/exec`) and method:
/// reading is `Read`; exec, terminals, file writes, code and ports on existing sandboxes
/// are `Use`; tenants are `Admin`; everything else that is not a `GET` is `Manage`.
pub fn required_permission(method: &Method, route: &str) -> Permission {
    const USE: [&str; 19] = [
        "/v1/sandboxes/{id}/processes",
        "/v1/sandboxes/{id}/processes/{process}",
        "/v1/sandboxes/{id}/processes/{process}/stdin",
        "/v1/sandboxes/{id}/processes/{process}/close-stdin",
        "/v1/sandboxes/{id}/processes/{process}/signal",
        "/v1/sandboxes/{id}/processes/{process}/resize",
        "/v1/sandboxes/{id}/files/watchers",
        "/v1/sandboxes/{id}/files/watchers/{wid}",
        "/v1/sandboxes/{id}/files/url",
        "/v1/sandboxes/{id}/exec",
        "/v1/sandboxes/{id}/exec/stream",
        "/v1/sandboxes/{id}/code",
        "/v1/sandboxes/{id}/contexts",
        "/v1/sandboxes/{id}/contexts/{cid}",
        "/v1/sandboxes/{id}/contexts/{cid}/restart",
        "/v1/sandboxes/{id}/files",
        "/v1/sandboxes/{id}/files/archive",
        "/v1/sandboxes/{id}/files/mkdir",
        "/v1/sandboxes/{id}/files/move",
    ];
    const USE_ANY_METHOD: [&str; 3] = [
        "/v1/sandboxes/{id}/pty",
        "/v1/sandboxes/{id}/tunnel/{port}",
        "/v1/sandboxes/{id}/port-tokens",
    ];
    if route == "/v1/tenants" || route.starts_with("/v1/tenants/") {
        return Permission::Admin;
    }
    // The step cache is the server's, every tenant's builds' (`routes::build_cache`).
    if route == "/v1/build-cache" || route.starts_with("/v1/build-cache/") {
        return Permission::Admin;
    }
    if route == "/v1/keys" || route.starts_with("/v1/keys/") || route == "/v1/audit" {
        return Permission::Manage;
    }
    if USE_ANY_METHOD.contains(&route) || route.starts_with("/v1/sandboxes/{id}/ports/") {
        return Permission::Use;
    }
    if method == Method::GET || method == Method::HEAD {
        return Permission::Read;
    }
    if USE.contains(&route) {
        return Permission::Use;
    }
    Permission::Manage
}

fn permission_words(p: Permission) -> &'static str {
    match p {
        Permission::Read => "read",
        Permission::Use => "exec, files, terminals, code and ports on existing sandboxes",
        Permission::Manage => {
            "creating, changing and deleting sandboxes, snapshots, volumes, templates and keys"
        }
        Permission::Admin => "the server's administration (tenants, the build cache)",
    }
}

/// The bearer key of a request.
pub(crate) fn bearer_key(headers: &HeaderMap) -> Option<String> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|s| s.trim().to_string())
}

impl AppState {
    /// Authenticate an API key (its secret, as a client sent it) into the [`Caller`] it
    /// is: 401 for an unknown, revoked or expired key or a sandbox token. Checked keys are
    /// cached for a few seconds (`key_cache.rs`); revoking a key through this server
    /// evicts it at once. This is what every route's middleware calls; another front end
    /// (an `X-API-Key` header, say) calls it the same way.
    pub async fn authenticate(&self, secret: &str) -> Result<Caller, ApiError> {
        if secret.starts_with(hutch_core::sandbox_token::TOKEN_PREFIX) {
            return Err(ApiError::unauthorized(
                "a sandbox token opens only its sandbox's port in a browser; API calls take the \
                 API key",
            ));
        }
        let now_ms = hutch_core::time::now_ms();
        let cached =
            self.keys
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(secret, Instant::now(), now_ms);
        let key = match cached {
            Some(k) => k,
            None => {
                let mut checked = true;
                let found = match self.manager.authenticate(secret).await {
                    Ok(found) => found,
                    // The database is gone for now: a key seen lately is still believed.
                    Err(e @ hutch_core::CoreError::StoreUnavailable(_)) => {
                        let stale = self
                            .keys
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_while_unreachable(secret, Instant::now(), now_ms);
                        match stale {
                            Some(record) => {
                                // Not checked now: its time in the cache stays when it was.
                                checked = false;
                                Some((*record).clone())
                            }
                            None => return Err(e.into()),
                        }
                    }
                    Err(e) => return Err(e.into()),
                };
                let Some(record) = found else {
                    return Err(ApiError::unauthorized("invalid API key"));
                };
                let record = Arc::new(record);
                if checked && !record.expired(now_ms) {
                    self.keys.lock().unwrap_or_else(|p| p.into_inner()).insert(
                        secret,
                        record.clone(),
                        Instant::now(),
                    );
                }
                record
            }
        };
        if key.expired(now_ms) {
            return Err(ApiError::unauthorized(format!(
                "API key {} expired at {}",
                key.id,
                key.expires_at_ms
                    .map(hutch_core::time::rfc3339)
                    .unwrap_or_default()
            )));
        }
        self.manager.note_key_use(&key.id);
        Ok(Caller {
            tenant: key.tenant.clone(),
            admin: key.is_admin(),
            revocation: Revocation {
                rx: self.revocations.watch(&key.id),
                expires_at_ms: key.expires_at_ms,
            },
            key,
        })
    }

    /// [`AppState::authenticate`], then the tenant an admin key acts for (`X-Hutch-Tenant`;
    /// it must exist). A tenant's key naming another tenant is 403.
    pub async fn caller(&self, secret: &str, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let mut caller = self.authenticate(secret).await?;
        let Some(named) = headers.get(TENANT_HEADER) else {
            return Ok(caller);
        };
        let named = named
            .to_str()
            .map_err(|_| ApiError::bad_request("X-Hutch-Tenant must be a tenant name"))?
            .trim();
        if !caller.key.is_admin() {
            if named == caller.tenant.as_str() {
                return Ok(caller);
            }
            return Err(ApiError::forbidden(
                "only admin keys act for another tenant (X-Hutch-Tenant)",
            ));
        }
        let tenant = Tenant::new(named);
        match self.manager.tenant(&tenant).await {
            Ok(_) => {}
            Err(CoreError::NotFound(_)) => {
                return Err(ApiError::bad_request(format!(
                    "X-Hutch-Tenant names tenant {named:?}, which does not exist"
                )))
            }
            Err(e) => return Err(e.into()),
        }
        caller.tenant = tenant;
        caller.admin = false;
        Ok(caller)
    }

    /// Revoke keys `ids` in this server: evicted from the cache and every request, stream
    /// and WebSocket of theirs ended.
    pub fn keys_revoked(&self, ids: &[hutch_core::ids::KeyId]) {
        self.keys
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .evict(ids);
        self.revocations.revoke(ids);
    }
}

/// Check the caller may reach the sandbox `raw` names (404 otherwise, with the same words
/// as for an unknown id, so ids do not leak across tenants or selectors): one indexed
/// lookup by id and tenant. A malformed id is answered as an unknown one.
pub async fn authorize_sandbox(
    state: &AppState,
    caller: &Caller,
    raw: &str,
) -> ApiResult<SandboxId> {
    let id: SandboxId = raw.parse().map_err(CoreError::from)?;
    if caller.admin {
        return Ok(id);
    }
    let record = state.manager.authorize(&id, &caller.scope()).await?;
    if !caller.selects(&record.metadata) {
        return Err(CoreError::NotFound(format!("sandbox {id} does not exist")).into());
    }
    Ok(id)
}

/// Middleware: the checks of the module docs, on every `/v1/` route behind it. Keys are
/// taken only from the `Authorization` header: never from a URL or a cookie (the port
/// proxy's browser tokens are checked by the proxy itself and authenticate nothing else).
pub async fn require_auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    match authorized(&state, req).await {
        Ok((req, caller)) => {
            let method = req.method().clone();
            let path = req.uri().path().to_string();
            let route = req
                .extensions()
                .get::<MatchedPath>()
                .map(|m| m.as_str().to_string())
                .unwrap_or_default();
            let sandbox = req
                .extensions()
                .get::<AuthorizedSandbox>()
                .map(|s| s.id.clone());
            let revoked = caller.revoked();
            let (response, cut) = tokio::select! {
                response = next.run(req) => (response, false),
                () = revoked => (
                    ApiError::unauthorized("the API key was revoked or expired").into_response(),
                    true,
                ),
            };
            if crate::audit::audited(&method, &route) {
                let argv = response.extensions().get::<crate::audit::AuditArgv>();
                state.manager.record_audit(crate::audit::entry(
                    &caller,
                    &method,
                    &route,
                    &path,
                    sandbox,
                    argv,
                    response.status().as_u16(),
                ));
            }
            if cut {
                return response;
            }
            until_revoked(response, caller.revocation())
        }
        Err(e) => e.into_response(),
    }
}

/// `response` with a body that ends (with an error) when `revocation` fires: an SSE
/// stream, a download or a proxied answer of a revoked key stops there.
pub(crate) fn until_revoked(response: Response, revocation: Revocation) -> Response {
    let (parts, body) = response.into_parts();
    Response::from_parts(
        parts,
        Body::new(RevocableBody {
            inner: body,
            revoked: Box::pin(revocation.wait()),
        }),
    )
}

/// Middleware of `GET`/`PUT /v1/sandboxes/{id}/files`: a request without an
/// `Authorization` header that carries a `signature` query parameter goes on without a
/// [`Caller`], for the handler to check the signed URL (`routes/files_url.rs`); every other
/// request is [`require_auth`]'s.
pub async fn require_auth_or_signed_url(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let signed = matches!(
        *req.method(),
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::PUT
    ) && !req
        .headers()
        .contains_key(axum::http::header::AUTHORIZATION)
        && req.uri().query().is_some_and(|q| {
            q.split('&')
                .any(|pair| pair.split('=').next() == Some("signature"))
        });
    if signed {
        return next.run(req).await;
    }
    require_auth(State(state), req, next).await
}

/// Steps 1–3 of the module docs; the request with the caller (and the checked sandbox) in
/// its extensions.
async fn authorized(state: &AppState, req: Request) -> ApiResult<(Request, Caller)> {
    let Some(key) = bearer_key(req.headers()) else {
        return Err(ApiError::unauthorized(
            "missing `Authorization: Bearer <key>` header",
        ));
    };
    let caller = state.caller(&key, req.headers()).await?;
    let (mut parts, body) = req.into_parts();
    let route = parts
        .extensions
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_default();
    let needed = required_permission(&parts.method, &route);
    if !caller.permits(needed) {
        return Err(ApiError::forbidden(format!(
            "this {} key may not do this: {} {route} needs a key allowed {}",
            caller.key.scope.as_str(),
            parts.method,
            permission_words(needed)
        )));
    }
    if route.starts_with("/v1/sandboxes/{id}") {
        let params = RawPathParams::from_request_parts(&mut parts, state)
            .await
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let raw: HashMap<&str, &str> = params.iter().collect();
        let id = authorize_sandbox(state, &caller, raw.get("id").copied().unwrap_or("")).await?;
        parts.extensions.insert(AuthorizedSandbox { id });
    }
    // A known client's connection is evicted only after every stranger's.
    if let Some(conn) = parts
        .extensions
        .get::<crate::serve::connections::ConnectionHandle>()
    {
        conn.mark_authenticated();
    }
    parts.extensions.insert(caller.clone());
    Ok((Request::from_parts(parts, body), caller))
}

/// An answer's body that ends with an error when its key is revoked or expires.
struct RevocableBody {
    inner: Body,
    revoked: Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

impl http_body::Body for RevocableBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if self.revoked.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(axum::Error::new(std::io::Error::other(
                "the API key was revoked or expired",
            )))));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_route_needs_the_permission_its_effect_asks() {
        use Permission::*;
        let cases = [
            (Method::GET, "/v1/sandboxes", Read),
            (Method::POST, "/v1/sandboxes", Manage),
            (Method::GET, "/v1/sandboxes/{id}/files", Read),
            (Method::PUT, "/v1/sandboxes/{id}/files", Use),
            (Method::DELETE, "/v1/sandboxes/{id}/files", Use),
            (Method::POST, "/v1/sandboxes/{id}/exec", Use),
            (Method::GET, "/v1/sandboxes/{id}/files/watch", Read),
            (Method::POST, "/v1/sandboxes/{id}/files/watchers", Use),
            (
                Method::DELETE,
                "/v1/sandboxes/{id}/files/watchers/{wid}",
                Use,
            ),
            (Method::POST, "/v1/sandboxes/{id}/files/url", Use),
            (Method::GET, "/v1/sandboxes/{id}/pty", Use),
            (Method::GET, "/v1/sandboxes/{id}/tunnel/{port}", Use),
            (Method::GET, "/v1/sandboxes/{id}/ports/{port}/{*path}", Use),
            (Method::POST, "/v1/sandboxes/{id}/pause", Manage),
            (Method::DELETE, "/v1/sandboxes/{id}", Manage),
            (Method::POST, "/v1/sandboxes/{id}/fork", Manage),
            (Method::POST, "/v1/volumes", Manage),
            (Method::GET, "/v1/keys", Manage),
            (Method::POST, "/v1/tenants", Admin),
            (Method::GET, "/v1/tenants/{name}", Admin),
            (Method::GET, "/v1/events", Read),
            // A route nobody listed: reading is Read, anything else Manage.
            (Method::GET, "/v1/sandboxes/{id}/future", Read),
            (Method::POST, "/v1/sandboxes/{id}/future", Manage),
        ];
        for (method, route, want) in cases {
            assert_eq!(
                required_permission(&method, route),
                want,
                "{method} {route}"
            );
        }
    }
}
