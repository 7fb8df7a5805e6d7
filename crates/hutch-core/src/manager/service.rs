//! A sandbox's start command: started through its agent after every start (create, wake,
//! fork child), and waited for until its ready check passes (`docs/templates.md`, "Start
//! command").

use std::time::Instant;

use hutch_proto::client::{service, AgentClient};

use super::Manager;
use crate::error::{CoreError, CoreResult};
use crate::model::SandboxRecord;

/// The start command a sandbox of template `info` runs: the template's, with the template's
/// environment under its own (a `vm` bake starts it before any sandbox's environment is
/// set, so both backends give it the same: the template's, never a create's).
pub(super) fn start_spec(info: &hutch_template::TemplateInfo) -> Option<hutch_proto::ServiceSpec> {
    let mut spec = info.start.clone()?;
    let mut env = info.defaults.env.clone();
    env.extend(std::mem::take(&mut spec.env));
    spec.env = env;
    Some(spec)
}

impl Manager {
    /// Start `record`'s start command unless its agent runs it already (a `vm` guest restored
    /// from a bake or snapshot taken with it up), then wait for its ready check.
    pub(super) async fn ensure_service(
        &self,
        record: &SandboxRecord,
        client: &AgentClient,
    ) -> CoreResult<()> {
        let Some(spec) = &record.start else {
            return Ok(());
        };
        let t0 = Instant::now();
        match service::start_and_wait(client, spec).await {
            Ok(started) => {
                tracing::info!(id = %record.id, started, ms = t0.elapsed().as_millis() as u64, "start command ready");
                Ok(())
            }
            Err(source) => Err(CoreError::NotReady {
                template: record.template.clone(),
                source: Box::new(source),
            }),
        }
    }

    /// For a warm guest whose ready check passed while it was warmed: one question to the
    /// agent — the start command still runs — instead of the check (an exec under TCG is
    /// most of a warm create). Anything else (it exited, the agent cannot tell) runs the
    /// whole of [`Self::ensure_service`], which reports it.
    pub(super) async fn confirm_service(
        &self,
        record: &SandboxRecord,
        client: &AgentClient,
    ) -> CoreResult<()> {
        match client.service_status().await {
            Ok(status) if status.state == hutch_proto::ServiceState::Running => {
                tracing::debug!(id = %record.id, "start command running, ready check passed in the warm pool");
                Ok(())
            }
            _ => self.ensure_service(record, client).await,
        }
    }
}
