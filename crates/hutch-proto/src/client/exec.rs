//! Exec sessions of the client: the full-duplex `/v1/exec` stream as typed input and events.
//!
//! The request body carries the [`ExecRequest`] frame and then whatever [`ExecInput`] sends;
//! the response body is decoded into [`ExecEvent`]s. Dropping [`ExecEvents`] (or the whole
//! [`ExecSession`]) resets the HTTP/2 stream, which makes the agent kill the process group
//! unless the request set `background`. A non-interactive exec feeds its stdin through
//! [`ExecSession::pipe_stdin`] (`super::piped`), which writes it while the output is read.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use http::Method;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::StreamBody;
use hyper::body::{Body, Frame, Incoming};
use tokio::sync::{mpsc, oneshot};

use super::{classify, AgentClient, BoxError, ClientError, ClientResult, StdinSource};
use crate::frame::{encode_frame, encode_json_frame, FrameDecoder, FrameKind, MAX_FRAME_PAYLOAD};
use crate::{AgentError, ExecExit, ExecRequest, ExecStarted, MissedOutput, PtySize, SignalFrame};

/// Input frames queued towards the agent before `send_stdin` waits.
const INPUT_QUEUE: usize = 16;

/// What the agent reports about a running exec, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// The process runs with this pid (not sent when it could not start).
    Started {
        /// Pid inside the sandbox; also accepted by [`AgentClient::signal`].
        pid: u32,
    },
    /// Bytes from stdout (or the PTY).
    Stdout(Bytes),
    /// Bytes from stderr.
    Stderr(Bytes),
    /// A process handle's ring dropped this much output before what follows (a handle's
    /// streams only: an attach that came late, or a reader let go for not reading).
    Missed(MissedOutput),
    /// The process ended. Always the last event.
    Exit(ExecExit),
    /// The exec failed before the process ran (bad cwd, unknown user, ...). The last event.
    Error(AgentError),
}

/// A running exec: [`ExecInput`] towards the process, [`ExecEvents`] from it.
#[derive(Debug)]
pub struct ExecSession {
    /// Sends stdin, EOF, signals and resizes. Cloneable.
    pub input: ExecInput,
    /// Yields the process's events.
    pub events: ExecEvents,
}

impl ExecSession {
    /// Write to the process's stdin (or type into its PTY).
    pub async fn send_stdin(&self, data: Bytes) -> ClientResult<()> {
        self.input.send_stdin(data).await
    }

    /// Close the process's stdin.
    pub async fn close_stdin(&self) -> ClientResult<()> {
        self.input.close_stdin().await
    }

    /// Signal the process group.
    pub async fn signal(&self, signal: i32) -> ClientResult<()> {
        self.input.signal(signal).await
    }

    /// Resize the PTY.
    pub async fn resize(&self, size: PtySize) -> ClientResult<()> {
        self.input.resize(size).await
    }

    /// The next event; `None` after the last one.
    pub async fn next_event(&mut self) -> Option<ClientResult<ExecEvent>> {
        self.events.next().await
    }

    /// Split into input and events, to drive them from different tasks.
    pub fn into_parts(self) -> (ExecInput, ExecEvents) {
        (self.input, self.events)
    }
}

/// The sending half of an exec. Clones feed the same process.
///
/// Input is delivered in order; a `Signal` queued behind stdin the process does not read
/// waits (use [`AgentClient::signal`] to signal out of band). Sends fail with
/// [`ClientError::Protocol`] once the exec has ended.
#[derive(Debug, Clone)]
pub struct ExecInput {
    tx: mpsc::Sender<Bytes>,
}

impl ExecInput {
    /// Write to the process's stdin (or type into its PTY); split into frames as needed.
    pub async fn send_stdin(&self, data: Bytes) -> ClientResult<()> {
        // One frame encoded at a time, as the queue takes it: a large `data` is never copied
        // whole.
        for piece in data.chunks(MAX_FRAME_PAYLOAD) {
            self.send(encode_frame(FrameKind::Stdin, piece)).await?;
        }
        Ok(())
    }

    /// Close stdin (EOF). On a PTY this types `^D`.
    pub async fn close_stdin(&self) -> ClientResult<()> {
        self.send(encode_frame(FrameKind::StdinEof, b"")).await
    }

    /// Deliver a signal to the process group.
    pub async fn signal(&self, signal: i32) -> ClientResult<()> {
        self.send(encode_json_frame(
            FrameKind::Signal,
            &SignalFrame { signal },
        ))
        .await
    }

    /// Resize the PTY (ignored without one).
    pub async fn resize(&self, size: PtySize) -> ClientResult<()> {
        self.send(encode_json_frame(FrameKind::Resize, &size)).await
    }

    async fn send(&self, frame: Bytes) -> ClientResult<()> {
        self.tx
            .send(frame)
            .await
            .map_err(|_| ClientError::Protocol("the exec has ended; input is closed".into()))
    }
}

/// The receiving half of an exec. Dropping it resets the stream (see the module docs).
#[derive(Debug)]
pub struct ExecEvents {
    body: Incoming,
    decoder: FrameDecoder,
    finished: bool,
    /// The `Started` frame said the process is a handle.
    pub(super) started_as_handle: bool,
    // Dropped with the events: makes the request body fail, so hyper resets the stream.
    _cancel: Option<oneshot::Sender<()>>,
}

impl ExecEvents {
    /// The next event; `None` after [`ExecEvent::Exit`] or [`ExecEvent::Error`].
    pub async fn next(&mut self) -> Option<ClientResult<ExecEvent>> {
        StreamExt::next(self).await
    }

    /// Events of a response whose request body is already complete (an attach): dropping
    /// them resets the stream.
    pub(super) fn of_response(body: Incoming) -> Self {
        Self {
            body,
            decoder: FrameDecoder::new(),
            finished: false,
            started_as_handle: false,
            _cancel: None,
        }
    }

    fn decode_next(&mut self) -> Option<ClientResult<ExecEvent>> {
        let frame = match self.decoder.next_frame() {
            Ok(Some(frame)) => frame,
            Ok(None) => return None,
            Err(e) => {
                self.finished = true;
                return Some(Err(ClientError::Protocol(format!("exec stream: {e}"))));
            }
        };
        let event = match frame.kind {
            FrameKind::Started => frame.json::<ExecStarted>().map(|s| {
                self.started_as_handle = s.handle;
                ExecEvent::Started { pid: s.pid }
            }),
            FrameKind::Stdout => Ok(ExecEvent::Stdout(frame.payload)),
            FrameKind::Stderr => Ok(ExecEvent::Stderr(frame.payload)),
            FrameKind::Missed => frame.json().map(ExecEvent::Missed),
            FrameKind::Exit => frame.json().map(ExecEvent::Exit),
            FrameKind::Error => frame.json().map(ExecEvent::Error),
            other => {
                self.finished = true;
                return Some(Err(ClientError::Protocol(format!(
                    "agent sent an input frame {other:?}"
                ))));
            }
        };
        match event {
            Ok(event) => {
                if matches!(event, ExecEvent::Exit(_) | ExecEvent::Error(_)) {
                    self.finished = true;
                }
                Some(Ok(event))
            }
            Err(e) => {
                self.finished = true;
                Some(Err(ClientError::Protocol(format!("exec stream: {e}"))))
            }
        }
    }
}

impl Stream for ExecEvents {
    type Item = ClientResult<ExecEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if self.finished {
                return Poll::Ready(None);
            }
            if let Some(event) = self.decode_next() {
                return Poll::Ready(Some(event));
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.decoder.push(&data);
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    self.finished = true;
                    return Poll::Ready(Some(Err(classify(&e))));
                }
                Poll::Ready(None) => {
                    self.finished = true;
                    let e = ClientError::Protocol("exec stream ended without an exit".into());
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }
}

/// What [`AgentClient::exec_collect`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectedExec {
    /// Stdout, up to the cap.
    pub stdout: Bytes,
    /// Stderr, up to the cap.
    pub stderr: Bytes,
    /// Stdout went over the cap; the rest was discarded.
    pub stdout_truncated: bool,
    /// Stderr went over the cap; the rest was discarded.
    pub stderr_truncated: bool,
    /// How the process ended.
    pub exit: ExecExit,
}

pub(super) async fn start(client: &AgentClient, request: ExecRequest) -> ClientResult<ExecSession> {
    let (tx, rx) = mpsc::channel::<Bytes>(INPUT_QUEUE);
    let (cancel_tx, cancel_rx) = oneshot::channel::<()>();
    tx.try_send(encode_json_frame(FrameKind::ExecRequest, &request))
        .expect("a new channel has room for the first frame");
    let response = client
        .call(Method::POST, "/v1/exec", input_body(rx, cancel_rx))
        .await?;
    Ok(ExecSession {
        input: ExecInput { tx },
        events: ExecEvents {
            body: response.into_body(),
            decoder: FrameDecoder::new(),
            finished: false,
            started_as_handle: false,
            _cancel: Some(cancel_tx),
        },
    })
}

/// The request body: queued input frames; an error (→ stream reset) once the events are gone.
fn input_body(
    rx: mpsc::Receiver<Bytes>,
    cancel: oneshot::Receiver<()>,
) -> UnsyncBoxBody<Bytes, BoxError> {
    let frames = futures_util::stream::unfold(Some((rx, cancel)), |state| async move {
        let (mut rx, mut cancel) = state?;
        tokio::select! {
            biased;
            _ = &mut cancel => Some((Err(BoxError::from("exec session dropped")), None)),
            next = rx.recv() => next.map(|frame| (Ok(Frame::data(frame)), Some((rx, cancel)))),
        }
    });
    UnsyncBoxBody::new(StreamBody::new(frames))
}

pub(super) async fn collect(
    client: &AgentClient,
    mut request: ExecRequest,
    stdin: Option<Bytes>,
    cap: usize,
) -> ClientResult<CollectedExec> {
    let stdin = StdinSource::from(stdin);
    request.stdin = stdin.is_piped();
    let mut exec = client.exec(request).await?.pipe_stdin(stdin);
    let mut stdout = Capture::new(cap);
    let mut stderr = Capture::new(cap);
    while let Some(event) = exec.next().await {
        match event? {
            ExecEvent::Started { .. } | ExecEvent::Missed(_) => {}
            ExecEvent::Stdout(data) => stdout.push(&data),
            ExecEvent::Stderr(data) => stderr.push(&data),
            ExecEvent::Error(e) => return Err(ClientError::Agent(e)),
            ExecEvent::Exit(exit) => {
                return Ok(CollectedExec {
                    stdout_truncated: stdout.truncated,
                    stderr_truncated: stderr.truncated,
                    stdout: stdout.buf.freeze(),
                    stderr: stderr.buf.freeze(),
                    exit,
                })
            }
        }
    }
    Err(ClientError::Protocol(
        "exec stream ended without an exit".into(),
    ))
}

struct Capture {
    buf: BytesMut,
    cap: usize,
    truncated: bool,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            cap,
            truncated: false,
        }
    }

    fn push(&mut self, data: &[u8]) {
        let room = self.cap.saturating_sub(self.buf.len());
        if data.len() > room {
            self.truncated = true;
        }
        self.buf.extend_from_slice(&data[..data.len().min(room)]);
    }
}

#[cfg(test)]
mod tests {
    use super::Capture;

    #[test]
    fn capture_keeps_the_cap_and_flags_the_rest() {
        let mut c = Capture::new(5);
        c.push(b"abc");
        assert!(!c.truncated);
        c.push(b"defg");
        c.push(b"hij");
        assert_eq!(&c.buf[..], b"abcde");
        assert!(c.truncated);
        let mut exact = Capture::new(3);
        exact.push(b"abc");
        assert!(!exact.truncated);
    }
}
