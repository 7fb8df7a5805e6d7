//! File watches of the client: `GET /v1/files/watch` as a stream of [`WatchMessage`]s.
//!
//! [`AgentClient::watch`] returns once the agent's first line, [`WatchMessage::Ready`], has
//! arrived: every change made after that is reported. Dropping the [`FileWatchStream`]
//! resets the HTTP/2 stream, and the agent then closes the watch's inotify instance.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use futures_util::Stream;
use http::Method;
use hyper::body::{Body, Incoming};

use super::{classify, empty_body, AgentClient, ClientError, ClientResult};
use crate::query;
use crate::watch::{WatchMessage, WatchReady};

/// Longest line of a watch answer the client accepts (an event with its entry is well
/// under 10 KiB even with 4 KiB paths).
pub const MAX_WATCH_LINE: usize = 64 << 10;

/// What to watch below a directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchOptions {
    /// Watch every subdirectory too, including those made later.
    pub recursive: bool,
    /// Give each event the entry as `files/stat` gives it.
    pub include_entry: bool,
}

/// A running watch: [`WatchMessage::Event`]s, warnings and, last, an optional
/// [`WatchMessage::End`]. Ends (`None`) after `End`; a lost connection is an error.
#[derive(Debug)]
pub struct FileWatchStream {
    ready: WatchReady,
    body: Incoming,
    buffer: BytesMut,
    finished: bool,
}

impl FileWatchStream {
    /// What the agent confirmed when the watch was armed.
    pub fn ready(&self) -> &WatchReady {
        &self.ready
    }

    /// The next message; `None` after [`WatchMessage::End`].
    pub async fn next_message(&mut self) -> Option<ClientResult<WatchMessage>> {
        futures_util::StreamExt::next(self).await
    }

    /// A complete line from the buffer, parsed.
    fn take_line(&mut self) -> Option<ClientResult<WatchMessage>> {
        let end = self.buffer.iter().position(|b| *b == b'\n')?;
        let line = self.buffer.split_to(end);
        self.buffer.advance(1);
        Some(
            serde_json::from_slice(&line)
                .map_err(|e| ClientError::Protocol(format!("bad watch line from the agent: {e}"))),
        )
    }
}

impl Stream for FileWatchStream {
    type Item = ClientResult<WatchMessage>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if self.finished {
                return Poll::Ready(None);
            }
            if let Some(message) = self.take_line() {
                match &message {
                    Ok(WatchMessage::End(_)) | Err(_) => self.finished = true,
                    Ok(WatchMessage::Ready(_)) => {
                        self.finished = true;
                        return Poll::Ready(Some(Err(ClientError::Protocol(
                            "the agent sent a second ready line".into(),
                        ))));
                    }
                    Ok(_) => {}
                }
                return Poll::Ready(Some(message));
            }
            if self.buffer.len() > MAX_WATCH_LINE {
                self.finished = true;
                return Poll::Ready(Some(Err(ClientError::Protocol(format!(
                    "a watch line from the agent is longer than {MAX_WATCH_LINE} bytes"
                )))));
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    self.finished = true;
                    return Poll::Ready(Some(Err(ClientError::Protocol(
                        "the agent ended the watch without an end line".into(),
                    ))));
                }
                Poll::Ready(Some(Err(e))) => {
                    self.finished = true;
                    return Poll::Ready(Some(Err(classify(&e))));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

/// `GET /v1/files/watch`: returns once the watch is armed.
pub(super) async fn start(
    client: &AgentClient,
    path: &str,
    options: WatchOptions,
) -> ClientResult<FileWatchStream> {
    let flag = |on: bool| if on { "true" } else { "false" };
    let uri = format!(
        "/v1/files/watch?{}",
        query::build(&[
            ("path", path),
            ("recursive", flag(options.recursive)),
            ("include_entry", flag(options.include_entry)),
        ])
    );
    let response = client.call(Method::GET, &uri, empty_body()).await?;
    let mut stream = FileWatchStream {
        ready: WatchReady {
            path: String::new(),
            recursive: false,
            watched_dirs: 0,
        },
        body: response.into_body(),
        buffer: BytesMut::new(),
        finished: false,
    };
    // The first line is the ready line (parsed here, before the stream is handed out).
    loop {
        if let Some(first) = stream.take_line() {
            return match first? {
                WatchMessage::Ready(ready) => {
                    stream.ready = ready;
                    Ok(stream)
                }
                other => Err(ClientError::Protocol(format!(
                    "a watch answer must start with a ready line, got {other:?}"
                ))),
            };
        }
        if stream.buffer.len() > MAX_WATCH_LINE {
            return Err(ClientError::Protocol(
                "the agent's ready line is too long".into(),
            ));
        }
        let frame = std::future::poll_fn(|cx| Pin::new(&mut stream.body).poll_frame(cx)).await;
        match frame {
            None => {
                return Err(ClientError::Protocol(
                    "the agent ended the watch before it was ready".into(),
                ))
            }
            Some(Err(e)) => return Err(classify(&e)),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    stream.buffer.extend_from_slice(&data);
                }
            }
        }
    }
}
