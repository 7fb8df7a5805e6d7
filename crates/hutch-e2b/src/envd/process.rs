//! `process.Process`: start processes and stream their output, list them, send them input
//! and signals, resize their terminals.
//!
//! Processes are Hutch execs. While a process's `Start` stream is open the adapter keeps its
//! input handle, so `SendInput`, `StreamInput`, `CloseStdin`, `Update` and `List` reach it;
//! the process keeps running when the stream closes (as envd's do), and signals reach it by
//! pid through the agent at any time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use bytes::Bytes;
use futures_util::StreamExt;
use hutch_core::exec::{Command, ExecCommand};
use hutch_core::ids::SandboxId;
use hutch_proto::client::{ExecEvent, ExecInput};
use serde_json::{json, Value};

use super::proto::{self, b64, ProcessSelector};
use super::EnvdUser;
use crate::connect::{self, Code, ConnectError};
use crate::target::SandboxTarget;
use crate::E2bState;

/// How often a stream says it is alive when nothing else happens, unless the client asks
/// otherwise (`Keepalive-Ping-Interval`, seconds).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

/// The processes whose `Start` stream is open, per sandbox.
#[derive(Default)]
pub struct Processes {
    by_sandbox: Mutex<HashMap<SandboxId, HashMap<u32, Running>>>,
}

struct Running {
    input: ExecInput,
    info: Value,
    tag: Option<String>,
    pty: bool,
}

impl Processes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, HashMap<u32, Running>>> {
        self.by_sandbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn insert(&self, id: &SandboxId, pid: u32, r: Running) {
        self.lock().entry(id.clone()).or_default().insert(pid, r);
    }

    fn remove(&self, id: &SandboxId, pid: u32) {
        let mut all = self.lock();
        if let Some(m) = all.get_mut(id) {
            m.remove(&pid);
            if m.is_empty() {
                all.remove(id);
            }
        }
    }

    fn find(&self, id: &SandboxId, sel: &ProcessSelector) -> Option<(u32, ExecInput, bool)> {
        let all = self.lock();
        let m = all.get(id)?;
        m.iter()
            .find(|(pid, r)| match (&sel.pid, &sel.tag) {
                (Some(p), _) => *p == **pid,
                (None, Some(t)) => r.tag.as_deref() == Some(t.as_str()),
                _ => false,
            })
            .map(|(pid, r)| (*pid, r.input.clone(), r.pty))
    }

    fn list(&self, id: &SandboxId) -> Vec<Value> {
        self.lock()
            .get(id)
            .map(|m| m.values().map(|r| r.info.clone()).collect())
            .unwrap_or_default()
    }
}

/// `POST /process.Process/{method}`.
pub async fn rpc(
    State(state): State<E2bState>,
    Extension(t): Extension<SandboxTarget>,
    Path(method): Path<String>,
    EnvdUser(user): EnvdUser,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let streaming = connect::is_streaming(&headers);
    match method.as_str() {
        "Start" => match connect::first_message::<proto::StartRequest>(body).await {
            Ok(req) => start(state, t.id, user, &headers, req).await,
            Err(e) => connect::stream_error(e),
        },
        "Connect" => connect::stream_error(ConnectError::new(
            Code::Unimplemented,
            "re-attaching to a process is not supported yet: keep the handle Start returned",
        )),
        "StreamInput" => stream_input(&state, &t.id, body).await,
        _ if streaming => connect::stream_error(ConnectError::new(
            Code::Unimplemented,
            format!("process.Process/{method} is not a streaming method"),
        )),
        _ => match unary(&state, &t.id, &method, body).await {
            Ok(v) => connect::unary_ok(&v),
            Err(e) => axum::response::IntoResponse::into_response(e),
        },
    }
}

async fn read_body(body: Body) -> Result<Bytes, ConnectError> {
    axum::body::to_bytes(body, connect::MAX_MESSAGE)
        .await
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("reading the request: {e}")))
}

fn selector(sel: Option<ProcessSelector>) -> Result<ProcessSelector, ConnectError> {
    match sel {
        Some(s) if s.pid.is_some() || s.tag.is_some() => Ok(s),
        _ => Err(ConnectError::new(
            Code::InvalidArgument,
            "process (pid or tag) is required",
        )),
    }
}

fn not_found(sel: &ProcessSelector) -> ConnectError {
    let what = match (&sel.pid, &sel.tag) {
        (Some(p), _) => format!("pid {p}"),
        (None, Some(t)) => format!("tag {t:?}"),
        _ => "the process".to_string(),
    };
    ConnectError::new(Code::NotFound, format!("process with {what} not found"))
}

fn client_error(e: hutch_proto::client::ClientError) -> ConnectError {
    ConnectError::new(Code::Unavailable, format!("the sandbox's agent: {e}"))
}

async fn unary(
    state: &E2bState,
    id: &SandboxId,
    method: &str,
    body: Body,
) -> Result<Value, ConnectError> {
    let body = read_body(body).await?;
    let procs = &state.processes;
    match method {
        "List" => Ok(json!({ "processes": procs.list(id) })),
        "SendInput" => {
            let req: proto::SendInputRequest = connect::decode_unary(&body)?;
            let sel = selector(req.process)?;
            let (_, input, _) = procs.find(id, &sel).ok_or_else(|| not_found(&sel))?;
            let data = req.input.map(|i| i.bytes()).unwrap_or_default();
            input
                .send_stdin(Bytes::from(data))
                .await
                .map_err(client_error)?;
            Ok(json!({}))
        }
        "CloseStdin" => {
            let req: proto::Selected = connect::decode_unary(&body)?;
            let sel = selector(req.process)?;
            let (_, input, pty) = procs.find(id, &sel).ok_or_else(|| not_found(&sel))?;
            if pty {
                return Err(ConnectError::new(
                    Code::FailedPrecondition,
                    "a terminal has no stdin to close: send Ctrl-D (\\x04) instead",
                ));
            }
            input.close_stdin().await.map_err(client_error)?;
            Ok(json!({}))
        }
        "Update" => {
            let req: proto::UpdateRequest = connect::decode_unary(&body)?;
            let sel = selector(req.process)?;
            let (_, input, _) = procs.find(id, &sel).ok_or_else(|| not_found(&sel))?;
            let size = req
                .pty
                .and_then(|p| p.size)
                .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "pty.size is required"))?;
            input
                .resize(hutch_proto::PtySize {
                    cols: size.cols,
                    rows: size.rows,
                })
                .await
                .map_err(client_error)?;
            Ok(json!({}))
        }
        "SendSignal" => {
            let req: proto::SendSignalRequest = connect::decode_unary(&body)?;
            let signal = req
                .number()
                .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "signal is required"))?;
            let sel = selector(req.process)?;
            let pid = match (procs.find(id, &sel), sel.pid) {
                (Some((pid, _, _)), _) => pid,
                (None, Some(pid)) => pid,
                (None, None) => return Err(not_found(&sel)),
            };
            let agent = state.app.manager.agent(id).await?;
            match agent.signal(pid, signal).await {
                Ok(()) => Ok(json!({})),
                Err(e) => {
                    let e =
                        crate::error::E2bError::from(state.app.manager.agent_error(id, e).await);
                    if e.http_status() == axum::http::StatusCode::NOT_FOUND {
                        Err(not_found(&sel))
                    } else {
                        Err(e.into())
                    }
                }
            }
        }
        other => Err(ConnectError::new(
            Code::Unimplemented,
            format!("process.Process/{other} is not implemented"),
        )),
    }
}

/// `StreamInput`: a `start` naming the process, then `data` messages, fed to its stdin.
async fn stream_input(state: &E2bState, id: &SandboxId, body: Body) -> Response {
    let result = async {
        let mut reader = connect::EnvelopeReader::default();
        let mut chunks = body.into_data_stream();
        let mut target: Option<ExecInput> = None;
        loop {
            while let Some(m) = reader.next_message()? {
                let req: proto::StreamInputRequest = connect::decode_unary(&m)?;
                if let Some(start) = req.start {
                    let sel = selector(start.process)?;
                    let (_, input, _) = state
                        .processes
                        .find(id, &sel)
                        .ok_or_else(|| not_found(&sel))?;
                    target = Some(input);
                } else if let Some(data) = req.data {
                    let input = target.as_ref().ok_or_else(|| {
                        ConnectError::new(Code::InvalidArgument, "the first message must be start")
                    })?;
                    let bytes = data.input.map(|i| i.bytes()).unwrap_or_default();
                    input
                        .send_stdin(Bytes::from(bytes))
                        .await
                        .map_err(client_error)?;
                }
            }
            match chunks.next().await {
                Some(Ok(c)) => reader.push(&c),
                Some(Err(e)) => return Err(ConnectError::new(Code::Canceled, e.to_string())),
                None => return Ok(()),
            }
        }
    }
    .await;
    match result {
        Ok(()) => connect::stream_response(futures_util::stream::iter([Ok::<_, ConnectError>(
            json!({}),
        )])),
        Err(e) => connect::stream_error(e),
    }
}

/// The exec a `StartRequest` asks for.
fn exec_command(
    req: &proto::StartRequest,
    user: Option<String>,
    headers: &HeaderMap,
) -> Result<ExecCommand, ConnectError> {
    let process = req
        .process
        .as_ref()
        .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "process is required"))?;
    if process.cmd.is_empty() {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "process.cmd is required",
        ));
    }
    let mut argv = vec![process.cmd.clone()];
    argv.extend(process.args.iter().cloned());
    // `Connect-Timeout-Ms`: the process's lifetime, as envd kills it at that deadline.
    let timeout = headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis);
    let cwd = match process.cwd.as_deref().filter(|c| !c.is_empty()) {
        Some(c) => Some(super::absolute(c, user.as_deref()).map_err(ConnectError::from)?),
        None => None,
    };
    Ok(ExecCommand {
        cmd: Command::Argv(argv),
        env: process.envs.clone(),
        cwd,
        user,
        stdin: (req.stdin == Some(true)).then(Bytes::new),
        timeout,
        // envd's processes outlive the stream that started them.
        background: true,
    })
}

/// How often a stream says it is alive (`Keepalive-Ping-Interval`, seconds).
pub(super) fn keepalive_interval(headers: &HeaderMap) -> Duration {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map_or(DEFAULT_KEEPALIVE, Duration::from_secs)
}

/// `Start`: the `start` event with the pid, the output as `data` events, then `end`.
async fn start(
    state: E2bState,
    id: SandboxId,
    user: Option<String>,
    headers: &HeaderMap,
    req: proto::StartRequest,
) -> Response {
    let cmd = match exec_command(&req, user, headers) {
        Ok(c) => c,
        Err(e) => return connect::stream_error(e),
    };
    let pty = req.pty.as_ref().map(|p| {
        let s = p.size.unwrap_or(proto::PtySize { cols: 80, rows: 24 });
        hutch_proto::PtySize {
            cols: s.cols.max(1),
            rows: s.rows.max(1),
        }
    });
    let mut cmd = cmd;
    if pty.is_some() {
        cmd.env
            .entry("TERM".into())
            .or_insert_with(|| "xterm-256color".into());
        cmd.env
            .entry("LANG".into())
            .or_insert_with(|| "C.UTF-8".into());
        cmd.env
            .entry("LC_ALL".into())
            .or_insert_with(|| "C.UTF-8".into());
    }
    let (session, slot) = match state.app.manager.exec_session(&id, &cmd, pty).await {
        Ok(s) => s,
        Err(e) => return connect::stream_error(e.into()),
    };
    let process = req.process.as_ref();
    let info = json!({
        "config": {
            "cmd": process.map(|p| p.cmd.clone()).unwrap_or_default(),
            "args": process.map(|p| p.args.clone()).unwrap_or_default(),
            "envs": process.map(|p| p.envs.clone()).unwrap_or_default(),
            "cwd": cmd.cwd,
        },
        "tag": req.tag,
    });
    let interval = keepalive_interval(headers);
    let (input, mut events) = session.into_parts();
    let procs = Arc::clone(&state.processes);
    let tag = req.tag.clone();
    let is_pty = pty.is_some();
    let stream = async_stream(move |tx| async move {
        let _slot = slot;
        let mut pid = None;
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            let event = tokio::select! {
                e = events.next() => e,
                _ = tick.tick() => {
                    if tx.send(Ok(json!({"event": {"keepalive": {}}}))).await.is_err() { break; }
                    continue;
                }
            };
            let message = match event {
                Some(Ok(ExecEvent::Started { pid: p })) => {
                    pid = Some(p);
                    let mut info = info.clone();
                    info["pid"] = json!(p);
                    procs.insert(
                        &id,
                        p,
                        Running {
                            input: input.clone(),
                            info,
                            tag: tag.clone(),
                            pty: is_pty,
                        },
                    );
                    Ok(json!({"event": {"start": {"pid": p}}}))
                }
                Some(Ok(ExecEvent::Stdout(b))) => {
                    let key = if is_pty { "pty" } else { "stdout" };
                    Ok(json!({"event": {"data": {key: b64(&b)}}}))
                }
                Some(Ok(ExecEvent::Stderr(b))) => {
                    Ok(json!({"event": {"data": {"stderr": b64(&b)}}}))
                }
                Some(Ok(ExecEvent::Exit(exit))) => {
                    let status = match exit.signal {
                        _ if exit.timed_out => "signal: killed (timeout)".to_string(),
                        Some(s) => format!("signal: {}", signal_name(s)),
                        None => format!("exit status {}", exit.exit_code),
                    };
                    let mut end = json!({"exitCode": exit.exit_code, "exited": exit.signal.is_none(), "status": status});
                    if exit.exit_code == 127 || exit.exit_code == 126 {
                        end["error"] = json!(status);
                    }
                    let _ = tx.send(Ok(json!({"event": {"end": end}}))).await;
                    break;
                }
                Some(Ok(ExecEvent::Error(e))) => {
                    let code = match e.code.as_str() {
                        "not_found" | "not_a_directory" | "bad_request" => Code::InvalidArgument,
                        "permission_denied" => Code::PermissionDenied,
                        _ => Code::Internal,
                    };
                    let _ = tx.send(Err(ConnectError::new(code, e.message))).await;
                    break;
                }
                Some(Err(e)) => {
                    let _ = tx.send(Err(client_error(e))).await;
                    break;
                }
                None => break,
            };
            if tx.send(message).await.is_err() {
                break;
            }
        }
        if let Some(p) = pid {
            procs.remove(&id, p);
        }
    });
    connect::stream_response(stream)
}

fn signal_name(s: i32) -> &'static str {
    match s {
        9 => "killed",
        15 => "terminated",
        2 => "interrupt",
        1 => "hangup",
        _ => "signal",
    }
}

/// A stream fed by a task that `f` runs with the sending half (ends when the task ends or
/// the response is dropped).
fn async_stream<F, Fut>(
    f: F,
) -> impl futures_util::Stream<Item = Result<Value, ConnectError>> + Send
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Value, ConnectError>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::spawn(f(tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
