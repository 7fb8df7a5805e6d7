//! `POST /v1/sandboxes/{id}/exec` (collected) and `/exec/stream` (SSE).
//!
//! Both take the command either as the JSON body (stdin, if any, inside it, within the JSON
//! body limit) or, with `Content-Type: application/octet-stream`, in the query string with
//! the request body as stdin (see [`query_exec_body`]). Either way stdin is written to the
//! process while its output is read ([`PipedExec`]), so a process that writes before it
//! reads never waits on its own input.
//!
//! With `"background": true` the command is started as a process handle
//! (`super::processes`): `/exec` answers `201` with the handle as soon as it runs (and its
//! stdin, if any, is written and closed), `/exec/stream` streams it as its first reader;
//! either way it outlives the request and can be listed and re-attached.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use std::sync::Arc;

use axum::extract::{FromRequest, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use bytes::Bytes;
use futures_util::{Stream, StreamExt, TryStreamExt};
use hutch_core::exec::{Command, ExecCommand, StdinSource};
use hutch_core::ids::SandboxId;
use hutch_core::process::{ProcessSelector, ProcessStart};
use hutch_core::Manager;
use hutch_proto::client::{ExecEvent, PipedExec};
use serde::Deserialize;

use super::exec_events::{respond, StreamEvent, StreamFormat};
use super::sandboxes::validate_env;
use crate::audit::AuditArgv;
use crate::auth::AuthorizedSandbox;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::AppState;

/// Longest timeout a request may set.
const MAX_TIMEOUT_SECONDS: f64 = 24.0 * 3600.0;

/// The exec body shared by `/exec` and `/exec/stream`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    cmd: Command,
    env: Option<BTreeMap<String, String>>,
    cwd: Option<String>,
    user: Option<String>,
    stdin: Option<String>,
    stdin_b64: Option<String>,
    timeout_seconds: Option<f64>,
    background: Option<bool>,
    /// The tag of the process handle a background command becomes.
    tag: Option<String>,
}

/// A request's timeout: `None` in the request gives `default`, 0 no limit; at most
/// [`MAX_TIMEOUT_SECONDS`].
pub fn timeout_of(seconds: Option<f64>, default: Option<Duration>) -> ApiResult<Option<Duration>> {
    match seconds {
        None => Ok(default),
        Some(0.0) => Ok(None),
        Some(t) if t.is_finite() && t > 0.0 && t <= MAX_TIMEOUT_SECONDS => {
            Ok(Some(Duration::from_secs_f64(t)))
        }
        Some(t) => Err(ApiError::invalid(format!(
            "timeout_seconds must be between 0 (no limit) and {MAX_TIMEOUT_SECONDS}, got {t}"
        ))),
    }
}

/// An exec request, parsed: the command, where its stdin comes from, and (for a background
/// command) the tag of its handle.
pub struct ExecCall {
    cmd: ExecCommand,
    stdin: StdinSource,
    tag: Option<String>,
}

impl ExecBody {
    /// Validate into the core's command.
    pub fn into_command(self, default_timeout: Duration) -> ApiResult<ExecCommand> {
        match &self.cmd {
            Command::Argv(argv) if argv.is_empty() || argv[0].is_empty() => {
                return Err(ApiError::invalid(
                    "cmd must name a program: [\"prog\", \"arg\", …]",
                ))
            }
            Command::Shell(s) if s.trim().is_empty() => {
                return Err(ApiError::invalid("cmd must not be an empty string"))
            }
            Command::Argv(argv) if argv.iter().any(|a| a.contains('\0')) => {
                return Err(ApiError::invalid(
                    "cmd arguments must not contain NUL bytes",
                ))
            }
            _ => {}
        }
        let env = self.env.unwrap_or_default();
        validate_env(&env)?;
        if let Some(cwd) = &self.cwd {
            if !cwd.starts_with('/') {
                return Err(ApiError::invalid(format!(
                    "cwd must be an absolute path, got {cwd:?}"
                )));
            }
        }
        let stdin = match (self.stdin, self.stdin_b64) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid("give stdin or stdin_b64, not both"));
            }
            (Some(s), None) => Some(Bytes::from(s)),
            (None, Some(b)) => Some(Bytes::from(
                base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .map_err(|e| ApiError::invalid(format!("stdin_b64 is not base64: {e}")))?,
            )),
            (None, None) => None,
        };
        let timeout = timeout_of(self.timeout_seconds, Some(default_timeout))?;
        if self.tag.is_some() && self.background != Some(true) {
            return Err(ApiError::invalid(
                "tag names a process handle: it needs \"background\": true",
            ));
        }
        Ok(ExecCommand {
            cmd: self.cmd,
            env,
            cwd: self.cwd,
            user: self.user,
            stdin,
            timeout,
            background: self.background.unwrap_or(false),
        })
    }
}

/// `POST /v1/sandboxes/{id}/exec`: the answer is written from the one copy of the output,
/// piece by piece ([`super::exec_json`]). The command comes as the JSON body or, with raw
/// stdin as the body, in the query string ([`query_exec_body`]); stdin is written while the
/// output is collected. A background command answers `201` with its process handle.
pub async fn exec(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    req: Request,
) -> ApiResult<Response> {
    let id = sandbox.id;
    let call = exec_call(&state, req).await?;
    let argv = AuditArgv::of(&call.cmd.cmd);
    let answer = async {
        if call.cmd.background {
            let info = state
                .manager
                .start_process(&id, handle_start(&call)?)
                .await?;
            feed_stdin(&state.manager, &id, info.pid, call.stdin).await?;
            return Ok((StatusCode::CREATED, Json(info)).into_response());
        }
        let out = state.manager.exec_piped(&id, call.cmd, call.stdin).await?;
        let pieces = super::exec_json::ExecJson::new(out).map(Ok::<_, Infallible>);
        Ok((
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            Body::from_stream(futures_util::stream::iter(pieces)),
        )
            .into_response())
    };
    Ok(with_argv(answer.await, argv))
}

/// The response with the exec's argv for the audit log (`crate::audit`).
pub(crate) fn with_argv(answer: ApiResult<impl IntoResponse>, argv: AuditArgv) -> Response {
    let mut response = match answer {
        Ok(a) => a.into_response(),
        Err(e) => e.into_response(),
    };
    response.extensions_mut().insert(argv);
    response
}

/// The process handle a background command becomes (with a stdin pipe when it has stdin).
fn handle_start(call: &ExecCall) -> ApiResult<ProcessStart> {
    let mut start = ProcessStart::from_exec(&call.cmd, call.tag.clone());
    start.stdin = call.stdin.is_piped();
    start.validate()?;
    Ok(start)
}

/// Write a background command's stdin to its handle, then close it. A source that fails
/// (an upload cut off) leaves stdin open: the process never takes half an input for a
/// whole one.
async fn feed_stdin(
    manager: &Arc<Manager>,
    id: &SandboxId,
    pid: u32,
    stdin: StdinSource,
) -> Result<(), hutch_core::CoreError> {
    let process = ProcessSelector::Pid(pid);
    match stdin {
        StdinSource::Closed => return Ok(()),
        StdinSource::Bytes(data) => manager.process_input(id, &process, data).await?,
        StdinSource::Stream(chunks) => {
            let chunks = chunks.map_err(|e| std::io::Error::other(e.to_string()));
            manager.process_input_stream(id, &process, chunks).await?;
        }
    }
    manager.close_process_stdin(id, &process).await
}

/// The command of an exec request and where its stdin comes from: the JSON body (stdin
/// inside it), or the query string with the raw request body as stdin.
async fn exec_call(state: &AppState, req: Request) -> ApiResult<ExecCall> {
    let default_timeout = state.manager.config().default_exec_timeout;
    if has_raw_stdin(&req) {
        let body = query_exec_body(req.uri().query().unwrap_or(""))?;
        let tag = body.tag.clone();
        let mut cmd = body.into_command(default_timeout)?;
        // Marks the exec as having stdin; the bytes follow from the request body.
        cmd.stdin = Some(Bytes::new());
        let stdin = StdinSource::stream(req.into_body().into_data_stream());
        Ok(ExecCall { cmd, stdin, tag })
    } else {
        let ApiJson(body) = ApiJson::<ExecBody>::from_request(req, state).await?;
        let tag = body.tag.clone();
        let cmd = body.into_command(default_timeout)?;
        let stdin = StdinSource::from(cmd.stdin.clone());
        Ok(ExecCall { cmd, stdin, tag })
    }
}

/// Whether a request carries raw stdin (`Content-Type: application/octet-stream`).
fn has_raw_stdin(req: &Request) -> bool {
    req.headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/octet-stream"))
}

/// The exec of a streamed-stdin request, from its query string: `cmd=` (a shell string) or
/// `arg=` repeated (an argv), `env=NAME=VALUE` repeated, `cwd=`, `user=`,
/// `timeout_seconds=`, `background=true|false`, `tag=`. The request body is stdin.
pub fn query_exec_body(query: &str) -> ApiResult<ExecBody> {
    let mut shell = None;
    let mut argv = Vec::new();
    let mut env = BTreeMap::new();
    let mut body = ExecBody {
        cmd: Command::Argv(Vec::new()),
        env: None,
        cwd: None,
        user: None,
        stdin: None,
        stdin_b64: None,
        timeout_seconds: None,
        background: None,
        tag: None,
    };
    for (key, value) in super::sandboxes::url_pairs(query) {
        match key.as_str() {
            "cmd" => shell = Some(value),
            "arg" => argv.push(value),
            "env" => {
                let Some((name, v)) = value.split_once('=') else {
                    return Err(ApiError::bad_request(format!(
                        "env must be NAME=VALUE, got {value:?}"
                    )));
                };
                env.insert(name.to_string(), v.to_string());
            }
            "cwd" => body.cwd = Some(value),
            "user" => body.user = Some(value),
            "tag" => body.tag = Some(value),
            "timeout_seconds" => {
                body.timeout_seconds = Some(value.parse().map_err(|_| {
                    ApiError::bad_request(format!("timeout_seconds must be a number, got {value:?}"))
                })?)
            }
            "background" => {
                body.background = Some(value.parse().map_err(|_| {
                    ApiError::bad_request(format!("background must be true or false, got {value:?}"))
                })?)
            }
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter {other:?} (expected cmd, arg, env, cwd, user, timeout_seconds, background, tag)"
                )))
            }
        }
    }
    body.cmd = match (shell, argv.is_empty()) {
        (Some(_), false) => {
            return Err(ApiError::bad_request("give cmd= or arg=…, not both"));
        }
        (Some(s), true) => Command::Shell(s),
        (None, _) => Command::Argv(argv),
    };
    if !env.is_empty() {
        body.env = Some(env);
    }
    Ok(body)
}

/// `POST /v1/sandboxes/{id}/exec/stream`: SSE of `start`, `stdout`, `stderr`, `exit`
/// (or `error`). Dropping the connection kills the process unless `background` is set; a
/// background command is a process handle, streamed as its first reader.
pub async fn exec_stream(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    req: Request,
) -> ApiResult<Response> {
    let id = sandbox.id;
    let call = exec_call(&state, req).await?;
    let argv = AuditArgv::of(&call.cmd.cmd);
    let answer = async {
        if call.cmd.background {
            let start = handle_start(&call)?;
            let (info, stream) = state.manager.start_process_streaming(&id, start).await?;
            let (manager, sandbox, pid) = (Arc::clone(&state.manager), id.clone(), info.pid);
            // Written while the output streams; it outlives the request like the process.
            tokio::spawn(async move {
                if let Err(e) = feed_stdin(&manager, &sandbox, pid, call.stdin).await {
                    tracing::debug!(sandbox = %sandbox, pid, error = %e, "background stdin not delivered");
                }
            });
            let first = StreamEvent::start(pid);
            let events = futures_util::stream::once(async move { first })
                .chain(super::processes::events_of(stream));
            return Ok(respond(StreamFormat::Sse, events));
        }
        let (session, slot) = state.manager.exec_session(&id, &call.cmd, None).await?;
        let exec = session.pipe_stdin(call.stdin);
        // Holding the guard in the stream keeps an idle-hibernating sandbox up while it
        // streams.
        let guard = state.manager.session_guard(&id);
        let exit = slot.exit_recorder();
        let stream = futures_util::StreamExt::map(exec_events(exec, exit), move |event| {
            let _ = (&guard, &slot);
            event
        });
        Ok(respond(StreamFormat::Sse, stream))
    };
    Ok(with_argv(answer.await, argv))
}

/// A plain exec's events, ending after `exit` or `error`.
fn exec_events(
    events: PipedExec,
    exit_recorder: hutch_core::manager::ExitRecorder,
) -> impl Stream<Item = StreamEvent> + Send {
    futures_util::stream::unfold(Some(events), move |state| {
        let exit_recorder = exit_recorder.clone();
        async move {
            let mut events = state?;
            let event = match events.next().await {
                Some(Ok(ExecEvent::Started { pid })) => StreamEvent::start(pid),
                Some(Ok(ExecEvent::Stdout(b))) => StreamEvent::output("stdout", &b),
                Some(Ok(ExecEvent::Stderr(b))) => StreamEvent::output("stderr", &b),
                Some(Ok(ExecEvent::Missed(m))) => StreamEvent::missed(m),
                Some(Ok(ExecEvent::Exit(exit))) => {
                    exit_recorder.record(exit.exit_code, exit.timed_out, exit.duration_ms);
                    StreamEvent::exit(&exit)
                }
                Some(Ok(ExecEvent::Error(e))) => StreamEvent::error(e.code.as_str(), &e.message),
                Some(Err(_)) | None => StreamEvent::error(
                    "sandbox_failed",
                    "the sandbox's agent went away before the command finished",
                ),
            };
            let rest = (!event.is_last()).then_some(events);
            Some((event, rest))
        }
    })
}
