//! `POST /v1/sandboxes/{id}/exec` (collected) and `/exec/stream` (SSE).
//!
//! Both take the command either as the JSON body (stdin, if any, inside it, within the JSON
//! body limit) or, with `Content-Type: application/octet-stream`, in the query string with
//! the request body as stdin (see [`query_exec_body`]). Either way stdin is written to the
//! process while its output is read ([`PipedExec`]), so a process that writes before it
//! reads never waits on its own input.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequest, Request, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use futures_util::Stream;
use hutch_core::exec::{Command, ExecCommand, StdinSource};
use hutch_proto::client::{ExecEvent, PipedExec};
use serde::Deserialize;

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
        let timeout = match self.timeout_seconds {
            None => Some(default_timeout),
            Some(0.0) => None,
            Some(t) if t.is_finite() && t > 0.0 && t <= MAX_TIMEOUT_SECONDS => {
                Some(Duration::from_secs_f64(t))
            }
            Some(t) => {
                return Err(ApiError::invalid(format!(
                "timeout_seconds must be between 0 (no limit) and {MAX_TIMEOUT_SECONDS}, got {t}"
            )))
            }
        };
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
/// output is collected.
pub async fn exec(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    req: Request,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    let (cmd, stdin) = exec_and_stdin(&state, req).await?;
    let argv = AuditArgv::of(&cmd.cmd);
    let answer = async {
        let out = state.manager.exec_piped(&id, cmd, stdin).await?;
        let pieces = super::exec_json::ExecJson::new(out).map(Ok::<_, Infallible>);
        Ok((
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            Body::from_stream(futures_util::stream::iter(pieces)),
        ))
    };
    Ok(with_argv(answer.await, argv))
}

/// The answer (or the error) of an exec, carrying its argv for the audit log.
pub(crate) fn with_argv(answer: ApiResult<impl IntoResponse>, argv: AuditArgv) -> Response {
    let mut response = match answer {
        Ok(a) => a.into_response(),
        Err(e) => e.into_response(),
    };
    response.extensions_mut().insert(argv);
    response
}

/// The command of an exec request and where its stdin comes from: the JSON body (stdin
/// inside it), or the query string with the raw request body as stdin.
async fn exec_and_stdin(state: &AppState, req: Request) -> ApiResult<(ExecCommand, StdinSource)> {
    let default_timeout = state.manager.config().default_exec_timeout;
    if has_raw_stdin(&req) {
        let body = query_exec_body(req.uri().query().unwrap_or(""))?;
        let mut cmd = body.into_command(default_timeout)?;
        // Marks the exec as having stdin; the bytes follow from the request body.
        cmd.stdin = Some(Bytes::new());
        let stdin = StdinSource::stream(req.into_body().into_data_stream());
        Ok((cmd, stdin))
    } else {
        let ApiJson(body) = ApiJson::<ExecBody>::from_request(req, state).await?;
        let cmd = body.into_command(default_timeout)?;
        let stdin = StdinSource::from(cmd.stdin.clone());
        Ok((cmd, stdin))
    }
}

fn data_event(name: &str, data: &[u8]) -> Event {
    let payload = match std::str::from_utf8(data) {
        Ok(s) => serde_json::json!({ "data": s }),
        Err(_) => serde_json::json!({
            "data_b64": base64::engine::general_purpose::STANDARD.encode(data)
        }),
    };
    Event::default().event(name).data(payload.to_string())
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
/// `timeout_seconds=`, `background=true|false`. The request body is stdin.
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
                    "unknown query parameter {other:?} (expected cmd, arg, env, cwd, user, timeout_seconds, background)"
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
/// (or `error`). Dropping the connection kills the process unless `background` is set.
pub async fn exec_stream(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    req: Request,
) -> ApiResult<Response> {
    let id = sandbox.id;
    let (cmd, stdin) = exec_and_stdin(&state, req).await?;
    let argv = AuditArgv::of(&cmd.cmd);
    let answer = async {
        let (session, slot) = state.manager.exec_session(&id, &cmd, None).await?;
        let exec = session.pipe_stdin(stdin);
        // Holding the guard in the stream keeps an idle-hibernating sandbox up while it
        // streams.
        let guard = state.manager.session_guard(&id);
        let exit = slot.exit_recorder();
        let stream = futures_util::StreamExt::map(async_stream(exec, exit), move |event| {
            let _ = (&guard, &slot);
            event
        });
        Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
    };
    Ok(with_argv(answer.await, argv))
}

fn async_stream(
    events: PipedExec,
    exit_recorder: hutch_core::manager::ExitRecorder,
) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold(Some(events), move |state| {
        let exit_recorder = exit_recorder.clone();
        async move {
            let mut events = state?;
            let event = match events.next().await {
                Some(Ok(ExecEvent::Started { pid })) => Event::default()
                    .event("start")
                    .data(serde_json::json!({ "pid": pid }).to_string()),
                Some(Ok(ExecEvent::Stdout(b))) => data_event("stdout", &b),
                Some(Ok(ExecEvent::Stderr(b))) => data_event("stderr", &b),
                Some(Ok(ExecEvent::Exit(exit))) => {
                    exit_recorder.record(exit.exit_code, exit.timed_out, exit.duration_ms);
                    let ev = Event::default().event("exit").data(
                        serde_json::json!({
                            "exit_code": exit.exit_code,
                            "timed_out": exit.timed_out,
                            "duration_ms": exit.duration_ms,
                        })
                        .to_string(),
                    );
                    return Some((Ok(ev), None));
                }
                Some(Ok(ExecEvent::Error(e))) => {
                    let ev = Event::default().event("error").data(
                        serde_json::json!({ "code": e.code, "message": e.message }).to_string(),
                    );
                    return Some((Ok(ev), None));
                }
                Some(Err(_)) | None => {
                    let ev = Event::default().event("error").data(
                        serde_json::json!({
                            "code": "sandbox_failed",
                            "message": "the sandbox's agent went away before the command finished"
                        })
                        .to_string(),
                    );
                    return Some((Ok(ev), None));
                }
            };
            Some((Ok(event), Some(events)))
        }
    })
}
