//! The host-side client of the agent protocol (feature `client`).
//!
//! One [`AgentClient`] wraps one HTTP/2 connection to one sandbox's agent. It is cheap to
//! clone; every clone multiplexes its calls over the same connection, so a server keeps one
//! client per sandbox and hands clones to every request.
//!
//! Errors are a [`ClientError`]: [`ClientError::Agent`] is an answer from the agent (not
//! found, not empty, ...), [`ClientError::Transport`] means the connection is gone (the
//! caller should treat the sandbox as unreachable, and [`AgentClient::is_closed`] turns true),
//! [`ClientError::Protocol`] is an answer the client could not understand.

mod exec;
mod piped;
mod process;
pub mod service;
mod tunnel;
mod watch;

use std::error::Error as StdError;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt, TryStreamExt};
use http::{Method, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, Limited, StreamBody};
use hyper::body::{Body, Frame, Incoming};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite};

pub use self::exec::{CollectedExec, ExecEvent, ExecEvents, ExecInput, ExecSession};
pub use self::piped::{PipedExec, StdinSource};
pub use self::tunnel::TcpTunnel;
pub use self::watch::{FileWatchStream, WatchOptions, MAX_WATCH_LINE};
use crate::file_metadata::{self, FileMetadata};
use crate::{
    query, AgentError, AgentErrorCode, AgentInfo, ExecRequest, FileEntry, IdentityRequest,
    ListResponse, MkdirRequest, MoveRequest, SignalRequest,
};

/// Per-stream HTTP/2 receive window the client advertises (4 MiB).
pub const STREAM_WINDOW: u32 = 4 << 20;
/// Connection-wide HTTP/2 receive window the client advertises (64 MiB). Data is only
/// buffered for streams the caller does not read, at most [`STREAM_WINDOW`] each; a large
/// connection window keeps a few such stalled streams (slow clients behind the server) from
/// blocking every other call on the connection.
pub const CONNECTION_WINDOW: u32 = 64 << 20;
/// Largest HTTP/2 frame the client accepts (256 KiB).
pub const MAX_FRAME_SIZE: u32 = 256 << 10;
/// Largest JSON answer the client buffers (a listing of 100 000 entries fits).
const MAX_JSON_RESPONSE: usize = 64 << 20;
/// Largest error body the client reads.
const MAX_ERROR_RESPONSE: usize = 64 << 10;

/// The authority in request URIs. HTTP/2 needs one; the agent ignores it.
const BASE: &str = "http://agent";

type BoxError = Box<dyn StdError + Send + Sync>;
type RequestBody = UnsyncBoxBody<Bytes, BoxError>;

/// Errors of the agent client. Messages never carry dependency types.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The agent answered with an error (its status mapped to [`AgentError::code`]).
    #[error("agent: {0}")]
    Agent(AgentError),
    /// The connection to the agent failed or is gone.
    #[error("agent connection: {0}")]
    Transport(String),
    /// The agent's answer did not follow the protocol (or a single call was cut off while the
    /// connection stayed up).
    #[error("agent protocol: {0}")]
    Protocol(String),
}

impl ClientError {
    /// True when the connection is gone (the sandbox is unreachable).
    pub fn is_transport(&self) -> bool {
        matches!(self, Self::Transport(_))
    }
}

/// Result alias of the client.
pub type ClientResult<T> = Result<T, ClientError>;

/// A connection to one agent. Clones share the connection.
#[derive(Clone)]
pub struct AgentClient {
    sender: http2::SendRequest<RequestBody>,
    /// A duplicate of the unix socket underneath, to end the connection at once whatever
    /// clones or streams are still alive ([`AgentClient::hang_up`]).
    socket: Option<std::sync::Arc<std::os::unix::net::UnixStream>>,
}

impl std::fmt::Debug for AgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentClient")
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl AgentClient {
    /// Connect to an agent listening on a unix socket (the `ns` backend's per-sandbox path).
    pub async fn connect_unix(path: impl AsRef<Path>) -> ClientResult<Self> {
        let path = path.as_ref();
        let stream = tokio::net::UnixStream::connect(path)
            .await
            .map_err(|e| ClientError::Transport(format!("connect to {}: {e}", path.display())))?;
        Self::handshake_unix(stream).await
    }

    /// Speak the protocol over a connected unix socket, keeping a duplicate of it so that
    /// [`AgentClient::hang_up`] can end the connection.
    pub async fn handshake_unix(stream: tokio::net::UnixStream) -> ClientResult<Self> {
        use std::os::fd::AsFd;
        let socket = stream
            .as_fd()
            .try_clone_to_owned()
            .map(std::os::unix::net::UnixStream::from)
            .map_err(|e| ClientError::Transport(format!("duplicate the agent socket: {e}")))?;
        let mut client = Self::handshake(stream).await?;
        client.socket = Some(std::sync::Arc::new(socket));
        Ok(client)
    }

    /// End the connection now, for every clone and open stream (the agent sees it close
    /// and ends its session). A no-op for clients made over other byte streams.
    pub fn hang_up(&self) {
        if let Some(socket) = &self.socket {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Speak the protocol over any byte stream (a unix socket, a serial port bridged by the
    /// `vm` backend, ...). Spawns the connection task on the current tokio runtime.
    pub async fn handshake<T>(io: T) -> ClientResult<Self>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_frame_size(MAX_FRAME_SIZE)
            .max_send_buf_size(1 << 20)
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| ClientError::Transport(format!("HTTP/2 handshake: {}", describe(&e))))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %describe(&e), "agent connection ended");
            }
        });
        Ok(Self {
            sender,
            socket: None,
        })
    }

    /// True once the connection is gone; a new client must be connected.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// Wait until the connection can take a new call; fails when it is gone.
    pub async fn ready(&self) -> ClientResult<()> {
        let mut sender = self.sender.clone();
        sender
            .ready()
            .await
            .map_err(|e| ClientError::Transport(describe(&e)))
    }

    /// `GET /v1/info`.
    pub async fn info(&self) -> ClientResult<AgentInfo> {
        self.json_call(Method::GET, "/v1/info", None).await
    }

    /// Start a process. See [`ExecSession`].
    pub async fn exec(&self, request: ExecRequest) -> ClientResult<ExecSession> {
        exec::start(self, request).await
    }

    /// Run a process to completion: feed `stdin` (then EOF; `None` gives it `/dev/null`),
    /// keep up to `output_cap_bytes` of each of stdout and stderr (the rest is read and
    /// discarded, and flagged as truncated), and return its exit.
    pub async fn exec_collect(
        &self,
        request: ExecRequest,
        stdin: Option<Bytes>,
        output_cap_bytes: usize,
    ) -> ClientResult<CollectedExec> {
        exec::collect(self, request, stdin, output_cap_bytes).await
    }

    /// `POST /v1/tcp?port=`: a byte stream to `port` on the sandbox's own loopback. Nothing
    /// listening is [`ClientError::Agent`] with code `connection_refused`. See [`TcpTunnel`].
    pub async fn connect_tcp(&self, port: u16) -> ClientResult<TcpTunnel> {
        tunnel::open(self, port).await
    }

    /// `POST /v1/signal`: signal the process group of a running exec.
    pub async fn signal(&self, pid: u32, signal: i32) -> ClientResult<()> {
        let body = json_body(&SignalRequest { pid, signal });
        self.empty_call(Method::POST, "/v1/signal", Some(body))
            .await
    }

    /// `GET /v1/files/read`: the file's bytes as a stream, so large files never sit in memory.
    pub async fn read_file(&self, path: &str) -> ClientResult<ByteStream> {
        self.read_file_as(path, None).await
    }

    /// [`Self::read_file`] with the file opened as `user` of the sandbox (its permissions
    /// apply); `None` reads as the agent (root).
    pub async fn read_file_as(&self, path: &str, user: Option<&str>) -> ClientResult<ByteStream> {
        let mut pairs = vec![("path", path)];
        if let Some(user) = user {
            pairs.push(("user", user));
        }
        let uri = format!("/v1/files/read?{}", query::build(&pairs));
        let response = self.call(Method::GET, &uri, empty_body()).await?;
        Ok(ByteStream {
            body: response.into_body(),
        })
    }

    /// `PUT /v1/files/write`: stream `body` into the file (parents created). With `mode` the
    /// file gets exactly that mode; without, a new file gets `0o644` and an existing file
    /// keeps its mode. A body that yields an error aborts the upload.
    pub async fn write_file<S>(&self, path: &str, mode: Option<u32>, body: S) -> ClientResult<()>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        self.write_file_as(path, mode, None, &FileMetadata::new(), body)
            .await
    }

    /// [`Self::write_file`] with the file opened, and created with its missing parents, as
    /// `user` of the sandbox: its permissions apply and what is created is its own. Each
    /// `metadata` pair becomes one of the file's `user.*` extended attributes (checked here
    /// first: [`crate::file_metadata::check`]).
    pub async fn write_file_as<S>(
        &self,
        path: &str,
        mode: Option<u32>,
        user: Option<&str>,
        metadata: &FileMetadata,
        body: S,
    ) -> ClientResult<()>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        let body = StreamBody::new(
            body.map_ok(Frame::data)
                .map_err(|e| Box::new(e) as BoxError),
        );
        self.write_file_body(path, mode, user, metadata, UnsyncBoxBody::new(body))
            .await
    }

    /// [`Self::write_file`] with the whole content at hand.
    pub async fn write_file_bytes(
        &self,
        path: &str,
        mode: Option<u32>,
        data: Bytes,
    ) -> ClientResult<()> {
        self.write_file_body(path, mode, None, &FileMetadata::new(), full_body(data))
            .await
    }

    async fn write_file_body(
        &self,
        path: &str,
        mode: Option<u32>,
        user: Option<&str>,
        metadata: &FileMetadata,
        body: RequestBody,
    ) -> ClientResult<()> {
        // Without a mode the agent gives new files 0644 and leaves an existing file's mode.
        let mode = mode.map(|m| format!("{m:04o}"));
        let mut pairs = vec![("path", path)];
        if let Some(mode) = &mode {
            pairs.push(("mode", mode.as_str()));
        }
        if let Some(user) = user {
            pairs.push(("user", user));
        }
        let metadata = if metadata.is_empty() {
            None
        } else {
            file_metadata::check(metadata).map_err(|e| {
                ClientError::Agent(AgentError::new(AgentErrorCode::BadRequest, e.to_string()))
            })?;
            Some(
                serde_json::to_string(metadata)
                    .map_err(|e| ClientError::Protocol(format!("metadata: {e}")))?,
            )
        };
        if let Some(metadata) = &metadata {
            pairs.push(("metadata", metadata.as_str()));
        }
        let uri = format!("/v1/files/write?{}", query::build(&pairs));
        self.call(Method::PUT, &uri, body).await.map(drop)
    }

    /// `GET /v1/files/archive`: a tar stream of the directory (or file) at `path`, made by
    /// the agent without following symlinks.
    pub async fn read_archive(&self, path: &str) -> ClientResult<ByteStream> {
        let uri = format!("/v1/files/archive?{}", query::build(&[("path", path)]));
        let response = self.call(Method::GET, &uri, empty_body()).await?;
        Ok(ByteStream {
            body: response.into_body(),
        })
    }

    /// `PUT /v1/files/archive`: the agent unpacks the tar stream `body` below the directory
    /// `path` (created if missing), refusing entries that would land outside it.
    pub async fn write_archive<S>(&self, path: &str, body: S) -> ClientResult<()>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        self.write_archive_as(path, false, body).await
    }

    /// `PUT /v1/files/archive?path=&owners=keep` when `keep_owners`: as
    /// [`AgentClient::write_archive`], the entries owned by the numeric owners the archive
    /// records (a Dockerfile build's `COPY --chown`).
    pub async fn write_archive_as<S>(
        &self,
        path: &str,
        keep_owners: bool,
        body: S,
    ) -> ClientResult<()>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        let body = StreamBody::new(
            body.map_ok(Frame::data)
                .map_err(|e| Box::new(e) as BoxError),
        );
        let mut params = vec![("path", path)];
        if keep_owners {
            params.push(("owners", "keep"));
        }
        let uri = format!("/v1/files/archive?{}", query::build(&params));
        self.call(Method::PUT, &uri, UnsyncBoxBody::new(body))
            .await
            .map(drop)
    }

    /// `DELETE /v1/files/remove`. Directories need `recursive`; symlinks are never followed.
    pub async fn remove(&self, path: &str, recursive: bool) -> ClientResult<()> {
        let recursive = if recursive { "true" } else { "false" };
        let uri = format!(
            "/v1/files/remove?{}",
            query::build(&[("path", path), ("recursive", recursive)])
        );
        self.empty_call(Method::DELETE, &uri, None).await
    }

    /// `GET /v1/files/list`: entries below a directory, `depth` levels deep (default 1).
    pub async fn list(&self, path: &str, depth: Option<u32>) -> ClientResult<ListResponse> {
        let depth = depth.unwrap_or(1).to_string();
        let uri = format!(
            "/v1/files/list?{}",
            query::build(&[("path", path), ("depth", &depth)])
        );
        self.json_call(Method::GET, &uri, None).await
    }

    /// `GET /v1/files/stat` (does not follow a final symlink).
    pub async fn stat(&self, path: &str) -> ClientResult<FileEntry> {
        let uri = format!("/v1/files/stat?{}", query::build(&[("path", path)]));
        self.json_call(Method::GET, &uri, None).await
    }

    /// `GET /v1/files/watch`: changes below the directory `path`, from once the watch is
    /// armed (this returns after the agent's ready line). A missing path is
    /// [`ClientError::Agent`] `not_found`, a file `not_a_directory`. See [`FileWatchStream`].
    pub async fn watch(&self, path: &str, options: WatchOptions) -> ClientResult<FileWatchStream> {
        watch::start(self, path, options).await
    }

    /// `POST /v1/files/mkdir` (with parents; fine if the directory exists).
    pub async fn mkdir(&self, path: &str) -> ClientResult<()> {
        let body = json_body(&MkdirRequest {
            path: path.to_string(),
        });
        self.empty_call(Method::POST, "/v1/files/mkdir", Some(body))
            .await
    }

    /// `POST /v1/files/move` (creates the destination's parents).
    pub async fn rename(&self, from: &str, to: &str) -> ClientResult<()> {
        let body = json_body(&MoveRequest {
            from: from.to_string(),
            to: to.to_string(),
        });
        self.empty_call(Method::POST, "/v1/files/move", Some(body))
            .await
    }

    /// `POST /v1/identity`: environment, hostname, entropy and clock of the sandbox.
    pub async fn identity(&self, identity: &IdentityRequest) -> ClientResult<()> {
        self.empty_call(Method::POST, "/v1/identity", Some(json_body(identity)))
            .await
    }

    /// `POST /v1/sync`: write every dirty page of the sandbox's filesystems to their disks
    /// (`vm`: before a volume's guest stops, so its data is on the volume's image).
    pub async fn sync(&self) -> ClientResult<()> {
        self.empty_call(Method::POST, "/v1/sync", None).await
    }

    /// Send a request; a non-2xx answer becomes [`ClientError::Agent`].
    pub(crate) async fn call(
        &self,
        method: Method,
        uri: &str,
        body: RequestBody,
    ) -> ClientResult<Response<Incoming>> {
        let request = Request::builder()
            .method(method)
            .uri(format!("{BASE}{uri}"))
            .body(body)
            .map_err(|e| ClientError::Protocol(format!("building request for {uri}: {e}")))?;
        let mut sender = self.sender.clone();
        sender
            .ready()
            .await
            .map_err(|e| ClientError::Transport(describe(&e)))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| classify(&e))?;
        if response.status().is_success() {
            return Ok(response);
        }
        Err(error_from_response(response).await)
    }

    async fn empty_call(&self, method: Method, uri: &str, body: Option<Bytes>) -> ClientResult<()> {
        let body = body.map_or_else(empty_body, full_body);
        self.call(method, uri, body).await.map(drop)
    }

    async fn json_call<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        uri: &str,
        body: Option<Bytes>,
    ) -> ClientResult<T> {
        let body = body.map_or_else(empty_body, full_body);
        let response = self.call(method, uri, body).await?;
        let bytes = collect_limited(response.into_body(), MAX_JSON_RESPONSE).await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Protocol(format!("bad JSON from {uri}: {e}")))
    }
}

/// The bytes of a file being read, as they arrive.
#[derive(Debug)]
pub struct ByteStream {
    body: Incoming,
}

impl ByteStream {
    /// The next chunk, `None` at the end of the file.
    pub async fn next_chunk(&mut self) -> Option<ClientResult<Bytes>> {
        self.next().await
    }

    /// Read everything into memory; fails with [`ClientError::Protocol`] past `limit` bytes.
    pub async fn collect_bytes(mut self, limit: usize) -> ClientResult<Bytes> {
        let mut out = BytesMut::new();
        while let Some(chunk) = self.next_chunk().await {
            let chunk = chunk?;
            if out.len() + chunk.len() > limit {
                return Err(ClientError::Protocol(format!(
                    "file is larger than {limit} bytes"
                )));
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out.freeze())
    }
}

impl Stream for ByteStream {
    type Item = ClientResult<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            return match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(classify(&e)))),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if data.is_empty() => continue,
                    Ok(data) => Poll::Ready(Some(Ok(data))),
                    // Trailers carry nothing for us.
                    Err(_) => continue,
                },
            };
        }
    }
}

fn empty_body() -> RequestBody {
    UnsyncBoxBody::new(Empty::<Bytes>::new().map_err(|never| match never {}))
}

fn full_body(data: Bytes) -> RequestBody {
    UnsyncBoxBody::new(Full::new(data).map_err(|never| match never {}))
}

fn json_body<T: serde::Serialize>(value: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(value).expect("protocol types always serialize"))
}

async fn collect_limited(body: Incoming, limit: usize) -> ClientResult<Bytes> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) => match e.downcast::<hyper::Error>() {
            Ok(e) => Err(classify(&e)),
            Err(e) => Err(ClientError::Protocol(format!("agent answer: {e}"))),
        },
    }
}

async fn error_from_response(response: Response<Incoming>) -> ClientError {
    let status = response.status();
    let body = match collect_limited(response.into_body(), MAX_ERROR_RESPONSE).await {
        Ok(body) => body,
        Err(e) => return e,
    };
    match parse_error_body(&body) {
        Some(error) => ClientError::Agent(error),
        None => ClientError::Protocol(format!(
            "agent answered {status} without an error body: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        )),
    }
}

/// An error body; a code this version does not know (from a newer agent) becomes
/// `internal` with the code kept in the message.
fn parse_error_body(body: &[u8]) -> Option<AgentError> {
    if let Ok(error) = serde_json::from_slice::<AgentError>(body) {
        return Some(error);
    }
    #[derive(serde::Deserialize)]
    struct Loose {
        code: String,
        message: String,
    }
    let loose: Loose = serde_json::from_slice(body).ok()?;
    Some(AgentError::new(
        crate::AgentErrorCode::Internal,
        format!("{}: {}", loose.code, loose.message),
    ))
}

/// Sort a hyper error into transport (the connection is gone) or protocol (one call failed).
pub(crate) fn classify(error: &hyper::Error) -> ClientError {
    let message = describe(error);
    let mut connection_gone =
        error.is_closed() || error.is_canceled() || error.is_incomplete_message();
    let mut source: Option<&(dyn StdError + 'static)> = error.source();
    while let Some(s) = source {
        if let Some(h2) = s.downcast_ref::<h2::Error>() {
            // I/O failures and GOAWAY end the connection; a RST_STREAM ends one call.
            connection_gone |= h2.is_io() || h2.is_go_away();
        }
        connection_gone |= s.is::<std::io::Error>();
        source = s.source();
    }
    if connection_gone {
        ClientError::Transport(message)
    } else {
        ClientError::Protocol(message)
    }
}

/// An error and its causes on one line (hyper's own message is terse).
fn describe(error: &dyn StdError) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = s.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AgentErrorCode;

    #[test]
    fn error_bodies_parse_and_unknown_codes_become_internal() {
        let known = parse_error_body(br#"{"code":"not_empty","message":"rm /a"}"#);
        assert_eq!(
            known,
            Some(AgentError::new(AgentErrorCode::NotEmpty, "rm /a"))
        );
        let unknown = parse_error_body(br#"{"code":"too_hot","message":"cool down"}"#);
        assert_eq!(
            unknown,
            Some(AgentError::new(
                AgentErrorCode::Internal,
                "too_hot: cool down"
            ))
        );
        assert_eq!(parse_error_body(b"<html>"), None);
    }
}
