//! Output of a running exec: pipes (or a PTY master) read in chunks and sent as frames.
//!
//! Backpressure: frames go through a bounded queue to the response body; when the host
//! stops reading, HTTP/2 flow control stops hyper polling the body, the queue fills, and
//! the pumps stop reading the pipes, so the process blocks on a full pipe. A process
//! handle's pumps put their output into its ring instead ([`OutputTarget`],
//! `crate::process`), which pushes back the same way while an attached reader lags.
//!
//! Once the host is gone the pumps keep reading and discard, so a `background` process
//! never blocks on output nobody reads.
//!
//! After the main process exits, its pipes may still be held open by background children.
//! The pumps then drain what is there for at most [`DRAIN_GRACE`] (time spent waiting for
//! the host to take frames does not count) and stop, so the exit is never held hostage by
//! a grandchild.

use std::future::Future;
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
/// Most bytes taken in the final sweep once the grace period is over (a pipe holds 64 KiB by
/// default, 1 MiB at most for an unprivileged writer).
const FINAL_SWEEP: usize = 1 << 20;

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

/// Where a pump puts what it reads: an exec's frames, or a process handle's ring.
pub trait OutputTarget: Send + 'static {
    /// Take a chunk of `kind` output, waiting while there is no room for it.
    fn put(&mut self, kind: FrameKind, data: &[u8]) -> impl Future<Output = ()> + Send;
}

impl OutputTarget for FrameSink {
    async fn put(&mut self, kind: FrameKind, data: &[u8]) {
        self.send(encode_frame(kind, data)).await;
    }
}

/// Copy `fd` into `kind` frames until end of file, or until the grace period after the
/// process's exit runs out. `exited` turns `Some(instant)` when the main process has exited.
pub async fn pump<T: OutputTarget>(
    fd: &FdIo,
    kind: FrameKind,
    mut sink: T,
    mut exited: watch::Receiver<Option<Instant>>,
) {
    let mut buf = vec![0u8; CHUNK];
    let mut deadline: Option<Instant> = exited.borrow().map(|at| at + DRAIN_GRACE);
    let mut watching_exit = deadline.is_none();
    loop {
        let read = match deadline {
            Some(at) => tokio::select! {
                biased;
                read = fd.read(&mut buf) => read,
                () = tokio::time::sleep_until(at) => {
                    final_sweep(fd, kind, &mut sink, &mut buf).await;
                    return;
                }
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
        sink.put(kind, &buf[..n]).await;
        if let Some(at) = deadline.as_mut() {
            *at += started.elapsed();
        }
        if deadline.is_some_and(|at| Instant::now() >= at) {
            final_sweep(fd, kind, &mut sink, &mut buf).await;
            return;
        }
    }
}

/// Take what the pipe holds right now: output written before the process exited is never
/// lost, even when this runtime was too busy to read it within the grace period.
async fn final_sweep<T: OutputTarget>(fd: &FdIo, kind: FrameKind, sink: &mut T, buf: &mut [u8]) {
    let mut taken = 0;
    while taken < FINAL_SWEEP {
        match fd.read_now(buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                taken += n;
                sink.put(kind, &buf[..n]).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{FromRawFd, OwnedFd};

    use super::*;

    /// Output written before the process exited reaches the host even when the pump first
    /// runs after the grace period is over (a runtime starved of CPU).
    #[tokio::test]
    async fn output_written_before_exit_survives_a_late_pump() {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe() writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: pipe() just returned these two open descriptors, owned from here on.
        let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: writes 6 bytes from a static buffer to the pipe's open write end.
        let n = unsafe {
            libc::write(
                std::os::fd::AsRawFd::as_raw_fd(&wr),
                b"hello\n".as_ptr().cast(),
                6,
            )
        };
        assert_eq!(n, 6);
        let fd = FdIo::new(rd).expect("register");
        let (tx, mut rx) = mpsc::channel(8);
        // The process exited a second ago; `wr` stays open, as a grandchild would keep it.
        let (_exit_tx, exit_rx) = watch::channel(Some(Instant::now() - Duration::from_secs(1)));
        pump(&fd, FrameKind::Stdout, FrameSink::new(tx), exit_rx).await;
        let frame = rx.try_recv().expect("a frame").expect("ok");
        assert!(frame.ends_with(b"hello\n"), "{frame:?}");
        drop(wr);
    }
}
