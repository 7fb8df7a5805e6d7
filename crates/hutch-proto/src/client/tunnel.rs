//! TCP tunnels of the client: `POST /v1/tcp?port=N` as an `AsyncRead + AsyncWrite` stream.
//!
//! What is written goes out as the request body; the response body is what is read. Both
//! directions keep HTTP/2 flow control: writes wait while a few chunks are queued towards a
//! peer that does not read, and the response body's window is handed back only as the
//! caller reads. `shutdown` ends the request body (the service inside reads end of file);
//! dropping the tunnel resets the stream, which closes the socket inside the sandbox.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http::Method;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::StreamBody;
use hyper::body::{Body, Frame, Incoming};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::PollSender;

use super::{AgentClient, BoxError, ClientResult};
use crate::query;

/// Chunks queued towards the agent before writes wait.
const WRITE_QUEUE: usize = 8;
/// Largest chunk one write sends (HTTP/2 splits it further into frames).
const MAX_WRITE: usize = 64 << 10;

/// A byte stream to a TCP port inside the sandbox. See the module docs.
#[derive(Debug)]
pub struct TcpTunnel {
    writer: PollSender<Bytes>,
    body: Incoming,
    pending: Bytes,
    read_done: bool,
    // Dropped with the tunnel: makes the request body fail, so hyper resets the stream.
    _cancel: oneshot::Sender<()>,
}

pub(super) async fn open(client: &AgentClient, port: u16) -> ClientResult<TcpTunnel> {
    let (tx, rx) = mpsc::channel::<Bytes>(WRITE_QUEUE);
    let (cancel_tx, cancel_rx) = oneshot::channel::<()>();
    let port = port.to_string();
    let uri = format!("/v1/tcp?{}", query::build(&[("port", &port)]));
    let response = client
        .call(Method::POST, &uri, request_body(rx, cancel_rx))
        .await?;
    Ok(TcpTunnel {
        writer: PollSender::new(tx),
        body: response.into_body(),
        pending: Bytes::new(),
        read_done: false,
        _cancel: cancel_tx,
    })
}

/// The request body: written chunks; a clean end once the writer is closed; an error
/// (→ stream reset) once the tunnel is dropped.
fn request_body(
    rx: mpsc::Receiver<Bytes>,
    cancel: oneshot::Receiver<()>,
) -> UnsyncBoxBody<Bytes, BoxError> {
    let chunks = futures_util::stream::unfold(Some((rx, cancel)), |state| async move {
        let (mut rx, mut cancel) = state?;
        tokio::select! {
            biased;
            _ = &mut cancel => Some((Err(BoxError::from("tunnel dropped")), None)),
            next = rx.recv() => next.map(|chunk| (Ok(Frame::data(chunk)), Some((rx, cancel)))),
        }
    });
    UnsyncBoxBody::new(StreamBody::new(chunks))
}

fn closed() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the tunnel is closed for writing",
    )
}

impl AsyncWrite for TcpTunnel {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        ready!(self.writer.poll_reserve(cx)).map_err(|_| closed())?;
        let n = buf.len().min(MAX_WRITE);
        self.writer
            .send_item(Bytes::copy_from_slice(&buf[..n]))
            .map_err(|_| closed())?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Queued chunks are sent by the connection task on its own.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.writer.close();
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for TcpTunnel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                buf.put_slice(&self.pending[..n]);
                self.pending.advance(n);
                return Poll::Ready(Ok(()));
            }
            if self.read_done {
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.pending = data;
                    }
                }
                Some(Err(e)) => {
                    self.read_done = true;
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        format!("tunnel: {}", super::describe(&e)),
                    )));
                }
                None => self.read_done = true,
            }
        }
    }
}
