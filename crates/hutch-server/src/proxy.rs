//! The port proxy's forwarding core, shared by the API origin (`…/ports/{port}/…`) and the
//! preview origin (`{port}-{id}.{domain}`): one HTTP/1.1 request (or an `Upgrade`) written
//! to a service inside the sandbox over the agent's stream, and its answer back.
//!
//! Both directions are cleaned here, because the service is the attacker:
//! - towards the service: hop-by-hop headers, Hutch's credentials (`Authorization: Bearer`,
//!   the `hutch_token` cookie) and any `Referer`/`Origin` that could carry a token go;
//!   service-worker script fetches are refused outright;
//! - towards the browser: `Service-Worker-Allowed` and `Clear-Site-Data` go, the service's
//!   cookies are confined to what it owns (its path prefix on the API origin, its own host on
//!   the preview origin), and `Referrer-Policy: no-referrer` with
//!   `Cross-Origin-Opener-Policy`/`Cross-Origin-Resource-Policy: same-origin` is set.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, Version};
use axum::response::Response;
use hutch_core::ids::SandboxId;
use hutch_core::PortConnection;
use hyper_util::rt::TokioIo;

use crate::browser::{self, TOKEN_PARAM};
use crate::error::{ApiError, ApiResult};
use crate::AppState;

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1), plus the proxy ones.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// What the proxy adds to `Via` both ways: clients tell the service's answers from Hutch's.
const VIA: &str = "1.1 hutch";

/// Headers set on every proxied answer, whatever the service said.
const BROWSER_POLICY: [(&str, &str); 3] = [
    // No page of the service ever tells another site (or itself) the URL it was opened at.
    ("referrer-policy", "no-referrer"),
    // No window of another origin keeps a handle on the service's pages, nor they on it.
    ("cross-origin-opener-policy", "same-origin"),
    // No other origin embeds the service's answers (`<img>`, `<script>`, no-cors fetch).
    ("cross-origin-resource-policy", "same-origin"),
];

/// Where a proxied service is served from, which decides what its cookies may claim.
#[derive(Debug, Clone, Copy)]
pub enum ServedAt<'a> {
    /// The API origin, below `prefix` (`/v1/sandboxes/{id}/ports/{port}`).
    ApiPath {
        /// The path prefix, without a trailing slash.
        prefix: &'a str,
    },
    /// The preview origin: the whole host `{port}-{id}.{domain}` is the service's.
    PreviewHost,
}

/// One request to forward: the sandbox, the port, where it is served, and the request line's
/// target as the service should see it (origin-form, credentials already taken out).
pub struct Forward<'a> {
    /// Sandbox id.
    pub id: &'a SandboxId,
    /// Port inside the sandbox.
    pub port: u16,
    /// The origin the browser sees.
    pub served_at: ServedAt<'a>,
    /// Path and query for the service.
    pub target: Uri,
    /// What ends the exchange and an upgraded connection: the revocation of the API key
    /// that opened it (`None`: a browser's sandbox token, which expires on its own).
    pub until: Option<crate::auth::Revocation>,
}

/// Forward `request` to the service and return its answer, both cleaned (see the module
/// doc). A service-worker script fetch is answered `403` and never forwarded.
pub async fn forward(state: &AppState, to: Forward<'_>, request: Request) -> ApiResult<Response> {
    if is_service_worker_fetch(request.headers()) {
        return Err(ApiError::forbidden(
            "service workers are refused on the port proxy: a worker registered here would \
             intercept every later request to this origin, other ports' and sandboxes' \
             included",
        ));
    }
    let Forward {
        id,
        port,
        served_at,
        target,
        until,
    } = to;
    let prefix = match served_at {
        ServedAt::ApiPath { prefix } => Some(prefix),
        ServedAt::PreviewHost => None,
    };
    let (upstream, client_upgrade) =
        upstream_request(request, target, port, prefix, state.scheme());
    let connection = state.manager.open_port(id, port).await?;
    let mut response = exchange(connection, upstream, id, port).await?;

    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(ApiError::bad_gateway(format!(
                "the service on port {port} switched protocols without being asked to"
            )));
        };
        let protocol = response.headers().get(header::UPGRADE).cloned();
        let service_upgrade = hyper::upgrade::on(&mut response);
        let spliced = splice(client_upgrade, service_upgrade);
        match until.clone() {
            Some(revocation) => tokio::spawn(async move {
                tokio::select! {
                    () = spliced => {}
                    () = revocation.wait() => {}
                }
            }),
            None => tokio::spawn(spliced),
        };
        strip_hop_by_hop(response.headers_mut());
        if let Some(protocol) = protocol {
            let headers = response.headers_mut();
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            headers.insert(header::UPGRADE, protocol);
        }
    } else {
        strip_hop_by_hop(response.headers_mut());
    }
    harden_response(response.headers_mut(), served_at);
    // Marks the answer as the service's own (RFC 9110 §7.6.3), as opposed to Hutch's errors.
    response
        .headers_mut()
        .append(header::VIA, HeaderValue::from_static(VIA));
    let response = response.map(Body::new);
    Ok(match until {
        Some(revocation) => crate::auth::until_revoked(response, revocation),
        None => response,
    })
}

/// Whether the browser is fetching a service worker's script (registration or update).
fn is_service_worker_fetch(headers: &HeaderMap) -> bool {
    let says = |name: &str, value: &str| {
        headers
            .get_all(name)
            .iter()
            .any(|v| v.as_bytes().eq_ignore_ascii_case(value.as_bytes()))
    };
    says("service-worker", "script") || says("sec-fetch-dest", "serviceworker")
}

/// The request as the service gets it: origin-form `target`, HTTP/1.1, headers without
/// hop-by-hop ones and Hutch's credentials, plus `Host` and `X-Forwarded-*`. Also the
/// client's pending upgrade, when it asked for one.
fn upstream_request(
    request: Request,
    target: Uri,
    port: u16,
    prefix: Option<&str>,
    scheme: &'static str,
) -> (hyper::Request<Body>, Option<hyper::upgrade::OnUpgrade>) {
    let (mut parts, body) = request.into_parts();
    let upgrade = upgrade_protocol(&parts.headers);
    let client_upgrade = upgrade
        .is_some()
        .then(|| parts.extensions.remove::<hyper::upgrade::OnUpgrade>())
        .flatten();
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let mut headers = std::mem::take(&mut parts.headers);
    let forwarded_host = headers
        .get(header::HOST)
        .cloned()
        .or_else(|| parts.uri.authority().and_then(|a| a.as_str().parse().ok()));
    strip_hop_by_hop(&mut headers);
    strip_credentials(&mut headers);
    scrub_referrers(&mut headers, forwarded_host.as_ref());
    if let Some(protocol) = upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, protocol);
    }
    set_forwarded(&mut headers, port, forwarded_host, peer, prefix, scheme);
    let mut upstream = hyper::Request::new(body);
    *upstream.method_mut() = parts.method;
    *upstream.uri_mut() = target;
    *upstream.version_mut() = Version::HTTP_11;
    *upstream.headers_mut() = headers;
    (upstream, client_upgrade)
}

/// Speak HTTP/1.1 over the connection: send the request, return the answer's head (the body
/// streams on). The connection lives until the answer (or the upgraded stream) ends.
async fn exchange(
    connection: PortConnection,
    request: hyper::Request<Body>,
    id: &str,
    port: u16,
) -> ApiResult<hyper::Response<hyper::body::Incoming>> {
    let (mut sender, driver) = hyper::client::conn::http1::handshake(TokioIo::new(connection))
        .await
        .map_err(|e| not_http(id, port, &e))?;
    tokio::spawn(async move {
        if let Err(e) = driver.with_upgrades().await {
            tracing::debug!(error = %e, "port proxy connection ended");
        }
    });
    sender
        .send_request(request)
        .await
        .map_err(|e| not_http(id, port, &e))
}

/// Join the client's and the service's upgraded connections (WebSocket and the like).
pub async fn splice(client: hyper::upgrade::OnUpgrade, service: hyper::upgrade::OnUpgrade) {
    let (client, service) = match tokio::try_join!(client, service) {
        Ok(both) => both,
        Err(e) => {
            tracing::debug!(error = %e, "port proxy upgrade failed");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut service = TokioIo::new(service);
    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut service).await {
        tracing::debug!(error = %e, "port proxy upgraded connection ended");
    }
}

fn not_http(id: &str, port: u16, e: &hyper::Error) -> ApiError {
    ApiError::bad_gateway(format!(
        "the service on port {port} in sandbox {id} did not answer with HTTP/1.1: {e}"
    ))
}

/// The protocol a request asks to upgrade to (`Connection: upgrade` + `Upgrade: …`).
pub fn upgrade_protocol(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| headers.get(header::UPGRADE).cloned())
        .flatten()
}

/// Remove hop-by-hop headers, including those named by `Connection`, and `Upgrade`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

/// Remove Hutch's credentials: the sandbox never sees the API key nor a sandbox token.
/// Hutch takes keys only as `Bearer` and tokens only as the `hutch_token` cookie, so other
/// schemes (`Basic` for the app) and the app's own cookies pass.
fn strip_credentials(headers: &mut HeaderMap) {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes().starts_with(b"Bearer "));
    if bearer {
        headers.remove(header::AUTHORIZATION);
    }
    let cookies: Vec<String> = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .map(str::trim)
        .filter(|c| !c.is_empty() && !browser::is_token_cookie(c))
        .map(str::to_string)
        .collect();
    headers.remove(header::COOKIE);
    if !cookies.is_empty() {
        if let Ok(value) = HeaderValue::from_str(&cookies.join("; ")) {
            headers.insert(header::COOKIE, value);
        }
    }
}

/// `Referer` and `Origin` never carry a credential to the service: one that mentions
/// `hutch_token` or holds a sandbox token goes whole, and a `Referer` from this same origin
/// (`host`) loses its query and fragment.
fn scrub_referrers(headers: &mut HeaderMap, host: Option<&HeaderValue>) {
    for name in [header::REFERER, header::ORIGIN] {
        let carries = headers
            .get_all(&name)
            .iter()
            .any(|v| browser::carries_credential(v.as_bytes()));
        if carries {
            headers.remove(&name);
        }
    }
    let Some(referer) = headers.get(header::REFERER).and_then(|v| v.to_str().ok()) else {
        return;
    };
    let same_origin = host
        .and_then(|h| h.to_str().ok())
        .zip(referer.split_once("://"))
        .is_some_and(|(host, (_, rest))| {
            rest.split(['/', '?', '#'])
                .next()
                .is_some_and(|a| a.eq_ignore_ascii_case(host))
        });
    if same_origin {
        let bare = referer.split(['?', '#']).next().unwrap_or_default();
        match HeaderValue::from_str(bare) {
            Ok(v) => {
                headers.insert(header::REFERER, v);
            }
            Err(_) => {
                headers.remove(header::REFERER);
            }
        }
    }
}

/// `Host` as the service expects it on loopback, and `X-Forwarded-*` for what it cannot see.
fn set_forwarded(
    headers: &mut HeaderMap,
    port: u16,
    host: Option<HeaderValue>,
    peer: Option<std::net::IpAddr>,
    prefix: Option<&str>,
    scheme: &'static str,
) {
    if let Ok(value) = HeaderValue::from_str(&format!("localhost:{port}")) {
        headers.insert(header::HOST, value);
    }
    if let Some(host) = host {
        headers.insert("x-forwarded-host", host);
    }
    if !headers.contains_key("x-forwarded-proto") {
        headers.insert("x-forwarded-proto", HeaderValue::from_static(scheme));
    }
    if let Some(peer) = peer {
        let chain = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
            Some(earlier) => format!("{earlier}, {peer}"),
            None => peer.to_string(),
        };
        if let Ok(value) = HeaderValue::from_str(&chain) {
            headers.insert("x-forwarded-for", value);
        }
    }
    match prefix.map(HeaderValue::from_str) {
        Some(Ok(value)) => {
            headers.insert("x-forwarded-prefix", value);
        }
        _ => {
            headers.remove("x-forwarded-prefix");
        }
    }
    headers.append(header::VIA, HeaderValue::from_static(VIA));
}

/// Clean the service's answer for a browser (see the module doc).
fn harden_response(headers: &mut HeaderMap, served_at: ServedAt<'_>) {
    headers.remove("service-worker-allowed");
    if matches!(served_at, ServedAt::ApiPath { .. }) {
        // It would wipe the cookies of every port and sandbox sharing the API origin.
        headers.remove("clear-site-data");
    }
    for (name, value) in BROWSER_POLICY {
        headers.insert(name, HeaderValue::from_static(value));
    }
    let cookies: Vec<HeaderValue> = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|c| confine_cookie(c, served_at))
        .filter_map(|c| HeaderValue::from_str(&c).ok())
        .collect();
    headers.remove(header::SET_COOKIE);
    for c in cookies {
        headers.append(header::SET_COOKIE, c);
    }
}

/// One `Set-Cookie` of the service, kept to what the service owns; `None` drops it.
///
/// Cookies named `hutch_token` are Hutch's and dropped. `Domain` is dropped (the cookie stays
/// host-only, so no sandbox plants cookies on the API's or another preview's host). On the
/// API origin the path is translated into the service's prefix: the service sees itself at
/// `/`, so its `Path=/x` is `{prefix}/x` (a path already under the prefix is kept).
fn confine_cookie(set_cookie: &str, served_at: ServedAt<'_>) -> Option<String> {
    let mut parts = set_cookie.split(';');
    let pair = parts.next()?.trim();
    let name = pair.split_once('=').map_or(pair, |(n, _)| n).trim();
    if name.is_empty() || name == TOKEN_PARAM {
        return None;
    }
    let mut kept = vec![pair.to_string()];
    let mut path = None;
    for attr in parts.map(str::trim).filter(|a| !a.is_empty()) {
        let key = attr.split_once('=').map_or(attr, |(k, _)| k).trim();
        if key.eq_ignore_ascii_case("domain") {
            continue;
        }
        if key.eq_ignore_ascii_case("path") {
            path = attr.split_once('=').map(|(_, v)| v.trim().to_string());
            continue;
        }
        kept.push(attr.to_string());
    }
    match served_at {
        ServedAt::ApiPath { prefix } => {
            let inside = format!("{prefix}/");
            let path = match path.filter(|p| p.starts_with('/')) {
                Some(p) if p.starts_with(&inside) => p,
                Some(p) => format!("{prefix}{p}"),
                None => inside,
            };
            kept.push(format!("Path={path}"));
        }
        ServedAt::PreviewHost => {
            if let Some(p) = path {
                kept.push(format!("Path={p}"));
            }
        }
    }
    Some(kept.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const API: ServedAt<'static> = ServedAt::ApiPath {
        prefix: "/v1/sandboxes/sbx_1/ports/80",
    };

    #[test]
    fn credentials_and_hop_by_hop_headers_are_not_forwarded() {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer secret"),
        );
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; hutch_token=secret; b=2"),
        );
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert("x-app", HeaderValue::from_static("kept"));
        strip_hop_by_hop(&mut h);
        strip_credentials(&mut h);
        assert!(h.get(header::AUTHORIZATION).is_none());
        assert_eq!(
            h.get(header::COOKIE).map(|v| v.as_bytes()),
            Some(&b"a=1; b=2"[..])
        );
        assert!(h.get("x-private").is_none() && h.get(header::TE).is_none());
        assert!(h.get(header::CONNECTION).is_none());
        assert_eq!(h.get("x-app").map(|v| v.as_bytes()), Some(&b"kept"[..]));
    }

    #[test]
    fn referrers_never_carry_a_token() {
        let host = HeaderValue::from_static("127.0.0.1:7700");
        let scrub = |referer: &str, origin: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::REFERER, HeaderValue::from_str(referer).expect("v"));
            h.insert(header::ORIGIN, HeaderValue::from_str(origin).expect("v"));
            scrub_referrers(&mut h, Some(&host));
            (
                h.get(header::REFERER)
                    .map(|v| v.to_str().expect("ascii").to_string()),
                h.get(header::ORIGIN).is_some(),
            )
        };
        let (referer, _) = scrub(
            "http://127.0.0.1:7700/v1/sandboxes/sbx_1/ports/80/?hutch_token=hk_x",
            "http://127.0.0.1:7700",
        );
        assert_eq!(referer, None);
        let (referer, _) = scrub("http://elsewhere/?t=hst1.abc.def", "null");
        assert_eq!(referer, None);
        let (referer, origin) = scrub(
            "http://127.0.0.1:7700/v1/sandboxes/sbx_1/ports/80/a?q=1#f",
            "http://127.0.0.1:7700",
        );
        assert_eq!(
            referer.as_deref(),
            Some("http://127.0.0.1:7700/v1/sandboxes/sbx_1/ports/80/a")
        );
        assert!(origin);
        let (referer, _) = scrub("https://docs.example/page?q=1", "null");
        assert_eq!(referer.as_deref(), Some("https://docs.example/page?q=1"));
    }

    #[test]
    fn service_worker_script_fetches_are_recognised() {
        let mut h = HeaderMap::new();
        assert!(!is_service_worker_fetch(&h));
        h.insert("service-worker", HeaderValue::from_static("script"));
        assert!(is_service_worker_fetch(&h));
        let mut h = HeaderMap::new();
        h.insert("sec-fetch-dest", HeaderValue::from_static("serviceworker"));
        assert!(is_service_worker_fetch(&h));
    }

    #[test]
    fn answers_lose_worker_scope_and_gain_the_browser_policy() {
        let mut h = HeaderMap::new();
        h.insert("service-worker-allowed", HeaderValue::from_static("/"));
        h.insert("clear-site-data", HeaderValue::from_static("\"cookies\""));
        h.insert("referrer-policy", HeaderValue::from_static("unsafe-url"));
        harden_response(&mut h, API);
        assert!(h.get("service-worker-allowed").is_none());
        assert!(h.get("clear-site-data").is_none());
        assert_eq!(h["referrer-policy"], "no-referrer");
        assert_eq!(h["cross-origin-opener-policy"], "same-origin");
        assert_eq!(h["cross-origin-resource-policy"], "same-origin");
    }

    #[test]
    fn service_cookies_stay_inside_what_the_service_owns() {
        let c = |s: &str, at| confine_cookie(s, at);
        assert_eq!(
            c("evil=1; Path=/; Domain=127.0.0.1; HttpOnly", API).as_deref(),
            Some("evil=1; HttpOnly; Path=/v1/sandboxes/sbx_1/ports/80/")
        );
        assert_eq!(
            c("a=1; path=/app", API).as_deref(),
            Some("a=1; Path=/v1/sandboxes/sbx_1/ports/80/app")
        );
        assert_eq!(
            c("a=1; Path=/v1/sandboxes/sbx_1/ports/80/x", API).as_deref(),
            Some("a=1; Path=/v1/sandboxes/sbx_1/ports/80/x")
        );
        assert_eq!(
            c("a=1", API).as_deref(),
            Some("a=1; Path=/v1/sandboxes/sbx_1/ports/80/")
        );
        assert_eq!(c("hutch_token=x; Path=/", API), None);
        assert_eq!(c("hutch_token=x", ServedAt::PreviewHost), None);
        assert_eq!(
            c("a=1; Domain=localhost; Path=/", ServedAt::PreviewHost).as_deref(),
            Some("a=1; Path=/")
        );
    }

    #[test]
    fn upgrades_are_recognised() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert_eq!(
            upgrade_protocol(&h),
            Some(HeaderValue::from_static("websocket"))
        );
        h.remove(header::CONNECTION);
        assert_eq!(upgrade_protocol(&h), None);
    }
}
