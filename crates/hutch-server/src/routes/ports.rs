//! Port forwarding on the API origin (see `docs/ports.md`).
//!
//! - `ANY /v1/sandboxes/{id}/ports/{port}/{path…}` proxies one HTTP/1.1 request (or a
//!   WebSocket, or any other `Upgrade`) to a service listening on `port` inside the sandbox.
//!   Programs authenticate with `Authorization: Bearer <key>`; browsers with a sandbox
//!   token (`?hutch_token=` once, exchanged for a cookie; see [`crate::browser`]), never
//!   with the API key in a URL.
//! - `POST /v1/sandboxes/{id}/port-tokens` signs such a link token.
//! - `GET /v1/sandboxes/{id}/tunnel/{port}` is a WebSocket whose binary messages carry the
//!   raw bytes of one TCP connection to that port (`hutch port-forward`).
//!
//! Both reach the service through the sandbox's agent ([`hutch_core::Manager::open_port`]):
//! the server never dials a sandbox address, and the agent dials only the sandbox's own
//! loopback. Each proxied request gets its own connection inside the sandbox.

use std::collections::HashMap;

use axum::extract::ws::{Message, WebSocket};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hutch_core::ids::SandboxId;
use hutch_core::sandbox_token::TOKEN_PREFIX;
use hutch_core::tenant::keys::Permission;
use hutch_core::CoreError;
use hutch_core::PortConnection;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::auth::{authorize_sandbox, bearer_key, AuthorizedSandbox};
use crate::browser::{self, BrowserCredential};
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, Caller};
use crate::proxy::{self, Forward, ServedAt};
use crate::AppState;

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
///
/// Not behind the API's auth middleware: it takes the key from the header, or a sandbox
/// token from a browser. A request with `?hutch_token=` is never proxied (a valid link is
/// answered `303` + cookie, anything else `401`).
pub async fn proxy(
    State(state): State<AppState>,
    Path(params): PortParams,
    request: Request,
) -> ApiResult<Response> {
    let id = params.get("id").map(String::as_str).unwrap_or_default();
    let raw_port = params.get("port").map(String::as_str).unwrap_or_default();
    let prefix = format!("/v1/sandboxes/{id}/ports/{raw_port}");
    let rest = path_in_service(request.uri().path());
    let bearer = bearer_key(request.headers());
    let mut until = None;
    match browser::browser_credential(request.uri(), request.headers()) {
        BrowserCredential::Link(token) => {
            let port = hutch_core::manager::parse_port(raw_port)?;
            let path = if rest.is_empty() {
                format!("{prefix}/")
            } else {
                request.uri().path().to_string()
            };
            let location = browser::location_without_token(&path, request.uri().query());
            return browser::exchange_link(
                &state,
                id,
                port,
                &token,
                &location,
                &format!("{prefix}/"),
            );
        }
        _ if bearer.is_some() => {
            let key = bearer.unwrap_or_default();
            if key.starts_with(TOKEN_PREFIX) {
                return Err(ApiError::unauthorized(
                    "a sandbox token is taken only from `?hutch_token=` or its cookie on the \
                     port proxy; programs use the API key in `Authorization: Bearer`",
                ));
            }
            let caller = state.caller(&key, request.headers()).await?;
            if !caller.permits(Permission::Use) {
                return Err(ApiError::forbidden(format!(
                    "this {} key may not reach ports: the port proxy needs a key allowed \
                     exec, files, terminals, code and ports",
                    caller.key.scope.as_str()
                )));
            }
            authorize_sandbox(&state, &caller, id).await?;
            until = Some(caller.revocation());
        }
        BrowserCredential::Session(token) => {
            let port = hutch_core::manager::parse_port(raw_port)?;
            browser::check_session(&state, id, port, &token)?;
        }
        BrowserCredential::None => {
            return Err(ApiError::unauthorized(
                "missing `Authorization: Bearer <key>` header (browsers: open a link from \
                 `POST /v1/sandboxes/{id}/port-tokens`)",
            ));
        }
    }
    let port = hutch_core::manager::parse_port(raw_port)?;
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
    let target: Uri = match request.uri().query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_string(),
    }
    .parse()
    .map_err(|e| ApiError::bad_request(format!("invalid path for the port proxy: {e}")))?;
    // Parsed after the browser credentials are checked, so a malformed id in a link still
    // answers as a bad link did.
    let id: SandboxId = id.parse().map_err(CoreError::from)?;
    let to = Forward {
        id: &id,
        port,
        served_at: ServedAt::ApiPath { prefix: &prefix },
        target,
        until,
    };
    proxy::forward(&state, to, request).await
}

/// `POST /v1/sandboxes/{id}/port-tokens` body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortTokenBody {
    /// The one port the link opens; omitted: any port of the sandbox.
    port: Option<u16>,
    /// Life of the link, in seconds (1 to 3600; default 300).
    ttl_seconds: Option<u64>,
}

/// `POST /v1/sandboxes/{id}/port-tokens` → `201 {"token", "url", "expires_at", …}`: a
/// short-lived link token for browsers on the port proxy of sandbox `id`.
pub async fn port_token(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    headers: HeaderMap,
    ApiJson(body): ApiJson<PortTokenBody>,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    let ttl = body.ttl_seconds.unwrap_or(browser::LINK_TTL_SECONDS);
    if !(1..=browser::MAX_LINK_TTL_SECONDS).contains(&ttl) {
        return Err(ApiError::invalid(format!(
            "ttl_seconds must be from 1 to {}, got {ttl}",
            browser::MAX_LINK_TTL_SECONDS
        )));
    }
    if let Some(p) = body.port {
        hutch_core::manager::parse_port(&p.to_string())?;
    }
    // 404 for a sandbox that is gone, also for admin keys.
    state.manager.get(&id).await?;
    let (token, exp) = browser::issue_link(&state, &id, body.port, ttl);
    let query = format!("?{}={token}", browser::TOKEN_PARAM);
    let url = body.port.map(|port| match &state.preview {
        Some(preview) => preview.url(&id, port, &query),
        None => {
            let host = headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("127.0.0.1:7700");
            let scheme = state.scheme();
            format!("{scheme}://{host}/v1/sandboxes/{id}/ports/{port}/{query}")
        }
    });
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({
            "token": token,
            "sandbox": id,
            "port": body.port,
            "url": url,
            "origin": if state.preview.is_some() { "preview" } else { "api" },
            "expires_at": hutch_core::time::rfc3339(exp),
        })),
    ))
}

/// `GET /v1/sandboxes/{id}/tunnel/{port}` → WebSocket carrying one raw TCP connection.
///
/// Binary messages carry bytes both ways. The text message `{"type": "eof"}` from the client
/// ends its direction (the service reads end of file). When the service closes its side,
/// the server closes the WebSocket.
pub async fn tunnel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    sandbox: AuthorizedSandbox,
    Path(params): PortParams,
    crate::extract::WsUpgrade(ws): crate::extract::WsUpgrade,
) -> ApiResult<Response> {
    let raw_port = params.get("port").map(String::as_str).unwrap_or_default();
    let port = hutch_core::manager::parse_port(raw_port)?;
    // Connect before upgrading, so nothing listening is an ordinary 502.
    let connection = state.manager.open_port(&sandbox.id, port).await?;
    let revoked = caller.revoked();
    Ok(ws
        .max_message_size(MAX_TUNNEL_MESSAGE)
        .max_frame_size(MAX_TUNNEL_MESSAGE)
        .on_upgrade(move |socket| async move {
            // A revoked key's tunnel closes at once (dropping the connection closes it in
            // the sandbox).
            tokio::select! {
                () = bridge(socket, connection) => {}
                () = revoked => {}
            }
        }))
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
}
