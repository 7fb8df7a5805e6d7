//! Execs, and the agent connection they (and file and PTY calls) go through: collected (output kept within the server's output budget, `crate::output`) and
//! sessions (streams and PTYs relayed by the caller), each counted against the sandbox's cap
//! of concurrent execs.
//!
//! Collected execs of one sandbox share one HTTP/2 connection to its agent, whose receive
//! window ([`CONNECTION_WINDOW`], 64 MiB) is shared by all its streams. A collector waiting
//! for the output budget leaves up to [`STREAM_WINDOW`] (4 MiB) unread in it; if enough of
//! them waited at once they would fill the connection's window, and the exec holding the
//! budget's overdraft could receive nothing: a deadlock. So at most
//! [`COLLECTING_PER_SANDBOX`] collected execs per sandbox read output at once (their windows
//! leave room for the rest of the connection); more wait to start.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hutch_proto::client::{
    AgentClient, ClientError, ExecSession, StdinSource, CONNECTION_WINDOW, STREAM_WINDOW,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{wrong_state, Manager};
use crate::error::{CoreError, CoreResult};
use crate::events::{EventBus, ExecInfo};
use crate::exec::{argv_of, ExecCommand, ExecOutcome};
use crate::ids::SandboxId;
use crate::model::{SandboxRecord, SandboxState};
use crate::output::OutputBudget;

/// Collected execs of one sandbox reading output at once: their stream windows together stay
/// below the connection's, with one window to spare for everything else on it.
pub const COLLECTING_PER_SANDBOX: usize = (CONNECTION_WINDOW / STREAM_WINDOW) as usize - 1;

/// One running exec of a sandbox, counted against `max_execs_per_sandbox` until dropped;
/// when it tracks an exec, a `sandbox.exec` event (argv, exit code, duration — never output)
/// is published as it goes.
pub struct ExecSlot {
    running: Arc<Mutex<HashMap<String, usize>>>,
    id: String,
    tracked: Option<TrackedExec>,
    /// The sandbox's working directory and user for commands that name neither, read with
    /// the record the slot was counted against.
    exec_defaults: hutch_proto::ExecDefaults,
}

impl std::fmt::Debug for ExecSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecSlot")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// What a slot reports in its `sandbox.exec` event.
struct TrackedExec {
    events: Arc<EventBus>,
    tenant: Option<String>,
    argv: Vec<String>,
    mode: &'static str,
    started: Instant,
    exit: ExitRecorder,
}

/// Where the relay of a streamed exec or PTY notes how the process ended.
#[derive(Clone, Default)]
pub struct ExitRecorder(Arc<Mutex<Option<(i32, bool, u64)>>>);

impl ExitRecorder {
    /// The process exited with `code` (`timed_out`: killed by its timeout) after `ms`.
    pub fn record(&self, code: i32, timed_out: bool, ms: u64) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((code, timed_out, ms));
    }
}

impl ExecSlot {
    /// `request` with the working directory and user it leaves out taken from the
    /// sandbox's template (`WORKDIR`, `USER`), as `docker exec` does.
    pub(super) fn with_exec_defaults(
        &self,
        mut request: hutch_proto::ExecRequest,
    ) -> hutch_proto::ExecRequest {
        self.exec_defaults.fill(&mut request.cwd, &mut request.user);
        request
    }

    /// Where to note the exit of the exec this slot tracks.
    pub fn exit_recorder(&self) -> ExitRecorder {
        self.tracked
            .as_ref()
            .map(|t| t.exit.clone())
            .unwrap_or_default()
    }
}

impl Drop for ExecSlot {
    fn drop(&mut self) {
        if let Some(t) = self.tracked.take() {
            let exit = *t.exit.0.lock().unwrap_or_else(|p| p.into_inner());
            t.events.publish_exec(
                &self.id,
                t.tenant,
                ExecInfo {
                    argv: t.argv,
                    mode: t.mode,
                    exit_code: exit.map(|(c, _, _)| c),
                    timed_out: exit.is_some_and(|(_, timed_out, _)| timed_out),
                    duration_ms: exit
                        .map(|(_, _, ms)| ms)
                        .unwrap_or_else(|| t.started.elapsed().as_millis() as u64),
                },
            );
        }
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
    pub fn exec_slot(&self, id: &SandboxId) -> CoreResult<ExecSlot> {
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
            tracked: None,
            exec_defaults: hutch_proto::ExecDefaults::default(),
        })
    }

    /// [`Manager::exec_slot`] for `cmd`, which publishes its `sandbox.exec` event.
    async fn tracked_exec_slot(
        &self,
        id: &SandboxId,
        cmd: &ExecCommand,
        mode: &'static str,
    ) -> CoreResult<ExecSlot> {
        self.tracked_slot_for(id, argv_of(&cmd.cmd), mode).await
    }

    /// [`Manager::exec_slot`] publishing a `sandbox.exec` event for `argv` run as `mode`.
    pub(super) async fn tracked_slot_for(
        &self,
        id: &SandboxId,
        argv: Vec<String>,
        mode: &'static str,
    ) -> CoreResult<ExecSlot> {
        let r = self.load(id).await?;
        let tenant = r.tenant();
        let mut slot = self.exec_slot(id)?;
        slot.exec_defaults = r.exec_defaults;
        slot.tracked = Some(TrackedExec {
            events: Arc::clone(&self.events),
            tenant,
            argv,
            mode,
            started: Instant::now(),
            exit: ExitRecorder::default(),
        });
        Ok(slot)
    }

    /// Wait for a permit to collect output in sandbox `id` (see the module docs).
    async fn collect_permit(&self, id: &str) -> OwnedSemaphorePermit {
        let semaphore = {
            let mut map = self.collecting.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(
                map.entry(id.to_string())
                    .or_insert_with(|| Arc::new(Semaphore::new(COLLECTING_PER_SANDBOX))),
            )
        };
        semaphore
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// Forget sandbox `id`'s collect permits when nobody holds or waits for one.
    fn release_collect_permits(&self, id: &str) {
        let mut map = self.collecting.lock().unwrap_or_else(|p| p.into_inner());
        // Clones are only taken under this lock: one left means only the map holds it.
        if map.get(id).is_some_and(|s| Arc::strong_count(s) == 1) {
            map.remove(id);
        }
    }

    /// Run a command and collect its output.
    pub async fn exec(
        self: &Arc<Self>,
        id: &SandboxId,
        cmd: ExecCommand,
    ) -> CoreResult<ExecOutcome> {
        self.exec_capped(id, cmd, self.cfg.output_cap_bytes).await
    }

    /// Run a command with its stdin piped from `stdin` (e.g. a request body, as it arrives,
    /// instead of `cmd.stdin`) and collect its output; stdin is written while the output
    /// is read.
    pub async fn exec_piped(
        self: &Arc<Self>,
        id: &SandboxId,
        cmd: ExecCommand,
        stdin: StdinSource,
    ) -> CoreResult<ExecOutcome> {
        self.exec_in_slot(id, cmd, stdin, self.cfg.output_cap_bytes)
            .await
    }

    /// Run a command and collect at most `cap` bytes of each stream: counted against the
    /// sandbox's cap of execs (refused past it), started once a collect permit is free.
    pub(super) async fn exec_capped(
        self: &Arc<Self>,
        id: &SandboxId,
        cmd: ExecCommand,
        cap: usize,
    ) -> CoreResult<ExecOutcome> {
        let stdin = StdinSource::from(cmd.stdin.clone());
        self.exec_in_slot(id, cmd, stdin, cap).await
    }

    /// [`Manager::exec_capped`] with stdin from `stdin`.
    async fn exec_in_slot(
        self: &Arc<Self>,
        id: &SandboxId,
        cmd: ExecCommand,
        stdin: StdinSource,
        cap: usize,
    ) -> CoreResult<ExecOutcome> {
        let slot = self.tracked_exec_slot(id, &cmd, "collected").await?;
        let permit = self.collect_permit(id).await;
        let result = self.exec_collecting(id, cmd, stdin, cap).await;
        if let Ok(o) = &result {
            slot.exit_recorder()
                .record(o.exit_code, o.timed_out, o.duration_ms);
        }
        drop(permit);
        self.release_collect_permits(id);
        result
    }

    /// The exec itself: output reserved from the budget as it arrives (waiting while it is
    /// spent).
    async fn exec_collecting(
        self: &Arc<Self>,
        id: &SandboxId,
        cmd: ExecCommand,
        stdin: StdinSource,
        cap: usize,
    ) -> CoreResult<ExecOutcome> {
        let client = self.agent(id).await?;
        let _active = self.session_guard(id);
        let r = self.load(id).await?;
        let backend = self.backend(r.isolation)?;
        let oom_before = backend.usage(&r).map(|u| u.oom_kills).unwrap_or(0);
        self.metrics.execs.fetch_add(1, Ordering::Relaxed);
        let mut req = cmd.to_agent_request(None);
        r.exec_defaults.fill(&mut req.cwd, &mut req.user);
        req.stdin = stdin.is_piped();
        // The stream's HTTP/2 window holds output not read yet: reserve it first (waiting
        // while the budget is spent), give it back once everything is read.
        let window = crate::output::STREAM_WINDOW as usize;
        let mut lease = self.output_budget.lease();
        lease.reserve(window).await;
        let exec = client
            .exec(req)
            .await
            .map_err(|e| self.on_transport_error(&r, e))?
            .pipe_stdin(stdin);
        let collected = crate::output::collect(exec, cap, &mut lease)
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
                r.tenant(),
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
        id: &SandboxId,
        cmd: &ExecCommand,
        pty: Option<hutch_proto::PtySize>,
    ) -> CoreResult<(ExecSession, ExecSlot)> {
        let mode = if pty.is_some() { "pty" } else { "stream" };
        let slot = self.tracked_exec_slot(id, cmd, mode).await?;
        let client = self.agent(id).await?;
        self.metrics.execs.fetch_add(1, Ordering::Relaxed);
        let request = slot.with_exec_defaults(cmd.to_agent_request(pty));
        let session = self.agent_call(id, client.exec(request).await).await?;
        Ok((session, slot))
    }

    /// A connected agent client for a running sandbox (refreshes its TTL). A hibernated
    /// sandbox is woken first.
    pub async fn agent(self: &Arc<Self>, id: &SandboxId) -> CoreResult<AgentClient> {
        let mut r = self.touch_used(id).await?;
        if r.state == SandboxState::Hibernated {
            self.wake_if_hibernated(id).await?;
            r = self.load(id).await?;
        }
        if !r.state.can_use() {
            return Err(wrong_state(&r, None));
        }
        if let Some(c) = self.lock_agents().get(id) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let backend = self.backend(r.isolation)?;
        let client = AgentClient::connect_unix(&backend.agent_socket(id))
            .await
            .map_err(|e| self.on_transport_error(&r, e))?;
        self.lock_agents().insert(id.clone(), client.clone());
        Ok(client)
    }

    /// Map an agent error, noticing a dead sandbox.
    pub fn on_transport_error(&self, r: &SandboxRecord, e: ClientError) -> CoreError {
        if matches!(e, ClientError::Agent(_)) {
            return CoreError::from(e);
        }
        if let Ok(backend) = self.backend(r.isolation) {
            if !backend.alive(r) {
                return CoreError::SandboxFailed(format!("sandbox {} is no longer running", r.id));
            }
        }
        CoreError::from(e)
    }

    /// Map an error from an agent call on sandbox `id`.
    pub async fn agent_error(&self, id: &SandboxId, e: ClientError) -> CoreError {
        match self.load(id).await {
            Ok(r) => self.on_transport_error(&r, e),
            Err(_) => CoreError::NotFound(format!("sandbox {id} does not exist")),
        }
    }

    /// The result of an agent call on sandbox `id`, its error mapped by
    /// [`Manager::agent_error`].
    pub async fn agent_call<T>(
        &self,
        id: &SandboxId,
        result: Result<T, ClientError>,
    ) -> CoreResult<T> {
        match result {
            Ok(v) => Ok(v),
            Err(e) => Err(self.agent_error(id, e).await),
        }
    }
}
