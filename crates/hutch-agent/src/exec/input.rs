//! Input of a running exec: the request body's frames after the `ExecRequest`.
//!
//! Frames are handled in order: stdin bytes are written to the process (waiting while it
//! does not read, which in turn stops reading the body: HTTP/2 flow control pushes back on
//! the host), `StdinEof` closes stdin (types `^D` on a PTY), `Signal` signals the process
//! group, `Resize` resizes the PTY. A normal end of the body closes stdin; an error (the
//! host reset the stream or the connection dropped) is reported as [`InputEnd::HostGone`].

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

/// How the input ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputEnd {
    /// The host finished its body (or sent garbage, which ends input but not the exec).
    Finished,
    /// The host went away.
    HostGone,
}

/// Apply input frames to the process whose group is `pgid` until the body ends.
pub async fn feed(mut input: InputFrames, mut stdin: StdinTarget, pgid: u32) -> InputEnd {
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
            FrameKind::Stdin => match &stdin {
                StdinTarget::Pipe(fd) | StdinTarget::Pty(fd) => {
                    if fd.write_all(&frame.payload).await.is_err() {
                        // The process closed its stdin (EPIPE) or the PTY is gone.
                        stdin = StdinTarget::Closed;
                    }
                }
                StdinTarget::Closed => {}
            },
            FrameKind::StdinEof => match &stdin {
                StdinTarget::Pty(fd) => {
                    let _ = fd.write_all(&[CTRL_D]).await;
                }
                _ => stdin = StdinTarget::Closed,
            },
            FrameKind::Signal => match frame.json::<SignalFrame>() {
                Ok(SignalFrame { signal }) if (1..=64).contains(&signal) => {
                    let _ = sys::kill_group(pgid, signal);
                }
                Ok(SignalFrame { signal }) => log!("exec {pgid}: ignoring signal {signal}"),
                Err(e) => log!("exec {pgid}: bad signal frame: {e}"),
            },
            FrameKind::Resize => match (frame.json::<PtySize>(), &stdin) {
                (Ok(size), StdinTarget::Pty(fd)) => {
                    if let Err(e) = pty::resize(fd.as_raw_fd(), size) {
                        log!("exec {pgid}: resize failed: {e}");
                    }
                }
                (Ok(_), _) => {}
                (Err(e), _) => log!("exec {pgid}: bad resize frame: {e}"),
            },
            other => log!("exec {pgid}: ignoring unexpected {other:?} frame from the host"),
        }
    }
}
