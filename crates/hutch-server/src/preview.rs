//! The preview origin: sandboxes' web services served from a listener of their own, one
//! host name per sandbox and port, `{port}-{sandbox id}.{domain}` (`hutch serve
//! --preview-listen`, `--preview-domain`; see `docs/ports.md`).
//!
//! Each service gets its own origin, apart from the API's and every other service's, so its
//! scripts, cookies and workers touch nothing else. The preview origin takes only sandbox
//! tokens (a link once, then the cookie it is exchanged for), never the API key, and serves
//! no API route.

use axum::extract::{Request, State};
use axum::http::{header, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hutch_core::ids::SandboxId;

use crate::browser::{self, BrowserCredential};
use crate::error::{ApiError, ApiResult};
use crate::proxy::{self, Forward, ServedAt};
use crate::AppState;

/// How browsers reach the preview origin.
#[derive(Debug, Clone)]
pub struct PreviewOrigin {
    /// The domain under which each service is a host, `{port}-{id}.{domain}`
    /// (`localhost` by default: browsers resolve `*.localhost` to loopback).
    pub domain: String,
    /// The port in the URLs handed out (the listener's, unless a proxy in front differs).
    pub port: u16,
    /// `https` when the listener serves TLS, else `http`.
    pub scheme: &'static str,
}

impl PreviewOrigin {
    /// The URL of `port` in sandbox `id` on this origin, with `query` (already encoded).
    pub fn url(&self, id: &str, port: u16, query: &str) -> String {
        format!(
            "{scheme}://{port}-{id}.{domain}:{listen}/{query}",
            scheme = self.scheme,
            domain = self.domain,
            listen = self.port
        )
    }
}

/// The host a request names: its `Host` header, else its URI's (`""` for none).
pub fn request_host(request: &Request) -> &str {
    request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| request.uri().host())
        .unwrap_or_default()
}

/// The preview listener's whole router: every request is a proxied one.
pub fn preview_app(state: AppState) -> Router {
    Router::new()
        .fallback(serve_preview)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
}

async fn serve_preview(State(state): State<AppState>, request: Request) -> Response {
    match preview(&state, request).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn preview(state: &AppState, request: Request) -> ApiResult<Response> {
    let domain = state
        .preview
        .as_ref()
        .map(|p| p.domain.as_str())
        .unwrap_or("localhost");
    let host = request_host(&request);
    let Some((port, id)) = parse_host(host, domain) else {
        return Err(ApiError::not_found(format!(
            "this is Hutch's preview origin: open http://{{port}}-{{sandbox id}}.{domain}/ \
             with a link from `POST /v1/sandboxes/{{id}}/port-tokens`"
        )));
    };
    match browser::browser_credential(request.uri(), request.headers()) {
        BrowserCredential::Link(token) => {
            let location =
                browser::location_without_token(request.uri().path(), request.uri().query());
            browser::exchange_link(state, &id, port, &token, &location, "/")
        }
        BrowserCredential::Session(token) => {
            browser::check_session(state, &id, port, &token)?;
            let target: Uri = request
                .uri()
                .path_and_query()
                .map_or("/", |pq| pq.as_str())
                .parse()
                .map_err(|e| ApiError::bad_request(format!("invalid path: {e}")))?;
            let to = Forward {
                id: &id,
                port,
                served_at: ServedAt::PreviewHost,
                target,
                until: None,
            };
            proxy::forward(state, to, request).await
        }
        BrowserCredential::None => Err(ApiError::unauthorized(format!(
            "the preview origin takes only a sandbox token, never the API key: open a link \
             from `POST /v1/sandboxes/{id}/port-tokens`"
        ))),
    }
}

/// `{port}-{id}.{domain}[:listener port]` → the port and sandbox id (case-insensitive, as
/// browsers lowercase host names; sandbox ids are lowercase).
pub fn parse_host(host: &str, domain: &str) -> Option<(u16, SandboxId)> {
    let host = host.to_ascii_lowercase();
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host.as_str(),
    };
    let label = name
        .strip_suffix(&domain.to_ascii_lowercase())?
        .strip_suffix('.')?;
    let (port, id) = label.split_once('-')?;
    let port = hutch_core::manager::parse_port(port).ok()?;
    Some((port, id.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_name_a_port_and_a_sandbox() {
        let id = "sbx_abcdefghijklmnop";
        assert_eq!(
            parse_host(&format!("8000-{id}.localhost:7701"), "localhost"),
            Some((8000, id.parse().expect("well-formed")))
        );
        assert_eq!(
            parse_host(
                &format!("80-{}.Preview.Example", id.to_uppercase()),
                "preview.example"
            ),
            Some((80, id.parse().expect("well-formed")))
        );
        for bad in [
            "localhost:7701".to_string(),
            format!("{id}.localhost"),
            format!("0-{id}.localhost"),
            format!("8000-{id}.localhost.evil"),
            format!("8000-{id}xlocalhost"),
            "8000-sbx_.localhost".to_string(),
            format!("a.8000-{id}.localhost"),
        ] {
            assert_eq!(parse_host(&bad, "localhost"), None, "{bad}");
        }
    }

    #[test]
    fn urls_name_the_host_form() {
        let origin = PreviewOrigin {
            domain: "localhost".into(),
            port: 7701,
            scheme: "http",
        };
        assert_eq!(
            origin.url("sbx_a", 8000, "?hutch_token=t"),
            "http://8000-sbx_a.localhost:7701/?hutch_token=t"
        );
    }
}
