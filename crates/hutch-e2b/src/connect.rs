//! The Connect protocol (connectrpc.com/docs/protocol), JSON codec, as envd speaks it to
//! the e2b SDKs: unary calls are `application/json` bodies; streaming calls (server and
//! client streams) are `application/connect+json` envelopes, each a flags byte, a
//! big-endian u32 length and a JSON message, the last one flagged end-of-stream and
//! carrying the error, if any.
//!
//! No Connect crate fits: the Rust ones are code generators over prost for the binary codec
//! and a tower stack of their own; envd's contract is a dozen messages in proto3's JSON
//! mapping, which serde states directly (`envd/proto.rs`).

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::E2bError;

/// The content type of unary JSON calls.
pub const UNARY_JSON: &str = "application/json";
/// The content type of streaming JSON calls.
pub const STREAM_JSON: &str = "application/connect+json";
/// Envelope flag: the end-of-stream message.
const END_STREAM: u8 = 0x02;
/// Envelope flag: a compressed message (compression is never negotiated here).
const COMPRESSED: u8 = 0x01;
/// The largest message accepted in a request.
pub const MAX_MESSAGE: usize = 16 << 20;

/// A Connect error code (the protocol's names; each has its HTTP status for unary calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// `canceled`.
    Canceled,
    /// `unknown`.
    Unknown,
    /// `invalid_argument`.
    InvalidArgument,
    /// `deadline_exceeded`.
    DeadlineExceeded,
    /// `not_found`.
    NotFound,
    /// `already_exists`.
    AlreadyExists,
    /// `permission_denied`.
    PermissionDenied,
    /// `resource_exhausted`.
    ResourceExhausted,
    /// `failed_precondition`.
    FailedPrecondition,
    /// `unimplemented`.
    Unimplemented,
    /// `internal`.
    Internal,
    /// `unavailable`.
    Unavailable,
    /// `unauthenticated`.
    Unauthenticated,
}

impl Code {
    /// The protocol's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Canceled => "canceled",
            Self::Unknown => "unknown",
            Self::InvalidArgument => "invalid_argument",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::NotFound => "not_found",
            Self::AlreadyExists => "already_exists",
            Self::PermissionDenied => "permission_denied",
            Self::ResourceExhausted => "resource_exhausted",
            Self::FailedPrecondition => "failed_precondition",
            Self::Unimplemented => "unimplemented",
            Self::Internal => "internal",
            Self::Unavailable => "unavailable",
            Self::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code.
    pub fn http_status(self) -> StatusCode {
        match self {
            Self::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Self::Unknown | Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::InvalidArgument | Self::FailedPrecondition => StatusCode::BAD_REQUEST,
            Self::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::AlreadyExists => StatusCode::CONFLICT,
            Self::PermissionDenied => StatusCode::FORBIDDEN,
            Self::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Self::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// A Connect error: a code and a message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", code.name())]
pub struct ConnectError {
    /// The code.
    pub code: Code,
    /// The message.
    pub message: String,
}

impl ConnectError {
    /// An error with `code`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    fn body(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.name(), "message": self.message})
    }
}

impl From<E2bError> for ConnectError {
    fn from(e: E2bError) -> Self {
        let code = match (e.hutch_code(), e.http_status().as_u16()) {
            (Some("not_a_directory"), _) | (Some("is_a_directory"), _) => Code::InvalidArgument,
            (_, 400) | (_, 422) | (_, 413) => Code::InvalidArgument,
            (_, 401) => Code::Unauthenticated,
            (_, 403) => Code::PermissionDenied,
            (_, 404) => Code::NotFound,
            (_, 409) => Code::AlreadyExists,
            (_, 429) | (_, 507) => Code::ResourceExhausted,
            (_, 501) => Code::Unimplemented,
            (_, 502) | (_, 503) => Code::Unavailable,
            (_, 504) => Code::DeadlineExceeded,
            _ => Code::Internal,
        };
        Self::new(code, e.message())
    }
}

impl From<hutch_core::CoreError> for ConnectError {
    fn from(e: hutch_core::CoreError) -> Self {
        E2bError::from(e).into()
    }
}

impl IntoResponse for ConnectError {
    /// The unary form: the code's HTTP status and a JSON body.
    fn into_response(self) -> Response {
        (self.code.http_status(), axum::Json(self.body())).into_response()
    }
}

/// Whether a request is a streaming call (its content type says so).
pub fn is_streaming(headers: &HeaderMap) -> bool {
    content_type(headers).starts_with("application/connect+")
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Decode a unary request's JSON body (an empty body is the empty message).
pub fn decode_unary<T: DeserializeOwned>(body: &[u8]) -> Result<T, ConnectError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body)
        .map_err(|e| ConnectError::new(Code::InvalidArgument, format!("invalid message: {e}")))
}

/// A unary success.
pub fn unary_ok<T: Serialize>(message: &T) -> Response {
    let body = serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec());
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, UNARY_JSON)
        .body(Body::from(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Split a streaming request body into its messages. Errors are the protocol's
/// (`invalid_argument` for a torn envelope, `unimplemented` for compression).
#[derive(Debug, Default)]
pub struct EnvelopeReader {
    buf: BytesMut,
    ended: bool,
}

impl EnvelopeReader {
    /// Add bytes as they arrive.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole message, if one has arrived (`None` after the end-of-stream flag).
    pub fn next_message(&mut self) -> Result<Option<Bytes>, ConnectError> {
        if self.ended || self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("message of {len} bytes is over the limit of {MAX_MESSAGE}"),
            ));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        if flags & COMPRESSED != 0 {
            return Err(ConnectError::new(
                Code::Unimplemented,
                "compressed messages are not accepted (no compression is negotiated)",
            ));
        }
        self.buf.advance(5);
        let data = self.buf.split_to(len).freeze();
        if flags & END_STREAM != 0 {
            self.ended = true;
            return Ok(None);
        }
        Ok(Some(data))
    }

    /// Whether bytes of a message that has not fully arrived are buffered.
    pub fn has_partial(&self) -> bool {
        !self.ended && !self.buf.is_empty()
    }
}

/// Read a whole streaming request body's first message (server-streaming calls send one).
pub async fn first_message<T: DeserializeOwned>(body: Body) -> Result<T, ConnectError> {
    let mut reader = EnvelopeReader::default();
    let mut stream = body.into_data_stream();
    loop {
        if let Some(m) = reader.next_message()? {
            return decode_unary(&m);
        }
        match stream.next().await {
            Some(Ok(chunk)) => reader.push(&chunk),
            Some(Err(e)) => {
                return Err(ConnectError::new(
                    Code::Canceled,
                    format!("reading the request: {e}"),
                ))
            }
            None => {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    "the request stream ended before its message",
                ))
            }
        }
    }
}

/// One envelope.
pub fn envelope(flags: u8, data: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + data.len());
    b.put_u8(flags);
    b.put_u32(data.len() as u32);
    b.put_slice(data);
    b.freeze()
}

/// The end-of-stream envelope, with the error if the call failed.
pub fn end_stream(error: Option<&ConnectError>) -> Bytes {
    let body = match error {
        Some(e) => serde_json::json!({"error": e.body()}),
        None => serde_json::json!({}),
    };
    envelope(END_STREAM, body.to_string().as_bytes())
}

/// A streaming answer: each message of `messages` as an envelope, then the end of the
/// stream (with the error that ended it, if one did).
pub fn stream_response<S, T>(messages: S) -> Response
where
    S: Stream<Item = Result<T, ConnectError>> + Send + 'static,
    T: Serialize + Send + 'static,
{
    let body = async_stream_body(messages);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, HeaderValue::from_static(STREAM_JSON))
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A streaming call refused before it began: HTTP 200 with only the end of the stream.
pub fn stream_error(e: ConnectError) -> Response {
    stream_response(futures_util::stream::iter([Err::<(), _>(e)]))
}

fn async_stream_body<S, T>(messages: S) -> impl Stream<Item = Result<Bytes, Infallible>> + Send
where
    S: Stream<Item = Result<T, ConnectError>> + Send + 'static,
    T: Serialize + Send + 'static,
{
    // `Some(state)`: still streaming; after an error or the end, one last envelope.
    futures_util::stream::unfold(Some(Box::pin(messages)), |state| async move {
        let mut messages = state?;
        match messages.next().await {
            Some(Ok(m)) => {
                let data = serde_json::to_vec(&m).unwrap_or_else(|_| b"{}".to_vec());
                Some((Ok(envelope(0, &data)), Some(messages)))
            }
            Some(Err(e)) => Some((Ok(end_stream(Some(&e))), None)),
            None => Some((Ok(end_stream(None)), None)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_split_across_chunks_come_out_whole() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&envelope(0, br#"{"a":1}"#));
        wire.extend_from_slice(&envelope(0, br#"{"b":2}"#));
        wire.extend_from_slice(&envelope(END_STREAM, b"{}"));
        let mut r = EnvelopeReader::default();
        let mut got = Vec::new();
        for chunk in wire.chunks(3) {
            r.push(chunk);
            while let Some(m) = r.next_message().expect("well-formed") {
                got.push(m);
            }
        }
        assert_eq!(
            got,
            vec![
                Bytes::from_static(br#"{"a":1}"#),
                Bytes::from_static(br#"{"b":2}"#)
            ]
        );
        assert!(!r.has_partial());
    }

    #[test]
    fn compressed_and_oversized_messages_are_refused() {
        let mut r = EnvelopeReader::default();
        r.push(&envelope(COMPRESSED, b"xx"));
        assert_eq!(
            r.next_message().expect_err("compressed").code,
            Code::Unimplemented
        );
        let mut r = EnvelopeReader::default();
        r.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            r.next_message().expect_err("huge").code,
            Code::ResourceExhausted
        );
    }

    #[test]
    fn the_end_of_a_stream_carries_its_error() {
        let e = ConnectError::new(Code::NotFound, "no such process");
        let end = end_stream(Some(&e));
        assert_eq!(end[0], END_STREAM);
        let v: serde_json::Value = serde_json::from_slice(&end[5..]).expect("json");
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(v["error"]["message"], "no such process");
    }
}
