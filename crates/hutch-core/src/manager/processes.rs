//! Process handles ([`crate::process`]): start, list, attach, input, signals, resizes.
//!
//! Every call goes through [`Manager::agent`], like an exec: it refreshes the sandbox's TTL
//! and idle clock, wakes a hibernated sandbox and is refused (409) on one that is not
//! running. Starting counts as an exec (the `execs` metric, a `sandbox.exec` event of mode
//! `process`, the sandbox's cap of concurrent execs for the length of the call); a
//! [`ProcessStream`] (a streaming start, an attach) holds an exec slot and keeps the
//! sandbox from idle hibernation while it is open. A handle nobody is attached to holds
//! nothing on the host: the agent keeps it.
//!
//! The agent's answers become typed errors: no such pid or tag is
//! [`CoreError::ProcessNotFound`], an exited handle [`CoreError::ProcessExited`], a tag a
//! running handle has [`CoreError::TagInUse`].

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::Stream;
use hutch_proto::client::ClientError;
use hutch_proto::AgentErrorCode;

use super::Manager;
use crate::error::{CoreError, CoreResult};
use crate::ids::SandboxId;
use crate::process::{
    check_pty_size, ProcessInfo, ProcessSelector, ProcessStart, ProcessStream, PtySize,
};

impl Manager {
    /// Start a process handle and return its description at once; the process runs on
    /// detached (nothing of it is lost: its output waits in its ring for an attach).
    pub async fn start_process(
        self: &Arc<Self>,
        id: &SandboxId,
        start: ProcessStart,
    ) -> CoreResult<ProcessInfo> {
        start.validate()?;
        let slot = self.tracked_slot_for(id, start.argv(), "process").await?;
        let client = self.agent(id).await?;
        self.metrics.execs.fetch_add(1, Ordering::Relaxed);
        let request = slot.with_exec_defaults(start.to_agent_request());
        let started = client.start_process(request).await;
        let (pid, session) = self.started(id, started).await?;
        // Detach: the starting call stops reading; the process runs on.
        drop(session);
        let info = self.process_info(id, &ProcessSelector::Pid(pid)).await?;
        if let Some(exit) = &info.exit {
            slot.exit_recorder()
                .record(exit.exit_code, exit.timed_out, exit.duration_ms);
        }
        Ok(info)
    }

    /// Start a process handle and attach to it in one: its description and a stream of its
    /// output from the first byte to its exit (nothing is lost, even of a process that exits
    /// at once). Dropping the stream detaches; the process runs on.
    pub async fn start_process_streaming(
        self: &Arc<Self>,
        id: &SandboxId,
        start: ProcessStart,
    ) -> CoreResult<(ProcessInfo, ProcessStream)> {
        start.validate()?;
        let slot = self.tracked_slot_for(id, start.argv(), "process").await?;
        let client = self.agent(id).await?;
        self.metrics.execs.fetch_add(1, Ordering::Relaxed);
        let request = slot.with_exec_defaults(start.to_agent_request());
        let started = client.start_process(request).await;
        let (pid, session) = self.started(id, started).await?;
        let (_input, events) = session.into_parts();
        let info = self.process_info(id, &ProcessSelector::Pid(pid)).await?;
        let stream = ProcessStream::new(pid, events, slot, self.session_guard(id));
        Ok((info, stream))
    }

    /// The sandbox's process handles: running ones by pid, then the exited ones its agent
    /// still keeps (the last 64, for 10 minutes), oldest first.
    pub async fn list_processes(self: &Arc<Self>, id: &SandboxId) -> CoreResult<Vec<ProcessInfo>> {
        let client = self.agent(id).await?;
        let list = self.agent_call(id, client.list_processes().await).await?;
        Ok(list.processes)
    }

    /// One process handle.
    pub async fn process_info(
        self: &Arc<Self>,
        id: &SandboxId,
        process: &ProcessSelector,
    ) -> CoreResult<ProcessInfo> {
        let client = self.agent(id).await?;
        let info = client.process_info(process).await;
        self.selected(id, info).await
    }

    /// Attach to a process handle: with `replay`, what its ring still holds (a
    /// [`crate::process::ProcessEvent::Missed`] first when it dropped some), then its live
    /// output, then its exit (at once for one that has exited); without, only what it
    /// writes from now on. Dropping the stream detaches.
    pub async fn attach_process(
        self: &Arc<Self>,
        id: &SandboxId,
        process: &ProcessSelector,
        replay: bool,
    ) -> CoreResult<ProcessStream> {
        let client = self.agent(id).await?;
        let slot = self.exec_slot(id)?;
        let attached = client.attach_process(process, replay).await;
        let (pid, events) = self.selected(id, attached).await?;
        Ok(ProcessStream::new(
            pid,
            events,
            slot,
            self.session_guard(id),
        ))
    }

    /// Write `data` to a handle's stdin (or type it into its terminal); returns once the
    /// process has taken it. A handle started without stdin is refused (400 from the agent).
    pub async fn process_input(
        self: &Arc<Self>,
        id: &SandboxId,
        process: &ProcessSelector,
        data: Bytes,
    ) -> CoreResult<()> {
        let client = self.agent(id).await?;
        let written = client.process_input(process, data).await;
        self.selected(id, written).await
    }

    /// [`Manager::process_input`] from a stream of chunks (a request body), written as they
    /// arrive and no faster than the process reads.
    pub async fn process_input_stream<S>(
        self: &Arc<Self>,
        id: &SandboxId,
        process: &ProcessSelector,
        body: S,
    ) -> CoreResult<()>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        let client = self.agent(id).await?;
        let written = client.process_input_stream(process, body).await;
        self.selected(id, written).await
    }

    /// End of file on a handle's stdin (`^D` on a terminal).
    pub async fn close_process_stdin(
        self: &Arc<Self>,
        id: &SandboxId,
        process: &ProcessSelector,
    ) -> CoreResult<()> {
        let client = self.agent(id).await?;
        let closed = client.close_process_stdin(process).await;
        self.selected(id, closed).await
    }

    /// Send `signal` (1–64) to a handle's process group.
    pub async fn signal_process(
        self: &Arc<Self>,
        id: &SandboxId,
        process: &ProcessSelector,
        signal: i32,
    ) -> CoreResult<()> {
        if !(1..=64).contains(&signal) {
            return Err(CoreError::InvalidArgument(format!(
                "a signal is a number from 1 to 64, got {signal}"
            )));
        }
        let client = self.agent(id).await?;
        let sent = client.signal_process(process, signal).await;
        self.selected(id, sent).await
    }

    /// Set the size of a handle's terminal (the process gets `SIGWINCH`).
    pub async fn resize_process(
        self: &Arc<Self>,
        id: &SandboxId,
        process: &ProcessSelector,
        size: PtySize,
    ) -> CoreResult<()> {
        check_pty_size(size)?;
        let client = self.agent(id).await?;
        let resized = client.resize_process(process, size).await;
        self.selected(id, resized).await
    }

    /// The answer to a start: a tag in use is [`CoreError::TagInUse`].
    async fn started<T>(&self, id: &SandboxId, result: Result<T, ClientError>) -> CoreResult<T> {
        self.agent_call(id, result).await.map_err(|e| match e {
            CoreError::Agent {
                code: AgentErrorCode::AlreadyExists,
                message,
            } => CoreError::TagInUse(message),
            other => other,
        })
    }

    /// The answer to a call on one handle: no such handle is
    /// [`CoreError::ProcessNotFound`], an exited one [`CoreError::ProcessExited`].
    async fn selected<T>(&self, id: &SandboxId, result: Result<T, ClientError>) -> CoreResult<T> {
        self.agent_call(id, result).await.map_err(|e| match e {
            CoreError::Agent {
                code: AgentErrorCode::NotFound,
                message,
            } => CoreError::ProcessNotFound(message),
            CoreError::Agent {
                code: AgentErrorCode::Exited,
                message,
            } => CoreError::ProcessExited(message),
            other => other,
        })
    }
}
