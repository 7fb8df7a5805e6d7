//! Forwarding one API call to the node that owns its sandbox (or that a create was placed
//! on): HTTP/1.1 over a new TCP connection to the node's advertised address, the body
//! streamed both ways, and an `Upgrade` (the PTY's and the port proxy's WebSockets, the
//! tunnel) spliced through.
//!
//! What crosses: the client's request as it came (its `Authorization` too: the owner
//! authenticates it again against the shared database), without hop-by-hop headers, plus
//! [`NODE_TOKEN`] (the cluster's node secret), [`FORWARDED_BY`] (this node's id) and
//! `X-Forwarded-For`. The owner serves a call that carries the right node token locally,
//! whatever the owner table says, so a call is forwarded at most once.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::Request;
use axum::http::{header, HeaderName, HeaderValue, StatusCode, Version};
use axum::response::Response;
use hutch_server::proxy::{splice, strip_hop_by_hop, upgrade_protocol};
use hyper_util::rt::TokioIo;

use crate::error::ClusterError;

/// The header that carries the node secret on node-to-node calls.
pub const NODE_TOKEN: HeaderName = HeaderName::from_static("x-hutch-node-token");

/// The header naming the node a call was forwarded by.
pub const FORWARDED_BY: HeaderName = HeaderName::from_static("x-hutch-forwarded-by");

/// How long connecting to a node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The node to forward to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its id.
    pub id: String,
    /// Its `host:port`.
    pub advertise: String,
}

/// Forward `request` to `peer` as node `from` with the node secret `secret`; the peer's
/// answer, streaming. A peer that cannot be reached or breaks HTTP is an error (the caller
/// answers 502, or tries another node for a create).
pub async fn forward(
    peer: &Peer,
    from: &str,
    secret: &HeaderValue,
    request: Request,
) -> Result<Response, ClusterError> {
    let io_err = |source| ClusterError::Peer {
        node: peer.id.clone(),
        addr: peer.advertise.clone(),
        source,
    };
    let http_err = |source| ClusterError::PeerHttp {
        node: peer.id.clone(),
        addr: peer.advertise.clone(),
        source,
    };
    let stream = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect(&peer.advertise),
    )
    .await
    .map_err(|_| io_err(std::io::Error::from(std::io::ErrorKind::TimedOut)))?
    .map_err(io_err)?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(http_err)?;
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!(error = %e, "node-to-node connection ended");
        }
    });

    let (mut parts, body) = request.into_parts();
    let upgrade = upgrade_protocol(&parts.headers);
    let client_upgrade = upgrade
        .is_some()
        .then(|| parts.extensions.remove::<hyper::upgrade::OnUpgrade>())
        .flatten();
    let peer_ip = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let mut headers = std::mem::take(&mut parts.headers);
    strip_hop_by_hop(&mut headers);
    if let Some(protocol) = upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, protocol);
    }
    headers.insert(NODE_TOKEN, secret.clone());
    if let Ok(v) = HeaderValue::from_str(from) {
        headers.insert(FORWARDED_BY, v);
    }
    if let Some(ip) = peer_ip.and_then(|ip| HeaderValue::from_str(&ip.to_string()).ok()) {
        headers.insert(HeaderName::from_static("x-forwarded-for"), ip);
    }
    if !headers.contains_key(header::HOST) {
        if let Ok(v) = HeaderValue::from_str(&peer.advertise) {
            headers.insert(header::HOST, v);
        }
    }
    let target = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut upstream = hyper::Request::new(body);
    *upstream.method_mut() = parts.method;
    *upstream.uri_mut() = target.parse().expect("a path and query parses as a URI");
    *upstream.version_mut() = Version::HTTP_11;
    *upstream.headers_mut() = headers;

    let mut response = sender.send_request(upstream).await.map_err(http_err)?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        let protocol = response.headers().get(header::UPGRADE).cloned();
        if let Some(client_upgrade) = client_upgrade {
            let peer_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(splice(client_upgrade, peer_upgrade));
        }
        strip_hop_by_hop(response.headers_mut());
        if let Some(protocol) = protocol {
            let headers = response.headers_mut();
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            headers.insert(header::UPGRADE, protocol);
        }
    } else {
        strip_hop_by_hop(response.headers_mut());
    }
    Ok(response.map(Body::new))
}
