//! `POST /v1/service` and `GET /v1/service`: the sandbox's start command (see
//! [`hutch_proto::ServiceSpec`]).
//!
//! The agent starts it once, as an exec with no host attached: its own session and process
//! group, stdin `/dev/null`, no timeout. Every line it prints (stdout and stderr) goes to the
//! agent's log as `<time> start: <line>`, so the host's log reader serves it as the `start`
//! source; the last [`SERVICE_TAIL_LINES`] are kept for the status, which is what a failed
//! ready check quotes. It is not restarted when it exits: its exit is recorded and the
//! host's ready check (or `GET /v1/service`) reports it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hutch_proto::{
    ExecExit, ExecRequest, ExecStarted, FrameDecoder, FrameKind, ServiceSpec, ServiceState,
    ServiceStatus, SERVICE_TAIL_LINES,
};
use hyper::body::Incoming;
use tokio::sync::watch;

use crate::error::Failure;
use crate::http as agent_http;
use crate::log::{log, service_line};
use crate::state::Agent;

/// Longest line written to the log; longer output is cut into lines of this size.
const MAX_LINE: usize = 16 << 10;
/// How long `POST /v1/service` waits for the process to be spawned (or refused).
const SPAWN_WAIT: Duration = Duration::from_secs(10);

/// What the agent knows of its service.
#[derive(Debug, Default)]
pub struct ServiceSlot {
    inner: Mutex<Slot>,
}

#[derive(Debug)]
struct Slot {
    status: ServiceStatus,
    tail: VecDeque<String>,
    /// Bumped whenever the status changes (the POST waits on it).
    changed: watch::Sender<u64>,
}

impl Default for Slot {
    fn default() -> Self {
        Self {
            status: ServiceStatus::not_started(),
            tail: VecDeque::new(),
            changed: watch::channel(0).0,
        }
    }
}

impl ServiceSlot {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current status with its tail.
    pub fn status(&self) -> ServiceStatus {
        let slot = self.lock();
        let mut status = slot.status.clone();
        status.tail = slot.tail.iter().cloned().collect();
        status
    }

    fn update(&self, change: impl FnOnce(&mut Slot)) {
        let mut slot = self.lock();
        change(&mut slot);
        slot.changed.send_modify(|n| *n += 1);
    }

    fn push_line(&self, line: String) {
        service_line(&line);
        self.update(|slot| {
            if slot.tail.len() == SERVICE_TAIL_LINES {
                slot.tail.pop_front();
            }
            slot.tail.push_back(line);
        });
    }
}

/// `GET /v1/service`.
pub fn status(agent: &Agent) -> ServiceStatus {
    agent.service.status()
}

/// `POST /v1/service`: start the service unless one was started already; answers once it
/// was spawned (or refused), with its status.
pub async fn start(agent: Arc<Agent>, body: Incoming) -> Result<ServiceStatus, Failure> {
    let spec: ServiceSpec = agent_http::read_json(body).await?;
    let mut changed = {
        let mut slot = agent.service.lock();
        if slot.status.state != ServiceState::NotStarted {
            drop(slot);
            return Ok(agent.service.status());
        }
        // Claimed: a concurrent POST now sees it as running and answers with its status.
        slot.status.state = ServiceState::Running;
        slot.changed.subscribe()
    };
    let request = ExecRequest {
        cmd: spec.cmd,
        env: spec.env,
        cwd: spec.cwd,
        user: spec.user,
        timeout_ms: None,
        pty: None,
        stdin: false,
        background: true,
        handle: None,
    };
    log!("starting the sandbox's start command");
    let frames = crate::exec::spawn_detached(Arc::clone(&agent), request);
    tokio::spawn(follow(Arc::clone(&agent), frames));
    let spawned = async {
        loop {
            let status = agent.service.status();
            if status.pid.is_some() || status.state == ServiceState::Exited {
                return status;
            }
            if changed.changed().await.is_err() {
                return agent.service.status();
            }
        }
    };
    Ok(tokio::time::timeout(SPAWN_WAIT, spawned)
        .await
        .unwrap_or_else(|_| agent.service.status()))
}

/// Read the service's frames until it exits: output into the log, the rest into the status.
async fn follow(
    agent: Arc<Agent>,
    mut frames: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, std::io::Error>>,
) {
    let service = &agent.service;
    let mut decoder = FrameDecoder::new();
    let mut partial = [Vec::new(), Vec::new()];
    let mut ended = false;
    while let Some(chunk) = frames.recv().await {
        let Ok(chunk) = chunk else { continue };
        decoder.push(&chunk);
        while let Ok(Some(frame)) = decoder.next_frame() {
            match frame.kind {
                FrameKind::Started => {
                    if let Ok(ExecStarted { pid, .. }) = frame.json::<ExecStarted>() {
                        log!("start command running as pid {pid}");
                        service.update(|slot| slot.status.pid = Some(pid));
                    }
                }
                FrameKind::Stdout | FrameKind::Stderr => {
                    let buf = &mut partial[usize::from(frame.kind == FrameKind::Stderr)];
                    buf.extend_from_slice(&frame.payload);
                    for line in take_lines(buf) {
                        service.push_line(line);
                    }
                }
                FrameKind::Exit => {
                    let exit = frame.json::<ExecExit>().ok();
                    flush(service, &mut partial);
                    let (code, signal) = exit.map_or((255, None), |e| (e.exit_code, e.signal));
                    log!("start command exited with status {code}");
                    service.update(|slot| {
                        slot.status.state = ServiceState::Exited;
                        slot.status.exit_code = Some(code);
                        slot.status.signal = signal;
                    });
                    ended = true;
                }
                FrameKind::Error => {
                    let message = frame
                        .json::<hutch_proto::AgentError>()
                        .map_or_else(|e| e.to_string(), |e| e.message);
                    service.push_line(format!("hutch: {message}"));
                    log!("start command could not start: {message}");
                    service.update(|slot| {
                        slot.status.state = ServiceState::Exited;
                        slot.status.exit_code = Some(127);
                    });
                    ended = true;
                }
                _ => {}
            }
        }
    }
    flush(service, &mut partial);
    if !ended {
        service.update(|slot| slot.status.state = ServiceState::Exited);
    }
}

/// The complete lines at the front of `buf` (and pieces of [`MAX_LINE`] of an overlong one).
fn take_lines(buf: &mut Vec<u8>) -> Vec<String> {
    let mut lines = Vec::new();
    let mut start = 0;
    while let Some(end) = buf[start..].iter().position(|&b| b == b'\n') {
        lines.push(text(&buf[start..start + end]));
        start += end + 1;
    }
    while buf.len() - start > MAX_LINE {
        lines.push(text(&buf[start..start + MAX_LINE]));
        start += MAX_LINE;
    }
    buf.drain(..start);
    lines
}

fn flush(service: &ServiceSlot, partial: &mut [Vec<u8>; 2]) {
    for buf in partial.iter_mut() {
        for line in take_lines(buf) {
            service.push_line(line);
        }
        if !buf.is_empty() {
            service.push_line(text(buf));
            buf.clear();
        }
    }
}

fn text(bytes: &[u8]) -> String {
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_cut_at_newlines_and_at_the_longest_line() {
        let mut buf = b"one\r\ntwo\nthr".to_vec();
        assert_eq!(take_lines(&mut buf), vec!["one", "two"]);
        assert_eq!(buf, b"thr");
        let mut long = vec![b'x'; MAX_LINE * 2 + 3];
        let lines = take_lines(&mut long);
        assert_eq!(lines.len(), 2);
        assert_eq!(long.len(), 3);
    }

    #[test]
    fn the_tail_keeps_the_last_lines() {
        let slot = ServiceSlot::default();
        for n in 0..(SERVICE_TAIL_LINES + 5) {
            slot.push_line(format!("line {n}"));
        }
        let status = slot.status();
        assert_eq!(status.tail.len(), SERVICE_TAIL_LINES);
        assert_eq!(status.tail[0], "line 5");
        assert_eq!(status.state, ServiceState::NotStarted);
    }
}
