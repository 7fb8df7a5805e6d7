//! The code interpreter E2B serves on port 49999 (`e2b-code-interpreter`): `POST /execute`
//! streams a cell's output as JSON lines, `/contexts` manages stateful contexts. Both are
//! Hutch's code contexts (`docs/code-interpreter.md`).
//!
//! `/execute` needs the sandbox's `X-Access-Token`, as the SDK sends it. The SDK sends no
//! token to `/contexts`: as on E2B, knowing the sandbox id (80 random bits) is what lets a
//! client list, make, restart and delete contexts — which run no code.

use std::collections::BTreeMap;
use std::str::FromStr;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Extension, Json, Router};
use hutch_core::interp::{
    CodeEvent, CodeRequest, ContextId, ContextInfo, ContextSpec, Language, RichOutput,
};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::error::{E2bError, E2bResult};
use crate::target::{self, SandboxTarget};
use crate::E2bState;

/// The code interpreter's routes.
pub fn router(state: E2bState) -> Router<E2bState> {
    Router::new()
        .route("/execute", post(execute))
        .route("/contexts", get(list).post(create))
        .route("/contexts/{cid}", delete(remove))
        .route("/contexts/{cid}/restart", post(restart))
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .layer(axum::middleware::from_fn_with_state(state, require_sandbox))
        .fallback(|uri: axum::http::Uri| async move {
            E2bError::not_found(format!("the code interpreter has no route {}", uri.path()))
        })
}

async fn require_sandbox(
    State(state): State<E2bState>,
    Extension(t): Extension<SandboxTarget>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match target::existing(&state, &t).await {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

fn language(name: Option<&str>) -> E2bResult<Language> {
    match name {
        None | Some("") => Ok(Language::Python),
        Some(n) => Language::from_str(n).map_err(|e| E2bError::bad_request(e.to_string())),
    }
}

fn context_json(c: &ContextInfo) -> Value {
    json!({
        "id": c.id,
        "language": c.language,
        "cwd": c.cwd.clone().unwrap_or_else(|| "/root".to_string()),
    })
}

/// `{code, context_id, language, env_vars}`.
#[derive(Debug, Deserialize)]
struct ExecuteBody {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<BTreeMap<String, String>>,
}

/// `POST /execute` → one JSON object per line: `stdout`, `stderr`, `result`, `error`, then
/// `number_of_executions`.
async fn execute(
    State(state): State<E2bState>,
    Extension(t): Extension<SandboxTarget>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> E2bResult<Response> {
    if !crate::envd::has_token(&state, &t, &headers) {
        return Err(E2bError::unauthorized(
            "missing or wrong X-Access-Token for this sandbox",
        ));
    }
    let req: ExecuteBody = serde_json::from_slice(&body)
        .map_err(|e| E2bError::bad_request(format!("invalid request body: {e}")))?;
    let context = req
        .context_id
        .as_deref()
        .map(ContextId::from_str)
        .transpose()
        .map_err(|e| E2bError::not_found(e.to_string()))?;
    let code = CodeRequest {
        code: req.code,
        context,
        language: language(req.language.as_deref())?,
        timeout: None,
        env: req.env_vars.unwrap_or_default(),
    };
    let mut run = state.app.manager.run_code(&t.id, code).await?;
    let lines = crate::task_stream::<Result<bytes::Bytes, std::convert::Infallible>, _, _>(
        8,
        move |tx| async move {
            while let Some(event) = run.next().await {
                let line = match event {
                    Ok(e) => match line_of(e) {
                        Some(l) => l,
                        None => continue,
                    },
                    Err(e) => {
                        json!({"type": "error", "name": "InterpreterError", "value": e.to_string(), "traceback": ""})
                    }
                };
                let mut text = line.to_string();
                text.push('\n');
                if tx.send(Ok(bytes::Bytes::from(text))).await.is_err() {
                    break;
                }
            }
        },
    );
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

fn timestamp() -> i64 {
    hutch_core::time::now_ms() * 1000
}

/// The `/execute` line of one Hutch event (`None`: nothing to say).
fn line_of(event: CodeEvent) -> Option<Value> {
    Some(match event {
        CodeEvent::Stdout { text } => {
            json!({"type": "stdout", "text": text, "timestamp": timestamp()})
        }
        CodeEvent::Stderr { text } => {
            json!({"type": "stderr", "text": text, "timestamp": timestamp()})
        }
        CodeEvent::Result(r) | CodeEvent::Display(r) => result_line(r),
        CodeEvent::Error(e) => json!({
            "type": "error",
            "name": e.name,
            "value": e.value,
            "traceback": e.traceback.join("\n"),
        }),
        CodeEvent::End(end) => json!({
            "type": "number_of_executions",
            "execution_count": end.execution_count.unwrap_or(0),
        }),
    })
}

/// A MIME bundle in E2B's field names (`text/plain` → `text`, `image/png` → `png`, …);
/// types without a name of their own go to `extra`.
fn result_line(r: RichOutput) -> Value {
    let mut out = Map::new();
    out.insert("type".into(), json!("result"));
    let mut extra = Map::new();
    for (mime, value) in r.data {
        let key = match mime.as_str() {
            "text/plain" => "text",
            "text/html" => "html",
            "text/markdown" => "markdown",
            "image/svg+xml" => "svg",
            "image/png" => "png",
            "image/jpeg" => "jpeg",
            "application/pdf" => "pdf",
            "text/latex" => "latex",
            "application/json" => "json",
            "application/javascript" => "javascript",
            _ => {
                extra.insert(mime, value);
                continue;
            }
        };
        out.insert(key.into(), value);
    }
    if !extra.is_empty() {
        out.insert("extra".into(), Value::Object(extra));
    }
    out.insert("is_main_result".into(), json!(r.is_main_result));
    Value::Object(out)
}

/// `GET /contexts`.
async fn list(
    State(state): State<E2bState>,
    Extension(t): Extension<SandboxTarget>,
) -> E2bResult<Json<Vec<Value>>> {
    let contexts = state.app.manager.list_contexts(&t.id).await?;
    Ok(Json(contexts.iter().map(context_json).collect()))
}

/// `{language, cwd}`.
#[derive(Debug, Deserialize, Default)]
struct CreateBody {
    language: Option<String>,
    cwd: Option<String>,
}

/// `POST /contexts` → the new context.
async fn create(
    State(state): State<E2bState>,
    Extension(t): Extension<SandboxTarget>,
    body: axum::body::Bytes,
) -> E2bResult<Json<Value>> {
    let req: CreateBody = if body.iter().all(u8::is_ascii_whitespace) {
        CreateBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| E2bError::bad_request(format!("invalid request body: {e}")))?
    };
    let spec = ContextSpec {
        language: language(req.language.as_deref())?,
        cwd: req.cwd,
        env: BTreeMap::new(),
    };
    let c = state.app.manager.create_context(&t.id, spec).await?;
    Ok(Json(context_json(&c)))
}

fn context_id(cid: &str) -> E2bResult<ContextId> {
    ContextId::from_str(cid).map_err(|e| E2bError::not_found(e.to_string()))
}

/// `DELETE /contexts/{cid}` → 204.
async fn remove(
    State(state): State<E2bState>,
    Extension(t): Extension<SandboxTarget>,
    Path(cid): Path<String>,
) -> E2bResult<StatusCode> {
    state
        .app
        .manager
        .delete_context(&t.id, &context_id(&cid)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /contexts/{cid}/restart` → 204.
async fn restart(
    State(state): State<E2bState>,
    Extension(t): Extension<SandboxTarget>,
    Path(cid): Path<String>,
) -> E2bResult<StatusCode> {
    state
        .app
        .manager
        .restart_context(&t.id, &context_id(&cid)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
