//! The fake backend's agent: a task of the test process serving the agent protocol
//! (HTTP/2 over a unix socket, `hutch-proto`) with a handful of built-in commands instead of
//! real processes.
//!
//! `GET /v1/info`, `POST /v1/identity` and `POST /v1/sync` answer as the real agent does.
//! `POST /v1/exec` runs one of these, given as an argv or a `sh -c` string split on spaces:
//!
//! - `echo WORDS…`: prints the words and a newline;
//! - `cat`: copies stdin to stdout as it arrives, until EOF;
//! - `true`, `false`, `exit N`: exit 0, 1, N;
//! - anything else: `fake agent: unknown command` on stderr, exit 127.
//!
//! Every other path answers 404 `not_found`.

use std::convert::Infallible;
use std::path::Path;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hutch_proto::{
    encode_data_frames, encode_json_frame, AgentError, AgentErrorCode, AgentInfo, Command,
    ExecExit, ExecRequest, ExecStarted, FrameDecoder, FrameKind,
};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

type Body = BoxBody<Bytes, Infallible>;

/// Start serving on a new socket at `socket` (replacing a stale file); the task ends when
/// aborted.
pub(super) fn serve(socket: &Path, hostname: String) -> std::io::Result<JoinHandle<()>> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)?;
    Ok(tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        while let Ok((stream, _)) = listener.accept().await {
            let hostname = hostname.clone();
            connections.spawn(async move {
                let service = service_fn(move |request| {
                    let hostname = hostname.clone();
                    async move { Ok::<_, Infallible>(route(request, &hostname).await) }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }))
}

fn full(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed());
    *response.status_mut() = status;
    response
}

fn json<T: serde::Serialize>(value: &T) -> Response<Body> {
    full(
        StatusCode::OK,
        serde_json::to_vec(value).expect("protocol types serialize"),
    )
}

async fn route(request: Request<Incoming>, hostname: &str) -> Response<Body> {
    match (request.method().as_str(), request.uri().path()) {
        ("GET", "/v1/info") => json(&AgentInfo {
            protocol_version: hutch_proto::PROTOCOL_VERSION,
            agent_version: "fake".into(),
            hostname: hostname.to_string(),
            kernel: "fake".into(),
            pid: 1,
        }),
        ("POST", "/v1/identity" | "/v1/sync") => full(StatusCode::OK, Vec::new()),
        ("POST", "/v1/exec") => exec(request.into_body()),
        (_, path) => full(
            StatusCode::NOT_FOUND,
            serde_json::to_vec(&AgentError {
                code: AgentErrorCode::NotFound,
                message: format!("the fake agent does not serve {path}"),
            })
            .expect("protocol types serialize"),
        ),
    }
}

/// The response of `POST /v1/exec`: frames sent by a task that reads the request body.
fn exec(body: Incoming) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(run(body, tx));
    let frames = tokio_stream_of(rx).map(|b| Ok::<_, Infallible>(Frame::data(b)));
    Response::new(BodyExt::boxed(StreamBody::new(frames)))
}

fn tokio_stream_of(rx: mpsc::Receiver<Bytes>) -> impl futures_util::Stream<Item = Bytes> {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) })
}

/// Input frames of one exec, in order.
struct Input {
    body: Incoming,
    decoder: FrameDecoder,
}

impl Input {
    async fn next(&mut self) -> Option<hutch_proto::Frame> {
        loop {
            if let Ok(Some(frame)) = self.decoder.next_frame() {
                return Some(frame);
            }
            let data = self.body.frame().await?.ok()?.into_data().ok()?;
            self.decoder.push(&data);
        }
    }
}

async fn run(body: Incoming, tx: mpsc::Sender<Bytes>) {
    let mut input = Input {
        body,
        decoder: FrameDecoder::new(),
    };
    let Some(request) = input
        .next()
        .await
        .and_then(|f| f.json::<ExecRequest>().ok())
    else {
        return;
    };
    let words: Vec<String> = match &request.cmd {
        Command::Argv(argv) => argv.clone(),
        Command::Shell(line) => line.split_whitespace().map(String::from).collect(),
    };
    let _ = tx
        .send(encode_json_frame(
            FrameKind::Started,
            &ExecStarted {
                pid: 2,
                handle: false,
            },
        ))
        .await;
    let send_all = |kind, data: Vec<u8>| {
        let tx = tx.clone();
        async move {
            for frame in encode_data_frames(kind, &data) {
                let _ = tx.send(frame).await;
            }
        }
    };
    let exit_code = match words.first().map(String::as_str) {
        Some("echo") => {
            send_all(
                FrameKind::Stdout,
                format!("{}\n", words[1..].join(" ")).into(),
            )
            .await;
            0
        }
        Some("cat") => {
            // Without stdin the process has /dev/null: nothing to copy.
            if request.stdin {
                while let Some(f) = input.next().await {
                    if f.kind != FrameKind::Stdin {
                        break;
                    }
                    send_all(FrameKind::Stdout, f.payload.to_vec()).await;
                }
            }
            0
        }
        Some("true") => 0,
        Some("false") => 1,
        Some("exit") => words.get(1).and_then(|n| n.parse().ok()).unwrap_or(0),
        _ => {
            send_all(FrameKind::Stderr, b"fake agent: unknown command\n".to_vec()).await;
            127
        }
    };
    let exit = ExecExit {
        exit_code,
        signal: None,
        timed_out: false,
        duration_ms: 0,
        oom_kills: None,
    };
    let _ = tx.send(encode_json_frame(FrameKind::Exit, &exit)).await;
}
