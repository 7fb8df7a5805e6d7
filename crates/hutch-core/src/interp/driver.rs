//! The host's side of the kernel driver: starting it inside a sandbox, and one request to it
//! over the agent's TCP tunnel.
//!
//! **Wire format** (version 1; `docs/code-interpreter.md`): one connection per request. The
//! host writes one JSON line, `{"op": "create_context" | "list" | "restart" | "delete" |
//! "interrupt" | "execute", ...}`, and keeps its side open (the driver takes the end of the
//! stream as the host leaving, and interrupts a running cell). The driver answers JSON lines:
//! `{"type": "ok", ...}` or `{"type": "failed", "code", "message"}` for every op but
//! `execute`, whose answer is its events (`stdout`, `stderr`, `result`, `display`, `error`,
//! then `end`; [`super::CodeEvent`]), or one `failed` line. Lines are UTF-8 JSON, at most
//! [`max_line_bytes`] long: the driver runs inside the sandbox, so whatever answers on its
//! port is untrusted and read within these bounds.

use std::time::Duration;

use hutch_proto::client::{AgentClient, ClientError, ExecEvent, StdinSource, TcpTunnel};
use hutch_proto::{Command, ExecRequest};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use super::{CodeEvent, InterpError, DRIVER_PORT};

/// What the driver prints once it listens.
const READY_LINE: &str = "hutch-interp ready";
/// How long the driver may take to listen (well under a second on `ns`, seconds in a `vm`
/// guest under TCG).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Output of a driver that failed to start, kept for the message.
const START_OUTPUT_CAP: usize = 16 << 10;
/// Exit status of `python3` when the agent cannot find it.
const NOT_FOUND_STATUS: i32 = 127;

/// Longest line the host reads from the driver: a rich result of the whole output cap in
/// base64, with room for its JSON.
pub fn max_line_bytes(output_cap: usize) -> usize {
    output_cap.saturating_mul(2).saturating_add(1 << 20)
}

/// Why the driver did not start.
#[derive(Debug)]
pub enum StartFailure {
    /// The sandbox has no `python3` (or the driver refused to run in it).
    NoPython(String),
    /// It started and failed, or never said it was ready.
    Failed(String),
    /// The agent could not be asked.
    Client(ClientError),
}

/// Start the driver in the background (it outlives this call), and wait until it listens.
pub async fn start(client: &AgentClient) -> Result<(), StartFailure> {
    let mut argv = vec!["python3".to_owned(), "-u".to_owned(), "-".to_owned()];
    argv.extend(hutch_template::interp::driver_args());
    let request = ExecRequest {
        cmd: Command::Argv(argv),
        env: Default::default(),
        cwd: Some("/".into()),
        user: None,
        timeout_ms: None,
        pty: None,
        stdin: true,
        background: true,
        handle: None,
    };
    let session = client.exec(request).await.map_err(StartFailure::Client)?;
    let program = bytes::Bytes::from_static(super::driver_program().as_bytes());
    let mut events = session.pipe_stdin(StdinSource::from(Some(program)));
    let mut output = Vec::new();
    let wait = async {
        while let Some(event) = events.next().await {
            match event.map_err(StartFailure::Client)? {
                ExecEvent::Stdout(b) | ExecEvent::Stderr(b) => {
                    let room = START_OUTPUT_CAP.saturating_sub(output.len());
                    output.extend_from_slice(&b[..b.len().min(room)]);
                    if String::from_utf8_lossy(&output).contains(READY_LINE) {
                        return Ok(());
                    }
                }
                ExecEvent::Exit(exit) => {
                    let said = String::from_utf8_lossy(&output).trim().to_string();
                    return Err(if exit.exit_code == NOT_FOUND_STATUS {
                        StartFailure::NoPython(if said.is_empty() {
                            "python3 is not installed".into()
                        } else {
                            said
                        })
                    } else {
                        StartFailure::Failed(format!(
                            "the kernel driver exited with status {}: {said}",
                            exit.exit_code
                        ))
                    });
                }
                ExecEvent::Error(e) => return Err(StartFailure::Client(ClientError::Agent(e))),
                ExecEvent::Started { .. } | ExecEvent::Missed(_) => {}
            }
        }
        Err(StartFailure::Failed(
            "the agent ended the driver's exec without an exit".into(),
        ))
    };
    match tokio::time::timeout(START_TIMEOUT, wait).await {
        Ok(result) => result,
        Err(_) => Err(StartFailure::Failed(format!(
            "the kernel driver did not listen within {} s",
            START_TIMEOUT.as_secs()
        ))),
    }
    // Dropping `events` leaves the background process running.
}

/// Connect to the driver; `Ok(None)` when nothing listens on its port.
pub async fn connect(client: &AgentClient) -> Result<Option<TcpTunnel>, ClientError> {
    match client.connect_tcp(DRIVER_PORT).await {
        Ok(tunnel) => Ok(Some(tunnel)),
        Err(ClientError::Agent(e)) if e.code == hutch_proto::AgentErrorCode::ConnectionRefused => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// A refusal of the driver: `{"type": "failed", "code", "message"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `not_found`, `invalid`, `unavailable` or `internal`.
    pub code: String,
    /// Its words.
    pub message: String,
}

/// A byte stream to the driver: the agent's tunnel, or a pipe in tests.
pub trait DriverStream: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> DriverStream for T {}

/// The driver's answer lines on one connection.
pub struct DriverLines {
    reader: BufReader<Box<dyn DriverStream>>,
    max_line: usize,
}

impl DriverLines {
    /// Send `request` (one line) and read what comes back.
    pub async fn send(
        stream: impl DriverStream + 'static,
        request: &Value,
        max_line: usize,
    ) -> Result<Self, InterpError> {
        let mut reader = BufReader::new(Box::new(stream) as Box<dyn DriverStream>);
        let mut line = serde_json::to_vec(request).expect("a JSON value always serializes");
        line.push(b'\n');
        reader
            .get_mut()
            .write_all(&line)
            .await
            .map_err(|e| InterpError::Driver(format!("sending the request: {e}")))?;
        Ok(Self { reader, max_line })
    }

    /// The next line as JSON; `Ok(None)` at the end of the stream.
    pub async fn next_value(&mut self) -> Result<Option<Value>, InterpError> {
        let mut line = Vec::new();
        let limit = self.max_line as u64 + 1;
        let n = (&mut self.reader)
            .take(limit)
            .read_until(b'\n', &mut line)
            .await
            .map_err(|e| InterpError::Driver(format!("reading its answer: {e}")))?;
        if n == 0 {
            return Ok(None);
        }
        if line.last() != Some(&b'\n') {
            return Err(InterpError::Driver(if line.len() > self.max_line {
                format!("it sent a line longer than {} bytes", self.max_line)
            } else {
                "it hung up in the middle of a line".into()
            }));
        }
        serde_json::from_slice(&line)
            .map(Some)
            .map_err(|e| InterpError::Driver(format!("it sent a line that is not JSON: {e}")))
    }

    /// The one answer of a non-`execute` op.
    pub async fn answer(mut self) -> Result<Result<Value, Refusal>, InterpError> {
        let value = self
            .next_value()
            .await?
            .ok_or_else(|| InterpError::Driver("it hung up without answering".into()))?;
        match value.get("type").and_then(Value::as_str) {
            Some("ok") => Ok(Ok(value)),
            Some("failed") => Ok(Err(refusal(&value))),
            _ => Err(InterpError::Driver(format!(
                "it answered {} instead of ok or failed",
                excerpt(&value)
            ))),
        }
    }
}

/// A `failed` line's refusal.
pub fn refusal(value: &Value) -> Refusal {
    let text = |k: &str| {
        value
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    Refusal {
        code: text("code"),
        message: text("message"),
    }
}

/// One line of an `execute` answer as an event; a `failed` line is the refusal's error.
pub fn event_from(value: Value) -> Result<CodeEvent, InterpError> {
    if value.get("type").and_then(Value::as_str) == Some("failed") {
        let r = refusal(&value);
        return Err(match r.code.as_str() {
            "invalid" => InterpError::Invalid(r.message),
            _ => InterpError::Driver(r.message),
        });
    }
    let shown = excerpt(&value);
    serde_json::from_value(value).map_err(|e| {
        InterpError::Driver(format!(
            "it sent an event this server does not know ({e}): {shown}"
        ))
    })
}

fn excerpt(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(200) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    /// Lines the "driver" end of a pipe sends, read by the host end.
    async fn lines_from(sent: &[u8], max_line: usize) -> DriverLines {
        let (host, mut driver) = tokio::io::duplex(1 << 20);
        driver.write_all(sent).await.expect("write");
        driver.shutdown().await.expect("end of answer");
        // The driver's end stays open (reading the request) while the host writes.
        tokio::spawn(async move {
            let mut request = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut driver, &mut request).await;
        });
        DriverLines::send(host, &serde_json::json!({"op": "list"}), max_line)
            .await
            .expect("send")
    }

    #[tokio::test]
    async fn lines_longer_than_the_limit_are_refused() {
        let mut lines = lines_from(&[b'x'; 100], 64).await;
        let e = lines.next_value().await.expect_err("too long");
        assert_eq!(
            e.to_string(),
            "the code interpreter inside the sandbox failed: it sent a line longer than 64 bytes"
        );
    }

    #[tokio::test]
    async fn a_cut_line_and_a_line_that_is_not_json_are_errors() {
        let mut lines = lines_from(b"{\"type\": \"ok\"", 64).await;
        let e = lines.next_value().await.expect_err("cut");
        assert!(
            e.to_string()
                .ends_with("it hung up in the middle of a line"),
            "{e}"
        );
        let mut lines = lines_from(b"hello\n", 64).await;
        let e = lines.next_value().await.expect_err("not JSON");
        assert!(
            e.to_string().contains("it sent a line that is not JSON"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn answers_are_ok_or_refusals() {
        let lines = lines_from(b"{\"type\": \"ok\", \"contexts\": []}\n", 1 << 10).await;
        let ok = lines.answer().await.expect("read").expect("ok");
        assert_eq!(ok["contexts"], serde_json::json!([]));
        let lines = lines_from(
            b"{\"type\": \"failed\", \"code\": \"not_found\", \"message\": \"context x does not exist\"}\n",
            1 << 10,
        )
        .await;
        let refused = lines.answer().await.expect("read").expect_err("refused");
        assert_eq!(refused.code, "not_found");
        let lines = lines_from(b"{\"type\": \"stdout\", \"text\": \"hi\"}\n", 1 << 10).await;
        let e = lines.answer().await.expect_err("not an answer");
        assert!(e.to_string().contains("instead of ok or failed"), "{e}");
        let lines = lines_from(b"", 1 << 10).await;
        assert!(lines.answer().await.is_err(), "silence is an error");
    }

    #[test]
    fn events_parse_by_type_and_unknown_ones_are_errors() {
        let event = |v: Value| event_from(v);
        assert_eq!(
            event(serde_json::json!({"type": "stdout", "text": "a"})).expect("stdout"),
            CodeEvent::Stdout { text: "a".into() }
        );
        let result = event(serde_json::json!({"type": "result", "data": {"text/plain": "2"}, "is_main_result": true}))
            .expect("result");
        let CodeEvent::Result(r) = result else {
            panic!("{result:?}")
        };
        assert!(r.is_main_result);
        assert_eq!(r.data["text/plain"], "2");
        let error = event(serde_json::json!({"type": "error", "name": "TimeoutError", "value": "v", "traceback": [], "timed_out": true}))
            .expect("error");
        assert!(
            matches!(error, CodeEvent::Error(ref e) if e.timed_out),
            "{error:?}"
        );
        let e = event(serde_json::json!({"type": "failed", "code": "invalid", "message": "bad"}))
            .expect_err("failed");
        assert!(
            matches!(e, InterpError::Invalid(ref m) if m == "bad"),
            "{e:?}"
        );
        let e = event(serde_json::json!({"type": "mystery", "x": "y".repeat(500)}))
            .expect_err("unknown");
        let text = e.to_string();
        assert!(
            text.contains("an event this server does not know"),
            "{text}"
        );
        assert!(text.len() < 500, "quoted in part: {text}");
    }
}
