//! Output of a running exec: pipes (or a PTY master) read in chunks and sent as frames.
//!
//! Backpressure: frames go through a bounded queue to the response body; when the host
//! stops reading, HTTP/2 flow control stops hyper polling the body, the queue fills, and
//! the pumps stop reading the pipes, so the process blocks on a full pipe.
//!
//! Once the host is gone the pumps keep reading and discard, so a `background` process
//! never blocks on output nobody reads.
//!
//! After the main process exits, its pipes may still be held open by background children.
//! The pumps then drain what is there for at most [`DRAIN_GRACE`] (time spent waiting for
//! the host to take frames does not count) and stop, so the exit is never held hostage by
//! a grandchild.

use std::io;
use std::time::Duration;

use bytes::Bytes;
use hutch_proto::{encode_frame, FrameKind};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::fdio::FdIo;

/// Largest chunk read from a pipe at once (one frame).
pub const CHUNK: usize = 64 << 10;
/// How long pipes are drained after the main process has exited.
pub const DRAIN_GRACE: Duration = Duration::from_millis(100);

/// The response body's queue of frames, which turns into a sink for nothing once the host
/// is gone.
#[derive(Debug, Clone)]
pub struct FrameSink {
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
    gone: bool,
}

impl FrameSink {
    /// A sink feeding `tx`.
    pub fn new(tx: mpsc::Sender<Result<Bytes, io::Error>>) -> Self {
        Self { tx, gone: false }
    }

    /// Queue a frame, waiting while the queue is full. Returns false (and drops the frame)
    /// once the host has stopped listening.
    pub async fn send(&mut self, frame: Bytes) -> bool {
        if !self.gone && self.tx.send(Ok(frame)).await.is_err() {
            self.gone = true;
        }
        !self.gone
    }

    /// Resolves when the host stops listening (the response body was dropped).
    pub async fn closed(&self) {
        self.tx.closed().await;
    }
}

/// Copy `fd` into `kind` frames until end of file, or until the grace period after the
/// process's exit runs out. `exited` turns `Some(instant)` when the main process has exited.
pub async fn pump(
    fd: &FdIo,
    kind: FrameKind,
    mut sink: FrameSink,
    mut exited: watch::Receiver<Option<Instant>>,
) {
    let mut buf = vec![0u8; CHUNK];
    let mut deadline: Option<Instant> = exited.borrow().map(|at| at + DRAIN_GRACE);
    let mut watching_exit = deadline.is_none();
    loop {
        let read = match deadline {
            Some(at) => tokio::select! {
                read = fd.read(&mut buf) => read,
                () = tokio::time::sleep_until(at) => return,
            },
            None => tokio::select! {
                read = fd.read(&mut buf) => read,
                changed = exited.changed(), if watching_exit => {
                    match changed {
                        Ok(()) => deadline = exited.borrow().map(|at| at + DRAIN_GRACE),
                        // The exec ended without telling us: read to EOF.
                        Err(_) => watching_exit = false,
                    }
                    continue;
                }
            },
        };
        let n = match read {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // A PTY master reports EIO once every slave fd is closed: that is its EOF.
            Err(_) => return,
        };
        let started = Instant::now();
        sink.send(encode_frame(kind, &buf[..n])).await;
        if let Some(at) = deadline.as_mut() {
            *at += started.elapsed();
        }
        if deadline.is_some_and(|at| Instant::now() >= at) {
            return;
        }
    }
}
