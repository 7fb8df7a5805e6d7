//! `process.Process`: start processes and stream their output, re-attach to them, list
//! them, send them input and signals, resize their terminals — onto Hutch's process handles
//! (`docs/processes.md`): every process envd starts outlives the stream that started it, as
//! envd's do, keeps what it writes while nobody is attached (a 1 MiB ring per stream) and
//! its exit code for late `Connect`s.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use bytes::Bytes;
use futures_util::StreamExt;
use hutch_core::exec::Command;
use hutch_core::ids::SandboxId;
use hutch_core::process::{
    ProcessEvent, ProcessInfo, ProcessSelector, ProcessStart, ProcessState, ProcessStream,
};
use hutch_core::CoreError;
use serde_json::{json, Value};

use super::proto::{self, b64};
use super::EnvdUser;
use crate::connect::{self, Code, ConnectError};
use crate::target::SandboxTarget;
use crate::E2bState;

/// How often a stream says it is alive when nothing else happens, unless the client asks
/// otherwise (`Keepalive-Ping-Interval`, seconds).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

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
        "Connect" => match connect::first_message::<proto::Selected>(body).await {
            Ok(req) => attach(state, t.id, &headers, req).await,
            Err(e) => connect::stream_error(e),
        },
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

fn selector(sel: Option<proto::ProcessSelector>) -> Result<ProcessSelector, ConnectError> {
    match sel {
        Some(proto::ProcessSelector { pid: Some(p), .. }) => Ok(ProcessSelector::Pid(p)),
        Some(proto::ProcessSelector { tag: Some(t), .. }) => Ok(ProcessSelector::Tag(t)),
        _ => Err(ConnectError::new(
            Code::InvalidArgument,
            "process (pid or tag) is required",
        )),
    }
}

/// A Hutch error about a process, in envd's codes: an unknown one is `not_found` (the SDKs'
/// `kill` then answers `False`), one that has exited too.
fn process_error(e: CoreError, sel: &ProcessSelector) -> ConnectError {
    let what = match sel {
        ProcessSelector::Pid(p) => format!("pid {p}"),
        ProcessSelector::Tag(t) => format!("tag {t:?}"),
    };
    match e {
        CoreError::ProcessNotFound(_) => {
            ConnectError::new(Code::NotFound, format!("process with {what} not found"))
        }
        CoreError::ProcessExited(_) => {
            ConnectError::new(Code::NotFound, format!("process with {what} has exited"))
        }
        other => other.into(),
    }
}

/// envd's `ProcessInfo` of a Hutch handle.
fn process_info(p: &ProcessInfo) -> Value {
    let (cmd, args) = match p.cmd.split_first() {
        Some((c, rest)) => (c.clone(), rest.to_vec()),
        None => (String::new(), Vec::new()),
    };
    let mut v = json!({
        "config": {"cmd": cmd, "args": args, "envs": p.env, "cwd": p.cwd},
        "pid": p.pid,
    });
    if let Some(tag) = &p.tag {
        v["tag"] = json!(tag);
    }
    v
}

async fn unary(
    state: &E2bState,
    id: &SandboxId,
    method: &str,
    body: Body,
) -> Result<Value, ConnectError> {
    let body = read_body(body).await?;
    let manager = &state.app.manager;
    match method {
        "List" => {
            let all = manager.list_processes(id).await?;
            let running: Vec<Value> = all
                .iter()
                .filter(|p| p.state == ProcessState::Running)
                .map(process_info)
                .collect();
            Ok(json!({ "processes": running }))
        }
        "SendInput" => {
            let req: proto::SendInputRequest = connect::decode_unary(&body)?;
            let sel = selector(req.process)?;
            let data = req.input.map(|i| i.bytes()).unwrap_or_default();
            manager
                .process_input(id, &sel, Bytes::from(data))
                .await
                .map_err(|e| process_error(e, &sel))?;
            Ok(json!({}))
        }
        "CloseStdin" => {
            let req: proto::Selected = connect::decode_unary(&body)?;
            let sel = selector(req.process)?;
            manager
                .close_process_stdin(id, &sel)
                .await
                .map_err(|e| process_error(e, &sel))?;
            Ok(json!({}))
        }
        "Update" => {
            let req: proto::UpdateRequest = connect::decode_unary(&body)?;
            let sel = selector(req.process)?;
            let size = req
                .pty
                .and_then(|p| p.size)
                .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "pty.size is required"))?;
            manager
                .resize_process(
                    id,
                    &sel,
                    hutch_proto::PtySize {
                        cols: size.cols,
                        rows: size.rows,
                    },
                )
                .await
                .map_err(|e| process_error(e, &sel))?;
            Ok(json!({}))
        }
        "SendSignal" => {
            let req: proto::SendSignalRequest = connect::decode_unary(&body)?;
            let signal = req
                .number()
                .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "signal is required"))?;
            let sel = selector(req.process)?;
            manager
                .signal_process(id, &sel, signal)
                .await
                .map_err(|e| process_error(e, &sel))?;
            Ok(json!({}))
        }
        other => Err(ConnectError::new(
            Code::Unimplemented,
            format!("process.Process has no method {other}"),
        )),
    }
}

/// `StreamInput`: a `start` naming the process, then `data` messages, fed to its stdin.
async fn stream_input(state: &E2bState, id: &SandboxId, body: Body) -> Response {
    let result = async {
        let mut reader = connect::EnvelopeReader::default();
        let mut chunks = body.into_data_stream();
        let mut target: Option<ProcessSelector> = None;
        loop {
            while let Some(m) = reader.next_message()? {
                let req: proto::StreamInputRequest = connect::decode_unary(&m)?;
                if let Some(start) = req.start {
                    let sel = selector(start.process)?;
                    state
                        .app
                        .manager
                        .process_info(id, &sel)
                        .await
                        .map_err(|e| process_error(e, &sel))?;
                    target = Some(sel);
                } else if let Some(data) = req.data {
                    let sel = target.as_ref().ok_or_else(|| {
                        ConnectError::new(Code::InvalidArgument, "the first message must be start")
                    })?;
                    let bytes = data.input.map(|i| i.bytes()).unwrap_or_default();
                    state
                        .app
                        .manager
                        .process_input(id, sel, Bytes::from(bytes))
                        .await
                        .map_err(|e| process_error(e, sel))?;
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

/// The handle a `StartRequest` asks for.
fn process_start(
    req: &proto::StartRequest,
    user: Option<String>,
    headers: &HeaderMap,
) -> Result<ProcessStart, ConnectError> {
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
    let mut start = ProcessStart::new(Command::Argv(argv));
    // `Connect-Timeout-Ms`: the process's lifetime, as envd kills it at that deadline.
    start.timeout = headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis);
    start.cwd = match process.cwd.as_deref().filter(|c| !c.is_empty()) {
        Some(c) => Some(super::absolute(c, user.as_deref()).map_err(ConnectError::from)?),
        None => None,
    };
    start.env = process.envs.clone();
    start.tag = req.tag.clone().filter(|t| !t.is_empty());
    start.stdin = req.stdin == Some(true);
    if let Some(pty) = &req.pty {
        let s = pty.size.unwrap_or(proto::PtySize { cols: 80, rows: 24 });
        start.pty = Some(hutch_proto::PtySize {
            cols: s.cols.max(1),
            rows: s.rows.max(1),
        });
        start.stdin = true;
        for (k, v) in [
            ("TERM", "xterm-256color"),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C.UTF-8"),
        ] {
            start.env.entry(k.into()).or_insert_with(|| v.into());
        }
    }
    start.user = user;
    Ok(start)
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
    let start = match process_start(&req, user, headers) {
        Ok(s) => s,
        Err(e) => return connect::stream_error(e),
    };
    match state.app.manager.start_process_streaming(&id, start).await {
        Ok((info, events)) => events_response(info, events, keepalive_interval(headers)),
        Err(CoreError::TagInUse(_)) => connect::stream_error(ConnectError::new(
            Code::AlreadyExists,
            format!(
                "a process with tag {:?} is running",
                req.tag.unwrap_or_default()
            ),
        )),
        Err(e) => connect::stream_error(start_error(e)),
    }
}

/// A start refused: a program that is not there, or a `cwd` that is not, is envd's
/// `invalid_argument`.
fn start_error(e: CoreError) -> ConnectError {
    let e = crate::error::E2bError::from(e);
    match e.hutch_code() {
        Some("command_not_found" | "not_found" | "not_a_directory" | "bad_request") => {
            ConnectError::new(Code::InvalidArgument, e.message())
        }
        _ => e.into(),
    }
}

/// `Connect`: re-attach to a handle: its new output, then its end (at once for one that
/// has exited: its exit code is kept).
async fn attach(
    state: E2bState,
    id: SandboxId,
    headers: &HeaderMap,
    req: proto::Selected,
) -> Response {
    let sel = match selector(req.process) {
        Ok(s) => s,
        Err(e) => return connect::stream_error(e),
    };
    let manager = &state.app.manager;
    let info = match manager.process_info(&id, &sel).await {
        Ok(i) => i,
        Err(e) => return connect::stream_error(process_error(e, &sel)),
    };
    match manager.attach_process(&id, &sel, false).await {
        Ok(events) => events_response(info, events, keepalive_interval(headers)),
        Err(e) => connect::stream_error(process_error(e, &sel)),
    }
}

/// A handle's events as envd's stream: `start`, `data`…, `end`, with keepalives.
fn events_response(info: ProcessInfo, mut events: ProcessStream, interval: Duration) -> Response {
    let messages = crate::task_stream::<Result<Value, ConnectError>, _, _>(
        8,
        move |tx| async move {
            if tx
                .send(Ok(json!({"event": {"start": {"pid": info.pid}}})))
                .await
                .is_err()
            {
                return;
            }
            let data_key = if info.pty.is_some() { "pty" } else { "stdout" };
            let mut tick = tokio::time::interval(interval);
            tick.tick().await;
            loop {
                let event = tokio::select! {
                    e = events.next() => e,
                    _ = tick.tick() => {
                        if tx.send(Ok(json!({"event": {"keepalive": {}}}))).await.is_err() { return; }
                        continue;
                    }
                };
                let message = match event {
                    Some(Ok(ProcessEvent::Stdout(b))) => {
                        Ok(json!({"event": {"data": {data_key: b64(&b)}}}))
                    }
                    Some(Ok(ProcessEvent::Stderr(b))) => {
                        Ok(json!({"event": {"data": {"stderr": b64(&b)}}}))
                    }
                    // envd has no word for output a reader missed: the stream goes on.
                    Some(Ok(ProcessEvent::Missed(_))) => continue,
                    Some(Ok(ProcessEvent::Exit(exit))) => {
                        let _ = tx
                            .send(Ok(json!({"event": {"end": end_event(&exit)}})))
                            .await;
                        return;
                    }
                    Some(Err(e)) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                    None => return,
                };
                if tx.send(message).await.is_err() {
                    return;
                }
            }
        },
    );
    connect::stream_response(messages)
}

/// envd's `EndEvent` of an exit.
fn end_event(exit: &hutch_proto::ExecExit) -> Value {
    let status = match exit.signal {
        _ if exit.timed_out => "signal: killed (timeout)".to_string(),
        Some(s) => format!("signal: {}", signal_name(s)),
        None => format!("exit status {}", exit.exit_code),
    };
    json!({"exitCode": exit.exit_code, "exited": exit.signal.is_none(), "status": status})
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
