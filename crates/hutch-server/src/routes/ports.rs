//! Port forwarding (see `docs/ports.md`).
//!
//! - `ANY /v1/sandboxes/{id}/ports/{port}/{path…}` proxies one HTTP/1.1 request (or a
//!   WebSocket, or any other `Upgrade`) to a service listening on `port` inside the sandbox.
//! - `GET /v1/sandboxes/{id}/tunnel/{port}` is a WebSocket whose binary messages carry the
//!   raw bytes of one TCP connection to that port (`hutch port-forward`).
//!
//! Both reach the service through the sandbox's agent ([`hutch_core::Manager::open_port`]):
//! the server never dials a sandbox address, and the agent dials only the sandbox's own
//! loopback. Each proxied request gets its own connection inside the sandbox.

use std::collections::HashMap;
use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, Version};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hutch_core::PortConnection;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::sandboxes::authorize;
use crate::error::{ApiError, ApiResult};
use crate::extract::{is_token_shaped, Caller, TOKEN_PARAM};
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

/// Largest chunk the raw tunnel puts in one WebSocket message.
const TUNNEL_CHUNK: usize = 64 << 10;

/// Largest WebSocket message a tunnel client may send (it is held in memory whole; clients
/// send chunks, `hutch port-forward` at most 64 KiB).
const MAX_TUNNEL_MESSAGE: usize = 1 << 20;
/// How long the tunnel waits for the client's answer to its Close.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// `{id}`, `{port}` and, for the long form, `{*path}`.
type PortParams = Path<HashMap<String, String>>;

/// `ANY /v1/sandboxes/{id}/ports/{port}` (redirects to the trailing-slash form, so relative
/// links of the app resolve under it), `…/ports/{port}/` and `…/ports/{port}/{path…}`.
pub async fn proxy(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(params): PortParams,
    request: Request,
) -> ApiResult<Response> {
    let id = params.get("id").map(String::as_str).unwrap_or_default();
    let raw_port = params.get("port").map(String::as_str).unwrap_or_default();
    authorize(&state, &caller, id)?;
    let port = hutch_core::manager::parse_port(raw_port)?;
    let prefix = format!("/v1/sandboxes/{id}/ports/{raw_port}");
    let rest = path_in_service(request.uri().path());
    if rest.is_empty() {
        let location = match request.uri().query() {
            Some(q) => format!("{prefix}/?{q}"),
            None => format!("{prefix}/"),
        };
        return Ok((
            StatusCode::PERMANENT_REDIRECT,
            [(header::LOCATION, location)],
        )
            .into_response());
    }
    let (query, token) = split_token(request.uri().query());
    let target: Uri = match &query {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_string(),
    }
    .parse()
    .map_err(|e| ApiError::bad_request(format!("invalid path for the port proxy: {e}")))?;
    let (upstream, client_upgrade) = upstream_request(request, target, port, &prefix);

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
        tokio::spawn(splice(client_upgrade, service_upgrade));
        strip_hop_by_hop(response.headers_mut());
        if let Some(protocol) = protocol {
            let headers = response.headers_mut();
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            headers.insert(header::UPGRADE, protocol);
        }
    } else {
        strip_hop_by_hop(response.headers_mut());
    }
    // Marks the answer as the service's own (RFC 9110 §7.6.3), as opposed to Hutch's errors.
    response
        .headers_mut()
        .append(header::VIA, HeaderValue::from_static(VIA));
    let mut response = response.map(Body::new);
    if let Some(token) = token.filter(|t| is_token_shaped(t)) {
        // A browser that came with `?hutch_token=` keeps the key for this port's pages
        // (scripts cannot read it; other paths never get it).
        let cookie = format!("{TOKEN_PARAM}={token}; Path={prefix}/; HttpOnly; SameSite=Strict");
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().append(header::SET_COOKIE, value);
        }
    }
    Ok(response)
}

/// The request as the service gets it: origin-form `target`, HTTP/1.1, headers without
/// hop-by-hop ones and Hutch's credentials, plus `Host` and `X-Forwarded-*`. Also the
/// client's pending upgrade, when it asked for one.
fn upstream_request(
    request: Request,
    target: Uri,
    port: u16,
    prefix: &str,
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
    if let Some(protocol) = upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, protocol);
    }
    set_forwarded(&mut headers, port, forwarded_host, peer, prefix);
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

/// `GET /v1/sandboxes/{id}/tunnel/{port}` → WebSocket carrying one raw TCP connection.
///
/// Binary messages carry bytes both ways. The text message `{"type": "eof"}` from the client
/// ends its direction (the service reads end of file). When the service closes its side,
/// the server closes the WebSocket.
pub async fn tunnel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(params): PortParams,
    ws: WebSocketUpgrade,
) -> ApiResult<Response> {
    let id = params.get("id").map(String::as_str).unwrap_or_default();
    let raw_port = params.get("port").map(String::as_str).unwrap_or_default();
    authorize(&state, &caller, id)?;
    let port = hutch_core::manager::parse_port(raw_port)?;
    // Connect before upgrading, so nothing listening is an ordinary 502.
    let connection = state.manager.open_port(id, port).await?;
    Ok(ws
        .max_message_size(MAX_TUNNEL_MESSAGE)
        .max_frame_size(MAX_TUNNEL_MESSAGE)
        .on_upgrade(move |socket| bridge(socket, connection)))
}

async fn bridge(socket: WebSocket, connection: PortConnection) {
    let (mut ws_tx, mut ws_rx) = socket.split();
    let (mut from_service, mut to_service) = tokio::io::split(connection);
    let inbound = async move {
        while let Some(message) = ws_rx.next().await {
            match message {
                Ok(Message::Binary(data)) => {
                    if to_service.write_all(&data).await.is_err() {
                        break;
                    }
                }
                Ok(Message::Text(text)) if is_eof(text.as_str()) => {
                    let _ = to_service.shutdown().await;
                }
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    let outbound = async move {
        let mut buf = vec![0u8; TUNNEL_CHUNK];
        loop {
            match from_service.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = Bytes::copy_from_slice(&buf[..n]);
                    if ws_tx.send(Message::Binary(chunk)).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = ws_tx.send(Message::Close(None)).await;
    };
    // The client closing ends the tunnel (dropping the connection closes it in the
    // sandbox). The service closing sent a Close: give the client a moment to answer it, so
    // the WebSocket ends cleanly instead of with a reset.
    tokio::pin!(inbound, outbound);
    tokio::select! {
        () = &mut inbound => {}
        () = &mut outbound => {
            let _ = tokio::time::timeout(CLOSE_GRACE, inbound).await;
        }
    }
}

fn is_eof(text: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(text)
        .map(|v| v["type"] == "eof")
        .unwrap_or(false)
}

/// Join the client's and the service's upgraded connections (WebSocket and the like).
async fn splice(client: hyper::upgrade::OnUpgrade, service: hyper::upgrade::OnUpgrade) {
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
fn upgrade_protocol(headers: &HeaderMap) -> Option<HeaderValue> {
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
fn strip_hop_by_hop(headers: &mut HeaderMap) {
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

/// Remove Hutch's credentials: the sandbox never sees the API key. Hutch takes keys only
/// as `Bearer` (or the `hutch_token` cookie), so other schemes (`Basic` for the app) pass.
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
        .filter(|c| !c.is_empty() && !is_token_cookie(c))
        .map(str::to_string)
        .collect();
    headers.remove(header::COOKIE);
    if !cookies.is_empty() {
        if let Ok(value) = HeaderValue::from_str(&cookies.join("; ")) {
            headers.insert(header::COOKIE, value);
        }
    }
}

fn is_token_cookie(cookie: &str) -> bool {
    cookie
        .split_once('=')
        .is_some_and(|(name, _)| name.trim() == TOKEN_PARAM)
}

/// `Host` as the service expects it on loopback, and `X-Forwarded-*` for what it cannot see.
fn set_forwarded(
    headers: &mut HeaderMap,
    port: u16,
    host: Option<HeaderValue>,
    peer: Option<std::net::IpAddr>,
    prefix: &str,
) {
    if let Ok(value) = HeaderValue::from_str(&format!("localhost:{port}")) {
        headers.insert(header::HOST, value);
    }
    if let Some(host) = host {
        headers.insert("x-forwarded-host", host);
    }
    if !headers.contains_key("x-forwarded-proto") {
        headers.insert("x-forwarded-proto", HeaderValue::from_static("http"));
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
    if let Ok(value) = HeaderValue::from_str(prefix) {
        headers.insert("x-forwarded-prefix", value);
    }
    headers.append(header::VIA, HeaderValue::from_static(VIA));
}

/// The request path below `/v1/sandboxes/{id}/ports/{port}`, as the client sent it (still
/// percent-encoded): `""` for the bare form, else starting with `/`.
fn path_in_service(path: &str) -> &str {
    // "", "v1", "sandboxes", id, "ports", port: six segments before the service's path.
    let mut cut = 0;
    for _ in 0..6 {
        match path[cut..].find('/') {
            Some(i) => cut += i + 1,
            None => return "",
        }
    }
    &path[cut - 1..]
}

/// The query without `hutch_token`, and the token if it was there.
fn split_token(query: Option<&str>) -> (Option<String>, Option<String>) {
    let Some(query) = query else {
        return (None, None);
    };
    let mut token = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.split_once('=') {
            Some((name, value)) if name == TOKEN_PARAM => {
                token = Some(value.to_string());
                false
            }
            _ => *pair != TOKEN_PARAM,
        })
        .collect();
    let kept = (!kept.is_empty()).then(|| kept.join("&"));
    (kept, token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_path_is_what_follows_the_port() {
        assert_eq!(path_in_service("/v1/sandboxes/sbx_1/ports/80"), "");
        assert_eq!(path_in_service("/v1/sandboxes/sbx_1/ports/80/"), "/");
        assert_eq!(
            path_in_service("/v1/sandboxes/sbx_1/ports/80/a%20b/c/"),
            "/a%20b/c/"
        );
        assert_eq!(path_in_service("/v1/sandboxes/sbx_1/ports/%38%30/x"), "/x");
    }

    #[test]
    fn the_token_is_taken_out_of_the_query() {
        assert_eq!(split_token(None), (None, None));
        assert_eq!(split_token(Some("a=1&b=2")), (Some("a=1&b=2".into()), None));
        assert_eq!(
            split_token(Some("a=1&hutch_token=k3y&b=2")),
            (Some("a=1&b=2".into()), Some("k3y".into()))
        );
        assert_eq!(
            split_token(Some("hutch_token=k3y")),
            (None, Some("k3y".into()))
        );
    }

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
