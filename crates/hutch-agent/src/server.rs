//! Listeners, HTTP/2 connections and routing.
//!
//! Every connection speaks HTTP/2 with prior knowledge and is served by its own task; a
//! failing connection or accept never stops the agent. Each request is routed here to its
//! handler, and failures become responses in one place ([`http::error`]).

use std::convert::Infallible;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixListener;

use crate::cli::Listener;
use crate::error::Failure;
use crate::fdio::FdIo;
use crate::http::{self as agent_http, AgentBody, Query};
use crate::log::log;
use crate::state::Agent;
use crate::{exec, files, identity, service, sys, tunnel};

/// Concurrent streams (execs, transfers) per connection.
pub const MAX_CONCURRENT_STREAMS: u32 = 4096;
/// Per-stream receive window (2 MiB): one upload keeps a local link busy, and a process
/// that does not read its stdin holds at most this much of the agent's memory.
pub const STREAM_WINDOW: u32 = 2 << 20;
/// Connection receive window (32 MiB): a dozen streams stalled on unread stdin leave room
/// for every other call on the connection.
pub const CONNECTION_WINDOW: u32 = 32 << 20;
/// Largest HTTP/2 frame accepted (256 KiB; fewer frames per megabyte moved).
pub const MAX_FRAME_SIZE: u32 = 256 << 10;
/// Pause after a failed accept (out of fds) before trying again.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// Pause before reopening a serial port after its connection ended.
const SERIAL_REOPEN_PAUSE: Duration = Duration::from_millis(5);
/// How often a serial port without a host is checked for one. It bounds how long a host
/// that connects (after a restore, or a restart of the server) waits for the agent.
const HOST_POLL: Duration = Duration::from_millis(5);

/// Serve on every listener, forever. Fails only when a listener cannot be set up.
pub async fn serve(agent: Arc<Agent>, listeners: Vec<Listener>) -> io::Result<Infallible> {
    for listener in listeners {
        match listener {
            Listener::Fd(fd) => {
                let socket = inherited_listener(fd)?;
                log!("serving on inherited fd {fd}");
                tokio::spawn(accept_loop(Arc::clone(&agent), socket));
            }
            Listener::Path(path) => {
                let socket = bind(&path)?;
                log!("serving on {}", path.display());
                tokio::spawn(accept_loop(Arc::clone(&agent), socket));
            }
            Listener::Serial(path) => {
                log!("serving on serial port {}", path.display());
                tokio::spawn(serial_loop(Arc::clone(&agent), path));
            }
        }
    }
    std::future::pending().await
}

fn inherited_listener(fd: RawFd) -> io::Result<UnixListener> {
    // Check before taking ownership: it must be an open socket.
    // SAFETY: fstat writes into the zeroed struct we pass; a bad fd yields EBADF.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    sys::cvt(unsafe { libc::fstat(fd, &mut st) })
        .map_err(|e| io::Error::new(e.kind(), format!("--listen-fd {fd}: {e}")))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("--listen-fd {fd} is not a socket"),
        ));
    }
    sys::set_cloexec(fd)?;
    sys::set_nonblocking(fd, true)?;
    // SAFETY: the fd is an open socket handed to us by our parent for exactly this use; we
    // take sole ownership of it here, once.
    let std_listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
    UnixListener::from_std(std_listener)
}

fn bind(path: &Path) -> io::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_socket() {
            std::fs::remove_file(path)?;
        }
    }
    UnixListener::bind(path)
        .map_err(|e| io::Error::new(e.kind(), format!("bind {}: {e}", path.display())))
}

async fn accept_loop(agent: Arc<Agent>, listener: UnixListener) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let agent = Arc::clone(&agent);
                tokio::spawn(async move {
                    if let Some(failure) = serve_connection(agent, stream).await {
                        log!("connection failed: {failure}");
                    }
                });
            }
            Err(e) => {
                log!("accept failed: {e}");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

async fn serial_loop(agent: Arc<Agent>, path: PathBuf) {
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        log!("serial path {} contains a NUL byte", path.display());
        return;
    };
    // While the host side is disconnected the port reads end of file at once, so this loop
    // turns quickly; log a problem once, not on every turn.
    let mut last_report = String::new();
    loop {
        let opened = match sys::open(&c_path, libc::O_RDWR | libc::O_NOCTTY) {
            // Register with the reactor only once a host is there: a hang-up seen by epoll
            // stays in tokio's readiness for good, and would make every read and write spin.
            Ok(fd) => match wait_for_host(&fd).await {
                Ok(()) => FdIo::new(fd).map_err(|e| format!("register {}: {e}", path.display())),
                Err(e) => Err(format!("poll {}: {e}", path.display())),
            },
            Err(e) => Err(format!("cannot open {}: {e}", path.display())),
        };
        let report = match opened {
            Ok(port) => {
                log!("serial: host connected");
                let ended = serve_connection(Arc::clone(&agent), port).await;
                if ended.is_none() {
                    log!("serial: host went away");
                }
                ended.map(|failure| format!("connection on {} failed: {failure}", path.display()))
            }
            Err(e) => Some(format!("{e} (retrying)")),
        };
        match report {
            Some(report) if report != last_report => {
                log!("{report}");
                last_report = report;
            }
            Some(_) => {}
            None => last_report.clear(),
        }
        tokio::time::sleep(SERIAL_REOPEN_PAUSE).await;
    }
}

/// Wait until a host is connected to the serial port (it stops reporting `POLLHUP`).
///
/// A new HTTP/2 session writes its SETTINGS frame at once; started while no host is
/// connected, that write blocks in the guest and the frame reaches the *next* host out of
/// step with its handshake, so that connection never answers (docs/vm.md). `POLLHUP` is
/// reported on every poll while the host is away, so this checks on a short timer.
async fn wait_for_host(port: &OwnedFd) -> io::Result<()> {
    while sys::hung_up(port.as_raw_fd())? {
        tokio::time::sleep(HOST_POLL).await;
    }
    Ok(())
}

/// Serve one HTTP/2 connection until it ends. Returns why it failed, unless it simply
/// ended or the host went away (closing a connection is how the host says goodbye).
pub async fn serve_connection<I>(agent: Arc<Agent>, io: I) -> Option<String>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request| {
        let agent = Arc::clone(&agent);
        async move { Ok::<_, Infallible>(route(agent, request).await) }
    });
    let result = http2::Builder::new(TokioExecutor::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME_SIZE)
        .max_send_buf_size(1 << 20)
        .auto_date_header(false)
        .serve_connection(TokioIo::new(io), service)
        .await;
    let error = result.err()?;
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<io::Error>() {
            if host_went_away(io) {
                return None;
            }
        }
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    Some(text)
}

/// I/O errors that only mean the other side closed the stream.
fn host_went_away(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof
    )
}

/// Every route of the protocol (for telling "wrong method" from "no such route").
const ROUTES: &[&str] = &[
    "/v1/info",
    "/v1/exec",
    "/v1/signal",
    "/v1/files/read",
    "/v1/files/write",
    "/v1/files/remove",
    "/v1/files/list",
    "/v1/files/stat",
    "/v1/files/mkdir",
    "/v1/files/move",
    "/v1/files/archive",
    "/v1/files/watch",
    "/v1/identity",
    "/v1/sync",
    "/v1/tcp",
    "/v1/service",
];

async fn route(agent: Arc<Agent>, request: Request<Incoming>) -> Response<AgentBody> {
    let (parts, body) = request.into_parts();
    let (method, path, query) = (parts.method, parts.uri.path(), parts.uri.query());
    if method == Method::POST && path == "/v1/exec" {
        return exec::handle_exec(agent, body).await;
    }
    let done = agent_http::no_content;
    let result = match (&method, path) {
        (&Method::GET, "/v1/info") => identity::info().map(|info| agent_http::json(&info)),
        (&Method::POST, "/v1/signal") => exec::handle_signal(agent, body).await.map(|()| done()),
        (&Method::GET, "/v1/files/read") => match Query::parse(query) {
            Ok(q) => files::read(&q).await,
            Err(e) => Err(e),
        },
        (&Method::PUT, "/v1/files/write") => match Query::parse(query) {
            Ok(q) => files::write(&q, body).await.map(|()| done()),
            Err(e) => Err(e),
        },
        (&Method::DELETE, "/v1/files/remove") => match Query::parse(query) {
            Ok(q) => files::remove(&q).await.map(|()| done()),
            Err(e) => Err(e),
        },
        (&Method::GET, "/v1/files/list") => match Query::parse(query) {
            Ok(q) => files::list(&q).await.map(|list| agent_http::json(&list)),
            Err(e) => Err(e),
        },
        (&Method::GET, "/v1/files/stat") => match Query::parse(query) {
            Ok(q) => files::stat(&q).await.map(|entry| agent_http::json(&entry)),
            Err(e) => Err(e),
        },
        (&Method::GET, "/v1/files/watch") => match Query::parse(query) {
            Ok(q) => files::watch(&q).await,
            Err(e) => Err(e),
        },
        (&Method::GET, "/v1/files/archive") => match Query::parse(query) {
            Ok(q) => files::read_archive(&q).await,
            Err(e) => Err(e),
        },
        (&Method::PUT, "/v1/files/archive") => match Query::parse(query) {
            Ok(q) => files::write_archive(&q, body).await.map(|()| done()),
            Err(e) => Err(e),
        },
        (&Method::POST, "/v1/files/mkdir") => files::mkdir(body).await.map(|()| done()),
        (&Method::POST, "/v1/files/move") => files::rename(body).await.map(|()| done()),
        (&Method::POST, "/v1/identity") => apply_identity(agent, body).await.map(|()| done()),
        (&Method::GET, "/v1/service") => Ok(agent_http::json(&service::status(&agent))),
        (&Method::POST, "/v1/service") => service::start(agent, body)
            .await
            .map(|status| agent_http::json(&status)),
        (&Method::POST, "/v1/sync") => sync_all().await.map(|()| done()),
        (&Method::POST, "/v1/tcp") => match Query::parse(query) {
            Ok(q) => tunnel::handle_tcp(&q, body).await,
            Err(e) => Err(e),
        },
        (_, known) if ROUTES.contains(&known) => Err(Failure::BadRequest(format!(
            "{method} is not allowed on {path}"
        ))),
        _ => Err(Failure::NotFound(format!("no route {method} {path}"))),
    };
    result.unwrap_or_else(|failure| agent_http::error(&failure))
}

async fn apply_identity(agent: Arc<Agent>, body: Incoming) -> Result<(), Failure> {
    let request: hutch_proto::IdentityRequest = agent_http::read_json(body).await?;
    identity::validate(&request)?;
    let is_init = sys::getpid() == 1;
    let applied = tokio::task::spawn_blocking(move || identity::apply(&agent, request, is_init))
        .await
        .map_err(|e| Failure::Internal(format!("identity did not finish: {e}")))??;
    if is_init {
        log!(
            "identity applied (hostname set: {}, entropy added: {}, clock set: {}, root grown to: {:?} bytes, volumes mounted: {})",
            applied.hostname,
            applied.entropy,
            applied.clock,
            applied.root_bytes,
            applied.volumes
        );
    }
    Ok(())
}

/// `POST /v1/sync`: flush every filesystem's dirty pages to its disk.
async fn sync_all() -> Result<(), Failure> {
    // SAFETY: sync has no arguments and cannot fail.
    tokio::task::spawn_blocking(|| unsafe { libc::sync() })
        .await
        .map_err(|e| Failure::Internal(format!("sync did not finish: {e}")))
}
