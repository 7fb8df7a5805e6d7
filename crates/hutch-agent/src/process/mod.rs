//! Process handles: processes that outlive the call that started them
//! (`docs/agent-protocol.md`, "Process handles").
//!
//! `POST /v1/exec` with `handle` set starts one ([`run_handle`]): it is spawned like any
//! exec (own session and process group, its timeout kills the group), registered in the
//! [`ProcessTable`] by pid and tag, and its output goes into a [`ProcessOutput`] ring instead
//! of straight to the response. The starting call is its first attached reader, registered
//! before the process runs, so "start and stream" loses nothing even for a process that
//! exits at once. The host going away never kills a handle, and the end of the starting
//! request body does not close its stdin (only `StdinEof` or `/v1/processes/close-stdin`
//! does).
//!
//! The `/v1/processes/…` routes reach a handle by `pid=` or `tag=`: list, info, attach
//! (replayed output, live output, exit), input, close-stdin, signal and resize.

mod ring;
mod table;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use hutch_proto::{
    check_tag, encode_frame, encode_json_frame, ExecExit, ExecRequest, ExecStarted, FrameKind,
    ProcessInfo, ProcessList, ProcessSelector, ProcessState, PtySize, SignalFrame,
};
use hyper::body::Incoming;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use self::ring::{OutStream, ProcessOutput, Reader, Taken, RING_BYTES};
pub use self::table::ProcessTable;
use crate::error::Failure;
use crate::exec::input::{self, InputFrames, ProcessStdin, StdinError};
use crate::exec::output::{pump, FrameSink, OutputTarget};
use crate::exec::{self, Started};
use crate::http::{self, AgentBody, Query};
use crate::state::Agent;
use crate::sys;

/// Frames queued between an attached reader and its response body.
const ATTACH_QUEUE: usize = 8;

/// One process handle.
#[derive(Debug)]
pub struct Process {
    /// Its pid (and process group).
    pub pid: u32,
    /// Its tag.
    pub tag: Option<String>,
    cmd: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: String,
    user: String,
    started_at_ms: i64,
    pty: Mutex<Option<PtySize>>,
    /// Its output, and its exit once it ended.
    pub output: Arc<ProcessOutput>,
    /// Its input side.
    pub stdin: Arc<ProcessStdin>,
}

impl Process {
    /// How it ended, once it has.
    pub fn exit(&self) -> Option<ExecExit> {
        self.output.exit()
    }

    /// Its description.
    pub fn info(&self) -> ProcessInfo {
        let exit = self.exit();
        ProcessInfo {
            pid: self.pid,
            tag: self.tag.clone(),
            cmd: self.cmd.clone(),
            env: self.env.clone(),
            cwd: self.cwd.clone(),
            user: self.user.clone(),
            pty: *self.pty.lock().unwrap_or_else(|p| p.into_inner()),
            stdin: self.stdin.has_stdin(),
            started_at: hutch_proto::time::rfc3339_utc_millis(self.started_at_ms),
            state: if exit.is_some() {
                ProcessState::Exited
            } else {
                ProcessState::Running
            },
            exit,
        }
    }

    /// Refuse input and signals once it has exited.
    fn check_running(&self) -> Result<(), Failure> {
        match self.exit() {
            Some(exit) => Err(Failure::Exited(format!(
                "process {} has exited (exit code {})",
                self.pid, exit.exit_code
            ))),
            None => Ok(()),
        }
    }
}

/// Where a handle's pumps put its output: its ring.
struct RingTarget {
    output: Arc<ProcessOutput>,
    stream: OutStream,
}

impl OutputTarget for RingTarget {
    async fn put(&mut self, _kind: FrameKind, data: &[u8]) {
        self.output.append(self.stream, data).await;
    }
}

fn now_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `POST /v1/exec` with `handle`: start the process as a handle and stream it to the
/// starting call (its first reader) until that call goes away or the process ends.
pub async fn run_handle(
    agent: Arc<Agent>,
    request: ExecRequest,
    input: InputFrames,
    mut sink: FrameSink,
) {
    let tag = request.handle.as_ref().and_then(|h| h.tag.clone());
    let refuse = |failure: Failure| encode_json_frame(FrameKind::Error, &failure.to_wire());
    if let Some(Err(message)) = tag.as_deref().map(check_tag) {
        sink.send(refuse(Failure::BadRequest(message))).await;
        return;
    }
    let reservation = match tag.as_deref().map(|t| agent.processes.reserve_tag(t)) {
        Some(Err(failure)) => {
            sink.send(refuse(failure)).await;
            return;
        }
        Some(Ok(reservation)) => Some(reservation),
        None => None,
    };
    let started = match exec::start(&agent, &request).await {
        Ok(started) => started,
        Err(refused) => {
            let error = refused.into_error();
            sink.send(encode_json_frame(FrameKind::Error, &error)).await;
            return;
        }
    };
    let Started {
        pid,
        status,
        spawned_at,
        outputs,
        stdin,
        cgroup,
        argv,
        cwd,
        user,
    } = started;
    let output = Arc::new(ProcessOutput::new(RING_BYTES));
    let first_reader = output.reader(true);
    let stdin = Arc::new(ProcessStdin::new(stdin));
    let process = Arc::new(Process {
        pid,
        tag,
        cmd: argv,
        env: request.env.clone(),
        cwd,
        user,
        started_at_ms: now_unix_ms(),
        pty: Mutex::new(request.pty),
        output: Arc::clone(&output),
        stdin: Arc::clone(&stdin),
    });
    agent.processes.insert(Arc::clone(&process), reservation);
    let running = agent.register_exec(pid);
    let started = ExecStarted { pid, handle: true };
    sink.send(encode_json_frame(FrameKind::Started, &started))
        .await;
    tokio::spawn(relay(first_reader, sink));

    let (exited_tx, exited_rx) = watch::channel(None);
    let pumps: Vec<JoinHandle<()>> = outputs
        .into_iter()
        .map(|(fd, kind)| {
            let stream = if kind == FrameKind::Stderr {
                OutStream::Stderr
            } else {
                OutStream::Stdout
            };
            let target = RingTarget {
                output: Arc::clone(&output),
                stream,
            };
            let exited = exited_rx.clone();
            tokio::spawn(async move { pump(&fd, kind, target, exited).await })
        })
        .collect();
    let input_task = tokio::spawn(input::feed(input, Arc::clone(&stdin), pid, true));

    let supervised = exec::supervise(pid, request.timeout_ms, status, None).await;
    let duration = spawned_at.elapsed();
    let oom_kills = exec::finish_cgroup(&agent, cgroup);
    let _ = exited_tx.send(Some(Instant::now()));
    for pump in pumps {
        let _ = pump.await;
    }
    drop(running);
    input_task.abort();
    stdin.release().await;
    let mut exit = exec::exit_frame(supervised.status, supervised.timed_out, duration);
    exit.oom_kills = oom_kills;
    output.finish(exit);
    agent.processes.exited(pid);
}

/// Hand a reader's output on as frames until the process's `Exit` was sent or the host
/// stopped listening (which detaches the reader, never the process).
async fn relay(mut reader: Reader, mut sink: FrameSink) {
    loop {
        let frame = match reader.take() {
            Taken::Missed(missed) => encode_json_frame(FrameKind::Missed, &missed),
            Taken::Data(OutStream::Stdout, data) => encode_frame(FrameKind::Stdout, &data),
            Taken::Data(OutStream::Stderr, data) => encode_frame(FrameKind::Stderr, &data),
            Taken::End(exit) => {
                sink.send(encode_json_frame(FrameKind::Exit, &exit)).await;
                return;
            }
            Taken::Idle => {
                tokio::select! {
                    () = reader.changed() => {}
                    () = sink.closed() => return,
                }
                continue;
            }
        };
        if !sink.send(frame).await {
            return;
        }
    }
}

/// The handle a request's `pid=` or `tag=` names.
fn find(agent: &Agent, query: &Query) -> Result<Arc<Process>, Failure> {
    let selector = ProcessSelector::from_query(query.get("pid"), query.get("tag"))
        .map_err(Failure::BadRequest)?;
    agent.processes.find(&selector).ok_or_else(|| {
        Failure::NotFound(format!(
            "no {selector}: it is not a process handle of this sandbox, or it exited too long ago"
        ))
    })
}

/// `GET /v1/processes`.
pub fn list(agent: &Agent) -> ProcessList {
    ProcessList {
        processes: agent.processes.list(),
    }
}

/// `GET /v1/processes/info?pid=|tag=`.
pub fn info(agent: &Agent, query: &Query) -> Result<ProcessInfo, Failure> {
    find(agent, query).map(|p| p.info())
}

/// `POST /v1/processes/attach?pid=|tag=[&replay=false]`: `Started`, the output (kept, then
/// live), `Exit`.
pub fn attach(agent: &Agent, query: &Query) -> Result<hyper::Response<AgentBody>, Failure> {
    let process = find(agent, query)?;
    let replay = query.flag("replay", true)?;
    let reader = process.output.reader(replay);
    let (tx, rx) = mpsc::channel(ATTACH_QUEUE);
    let mut sink = FrameSink::new(tx);
    let pid = process.pid;
    tokio::spawn(async move {
        let started = ExecStarted { pid, handle: true };
        if sink
            .send(encode_json_frame(FrameKind::Started, &started))
            .await
        {
            relay(reader, sink).await;
        }
    });
    Ok(http::stream(http::FRAMES_CONTENT_TYPE, rx))
}

/// `POST /v1/processes/input?pid=|tag=`: the body, written to stdin as it arrives.
pub async fn input(agent: &Agent, query: &Query, mut body: Incoming) -> Result<(), Failure> {
    let process = find(agent, query)?;
    process.check_running()?;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Failure::BadRequest(format!("reading the input: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if let Err(e) = process.stdin.write(&data).await {
            process.check_running()?;
            return Err(stdin_failure(&process, e));
        }
    }
    Ok(())
}

/// `POST /v1/processes/close-stdin?pid=|tag=`.
pub async fn close_stdin(agent: &Agent, query: &Query) -> Result<(), Failure> {
    let process = find(agent, query)?;
    process.check_running()?;
    process
        .stdin
        .close()
        .await
        .map_err(|e| stdin_failure(&process, e))
}

fn stdin_failure(process: &Process, error: StdinError) -> Failure {
    match error {
        StdinError::NoStdin => Failure::BadRequest(format!(
            "process {} was started without stdin (start it with \"stdin\": true)",
            process.pid
        )),
        StdinError::Closed => {
            Failure::BadRequest(format!("the stdin of process {} is closed", process.pid))
        }
    }
}

/// `POST /v1/processes/signal?pid=|tag=` with `{"signal": N}`: signal its process group.
pub async fn signal(agent: &Agent, query: &Query, body: Incoming) -> Result<(), Failure> {
    let process = find(agent, query)?;
    let SignalFrame { signal } = http::read_json(body).await?;
    exec::check_signal(signal)?;
    process.check_running()?;
    sys::kill_group(process.pid, signal).map_err(|e| {
        if e.raw_os_error() == Some(libc::ESRCH) {
            Failure::Exited(format!("process {} has exited", process.pid))
        } else {
            Failure::io("kill", format!("process group {}", process.pid), e)
        }
    })
}

/// `POST /v1/processes/resize?pid=|tag=` with `{"cols", "rows"}`.
pub async fn resize(agent: &Agent, query: &Query, body: Incoming) -> Result<(), Failure> {
    let process = find(agent, query)?;
    let size: PtySize = http::read_json(body).await?;
    if size.cols == 0 || size.rows == 0 {
        return Err(Failure::BadRequest(format!(
            "a terminal needs at least one column and one row, got {}x{}",
            size.cols, size.rows
        )));
    }
    process.check_running()?;
    match process.stdin.resize(size) {
        Ok(true) => {
            *process.pty.lock().unwrap_or_else(|p| p.into_inner()) = Some(size);
            Ok(())
        }
        Ok(false) => Err(Failure::BadRequest(format!(
            "process {} has no terminal to resize (start it with \"pty\")",
            process.pid
        ))),
        Err(e) => Err(Failure::io("resize", format!("process {}", process.pid), e)),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::exec::input::StdinTarget;

    /// A process entry with nothing behind it (for table tests).
    pub(crate) fn process(pid: u32, tag: Option<&str>) -> Arc<Process> {
        Arc::new(Process {
            pid,
            tag: tag.map(String::from),
            cmd: vec!["sleep".into()],
            env: BTreeMap::new(),
            cwd: "/".into(),
            user: "root".into(),
            started_at_ms: 0,
            pty: Mutex::new(None),
            output: Arc::new(ProcessOutput::new(RING_BYTES)),
            stdin: Arc::new(ProcessStdin::new(StdinTarget::Closed)),
        })
    }

    #[test]
    fn info_says_running_then_exited() {
        let p = process(4, Some("t"));
        let info = p.info();
        assert_eq!(info.state, ProcessState::Running);
        assert_eq!(info.started_at, "1970-01-01T00:00:00.000Z");
        assert!(!info.stdin);
        assert!(p.check_running().is_ok());
        p.output.finish(ExecExit {
            exit_code: 143,
            signal: Some(15),
            timed_out: false,
            duration_ms: 3,
            oom_kills: None,
        });
        let info = p.info();
        assert_eq!(info.state, ProcessState::Exited);
        assert_eq!(info.exit.map(|e| e.signal), Some(Some(15)));
        assert_eq!(
            p.check_running().expect_err("exited").to_string(),
            "process 4 has exited (exit code 143)"
        );
    }
}
