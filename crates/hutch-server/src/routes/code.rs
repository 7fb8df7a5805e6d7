//! The code interpreter: `/v1/sandboxes/{id}/contexts` (stateful kernels) and
//! `POST /v1/sandboxes/{id}/code` (a cell, answered as JSON or, with
//! `Accept: text/event-stream`, as its events in order). See `docs/code-interpreter.md`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::Stream;
use hutch_core::interp::{CodeRequest, CodeRun, ContextId, ContextSpec, Language};
use hutch_core::CoreError;
use serde::Deserialize;

use super::sandboxes::validate_env;
use crate::auth::AuthorizedSandbox;
use crate::error::{ApiError, ApiResult};
use crate::extract::{json_or_default, ApiJson, JsonBytes};
use crate::AppState;

/// Longest timeout a cell may set (as for exec).
const MAX_TIMEOUT_SECONDS: f64 = 24.0 * 3600.0;
/// Largest cell, in bytes.
const MAX_CODE_BYTES: usize = 512 << 10;

/// `POST /v1/sandboxes/{id}/contexts` body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextBody {
    language: Option<String>,
    cwd: Option<String>,
    env: Option<BTreeMap<String, String>>,
}

/// `POST /v1/sandboxes/{id}/code` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeBody {
    code: String,
    language: Option<String>,
    context_id: Option<String>,
    timeout_seconds: Option<f64>,
    env: Option<BTreeMap<String, String>>,
}

fn language(raw: Option<&str>) -> ApiResult<Language> {
    match raw {
        None => Ok(Language::Python),
        Some(raw) => raw.parse().map_err(|e| ApiError::from(CoreError::from(e))),
    }
}

fn context_id(raw: &str) -> ApiResult<ContextId> {
    raw.parse().map_err(|e| ApiError::from(CoreError::from(e)))
}

impl CodeBody {
    /// Validate into the core's request.
    pub fn into_request(self, default_timeout: Duration) -> ApiResult<CodeRequest> {
        if self.code.len() > MAX_CODE_BYTES {
            return Err(ApiError::invalid(format!(
                "code is {} bytes, more than the limit of {MAX_CODE_BYTES}: write large \
                 programs to a file (PUT …/files) and run that",
                self.code.len()
            )));
        }
        if self.language.is_some() && self.context_id.is_some() {
            return Err(ApiError::invalid(
                "give language or context_id, not both (a context has its language)",
            ));
        }
        let env = self.env.unwrap_or_default();
        validate_env(&env)?;
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
        Ok(CodeRequest {
            code: self.code,
            context: self.context_id.as_deref().map(context_id).transpose()?,
            language: language(self.language.as_deref())?,
            timeout,
            env,
        })
    }
}

/// `POST /v1/sandboxes/{id}/contexts` → 201 `{"id", "language", "cwd"}`.
pub async fn create_context(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    JsonBytes(body): JsonBytes,
) -> ApiResult<impl IntoResponse> {
    let body: ContextBody = json_or_default(&body)?;
    let id = sandbox.id;
    let env = body.env.unwrap_or_default();
    validate_env(&env)?;
    let spec = ContextSpec {
        language: language(body.language.as_deref())?,
        cwd: body.cwd,
        env,
    };
    let context = state.manager.create_context(&id, spec).await?;
    Ok((StatusCode::CREATED, Json(context)))
}

/// `GET /v1/sandboxes/{id}/contexts` → `{"contexts": [...]}`.
pub async fn list_contexts(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    let contexts = state.manager.list_contexts(&id).await?;
    Ok(Json(serde_json::json!({ "contexts": contexts })))
}

/// `POST /v1/sandboxes/{id}/contexts/{cid}/restart` → the context, with a new kernel.
pub async fn restart_context(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    Path((_, cid)): Path<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    let context = state
        .manager
        .restart_context(&id, &context_id(&cid)?)
        .await?;
    Ok(Json(context))
}

/// `DELETE /v1/sandboxes/{id}/contexts/{cid}` → 204.
pub async fn delete_context(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    Path((_, cid)): Path<(String, String)>,
) -> ApiResult<impl IntoResponse> {
    let id = sandbox.id;
    state
        .manager
        .delete_context(&id, &context_id(&cid)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/sandboxes/{id}/code`: the whole run as JSON, or its events as SSE when the
/// client accepts `text/event-stream`. Closing the connection interrupts the cell.
pub async fn run_code(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CodeBody>,
) -> ApiResult<Response> {
    let id = sandbox.id;
    let request = body.into_request(state.manager.config().default_exec_timeout)?;
    let run = state.manager.run_code(&id, request).await?;
    if wants_events(&headers) {
        return Ok(Sse::new(events(run))
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let execution = run.collect().await.map_err(CoreError::from)?;
    Ok(Json(execution).into_response())
}

/// Whether the client asked for server-sent events.
fn wants_events(headers: &HeaderMap) -> bool {
    super::negotiate::accepts(headers, "text/event-stream")
}

/// The run's events as SSE: each event under its name with its JSON as data; a failure of
/// the interpreter mid-run is a last `failed` event `{"code", "message"}`.
fn events(run: CodeRun) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold(Some(run), |run| async move {
        let mut run = run?;
        let event = match run.next().await? {
            Ok(event) => Event::default()
                .event(event.name())
                .data(serde_json::to_string(&event).expect("events always serialize")),
            Err(e) => {
                let e = ApiError::from(CoreError::from(e));
                Event::default()
                    .event("failed")
                    .data(serde_json::json!({ "code": e.code, "message": e.message }).to_string())
            }
        };
        Some((Ok(event), Some(run)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: serde_json::Value) -> CodeBody {
        serde_json::from_value(v).expect("a code body")
    }

    fn refused(v: serde_json::Value) -> String {
        body(v)
            .into_request(Duration::from_secs(60))
            .expect_err("refused")
            .message
    }

    #[test]
    fn a_cell_defaults_to_python_and_the_servers_timeout() {
        let r = body(serde_json::json!({"code": "1"}))
            .into_request(Duration::from_secs(60))
            .expect("valid");
        assert_eq!(r.language, Language::Python);
        assert_eq!(r.timeout, Some(Duration::from_secs(60)));
        assert!(r.context.is_none());
        let r = body(serde_json::json!({"code": "1", "timeout_seconds": 0, "language": "js"}))
            .into_request(Duration::from_secs(60))
            .expect("valid");
        assert_eq!((r.language, r.timeout), (Language::Javascript, None));
    }

    #[test]
    fn bad_cells_are_refused_with_words_a_user_reads() {
        assert_eq!(
            refused(serde_json::json!({"code": "1", "language": "python", "context_id": "ctx_a"})),
            "give language or context_id, not both (a context has its language)"
        );
        assert_eq!(
            refused(serde_json::json!({"code": "1", "timeout_seconds": -1})),
            "timeout_seconds must be between 0 (no limit) and 86400, got -1"
        );
        assert_eq!(
            refused(serde_json::json!({"code": "1", "language": "cobol"})),
            "unknown language \"cobol\": expected python, r, bash or javascript"
        );
        assert_eq!(
            refused(serde_json::json!({"code": "1", "env": {"A=B": "c"}})),
            "invalid environment variable name \"A=B\""
        );
        let big = "x".repeat(MAX_CODE_BYTES + 1);
        assert!(refused(serde_json::json!({"code": big})).starts_with("code is 524289 bytes"));
        assert_eq!(
            refused(serde_json::json!({"code": "1", "context_id": "../x"})),
            "context ../x does not exist"
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = serde_json::from_value::<CodeBody>(serde_json::json!({"code": "1", "cmd": "x"}))
            .expect_err("unknown field");
        assert!(e.to_string().contains("unknown field `cmd`"), "{e}");
    }

    #[test]
    fn the_event_stream_is_chosen_by_the_accept_header() {
        use axum::http::header;
        let mut h = HeaderMap::new();
        assert!(!wants_events(&h));
        h.insert(header::ACCEPT, "application/json".parse().expect("header"));
        assert!(!wants_events(&h));
        h.insert(
            header::ACCEPT,
            "application/json, text/event-stream;q=0.9"
                .parse()
                .expect("header"),
        );
        assert!(wants_events(&h));
    }
}
