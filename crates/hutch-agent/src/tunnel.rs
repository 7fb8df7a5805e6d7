//! `POST /v1/tcp?port=N`: a full-duplex byte tunnel to a TCP port inside the sandbox.
//!
//! The agent connects to `127.0.0.1:N` (then `[::1]:N`) **only**: the tunnel reaches
//! services listening on the sandbox's own loopback, never another address, so it works
//! whatever the sandbox's network is (none at all, or a `vm` guest) and cannot be used to
//! reach anything outside the sandbox. The request body is written to the socket as it
//! arrives; what the socket sends comes back as the response body.
//!
//! - **Backpressure.** The body is read only as fast as the socket takes it, so HTTP/2 flow
//!   control pushes back on the host; socket reads go through a bounded queue into the
//!   response, so a host that stops reading stops the agent from reading the socket.
//! - **Half-close.** The end of the request body shuts down the socket's write side (the
//!   service reads end of file); the service closing its side ends the response body.
//! - **Reset.** The host resetting the stream (or the connection dropping) closes the socket
//!   at once, whichever direction was waiting.
//! - Nothing listening (or no answer within 10 s) is `502 connection_refused`, before any
//!   byte moves.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::BytesMut;
use http::Response;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::error::Failure;
use crate::http::{self as agent_http, AgentBody, Query};

/// Content type of tunnel bodies.
pub const TUNNEL_CONTENT_TYPE: &str = "application/octet-stream";
/// Largest chunk read from the socket at once.
const READ_CHUNK: usize = 64 << 10;
/// Longest wait for a loopback connect (normally instant; only a firewall inside the
/// sandbox that drops packets makes it wait).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Chunks queued towards the host before the agent stops reading the socket.
const OUTPUT_QUEUE: usize = 4;

/// Handle `POST /v1/tcp?port=N`.
pub async fn handle_tcp(query: &Query, body: Incoming) -> Result<Response<AgentBody>, Failure> {
    let port = parse_port(query.get("port"))?;
    let stream = connect_loopback(port).await?;
    // Small writes (interactive protocols, WebSocket frames) should not wait for Nagle.
    let _ = stream.set_nodelay(true);
    let (reader, writer) = stream.into_split();
    let (tx, rx) = mpsc::channel(OUTPUT_QUEUE);
    let (abort_tx, abort_rx) = oneshot::channel();
    tokio::spawn(upstream(body, writer, abort_tx));
    tokio::spawn(downstream(reader, tx, abort_rx));
    Ok(agent_http::stream(TUNNEL_CONTENT_TYPE, rx))
}

/// The `port` parameter: a number from 1 to 65535.
fn parse_port(raw: Option<&str>) -> Result<u16, Failure> {
    let raw = raw.ok_or_else(|| Failure::BadRequest("missing query parameter port".into()))?;
    match raw.parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => Err(Failure::BadRequest(format!(
            "port must be a number from 1 to 65535, got {raw:?}"
        ))),
    }
}

/// Connect to the port on IPv4 loopback, then IPv6 loopback. Refused on both (or refused on
/// one with no IPv6 at all), or no answer within [`CONNECT_TIMEOUT`] (a firewall inside the
/// sandbox dropping loopback packets), is [`Failure::ConnectionRefused`].
async fn connect_loopback(port: u16) -> Result<TcpStream, Failure> {
    match tokio::time::timeout(CONNECT_TIMEOUT, try_both(port)).await {
        Ok(result) => result,
        Err(_) => Err(Failure::ConnectionRefused(format!(
            "nothing answers on port {port} inside the sandbox (connecting timed out after {} s)",
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

async fn try_both(port: u16) -> Result<TcpStream, Failure> {
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
    let first = match TcpStream::connect(v4).await {
        Ok(stream) => return Ok(stream),
        Err(e) => e,
    };
    match TcpStream::connect(v6).await {
        Ok(stream) => Ok(stream),
        Err(second) => {
            let refused = |e: &io::Error| e.kind() == io::ErrorKind::ConnectionRefused;
            let no_v6 = matches!(
                second.raw_os_error(),
                Some(libc::EADDRNOTAVAIL | libc::ENETUNREACH | libc::EAFNOSUPPORT)
            );
            if refused(&first) && (refused(&second) || no_v6) {
                Err(Failure::ConnectionRefused(format!(
                    "nothing is listening on port {port} inside the sandbox \
                     (connecting to 127.0.0.1:{port} and [::1]:{port} was refused)"
                )))
            } else {
                Err(Failure::io("connect", format!("127.0.0.1:{port}"), first))
            }
        }
    }
}

/// Request body → socket. A clean end shuts down the socket's write side; a failed body
/// (the host reset the stream) aborts the whole tunnel.
async fn upstream(mut body: Incoming, mut writer: OwnedWriteHalf, abort: oneshot::Sender<()>) {
    loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if writer.write_all(&data).await.is_err() {
                    // The service closed its side; what it still sends goes on downstream.
                    return;
                }
            }
            Some(Err(_)) => {
                let _ = abort.send(());
                return;
            }
            None => {
                // Dropping `abort` unsent tells downstream to carry on alone.
                let _ = writer.shutdown().await;
                return;
            }
        }
    }
}

/// Socket → response body, until the service closes, the host goes away, or the upstream
/// side aborts.
async fn downstream(
    mut reader: OwnedReadHalf,
    tx: mpsc::Sender<Result<bytes::Bytes, io::Error>>,
    mut abort: oneshot::Receiver<()>,
) {
    let mut aborted = false;
    loop {
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        let read = tokio::select! {
            read = reader.read_buf(&mut buf) => read,
            () = tx.closed() => return,
            result = &mut abort, if !aborted => {
                match result {
                    Ok(()) => return,
                    // Upstream finished cleanly: only this direction is left.
                    Err(_) => {
                        aborted = true;
                        continue;
                    }
                }
            }
        };
        match read {
            Ok(0) => return,
            Ok(_) => {
                if tx.send(Ok(buf.freeze())).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                // Resets the HTTP/2 stream: the host sees a failed tunnel, not a clean end.
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_validated() {
        assert_eq!(parse_port(Some("8080")).ok(), Some(8080));
        assert_eq!(parse_port(Some("65535")).ok(), Some(65535));
        for bad in ["0", "65536", "-1", "http", ""] {
            let e = parse_port(Some(bad)).expect_err(bad);
            assert_eq!(
                e.to_string(),
                format!("port must be a number from 1 to 65535, got {bad:?}")
            );
        }
        assert_eq!(
            parse_port(None).expect_err("missing").to_string(),
            "missing query parameter port"
        );
    }

    #[tokio::test]
    async fn nothing_listening_is_connection_refused() {
        // Bind and drop to find a port nobody listens on.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        let e = connect_loopback(port).await.expect_err("refused");
        assert_eq!(e.code(), hutch_proto::AgentErrorCode::ConnectionRefused);
        assert!(e.to_string().contains(&format!("port {port}")), "{e}");
    }
}
