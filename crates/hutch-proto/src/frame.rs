//! Binary framing for the bodies of `/v1/exec`.
//!
//! A frame is `kind: u8`, `len: u32` (big endian), then `len` bytes of payload. Payloads are
//! raw bytes for output and input data, and JSON for control frames. A payload is at most
//! [`MAX_FRAME_PAYLOAD`] bytes; a longer length is a protocol error, so a corrupt stream cannot
//! make either side allocate without bound.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Largest payload of one frame (1 MiB). Larger data is split across frames.
pub const MAX_FRAME_PAYLOAD: usize = 1 << 20;
const HEADER_LEN: usize = 5;

/// What a frame carries. Values are part of the wire format: never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    // host -> agent
    /// JSON [`crate::ExecRequest`]; must be the first frame of an exec request body.
    ExecRequest = 1,
    /// Raw bytes for the process's stdin (or the PTY's input).
    Stdin = 2,
    /// Close the process's stdin (EOF). Empty payload.
    StdinEof = 3,
    /// JSON [`crate::SignalFrame`]: deliver a signal to the process group.
    Signal = 4,
    /// JSON [`crate::PtySize`]: resize the PTY.
    Resize = 5,
    // agent -> host
    /// JSON [`crate::ExecStarted`]: the process is running.
    Started = 16,
    /// Raw bytes the process wrote to stdout (or the PTY's output).
    Stdout = 17,
    /// Raw bytes the process wrote to stderr.
    Stderr = 18,
    /// JSON [`crate::ExecExit`]: the process ended; always the last frame.
    Exit = 19,
    /// JSON [`crate::AgentError`]: the process could not be started or the exec failed.
    Error = 20,
    /// JSON [`crate::MissedOutput`]: bytes of a process handle's output its ring dropped
    /// before what follows (the streams of a process handle: its start and its attaches).
    Missed = 21,
}

impl FrameKind {
    /// The kind for a wire byte, if it is one we know.
    pub fn from_u8(b: u8) -> Option<Self> {
        use FrameKind::*;
        Some(match b {
            1 => ExecRequest,
            2 => Stdin,
            3 => StdinEof,
            4 => Signal,
            5 => Resize,
            16 => Started,
            17 => Stdout,
            18 => Stderr,
            19 => Exit,
            20 => Error,
            21 => Missed,
            _ => return None,
        })
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What the payload is.
    pub kind: FrameKind,
    /// The payload bytes.
    pub payload: Bytes,
}

impl Frame {
    /// Parse the payload of a JSON control frame.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, FrameError> {
        serde_json::from_slice(&self.payload).map_err(|e| FrameError::Json(e.to_string()))
    }
}

/// Errors of the frame codec.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// The stream named a frame kind this version does not know.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// The stream announced a payload over the limit.
    #[error("frame payload of {0} bytes exceeds the limit of {MAX_FRAME_PAYLOAD}")]
    TooLarge(usize),
    /// A JSON control frame did not parse.
    #[error("bad JSON in control frame: {0}")]
    Json(String),
    /// The stream ended in the middle of a frame.
    #[error("stream ended inside a frame")]
    Truncated,
}

/// Encode one frame. Payloads over [`MAX_FRAME_PAYLOAD`] must be split by the caller
/// (see [`encode_data_frames`]).
pub fn encode_frame(kind: FrameKind, payload: &[u8]) -> Bytes {
    debug_assert!(payload.len() <= MAX_FRAME_PAYLOAD);
    let mut b = BytesMut::with_capacity(HEADER_LEN + payload.len());
    b.put_u8(kind as u8);
    b.put_u32(payload.len() as u32);
    b.put_slice(payload);
    b.freeze()
}

/// Encode a JSON control frame.
pub fn encode_json_frame<T: serde::Serialize>(kind: FrameKind, value: &T) -> Bytes {
    let payload = serde_json::to_vec(value).expect("protocol types always serialize");
    encode_frame(kind, &payload)
}

/// Encode data of any length as one or more frames of `kind`.
pub fn encode_data_frames(kind: FrameKind, data: &[u8]) -> Vec<Bytes> {
    data.chunks(MAX_FRAME_PAYLOAD)
        .map(|c| encode_frame(kind, c))
        .collect()
}

/// Incremental decoder: feed it body chunks as they arrive, take complete frames out.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: BytesMut,
}

impl FrameDecoder {
    /// A decoder with nothing buffered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append bytes received from the stream.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let kind_byte = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_FRAME_PAYLOAD {
            return Err(FrameError::TooLarge(len));
        }
        let kind = FrameKind::from_u8(kind_byte).ok_or(FrameError::UnknownKind(kind_byte))?;
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        self.buf.advance(HEADER_LEN);
        let payload = self.buf.split_to(len).freeze();
        Ok(Some(Frame { kind, payload }))
    }

    /// Call when the stream has ended: errors if a partial frame is left over.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Truncated)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_frames_split_at_every_byte() {
        let mut wire = Vec::new();
        wire.extend_from_slice(&encode_frame(FrameKind::Stdout, b"hello"));
        wire.extend_from_slice(&encode_frame(FrameKind::StdinEof, b""));
        wire.extend_from_slice(&encode_json_frame(
            FrameKind::Exit,
            &serde_json::json!({"exit_code": 3}),
        ));
        for split in 0..wire.len() {
            let mut d = FrameDecoder::new();
            let mut out = Vec::new();
            for part in [&wire[..split], &wire[split..]] {
                d.push(part);
                while let Some(f) = d.next_frame().expect("valid stream") {
                    out.push(f);
                }
            }
            d.finish().expect("no partial frame");
            assert_eq!(out.len(), 3, "split at {split}");
            assert_eq!(out[0].payload.as_ref(), b"hello");
            assert_eq!(out[1].kind, FrameKind::StdinEof);
            let v: serde_json::Value = out[2].json().expect("json");
            assert_eq!(v["exit_code"], 3);
        }
    }

    #[test]
    fn rejects_oversized_and_unknown_frames() {
        let mut d = FrameDecoder::new();
        d.push(&[17, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(d.next_frame(), Err(FrameError::TooLarge(0xffff_ffff)));
        let mut d = FrameDecoder::new();
        d.push(&[99, 0, 0, 0, 0]);
        assert_eq!(d.next_frame(), Err(FrameError::UnknownKind(99)));
        let mut d = FrameDecoder::new();
        d.push(&[17, 0, 0, 0, 4, b'a']);
        assert_eq!(d.next_frame(), Ok(None));
        assert_eq!(d.finish(), Err(FrameError::Truncated));
    }

    #[test]
    fn splits_large_data() {
        let data = vec![7u8; MAX_FRAME_PAYLOAD * 2 + 10];
        let frames = encode_data_frames(FrameKind::Stdin, &data);
        assert_eq!(frames.len(), 3);
    }
}
