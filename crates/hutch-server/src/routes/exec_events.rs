//! The events of a streamed process, as `/exec/stream` and `…/processes/{sel}/output` send
//! them: `start {"pid"}`, `stdout`/`stderr` (`{"data"}`, or `{"data_b64"}` for a chunk that
//! is not UTF-8), `missed {"stdout", "stderr"}` (bytes a process handle's ring dropped before
//! what follows), then `exit {"exit_code", "signal", "timed_out", "duration_ms"}` or
//! `error {"code", "message"}`, which end the stream.
//!
//! Each is written as a server-sent event (`event: NAME`, `data: JSON`) or as one line of
//! NDJSON: the same JSON with `"event": NAME` in it.

use std::convert::Infallible;

use axum::body::Body;
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use hutch_core::process::{ExecExit, MissedOutput};
use serde_json::{json, Map, Value};

use crate::error::ApiError;

/// Content type of NDJSON answers.
pub const NDJSON: &str = "application/x-ndjson";

/// One event: its name and its JSON object.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamEvent {
    name: &'static str,
    data: Map<String, Value>,
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

impl StreamEvent {
    /// `start`: the process runs with this pid.
    pub fn start(pid: u32) -> Self {
        Self {
            name: "start",
            data: object(json!({ "pid": pid })),
        }
    }

    /// `stdout` or `stderr` bytes.
    pub fn output(name: &'static str, data: &[u8]) -> Self {
        let data = match std::str::from_utf8(data) {
            Ok(s) => json!({ "data": s }),
            Err(_) => json!({
                "data_b64": base64::engine::general_purpose::STANDARD.encode(data)
            }),
        };
        Self {
            name,
            data: object(data),
        }
    }

    /// `missed`: the ring dropped this much before what follows.
    pub fn missed(missed: MissedOutput) -> Self {
        Self {
            name: "missed",
            data: object(json!({ "stdout": missed.stdout, "stderr": missed.stderr })),
        }
    }

    /// `exit`: how the process ended (the last event).
    pub fn exit(exit: &ExecExit) -> Self {
        Self {
            name: "exit",
            data: object(json!({
                "exit_code": exit.exit_code,
                "signal": exit.signal,
                "timed_out": exit.timed_out,
                "duration_ms": exit.duration_ms,
            })),
        }
    }

    /// `error`: the stream ends without an exit.
    pub fn error(code: &str, message: &str) -> Self {
        Self {
            name: "error",
            data: object(json!({ "code": code, "message": message })),
        }
    }

    /// `error` for a failure while streaming.
    pub fn failure(error: ApiError) -> Self {
        Self::error(error.code, &error.message)
    }

    /// Whether this event ends the stream.
    pub fn is_last(&self) -> bool {
        matches!(self.name, "exit" | "error")
    }

    /// As a server-sent event.
    pub fn sse(&self) -> Event {
        Event::default()
            .event(self.name)
            .data(Value::Object(self.data.clone()).to_string())
    }

    /// As one NDJSON line: `{"event": NAME, …the event's fields}\n`, the name first.
    pub fn ndjson(&self) -> Bytes {
        let fields = Value::Object(self.data.clone()).to_string();
        let rest = &fields[1..];
        let comma = if rest == "}" { "" } else { "," };
        Bytes::from(format!("{{\"event\":\"{}\"{comma}{rest}\n", self.name))
    }
}

/// How a stream of events is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFormat {
    /// `text/event-stream`.
    Sse,
    /// `application/x-ndjson`.
    Ndjson,
}

impl StreamFormat {
    /// SSE when `Accept` names `text/event-stream`, else NDJSON.
    pub fn of(headers: &HeaderMap) -> Self {
        let accept = headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if accept.contains("text/event-stream") {
            Self::Sse
        } else {
            Self::Ndjson
        }
    }
}

/// The answer streaming `events` in `format` (SSE with keep-alives).
pub fn respond<S>(format: StreamFormat, events: S) -> Response
where
    S: Stream<Item = StreamEvent> + Send + 'static,
{
    match format {
        StreamFormat::Sse => Sse::new(events.map(|e| Ok::<_, Infallible>(e.sse())))
            .keep_alive(KeepAlive::default())
            .into_response(),
        StreamFormat::Ndjson => (
            [(header::CONTENT_TYPE, NDJSON)],
            Body::from_stream(events.map(|e| Ok::<_, Infallible>(e.ndjson()))),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_the_same_as_sse_and_ndjson() {
        let exit = ExecExit {
            exit_code: 143,
            signal: Some(15),
            timed_out: false,
            duration_ms: 9,
            oom_kills: None,
        };
        assert_eq!(
            StreamEvent::exit(&exit).ndjson(),
            "{\"event\":\"exit\",\"duration_ms\":9,\"exit_code\":143,\"signal\":15,\"timed_out\":false}\n"
        );
        assert_eq!(
            StreamEvent::output("stdout", b"hi\n").ndjson(),
            "{\"event\":\"stdout\",\"data\":\"hi\\n\"}\n"
        );
        assert_eq!(
            StreamEvent::output("stderr", &[0xff]).ndjson(),
            "{\"event\":\"stderr\",\"data_b64\":\"/w==\"}\n"
        );
        let missed = MissedOutput {
            stdout: 5,
            stderr: 0,
        };
        assert_eq!(
            StreamEvent::missed(missed).ndjson(),
            "{\"event\":\"missed\",\"stderr\":0,\"stdout\":5}\n"
        );
        assert!(StreamEvent::exit(&exit).is_last() && !StreamEvent::start(3).is_last());
    }

    #[test]
    fn accept_picks_the_format() {
        let mut headers = HeaderMap::new();
        assert_eq!(StreamFormat::of(&headers), StreamFormat::Ndjson);
        headers.insert(header::ACCEPT, "text/event-stream".parse().expect("value"));
        assert_eq!(StreamFormat::of(&headers), StreamFormat::Sse);
    }
}
