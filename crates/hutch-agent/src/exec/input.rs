//! Input of a running exec: the request body's frames after the `ExecRequest`.
//!
//! Frames are handled in order: stdin bytes are written to the process (waiting while it
//! does not read, which in turn stops reading the body: HTTP/2 flow control pushes back on
//! the host), `StdinEof` closes stdin (types `^D` on a PTY), `Signal` signals the process
//! group, `Resize` resizes the PTY. A normal end of the body closes stdin (not a process
//! handle's, whose stdin outlives the call); an error (the host reset the stream or the
//! connection dropped) is reported as [`InputEnd::HostGone`]. The process's stdin is a
//! [`ProcessStdin`], which a process handle shares with the calls that reach it by pid.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use http_body_util::BodyExt;
use hutch_proto::{Frame, FrameDecoder, FrameError, FrameKind, PtySize, SignalFrame};
use hyper::body::Incoming;

use crate::fdio::FdIo;
use crate::log::log;
use crate::{pty, sys};

/// The `^D` a PTY's line discipline turns into end of file.
const CTRL_D: u8 = 0x04;

/// Frames decoded from a request body.
#[derive(Debug)]
pub struct InputFrames {
    body: Option<Incoming>,
    decoder: FrameDecoder,
    ended: bool,
}

/// Why the input could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The body failed: the host reset the stream or the connection is gone.
    #[error("exec request body: {0}")]
    Body(String),
    /// The body is not a valid frame stream.
    #[error("exec request body: {0}")]
    Frame(#[from] FrameError),
}

impl InputFrames {
    /// Decode frames from `body`.
    pub fn new(body: Incoming) -> Self {
        Self {
            body: Some(body),
            decoder: FrameDecoder::new(),
            ended: false,
        }
    }

    /// No input at all (an exec the agent starts itself, such as the sandbox's service).
    pub fn none() -> Self {
        Self {
            body: None,
            decoder: FrameDecoder::new(),
            ended: true,
        }
    }

    /// The next frame; `None` when the body has ended cleanly.
    pub async fn next(&mut self) -> Result<Option<Frame>, InputError> {
        loop {
            if let Some(frame) = self.decoder.next_frame()? {
                return Ok(Some(frame));
            }
            if self.ended {
                self.decoder.finish()?;
                return Ok(None);
            }
            let Some(body) = self.body.as_mut() else {
                self.ended = true;
                continue;
            };
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.decoder.push(&data);
                    }
                }
                Some(Err(e)) => return Err(InputError::Body(e.to_string())),
                None => self.ended = true,
            }
        }
    }
}

/// Where stdin frames go.
#[derive(Debug)]
pub enum StdinTarget {
    /// Nowhere: stdin is `/dev/null` or already closed.
    Closed,
    /// The write end of the stdin pipe.
    Pipe(Arc<FdIo>),
    /// The PTY master.
    Pty(Arc<FdIo>),
}

/// Why input could not be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StdinError {
    /// The process was started without a stdin (it reads `/dev/null`).
    NoStdin,
    /// Its stdin was closed (or the process closed its end).
    Closed,
}

/// A process's input side, shared by everyone who may write to it: its exec's request body
/// and, for a process handle, any call. Writes are serialized (one chunk at a time, in the
/// order they come); a resize never waits behind a write the process does not read.
#[derive(Debug)]
pub struct ProcessStdin {
    target: tokio::sync::Mutex<StdinTarget>,
    terminal: std::sync::Mutex<Option<Arc<FdIo>>>,
    had_stdin: bool,
}

impl ProcessStdin {
    /// The input side of a process whose stdin is `target`.
    pub fn new(target: StdinTarget) -> Self {
        let terminal = match &target {
            StdinTarget::Pty(fd) => Some(Arc::clone(fd)),
            _ => None,
        };
        Self {
            had_stdin: !matches!(target, StdinTarget::Closed),
            target: tokio::sync::Mutex::new(target),
            terminal: std::sync::Mutex::new(terminal),
        }
    }

    /// The process has ended: let go of its stdin pipe or terminal.
    pub async fn release(&self) {
        *self.target.lock().await = StdinTarget::Closed;
        *self.terminal.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Whether the process was started with a stdin (a pipe or a terminal).
    pub fn has_stdin(&self) -> bool {
        self.had_stdin
    }

    /// Write `data` to the process's stdin (or type it into its terminal), waiting while it
    /// does not read.
    pub async fn write(&self, data: &[u8]) -> Result<(), StdinError> {
        let mut target = self.target.lock().await;
        let fd = match &*target {
            StdinTarget::Pipe(fd) | StdinTarget::Pty(fd) => Arc::clone(fd),
            StdinTarget::Closed if self.had_stdin => return Err(StdinError::Closed),
            StdinTarget::Closed => return Err(StdinError::NoStdin),
        };
        if fd.write_all(data).await.is_err() {
            // The process closed its stdin (EPIPE) or the terminal is gone.
            *target = StdinTarget::Closed;
            return Err(StdinError::Closed);
        }
        Ok(())
    }

    /// End of file: closes a pipe, types `^D` into a terminal.
    pub async fn close(&self) -> Result<(), StdinError> {
        let mut target = self.target.lock().await;
        match &*target {
            StdinTarget::Pty(fd) => {
                let fd = Arc::clone(fd);
                fd.write_all(&[CTRL_D])
                    .await
                    .map_err(|_| StdinError::Closed)
            }
            StdinTarget::Pipe(_) => {
                *target = StdinTarget::Closed;
                Ok(())
            }
            StdinTarget::Closed if self.had_stdin => Ok(()),
            StdinTarget::Closed => Err(StdinError::NoStdin),
        }
    }

    /// What the end of an exec's request body does: a pipe is closed, a terminal stays.
    async fn end_of_body(&self) {
        let mut target = self.target.lock().await;
        if matches!(&*target, StdinTarget::Pipe(_)) {
            *target = StdinTarget::Closed;
        }
    }

    /// Set the terminal's size; `Ok(false)` for a process without a terminal.
    pub fn resize(&self, size: PtySize) -> std::io::Result<bool> {
        let terminal = self.terminal.lock().unwrap_or_else(|p| p.into_inner());
        match terminal.as_ref() {
            Some(fd) => pty::resize(fd.as_raw_fd(), size).map(|()| true),
            None => Ok(false),
        }
    }
}

/// How the input ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputEnd {
    /// The host finished its body (or sent garbage, which ends input but not the exec).
    Finished,
    /// The host went away.
    HostGone,
}

/// Apply input frames to the process whose group is `pgid` until the body ends. Unless
/// `keep_stdin` (a process handle, whose stdin outlives the call that started it), the end
/// of the body closes a stdin pipe.
pub async fn feed(
    mut input: InputFrames,
    stdin: Arc<ProcessStdin>,
    pgid: u32,
    keep_stdin: bool,
) -> InputEnd {
    let end = apply(&mut input, &stdin, pgid).await;
    if !keep_stdin {
        stdin.end_of_body().await;
    }
    end
}

async fn apply(input: &mut InputFrames, stdin: &ProcessStdin, pgid: u32) -> InputEnd {
    loop {
        let frame = match input.next().await {
            Ok(Some(frame)) => frame,
            Ok(None) => return InputEnd::Finished,
            Err(InputError::Body(_)) => return InputEnd::HostGone,
            Err(e @ InputError::Frame(_)) => {
                log!("exec {pgid}: ignoring further input: {e}");
                return InputEnd::Finished;
            }
        };
        match frame.kind {
            // Input to a process without stdin, or whose stdin is closed, is dropped.
            FrameKind::Stdin => {
                let _ = stdin.write(&frame.payload).await;
            }
            FrameKind::StdinEof => {
                let _ = stdin.close().await;
            }
            FrameKind::Signal => match frame.json::<SignalFrame>() {
                Ok(SignalFrame { signal }) if (1..=64).contains(&signal) => {
                    let _ = sys::kill_group(pgid, signal);
                }
                Ok(SignalFrame { signal }) => log!("exec {pgid}: ignoring signal {signal}"),
                Err(e) => log!("exec {pgid}: bad signal frame: {e}"),
            },
            FrameKind::Resize => match frame.json::<PtySize>() {
                Ok(size) => {
                    if let Err(e) = stdin.resize(size) {
                        log!("exec {pgid}: resize failed: {e}");
                    }
                }
                Err(e) => log!("exec {pgid}: bad resize frame: {e}"),
            },
            other => log!("exec {pgid}: ignoring unexpected {other:?} frame from the host"),
        }
    }
}
