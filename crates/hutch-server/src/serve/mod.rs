//! Serving the API on a TCP listener: our own accept loop over hyper's HTTP/1.1 server
//! (with upgrades, for WebSockets and tunnels), so hostile clients cannot take it down.
//!
//! What `axum::serve` lacked and this adds (see `docs/limits.md`):
//! - a cap on open connections, kept by evicting idle strangers first
//!   ([`connections`]), so half-sent request heads cannot exhaust descriptors and starve a
//!   client that sends a complete request;
//! - a header timeout (first request head) and an idle timeout (between keep-alive
//!   requests), kept by a watchdog over the same table;
//! - request heads limited to [`MAX_HEAD_BYTES`] of buffer per connection;
//! - `TCP_NODELAY` on every accepted socket (no Nagle/delayed-ACK stall on keep-alive);
//! - graceful shutdown: stop accepting, let requests in flight finish.
//!
//! The server speaks HTTP/1.1, and also HTTP/2 on listeners whose [`ConnectionLimits::h2c`]
//! is set (the E2B-compatible API's): with prior knowledge (h2c) in plaintext, by ALPN under
//! TLS ([`tls`]).

pub mod connections;
pub mod tls;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tower::ServiceExt;

use self::connections::{ConnectionHandle, ConnectionStats, Connections, TrackedStream};

/// Largest buffer hyper keeps for one connection's request head (and reads).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Default header timeout.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default idle keep-alive timeout: longer than the idle timeout of common client pools
/// (reqwest/hyper 90 s, httpx 5 s, undici 4 s), so the client closes first and never sends
/// on a connection the server is closing.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Upper bound of the default connection cap.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// Limits on client connections.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Open connections at most (evicting idle ones beyond).
    pub max_connections: usize,
    /// A new connection must complete its first request head within this.
    pub header_timeout: Duration,
    /// A keep-alive connection must complete its next request head within this of the
    /// previous response.
    pub idle_timeout: Duration,
    /// Also serve HTTP/2: in plaintext with prior knowledge (h2c: a connection that opens
    /// with the HTTP/2 preface speaks HTTP/2, any other HTTP/1.1); under TLS offered by ALPN.
    pub h2c: bool,
}

impl ConnectionLimits {
    /// Defaults for a process allowed `open_files` descriptors: half of them for client
    /// connections (the rest for sandboxes, agent sockets, the database), at most
    /// [`DEFAULT_MAX_CONNECTIONS`].
    pub fn for_descriptor_limit(open_files: u64) -> Self {
        let half = usize::try_from(open_files / 2).unwrap_or(usize::MAX);
        Self {
            max_connections: half.clamp(16, DEFAULT_MAX_CONNECTIONS),
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            h2c: false,
        }
    }
}

/// Errors of [`serve`].
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listening socket failed for good.
    #[error("accepting connections: {0}")]
    Accept(#[source] std::io::Error),
}

/// Serve `app` on `listener` until `shutdown` resolves, then finish the requests in flight
/// (the caller bounds how long it waits for that). With `tls`, every connection is TLS
/// (its acceptor's ALPN list says which protocols it offers; see [`tls::TlsIdentity`]).
/// The counters of the connection table land in `stats` (see [`crate::AppState::connection_stats`]).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stats: Arc<ConnectionStats>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let table = Connections::new(
        limits.max_connections,
        limits.header_timeout,
        limits.idle_timeout,
        stats,
    );
    tracing::info!(
        max_connections = limits.max_connections,
        header_timeout_s = limits.header_timeout.as_secs_f64(),
        idle_timeout_s = limits.idle_timeout.as_secs_f64(),
        tls = tls.is_some(),
        http2 = limits.h2c,
        "serving HTTP"
    );
    let watchdog = tokio::spawn(watch_timeouts(Arc::clone(&table)));
    // Each connection holds a receiver and watches it for the shutdown.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(());
    tokio::pin!(shutdown);
    let result = loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break Ok(()),
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) if is_out_of_descriptors(&e) => {
                // Free one by evicting an idle connection, and let the kernel's backlog wait.
                let freed = table.evict_for_descriptor();
                tracing::warn!(error = %e, freed, "out of descriptors accepting a connection");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(e) if is_transient(&e) => continue,
            Err(e) => break Err(ServeError::Accept(e)),
        };
        let Some((handle, evicted)) = table.admit() else {
            tracing::debug!(%peer, "every connection slot is serving a request: closed");
            continue;
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY");
        }
        let stream = TrackedStream::new(stream, handle.slot());
        let connection = Connection {
            peer,
            app: app.clone(),
            handle,
            evicted,
            stop: stop_rx.clone(),
            http2: limits.h2c,
        };
        match &tls {
            None => {
                tokio::spawn(connection.serve(stream));
            }
            Some(acceptor) => {
                tokio::spawn(connection.serve_tls(acceptor.clone(), stream));
            }
        }
    };
    watchdog.abort();
    drop(stop_rx);
    drop(listener);
    // Every connection sees the change and shuts down gracefully; `closed` resolves when
    // the last one has ended.
    stop_tx.send_replace(());
    stop_tx.closed().await;
    result
}

/// One accepted connection and what its task watches.
struct Connection {
    peer: SocketAddr,
    app: Router,
    handle: ConnectionHandle,
    /// Fires when the table evicts the connection (or its header or idle timeout passed).
    evicted: tokio::sync::oneshot::Receiver<()>,
    /// Changes when the server stops.
    stop: tokio::sync::watch::Receiver<()>,
    /// HTTP/2 besides HTTP/1.1 (h2c in plaintext, ALPN `h2` under TLS).
    http2: bool,
}

impl Connection {
    /// Finish the TLS handshake, then serve. A client that never completes it is evicted
    /// like one that never sends a request head: it counts as a stranger in the table.
    async fn serve_tls(mut self, acceptor: tokio_rustls::TlsAcceptor, stream: TrackedStream) {
        let peer = self.peer;
        let tls = tokio::select! {
            accepted = acceptor.accept(stream) => match accepted {
                Ok(tls) => tls,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    self.handle.stopped_serving();
                    return;
                }
            },
            _ = &mut self.evicted => {
                tracing::debug!(%peer, "connection closed during the TLS handshake");
                self.handle.stopped_serving();
                return;
            }
        };
        // Only a listener that offers `h2` by ALPN can have negotiated it.
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
        self.http2 = self.http2 && h2;
        self.serve(tls).await;
    }

    /// Hyper drives the connection until it ends, is evicted, or the server stops.
    async fn serve<I>(self, stream: I)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let Self {
            peer,
            app,
            handle,
            mut evicted,
            mut stop,
            http2,
        } = self;
        let io = TokioIo::new(stream);
        let per_request = handle.clone();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            let guard = per_request.request_started();
            // The peer address feeds `X-Forwarded-For` on the port proxy; the handle lets
            // authentication mark the connection as a known client's.
            req.extensions_mut().insert(ConnectInfo(peer));
            req.extensions_mut().insert(per_request.clone());
            let app = app.clone();
            async move {
                let response = app
                    .oneshot(req.map(Body::new))
                    .await
                    .unwrap_or_else(|never: Infallible| match never {});
                // The request is served until its response body is finished (or dropped).
                Ok::<_, Infallible>(response.map(|body| {
                    Body::new(body.map_frame(move |frame| {
                        let _serving = &guard;
                        frame
                    }))
                }))
            }
        });
        // The same loop for both kinds of connection (their types differ).
        macro_rules! drive {
            ($conn:expr) => {{
                let conn = $conn;
                tokio::pin!(conn);
                let mut stopping = false;
                loop {
                    tokio::select! {
                        result = conn.as_mut() => {
                            if let Err(e) = result {
                                tracing::debug!(%peer, error = %e, "connection ended with an error");
                            }
                            break;
                        }
                        _ = &mut evicted => {
                            tracing::debug!(%peer, "connection closed: evicted or timed out");
                            break;
                        }
                        changed = stop.changed(), if !stopping => {
                            let _ = changed;
                            stopping = true;
                            conn.as_mut().graceful_shutdown();
                        }
                    }
                }
            }};
        }
        if http2 {
            let mut builder =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            builder
                .http1()
                .max_buf_size(MAX_HEAD_BYTES)
                .keep_alive(true)
                .header_read_timeout(None);
            drive!(builder.serve_connection_with_upgrades(io, service));
        } else {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .max_buf_size(MAX_HEAD_BYTES)
                .keep_alive(true)
                // The connection table keeps the header and idle timeouts (one clock for both).
                .header_read_timeout(None);
            drive!(builder.serve_connection(io, service).with_upgrades());
        }
        handle.stopped_serving();
    }
}

/// Close connections past their header or idle timeout.
async fn watch_timeouts(table: Arc<Connections>) {
    let mut tick = tokio::time::interval(table.tick());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let closed = table.expire(Instant::now());
        if closed > 0 {
            tracing::debug!(closed, "connections closed by the header or idle timeout");
        }
    }
}

fn is_out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(code) if code == EMFILE || code == ENFILE)
}

/// Errors of one accept that say nothing about the listener (the peer gave up early).
fn is_transient(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::Interrupted
    ) || matches!(e.raw_os_error(), Some(code) if code == ENOBUFS || code == ENOMEM)
}

/// `EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM` on Linux (x86-64), without a libc dependency.
const EMFILE: i32 = 24;
const ENFILE: i32 = 23;
const ENOBUFS: i32 = 105;
const ENOMEM: i32 = 12;
