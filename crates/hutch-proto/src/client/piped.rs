//! An exec whose stdin is piped from a source while its output is read: the one way the host
//! runs a non-interactive exec (collected or streamed).
//!
//! A process may write before it reads (`sort`'s opposite: `head -c 8M /dev/zero; cat`), so
//! writing all of stdin before reading any output deadlocks once the output fills the pipe
//! and the HTTP/2 windows. [`PipedExec`] writes stdin in its own task and yields the output
//! as it is read, so neither side waits for the other:
//!
//! - **stdin back-pressure**: a chunk is taken from the source only when the exec's input
//!   queue has room, and the queue drains only as fast as the agent's HTTP/2 window opens,
//!   which is as fast as the process reads. A source that is a request body is therefore
//!   read no faster than the process reads it; nothing is buffered whole.
//! - **output back-pressure**: events are read only when the caller asks for the next one;
//!   unread output stops the agent (its stream window) and blocks the process on its pipe.
//! - **EOF** is sent when the source ends. A source that fails (an upload cut off: its
//!   client is gone) sends no EOF, so the process never mistakes a partial input for a whole
//!   one (`curl … | sh` running half a script); the exec is cancelled instead.
//! - **cancellation**: dropping the [`PipedExec`], or its source failing, stops the writer
//!   and resets the stream, which makes the agent kill the process group (unless the
//!   request set `background`). A collected exec has no other way to learn that its client
//!   went away: nothing is written to the client until the process ends.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{ClientError, ClientResult, ExecEvent, ExecEvents, ExecInput, ExecSession};

/// Where an exec's stdin comes from.
pub enum StdinSource {
    /// No stdin: the process reads `/dev/null`.
    Closed,
    /// These bytes, then EOF.
    Bytes(Bytes),
    /// Chunks as they arrive (a request body), then EOF when the stream ends.
    Stream(BoxStream<'static, Result<Bytes, Box<dyn StdError + Send + Sync>>>),
}

impl std::fmt::Debug for StdinSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Closed => f.write_str("Closed"),
            Self::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Self::Stream(_) => f.write_str("Stream"),
        }
    }
}

impl StdinSource {
    /// Chunks from `stream`, then EOF; an error ends the input without EOF.
    pub fn stream<S, E>(stream: S) -> Self
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: Into<Box<dyn StdError + Send + Sync>>,
    {
        Self::Stream(stream.map(|chunk| chunk.map_err(Into::into)).boxed())
    }

    /// Whether the process gets a stdin pipe (`ExecRequest::stdin`); `false` only for
    /// [`StdinSource::Closed`].
    pub fn is_piped(&self) -> bool {
        !matches!(self, Self::Closed)
    }
}

impl From<Option<Bytes>> for StdinSource {
    fn from(stdin: Option<Bytes>) -> Self {
        stdin.map_or(Self::Closed, Self::Bytes)
    }
}

/// A running exec fed from a [`StdinSource`] while its events are read (see the module docs).
/// A [`Stream`] of the same events as [`ExecEvents`]; ends after the exit (or error).
#[derive(Debug)]
pub struct PipedExec {
    /// `None` once the source failed: dropping the events resets the stream.
    events: Option<ExecEvents>,
    writer: JoinHandle<()>,
    /// Why the source failed, sent by the writer; `None` once it is done without failing.
    source_failed: Option<oneshot::Receiver<String>>,
}

impl ExecSession {
    /// Pipe `stdin` into this exec while its events are read. The session's request must
    /// have asked for a stdin pipe unless `stdin` is [`StdinSource::Closed`]. Spawns the
    /// writer on the current tokio runtime.
    pub fn pipe_stdin(self, stdin: StdinSource) -> PipedExec {
        let (input, events) = self.into_parts();
        let (failed_tx, failed_rx) = oneshot::channel();
        PipedExec {
            events: Some(events),
            writer: tokio::spawn(write_stdin(input, stdin, failed_tx)),
            source_failed: Some(failed_rx),
        }
    }
}

impl PipedExec {
    /// The next event; `None` after the last one.
    pub async fn next(&mut self) -> Option<ClientResult<ExecEvent>> {
        StreamExt::next(self).await
    }
}

impl Stream for PipedExec {
    type Item = ClientResult<ExecEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.events.is_none() {
            return Poll::Ready(None);
        }
        if let Some(failed) = self.source_failed.as_mut() {
            match Pin::new(failed).poll(cx) {
                Poll::Ready(Ok(why)) => {
                    self.events = None;
                    return Poll::Ready(Some(Err(ClientError::Protocol(format!(
                        "exec stdin: {why}; the exec was cancelled"
                    )))));
                }
                // The writer is done without a failure.
                Poll::Ready(Err(_)) => self.source_failed = None,
                Poll::Pending => {}
            }
        }
        match self.events.as_mut() {
            Some(events) => Pin::new(events).poll_next(cx),
            None => Poll::Ready(None),
        }
    }
}

impl Drop for PipedExec {
    fn drop(&mut self) {
        // The writer may wait on a source (a client's upload) or on a queue nobody drains
        // any more: it ends with the exec.
        self.writer.abort();
    }
}

/// Write `stdin` into the exec, then EOF. Ends early, quietly, when the exec has ended (its
/// events say how); dropping `input` at the end closes the request body (which the agent
/// takes as EOF too). A failed source is reported on `failed`, without EOF.
async fn write_stdin(input: ExecInput, stdin: StdinSource, failed: oneshot::Sender<String>) {
    match stdin {
        StdinSource::Closed => {}
        StdinSource::Bytes(data) => {
            if input.send_stdin(data).await.is_ok() {
                let _ = input.close_stdin().await;
            }
        }
        StdinSource::Stream(mut chunks) => {
            while let Some(chunk) = chunks.next().await {
                let chunk = match chunk {
                    Ok(chunk) => chunk,
                    Err(e) => {
                        tracing::debug!(error = %e, "exec stdin source failed; cancelling");
                        let _ = failed.send(format!("the input failed: {e}"));
                        // Held until the exec is dropped: ending the body would be an EOF.
                        let _open = input;
                        return std::future::pending().await;
                    }
                };
                if input.send_stdin(chunk).await.is_err() {
                    return;
                }
            }
            let _ = input.close_stdin().await;
        }
    }
}
