//! `/v1/sandboxes/{id}/processes`: process handles, processes that outlive the request that
//! started them (see `docs/processes.md`).
//!
//! A process is named in the path by its pid (`…/processes/123`) or its tag
//! (`…/processes/tag:web`; percent-encode other characters as usual). Output is streamed as
//! NDJSON, or as SSE with `Accept: text/event-stream`, with the event names of
//! `/exec/stream` ([`super::exec_events`]).

use std::collections::BTreeMap;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::{Stream, StreamExt, TryStreamExt};
use hutch_core::exec::Command;
use hutch_core::ids::SandboxId;
use hutch_core::process::{
    check_tag, signal_number, ProcessEvent, ProcessSelector, ProcessStart, ProcessStream, PtySize,
    SIGKILL,
};
use serde::Deserialize;

use super::exec::timeout_of;
use super::exec_events::{respond, StreamEvent, StreamFormat};
use super::sandboxes::validate_env;
use crate::auth::authorize_sandbox as authorize;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, ApiQuery, Caller};
use crate::AppState;

/// A terminal's size in a request.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtyBody {
    cols: u16,
    rows: u16,
}

impl From<PtyBody> for PtySize {
    fn from(b: PtyBody) -> Self {
        PtySize {
            cols: b.cols,
            rows: b.rows,
        }
    }
}

/// `POST /v1/sandboxes/{id}/processes` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessBody {
    cmd: Command,
    env: Option<BTreeMap<String, String>>,
    cwd: Option<String>,
    user: Option<String>,
    /// Default: no limit (a handle is meant to run on).
    timeout_seconds: Option<f64>,
    tag: Option<String>,
    pty: Option<PtyBody>,
    /// Keep a stdin pipe open for `…/stdin` (a terminal always has one).
    stdin: Option<bool>,
}

impl ProcessBody {
    fn into_start(self) -> ApiResult<ProcessStart> {
        let env = self.env.unwrap_or_default();
        validate_env(&env)?;
        let start = ProcessStart {
            cmd: self.cmd,
            env,
            cwd: self.cwd,
            user: self.user,
            timeout: timeout_of(self.timeout_seconds, None)?,
            tag: self.tag,
            pty: self.pty.map(PtySize::from),
            stdin: self.stdin.unwrap_or(false),
        };
        start.validate()?;
        Ok(start)
    }
}

/// A process of the path: `123` or `tag:NAME`.
pub fn selector(raw: &str) -> ApiResult<ProcessSelector> {
    if let Some(tag) = raw.strip_prefix("tag:") {
        check_tag(tag).map_err(ApiError::invalid)?;
        return Ok(ProcessSelector::Tag(tag.to_string()));
    }
    raw.parse().map(ProcessSelector::Pid).map_err(|_| {
        ApiError::bad_request(format!(
            "a process is named by its pid or as tag:NAME, got {raw:?}"
        ))
    })
}

/// `POST /v1/sandboxes/{id}/processes` → 201 with the process's description.
pub async fn start(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ProcessBody>,
) -> ApiResult<impl IntoResponse> {
    let id = authorize(&state, &caller, &id).await?;
    let start = body.into_start()?;
    let info = state.manager.start_process(&id, start).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// `GET /v1/sandboxes/{id}/processes` → `{"processes": [...]}`.
pub async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let id = authorize(&state, &caller, &id).await?;
    let processes = state.manager.list_processes(&id).await?;
    Ok(Json(serde_json::json!({ "processes": processes })))
}

/// The sandbox and process of a `…/processes/{sel}` path.
async fn target(
    state: &AppState,
    caller: &Caller,
    id: &str,
    sel: &str,
) -> ApiResult<(SandboxId, ProcessSelector)> {
    let process = selector(sel)?;
    let id = authorize(state, caller, id).await?;
    Ok((id, process))
}

/// `GET /v1/sandboxes/{id}/processes/{sel}`.
pub async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, sel)): Path<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    let (id, process) = target(&state, &caller, &id, &sel).await?;
    Ok(Json(state.manager.process_info(&id, &process).await?))
}

/// `DELETE /v1/sandboxes/{id}/processes/{sel}`: `SIGKILL` to its process group → 204.
pub async fn kill(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, sel)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let (id, process) = target(&state, &caller, &id, &sel).await?;
    state.manager.signal_process(&id, &process, SIGKILL).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The query of `…/output`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputQuery {
    /// Start with what the ring still holds (default) or with what comes next.
    replay: Option<bool>,
}

/// `GET /v1/sandboxes/{id}/processes/{sel}/output[?replay=false]`: its events, NDJSON or SSE.
pub async fn output(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, sel)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<OutputQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (id, process) = target(&state, &caller, &id, &sel).await?;
    let replay = q.replay.unwrap_or(true);
    let stream = state.manager.attach_process(&id, &process, replay).await?;
    let start = StreamEvent::start(stream.pid());
    let events = futures_util::stream::once(async move { start }).chain(events_of(stream));
    Ok(respond(StreamFormat::of(&headers), events))
}

/// A process stream as API events, ending after `exit` or `error`.
pub fn events_of(stream: ProcessStream) -> impl Stream<Item = StreamEvent> + Send {
    futures_util::stream::unfold(Some(stream), |stream| async move {
        let mut stream = stream?;
        let event = match stream.next().await {
            Some(Ok(ProcessEvent::Stdout(b))) => StreamEvent::output("stdout", &b),
            Some(Ok(ProcessEvent::Stderr(b))) => StreamEvent::output("stderr", &b),
            Some(Ok(ProcessEvent::Missed(m))) => StreamEvent::missed(m),
            Some(Ok(ProcessEvent::Exit(exit))) => StreamEvent::exit(&exit),
            Some(Err(e)) => StreamEvent::failure(ApiError::from(e)),
            None => StreamEvent::error(
                "sandbox_failed",
                "the sandbox's agent went away before the process finished",
            ),
        };
        let rest = (!event.is_last()).then_some(stream);
        Some((event, rest))
    })
}

/// `POST /v1/sandboxes/{id}/processes/{sel}/stdin`: the raw body, written as it arrives → 204.
pub async fn stdin(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, sel)): Path<(String, String)>,
    req: Request,
) -> ApiResult<StatusCode> {
    let (id, process) = target(&state, &caller, &id, &sel).await?;
    let body = req
        .into_body()
        .into_data_stream()
        .map_err(std::io::Error::other);
    state
        .manager
        .process_input_stream(&id, &process, body)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/sandboxes/{id}/processes/{sel}/close-stdin` → 204.
pub async fn close_stdin(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, sel)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let (id, process) = target(&state, &caller, &id, &sel).await?;
    state.manager.close_process_stdin(&id, &process).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A signal in a request: a number or a name (`TERM`, `SIGTERM`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum SignalValue {
    /// `15`.
    Number(i64),
    /// `"TERM"`, `"SIGTERM"`.
    Name(String),
}

/// `POST …/signal` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalBody {
    signal: SignalValue,
}

impl SignalValue {
    fn number(&self) -> ApiResult<i32> {
        match self {
            SignalValue::Number(n) => i32::try_from(*n)
                .ok()
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| {
                    ApiError::invalid(format!("a signal is a number from 1 to 64, got {n}"))
                }),
            SignalValue::Name(name) => signal_number(name).ok_or_else(|| {
                ApiError::invalid(format!(
                    "unknown signal {name:?}: give a number or a name such as TERM, KILL, INT, HUP"
                ))
            }),
        }
    }
}

/// `POST /v1/sandboxes/{id}/processes/{sel}/signal` `{"signal": "TERM" | 15}` → 204.
pub async fn signal(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, sel)): Path<(String, String)>,
    ApiJson(body): ApiJson<SignalBody>,
) -> ApiResult<StatusCode> {
    let (id, process) = target(&state, &caller, &id, &sel).await?;
    let signal = body.signal.number()?;
    state.manager.signal_process(&id, &process, signal).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/sandboxes/{id}/processes/{sel}/resize` `{"cols", "rows"}` → 204.
pub async fn resize(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, sel)): Path<(String, String)>,
    ApiJson(body): ApiJson<PtyBody>,
) -> ApiResult<StatusCode> {
    let (id, process) = target(&state, &caller, &id, &sel).await?;
    state
        .manager
        .resize_process(&id, &process, body.into())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_a_pid_or_a_tag() {
        assert_eq!(selector("42").expect("pid"), ProcessSelector::Pid(42));
        assert_eq!(
            selector("tag:web server").expect("tag"),
            ProcessSelector::Tag("web server".into())
        );
        let bad = selector("web").expect_err("neither");
        assert_eq!(
            (bad.status.as_u16(), bad.message.as_str()),
            (
                400,
                "a process is named by its pid or as tag:NAME, got \"web\""
            )
        );
        assert_eq!(selector("tag:").expect_err("empty").status.as_u16(), 422);
    }

    #[test]
    fn signals_are_numbers_or_names() {
        let parse = |v: serde_json::Value| {
            serde_json::from_value::<SignalBody>(serde_json::json!({ "signal": v }))
                .expect("parses")
                .signal
                .number()
        };
        assert_eq!(parse(serde_json::json!("TERM")).expect("name"), 15);
        assert_eq!(parse(serde_json::json!("SIGINT")).expect("name"), 2);
        assert_eq!(parse(serde_json::json!(9)).expect("number"), 9);
        assert_eq!(
            parse(serde_json::json!(0)).expect_err("zero").message,
            "a signal is a number from 1 to 64, got 0"
        );
        assert_eq!(
            parse(serde_json::json!("NOPE"))
                .expect_err("unknown")
                .status
                .as_u16(),
            422
        );
    }

    #[test]
    fn a_body_validates_into_a_start() {
        let body: ProcessBody = serde_json::from_value(serde_json::json!({
            "cmd": ["sleep", "5"], "tag": "t", "pty": {"cols": 100, "rows": 30}, "stdin": true
        }))
        .expect("parses");
        let start = body.into_start().expect("valid");
        assert_eq!(
            start.timeout, None,
            "handles run without a limit by default"
        );
        assert_eq!(
            start.pty,
            Some(PtySize {
                cols: 100,
                rows: 30
            })
        );
        let body: ProcessBody =
            serde_json::from_value(serde_json::json!({"cmd": "x", "cwd": "rel"})).expect("parses");
        assert_eq!(
            body.into_start().expect_err("relative").status.as_u16(),
            422
        );
        assert!(
            serde_json::from_value::<ProcessBody>(serde_json::json!({"cmd": "x", "bogus": 1}))
                .is_err()
        );
    }
}
