//! Which sandbox and port a data-plane request is for, as the SDKs say it: the
//! `E2b-Sandbox-Id` and `E2b-Sandbox-Port` headers (one gateway URL, `E2B_SANDBOX_URL`), or
//! the host `<port>-<sandbox id>.<domain>` (what `get_host(port)` names).

use axum::extract::Request;
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use hutch_core::ids::SandboxId;
use hutch_server::parse_host;
use hutch_server::proxy::{self, Forward, ServedAt};

use crate::error::{E2bError, E2bResult};
use crate::{E2bState, ENVD_PORT};

/// The sandbox and port a data-plane request is for (a request extension).
#[derive(Debug, Clone)]
pub struct SandboxTarget {
    /// The sandbox.
    pub id: SandboxId,
    /// The port the SDK addressed (49983 envd, 49999 the code interpreter, or a service's).
    pub port: u16,
}

/// The metadata key that turns off public traffic to a sandbox's ports (E2B's
/// `network.allowPublicTraffic: false`): requests then need `E2B-Traffic-Access-Token`.
pub const PRIVATE_TRAFFIC_KEY: &str = "e2b.private_traffic";

/// The data-plane target of `request`, `None` for a control-plane request. A well-formed id
/// of no sandbox is a 502 in the SDKs' wording.
pub fn of_request(state: &E2bState, request: &Request) -> E2bResult<Option<SandboxTarget>> {
    let headers = request.headers();
    if let Some(id) = header_text(headers, "e2b-sandbox-id") {
        let port = match header_text(headers, "e2b-sandbox-port") {
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| E2bError::bad_request(format!("invalid E2b-Sandbox-Port {p:?}")))?,
            None => ENVD_PORT,
        };
        let id = id
            .parse::<SandboxId>()
            .map_err(|_| E2bError::SandboxGone { id: id.to_string() })?;
        return Ok(Some(SandboxTarget { id, port }));
    }
    let host = hutch_server::request_host(request);
    Ok(parse_host(host, &state.cfg.domain).map(|(port, id)| SandboxTarget { id, port }))
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The sandbox a signed `/files` URL without a sandbox header is for: the one whose
/// access token made the signature. With one gateway URL (`E2B_SANDBOX_URL`) the SDKs'
/// `download_url`/`upload_url` name no sandbox; the signature, made from one sandbox's
/// token, does. A signature no sandbox made is no target (the control plane's 404).
pub async fn signed_file_url(state: &E2bState, uri: &Uri) -> Option<SandboxTarget> {
    if uri.path() != "/files" {
        return None;
    }
    let q = crate::envd::FileQuery::parse(uri.query()?)?;
    q.signature.as_ref()?;
    let all = hutch_core::tenant::TenantScope::All;
    let mut page = hutch_core::store::PageRequest::new(None, None).ok()?;
    loop {
        let found = state
            .app
            .manager
            .list(&Default::default(), &all, &page)
            .await
            .ok()?;
        for view in &found.items {
            let t = SandboxTarget {
                id: view.id.clone(),
                port: ENVD_PORT,
            };
            for op in ["read", "write"] {
                if q.signature_matches(state, &t, op) {
                    return Some(t);
                }
            }
        }
        page = hutch_core::store::PageRequest::new(None, Some(found.next?)).ok()?;
    }
}

/// The sandbox of a data-plane request, which must exist (else the SDKs' 502).
pub async fn existing(state: &E2bState, target: &SandboxTarget) -> E2bResult<()> {
    match state.app.manager.get(&target.id).await {
        Ok(_) => Ok(()),
        Err(hutch_core::CoreError::NotFound(_)) => Err(E2bError::SandboxGone {
            id: target.id.to_string(),
        }),
        Err(e) => Err(e.into()),
    }
}

/// The traffic token of sandbox `id` (for sandboxes made with `allowPublicTraffic: false`).
pub fn traffic_token(state: &E2bState, id: &SandboxId) -> String {
    state
        .app
        .manager
        .sandbox_tokens()
        .derive("e2b-traffic", id.as_str())
}

/// A request to a service's port in the sandbox, through Hutch's port proxy. As in E2B, a
/// sandbox's ports are public to whoever knows its id unless it was made with
/// `allowPublicTraffic: false`; then the request needs `E2B-Traffic-Access-Token`.
pub async fn proxy_port(state: &E2bState, request: Request) -> Response {
    match forward(state, request).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn forward(state: &E2bState, mut request: Request) -> E2bResult<Response> {
    let target = request
        .extensions_mut()
        .remove::<SandboxTarget>()
        .ok_or_else(|| E2bError::bad_request("no sandbox named"))?;
    let view = match state.app.manager.get(&target.id).await {
        Ok(v) => v,
        Err(hutch_core::CoreError::NotFound(_)) => {
            return Err(E2bError::SandboxGone {
                id: target.id.to_string(),
            })
        }
        Err(e) => return Err(e.into()),
    };
    if view.metadata.get(PRIVATE_TRAFFIC_KEY).map(String::as_str) == Some("true") {
        let given = header_text(request.headers(), "e2b-traffic-access-token").unwrap_or("");
        if !crate::envd::same_secret(given, &traffic_token(state, &target.id)) {
            return Err(E2bError::status(
                axum::http::StatusCode::FORBIDDEN,
                "this sandbox's ports are private: send E2B-Traffic-Access-Token",
            ));
        }
    }
    for h in [
        "e2b-sandbox-id",
        "e2b-sandbox-port",
        "e2b-traffic-access-token",
    ] {
        request.headers_mut().remove(h);
    }
    let target_uri: Uri = request
        .uri()
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .parse()
        .map_err(|e| E2bError::bad_request(format!("invalid path: {e}")))?;
    let to = Forward {
        id: &target.id,
        port: target.port,
        served_at: ServedAt::PreviewHost,
        target: target_uri,
        until: None,
    };
    match proxy::forward(&state.app, to, request).await {
        Ok(r) => Ok(r),
        Err(e) if e.status == axum::http::StatusCode::BAD_GATEWAY => Err(E2bError::status(
            axum::http::StatusCode::BAD_GATEWAY,
            format!(
                "The sandbox is running but port is not open: {} ({})",
                target.port, e.message
            ),
        )),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_name_a_port_and_a_sandbox() {
        let id = "sbx_abcdefghijklmnop";
        assert_eq!(
            parse_host(&format!("49983-{id}.e2b.localhost:3000"), "e2b.localhost"),
            Some((49983, id.parse().expect("well-formed")))
        );
        assert_eq!(parse_host("e2b.localhost:3000", "e2b.localhost"), None);
        assert_eq!(
            parse_host(&format!("x-{id}.e2b.localhost"), "e2b.localhost"),
            None
        );
        assert_eq!(parse_host(&format!("80-{id}.other"), "e2b.localhost"), None);
    }
}
