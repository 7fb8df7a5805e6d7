//! Code contexts and runs (`crate::interp`): every call reaches the sandbox's kernel driver
//! through the agent's TCP tunnel, starting the driver first when nothing listens on its
//! port (once at a time per sandbox). Like exec, a call refreshes the TTL, wakes a
//! hibernated sandbox and refuses a paused one; a running cell counts against the sandbox's
//! cap of concurrent execs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hutch_proto::client::TcpTunnel;
use serde_json::{json, Value};

use super::Manager;
use crate::error::{CoreError, CoreResult};
use crate::ids::SandboxId;
use crate::interp::driver::{self, DriverLines, Refusal, StartFailure};
use crate::interp::{
    CodeRequest, CodeRun, ContextId, ContextInfo, ContextSpec, InterpError, Language,
};

/// Extra time the host waits past a cell's timeout for its end: the driver's grace for an
/// interrupt, and a kernel restart.
const END_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// Per sandbox: held while its driver is started, so concurrent first calls start one.
#[derive(Default)]
pub(crate) struct DriverStarts(Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>);

impl DriverStarts {
    fn lock_for(&self, id: &SandboxId) -> Arc<tokio::sync::Mutex<()>> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.clone())
            .or_default()
            .clone()
    }

    /// Forget sandbox `id` (it is gone).
    pub(crate) fn forget(&self, id: &SandboxId) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }
}

impl Manager {
    /// `POST /v1/sandboxes/{id}/contexts`: a new context, its kernel started.
    pub async fn create_context(
        self: &Arc<Self>,
        id: &SandboxId,
        spec: ContextSpec,
    ) -> CoreResult<ContextInfo> {
        validate_cwd(spec.cwd.as_deref())?;
        let request = json!({
            "op": "create_context",
            "language": spec.language,
            "cwd": spec.cwd,
            "env": spec.env,
        });
        let answer = self
            .driver_answer(id, &request, spec.language, None)
            .await?;
        context_of(&answer)
    }

    /// `GET /v1/sandboxes/{id}/contexts`.
    pub async fn list_contexts(self: &Arc<Self>, id: &SandboxId) -> CoreResult<Vec<ContextInfo>> {
        let answer = self
            .driver_answer(id, &json!({"op": "list"}), Language::Python, None)
            .await?;
        serde_json::from_value(answer.get("contexts").cloned().unwrap_or(Value::Null))
            .map_err(|e| InterpError::Driver(format!("its list of contexts: {e}")).into())
    }

    /// `POST /v1/sandboxes/{id}/contexts/{cid}/restart`: a new kernel (its state is gone).
    pub async fn restart_context(
        self: &Arc<Self>,
        id: &SandboxId,
        context: &ContextId,
    ) -> CoreResult<ContextInfo> {
        let request = json!({"op": "restart", "context_id": context});
        let answer = self
            .driver_answer(id, &request, Language::Python, Some(context))
            .await?;
        context_of(&answer)
    }

    /// `DELETE /v1/sandboxes/{id}/contexts/{cid}`: its kernel stopped.
    pub async fn delete_context(
        self: &Arc<Self>,
        id: &SandboxId,
        context: &ContextId,
    ) -> CoreResult<()> {
        let request = json!({"op": "delete", "context_id": context});
        self.driver_answer(id, &request, Language::Python, Some(context))
            .await
            .map(drop)
    }

    /// `POST /v1/sandboxes/{id}/code`: run a cell; its events come from the returned run.
    pub async fn run_code(
        self: &Arc<Self>,
        id: &SandboxId,
        code: CodeRequest,
    ) -> CoreResult<CodeRun> {
        let cap = self.cfg.output_cap_bytes;
        let request = json!({
            "op": "execute",
            "context_id": code.context,
            "language": code.language,
            "code": code.code,
            "timeout_ms": code.timeout.map_or(0, |t| t.as_millis() as u64),
            "env": code.env,
            "output_cap": cap,
        });
        // A running cell counts as an exec of the sandbox (its cap, idle hibernation).
        let slot = self.exec_slot(id)?;
        let active = self.session_guard(id);
        let mut lines = self.driver_lines(id, &request, code.language).await?;
        // The first line says whether the cell runs (a refusal is an error of the call, not
        // an event of a run).
        let first = lines.next_value().await.map_err(CoreError::from)?;
        let first = match first {
            Some(v) if v.get("type").and_then(Value::as_str) == Some("failed") => {
                let template = self.load(id).await?.template;
                return Err(refusal_error(
                    driver::refusal(&v),
                    id,
                    &template,
                    code.language,
                    code.context.as_ref(),
                )
                .into());
            }
            Some(v) => v,
            None => return Err(InterpError::Driver("it hung up without answering".into()).into()),
        };
        let deadline = code.timeout.map(|t| Instant::now() + t + END_GRACE);
        Ok(CodeRun::starting_with(
            first,
            lines,
            deadline,
            cap,
            Some((active, slot)),
        ))
    }

    /// Send `request` and read its one answer, a refusal mapped to its error.
    async fn driver_answer(
        self: &Arc<Self>,
        id: &SandboxId,
        request: &Value,
        language: Language,
        context: Option<&ContextId>,
    ) -> CoreResult<Value> {
        let lines = self.driver_lines(id, request, language).await?;
        match lines.answer().await? {
            Ok(value) => Ok(value),
            Err(refused) => {
                let template = self.load(id).await?.template;
                Err(refusal_error(refused, id, &template, language, context).into())
            }
        }
    }

    /// A connection to sandbox `id`'s driver (started when nothing listens) with `request`
    /// sent.
    async fn driver_lines(
        self: &Arc<Self>,
        id: &SandboxId,
        request: &Value,
        language: Language,
    ) -> CoreResult<DriverLines> {
        let tunnel = self.driver_tunnel(id, language).await?;
        let max_line = driver::max_line_bytes(self.cfg.output_cap_bytes);
        Ok(DriverLines::send(tunnel, request, max_line).await?)
    }

    async fn driver_tunnel(
        self: &Arc<Self>,
        id: &SandboxId,
        language: Language,
    ) -> CoreResult<TcpTunnel> {
        let client = self.agent(id).await?;
        if let Some(tunnel) = self.agent_call(id, driver::connect(&client).await).await? {
            return Ok(tunnel);
        }
        let lock = self.driver_starts.lock_for(id);
        let _starting = lock.lock().await;
        // Another call may have started it while this one waited.
        if let Some(tunnel) = self.agent_call(id, driver::connect(&client).await).await? {
            return Ok(tunnel);
        }
        tracing::debug!(sandbox = id.as_str(), "starting the kernel driver");
        match driver::start(&client).await {
            Ok(()) => {}
            Err(StartFailure::Client(e)) => return Err(self.agent_error(id, e).await),
            Err(StartFailure::NoPython(detail)) => {
                let template = self.load(id).await?.template;
                return Err(InterpError::Unavailable {
                    sandbox: id.to_string(),
                    template,
                    what: language.to_string(),
                    detail,
                }
                .into());
            }
            Err(StartFailure::Failed(why)) => return Err(InterpError::Driver(why).into()),
        }
        match self.agent_call(id, driver::connect(&client).await).await? {
            Some(tunnel) => Ok(tunnel),
            None => Err(InterpError::Driver(
                "the kernel driver said it listens, but nothing answers on its port".into(),
            )
            .into()),
        }
    }
}

/// The context of an `ok` answer.
fn context_of(answer: &Value) -> CoreResult<ContextInfo> {
    serde_json::from_value(answer.get("context").cloned().unwrap_or(Value::Null))
        .map_err(|e| InterpError::Driver(format!("its context: {e}")).into())
}

fn validate_cwd(cwd: Option<&str>) -> CoreResult<()> {
    match cwd {
        Some(c) if !c.starts_with('/') => {
            Err(InterpError::Invalid(format!("cwd must be an absolute path, got {c:?}")).into())
        }
        _ => Ok(()),
    }
}

/// The error of a driver's refusal.
fn refusal_error(
    refused: Refusal,
    id: &SandboxId,
    template: &str,
    language: Language,
    context: Option<&ContextId>,
) -> InterpError {
    match refused.code.as_str() {
        "not_found" => {
            InterpError::UnknownContext(context.map_or_else(|| "?".into(), |c| c.to_string()))
        }
        "invalid" => InterpError::Invalid(refused.message),
        "unavailable" => InterpError::Unavailable {
            sandbox: id.to_string(),
            template: template.to_string(),
            what: language.to_string(),
            detail: refused.message,
        },
        _ => InterpError::Driver(refused.message),
    }
}
