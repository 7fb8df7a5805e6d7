//! `GET /v1/sandboxes/{id}/pty`: a terminal over WebSocket (xterm.js compatible).
//!
//! Binary frames carry terminal bytes both ways. Text frames carry JSON control: from the
//! client `{"type": "resize", "cols", "rows"}`; from the server, last,
//! `{"type": "exit", "exit_code"}`.

use std::collections::BTreeMap;

use axum::extract::ws::{Message, WebSocket};
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Extension;
use hutch_core::exec::{Command, ExecCommand};
use hutch_proto::client::ExecEvent;
use hutch_proto::PtySize;
use serde::Deserialize;

use crate::auth::AuthorizedSandbox;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiQuery, Caller};
use crate::AppState;

/// The interactive login shell: bash where the template has it, sh elsewhere.
const DEFAULT_SHELL: &str = "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi";

/// How long the terminal waits for the agent to say the process started before it upgrades
/// anyway (the agent answers within milliseconds; this only bounds a stuck one).
const FIRST_EVENT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Query of the PTY route.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtyQuery {
    cmd: Option<String>,
    cols: Option<u16>,
    rows: Option<u16>,
    user: Option<String>,
    cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Control {
    Resize { cols: u16, rows: u16 },
}

/// `GET /v1/sandboxes/{id}/pty?cmd=&cols=&rows=` → WebSocket.
pub async fn pty(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    sandbox: AuthorizedSandbox,
    ApiQuery(q): ApiQuery<PtyQuery>,
    crate::extract::WsUpgrade(ws): crate::extract::WsUpgrade,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    let size = PtySize {
        cols: q.cols.unwrap_or(80).clamp(1, 1000),
        rows: q.rows.unwrap_or(24).clamp(1, 1000),
    };
    let cmd = ExecCommand {
        cmd: match q.cmd {
            Some(c) if c.trim().is_empty() => {
                return Err(ApiError::invalid("cmd must not be empty"))
            }
            Some(c) => Command::Shell(format!("exec {c}")),
            None => Command::Shell(DEFAULT_SHELL.into()),
        },
        env: BTreeMap::new(),
        cwd: q.cwd,
        user: q.user,
        stdin: None,
        timeout: None,
        background: false,
    };
    let argv = crate::audit::AuditArgv::of(&cmd.cmd);
    // Start the process before upgrading so errors are ordinary HTTP errors.
    let (session, slot) = match state.manager.exec_session(&id, &cmd, Some(size)).await {
        Ok(started) => started,
        Err(e) => return Ok(super::exec::with_argv(Err::<(), _>(e.into()), argv)),
    };
    // The agent says whether the process started (a bad cwd or user is its error, sent
    // instead of `started`): an error is an ordinary HTTP error, never a 101 and then an
    // error frame.
    let (input, mut events) = session.into_parts();
    let first = tokio::time::timeout(FIRST_EVENT_WAIT, events.next()).await;
    let first = match first {
        Ok(Some(Ok(ExecEvent::Error(e)))) => {
            let e = hutch_core::CoreError::Agent {
                code: e.code,
                message: e.message,
            };
            return Ok(super::exec::with_argv(Err::<(), _>(e.into()), argv));
        }
        Ok(Some(Ok(ev))) => Some(ev),
        Ok(Some(Err(e))) => {
            return Err(ApiError::from(hutch_core::CoreError::SandboxFailed(
                format!("the sandbox's agent went away before the terminal started: {e}"),
            )))
        }
        Ok(None) => {
            return Err(ApiError::from(hutch_core::CoreError::SandboxFailed(
                "the sandbox's agent went away before the terminal started".into(),
            )))
        }
        // Not said yet: the terminal opens and the bridge reads on.
        Err(_) => None,
    };
    // An open terminal keeps an idle-hibernating sandbox up.
    let guard = state.manager.session_guard(&id);
    let exit = slot.exit_recorder();
    let revoked = caller.revoked();
    let mut response = ws.on_upgrade(move |socket| async move {
        // A revoked key's terminal closes at once; dropping the session ends its process.
        tokio::select! {
            () = bridge(socket, input, events, first, exit) => {}
            () = revoked => {}
        }
        drop((guard, slot));
    });
    response.extensions_mut().insert(argv);
    Ok(response)
}

async fn bridge(
    mut socket: WebSocket,
    input: hutch_proto::client::ExecInput,
    mut events: hutch_proto::client::ExecEvents,
    mut first: Option<ExecEvent>,
    exit_recorder: hutch_core::manager::ExitRecorder,
) {
    loop {
        tokio::select! {
            ev = async { match first.take() { Some(ev) => Some(Ok(ev)), None => events.next().await } } => match ev {
                Some(Ok(ExecEvent::Stdout(b))) | Some(Ok(ExecEvent::Stderr(b))) => {
                    if socket.send(Message::Binary(b)).await.is_err() {
                        return;
                    }
                }
                Some(Ok(ExecEvent::Started { .. } | ExecEvent::Missed(_))) => {}
                Some(Ok(ExecEvent::Exit(exit))) => {
                    exit_recorder.record(exit.exit_code, exit.timed_out, exit.duration_ms);
                    let msg = serde_json::json!({"type": "exit", "exit_code": exit.exit_code});
                    let _ = socket.send(Message::Text(msg.to_string().into())).await;
                    let _ = socket.send(Message::Close(None)).await;
                    return;
                }
                Some(Ok(ExecEvent::Error(e))) => {
                    let msg = serde_json::json!({"type": "error", "message": e.message});
                    let _ = socket.send(Message::Text(msg.to_string().into())).await;
                    let _ = socket.send(Message::Close(None)).await;
                    return;
                }
                Some(Err(_)) | None => {
                    let _ = socket.send(Message::Close(None)).await;
                    return;
                }
            },
            msg = socket.recv() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    if input.send_stdin(b).await.is_err() {
                        return;
                    }
                }
                Some(Ok(Message::Text(t))) => match serde_json::from_str::<Control>(t.as_str()) {
                    Ok(Control::Resize { cols, rows }) => {
                        let _ = input
                            .resize(PtySize { cols: cols.clamp(1, 1000), rows: rows.clamp(1, 1000) })
                            .await;
                    }
                    Err(_) => {
                        // Plain text typed by a simple client: treat as input.
                        if input.send_stdin(bytes::Bytes::from(t.as_str().to_owned())).await.is_err() {
                            return;
                        }
                    }
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
        }
    }
}
