//! Execs: collected (output kept within the server's output budget, `crate::output`) and
//! sessions (streams and PTYs relayed by the caller), each counted against the sandbox's cap
//! of concurrent execs.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use hutch_proto::client::ExecSession;

use super::Manager;
use crate::error::{CoreError, CoreResult};
use crate::exec::{ExecCommand, ExecOutcome};
use crate::output::OutputBudget;

/// One running exec of a sandbox, counted against `max_execs_per_sandbox` until dropped.
#[derive(Debug)]
pub struct ExecSlot {
    running: Arc<Mutex<HashMap<String, usize>>>,
    id: String,
}

impl Drop for ExecSlot {
    fn drop(&mut self) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = running.get_mut(&self.id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                running.remove(&self.id);
            }
        }
    }
}

impl Manager {
    /// The budget of collected exec output (for metrics).
    pub fn output_budget(&self) -> &OutputBudget {
        &self.output_budget
    }

    /// Count one more exec in sandbox `id`, or refuse it when the sandbox runs its cap.
    pub fn exec_slot(&self, id: &str) -> CoreResult<ExecSlot> {
        let cap = self.cfg.max_execs_per_sandbox;
        let mut running = self.running_execs.lock().unwrap_or_else(|p| p.into_inner());
        let n = running.entry(id.to_string()).or_default();
        if *n >= cap {
            return Err(CoreError::TooManyExecs(format!(
                "sandbox {id} already runs {cap} execs at once, its limit (hutch serve \
                 --max-execs-per-sandbox); wait for one to finish"
            )));
        }
        *n += 1;
        Ok(ExecSlot {
            running: Arc::clone(&self.running_execs),
            id: id.to_string(),
        })
    }

    /// Run a command and collect its output.
    pub async fn exec(self: &Arc<Self>, id: &str, cmd: ExecCommand) -> CoreResult<ExecOutcome> {
        self.exec_capped(id, cmd, self.cfg.output_cap_bytes).await
    }

    /// Run a command and collect at most `cap` bytes of each stream, reserved from the
    /// output budget as they arrive (waiting while it is spent).
    pub(super) async fn exec_capped(
        self: &Arc<Self>,
        id: &str,
        cmd: ExecCommand,
        cap: usize,
    ) -> CoreResult<ExecOutcome> {
        let _slot = self.exec_slot(id)?;
        let client = self.agent(id).await?;
        let _active = self.session_guard(id);
        let r = self.load(id)?;
        let backend = self.backend(r.isolation)?;
        let oom_before = backend.usage(&r).map(|u| u.oom_kills).unwrap_or(0);
        self.metrics.execs.fetch_add(1, Ordering::Relaxed);
        let req = cmd.to_agent_request(None);
        // The stream's HTTP/2 window holds output not read yet: reserve it first (waiting
        // while the budget is spent), give it back once everything is read.
        let window = crate::output::STREAM_WINDOW as usize;
        let mut lease = self.output_budget.lease();
        lease.reserve(window).await;
        let session = client
            .exec(req)
            .await
            .map_err(|e| self.on_transport_error(&r, e))?;
        let collected = crate::output::collect(session, cmd.stdin.clone(), cap, &mut lease)
            .await
            .map_err(|e| self.on_transport_error(&r, e))?;
        lease.release(window);
        let exit = collected.exit;
        if exit.timed_out {
            self.metrics.exec_timeouts.fetch_add(1, Ordering::Relaxed);
        }
        // A vm guest's agent counts the OOM kills of the exec's own cgroup (exact per exec);
        // otherwise (ns) the sandbox's host cgroup counter moved during the exec.
        let oom_killed = exit.signal == Some(libc::SIGKILL)
            && !exit.timed_out
            && match exit.oom_kills {
                Some(kills) => kills > 0,
                None => backend.usage(&r).map(|u| u.oom_kills).unwrap_or(0) > oom_before,
            };
        if oom_killed {
            self.metrics.oom_kills.fetch_add(1, Ordering::Relaxed);
            self.events.publish(
                "sandbox.oom",
                id,
                r.metadata.get("tenant_id").cloned(),
                Some(format!(
                    "a process exceeded the memory limit of {} MiB",
                    r.memory_mib
                )),
            );
        }
        Ok(ExecOutcome {
            stdout: collected.stdout,
            stderr: collected.stderr,
            lease: Some(lease),
            exit_code: exit.exit_code,
            timed_out: exit.timed_out,
            duration_ms: exit.duration_ms,
            stdout_truncated: collected.stdout_truncated,
            stderr_truncated: collected.stderr_truncated,
            oom_killed,
        })
    }

    /// Start a streaming (or PTY) exec; the caller drives the session and holds the slot
    /// for as long as it runs.
    pub async fn exec_session(
        self: &Arc<Self>,
        id: &str,
        cmd: &ExecCommand,
        pty: Option<hutch_proto::PtySize>,
    ) -> CoreResult<(ExecSession, ExecSlot)> {
        let slot = self.exec_slot(id)?;
        let client = self.agent(id).await?;
        self.metrics.execs.fetch_add(1, Ordering::Relaxed);
        let session = client
            .exec(cmd.to_agent_request(pty))
            .await
            .map_err(|e| self.agent_error(id, e))?;
        Ok((session, slot))
    }
}
