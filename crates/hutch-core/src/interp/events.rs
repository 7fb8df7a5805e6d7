//! What running code yields: the events in order ([`CodeEvent`], streamed as SSE), and the
//! whole of them collected ([`Execution`], the JSON answer).

use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::driver::DriverLines;
use super::InterpError;
use crate::manager::{ActiveGuard, ExecSlot};

/// A context as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextInfo {
    /// Its id.
    pub id: String,
    /// Its language.
    pub language: String,
    /// Its kernel's working directory (`None`: the user's home).
    pub cwd: Option<String>,
}

/// A rich output: every MIME type of one bundle (`text/plain`, `text/html`, `image/png` as
/// base64, `application/json` as JSON, ...), as the kernel sent it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RichOutput {
    /// MIME type → content.
    pub data: Map<String, Value>,
    /// The kernel's metadata of the bundle (image sizes, ...).
    #[serde(default)]
    pub metadata: Map<String, Value>,
    /// The value of the cell's last expression (`execute_result`); false for displays.
    #[serde(default)]
    pub is_main_result: bool,
    /// A display's id, when it may be updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_id: Option<String>,
    /// This display replaces an earlier one of the same id (`update_display_data`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub update: bool,
}

impl RichOutput {
    fn size(&self) -> usize {
        self.data
            .values()
            .map(|v| match v {
                Value::String(s) => s.len(),
                other => other.to_string().len(),
            })
            .sum()
    }
}

/// An error the code raised, or the interpreter's account of why it stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeError {
    /// Its name: the exception's class (`ZeroDivisionError`), `TimeoutError` for a cell
    /// interrupted at its timeout, `KernelDied` for a kernel that exited, `ExitStatus` for a
    /// Bash cell whose last command failed.
    pub name: String,
    /// Its message.
    pub value: String,
    /// The traceback's lines (terminal colours removed).
    #[serde(default)]
    pub traceback: Vec<String>,
    /// The cell was interrupted at its timeout (its context keeps its state).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
}

/// The last event of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEnd {
    /// The kernel's execution counter after the cell (`None` when it never ran).
    pub execution_count: Option<u64>,
    /// Wall time of the run inside the sandbox.
    pub duration_ms: u64,
    /// The context it ran in.
    pub context_id: String,
    /// The context's kernel was started afresh for this run: its earlier state is gone (a
    /// wake or fork on `ns`, a kernel that died).
    pub context_restarted: bool,
    /// Output was cut at the server's output cap.
    #[serde(default)]
    pub truncated: bool,
}

/// One event of a run, in the order the kernel produced them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CodeEvent {
    /// Text the code wrote to stdout.
    Stdout {
        /// The text.
        text: String,
    },
    /// Text the code wrote to stderr.
    Stderr {
        /// The text.
        text: String,
    },
    /// The value of the cell's last expression.
    Result(RichOutput),
    /// Something the code displayed (a chart, a table).
    Display(RichOutput),
    /// The code raised, timed out, or its kernel died.
    Error(CodeError),
    /// The run is over.
    End(RunEnd),
}

impl CodeEvent {
    /// The event's name (the SSE event name).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Stdout { .. } => "stdout",
            Self::Stderr { .. } => "stderr",
            Self::Result(_) => "result",
            Self::Display(_) => "display",
            Self::Error(_) => "error",
            Self::End(_) => "end",
        }
    }
}

/// The logs of a run: each chunk as the kernel sent it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeLogs {
    /// Chunks of stdout.
    pub stdout: Vec<String>,
    /// Chunks of stderr.
    pub stderr: Vec<String>,
}

/// A whole run: `POST /v1/sandboxes/{id}/code` without `Accept: text/event-stream`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Execution {
    /// Results and displays, in order.
    pub results: Vec<RichOutput>,
    /// What the code printed.
    pub logs: CodeLogs,
    /// What it raised (or why it stopped).
    pub error: Option<CodeError>,
    /// See [`RunEnd::execution_count`].
    pub execution_count: Option<u64>,
    /// See [`RunEnd::duration_ms`].
    pub duration_ms: u64,
    /// See [`RunEnd::context_id`].
    pub context_id: String,
    /// See [`RunEnd::context_restarted`].
    pub context_restarted: bool,
    /// Output was cut at the server's output cap.
    pub truncated: bool,
}

/// A run in progress: its events as they come ([`CodeRun::next`]) or all of them
/// ([`CodeRun::collect`]). While it lives the sandbox counts as in use; dropping it closes
/// the tunnel, and the driver interrupts the cell.
pub struct CodeRun {
    /// The first line, read before the run was handed out.
    first: Option<Value>,
    lines: DriverLines,
    deadline: Option<Instant>,
    /// Bytes of output the host keeps when collecting (the server's output cap).
    cap: usize,
    finished: bool,
    /// Keeps the sandbox from idle hibernation and counts against its cap of execs.
    _held: Option<(ActiveGuard, ExecSlot)>,
}

impl std::fmt::Debug for CodeRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeRun")
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

/// Output kept by [`CodeRun::collect`], within the cap.
struct Kept {
    left: usize,
    truncated: bool,
}

impl Kept {
    fn take(&mut self, size: usize) -> bool {
        if size <= self.left {
            self.left -= size;
            true
        } else {
            self.truncated = true;
            false
        }
    }
}

impl CodeRun {
    /// A run whose first line has been read (`first`), ending by `deadline`.
    pub(crate) fn starting_with(
        first: Value,
        lines: DriverLines,
        deadline: Option<Instant>,
        cap: usize,
        held: Option<(ActiveGuard, ExecSlot)>,
    ) -> Self {
        Self {
            first: Some(first),
            lines,
            deadline,
            cap,
            finished: false,
            _held: held,
        }
    }

    /// The next event; `None` after [`CodeEvent::End`] (or after an error).
    pub async fn next(&mut self) -> Option<Result<CodeEvent, InterpError>> {
        if self.finished {
            return None;
        }
        let line = match (self.first.take(), self.deadline) {
            (Some(first), _) => Ok(Some(first)),
            (None, deadline) => self.next_line(deadline).await,
        };
        let event = line.and_then(|value| match value {
            Some(value) => super::driver::event_from(value),
            None => Err(InterpError::Driver(
                "the kernel driver hung up before the cell ended".into(),
            )),
        });
        if matches!(event, Ok(CodeEvent::End(_)) | Err(_)) {
            self.finished = true;
        }
        Some(event)
    }

    async fn next_line(&mut self, deadline: Option<Instant>) -> Result<Option<Value>, InterpError> {
        match deadline {
            Some(deadline) => {
                match tokio::time::timeout_at(deadline.into(), self.lines.next_value()).await {
                    Ok(line) => line,
                    Err(_) => Err(InterpError::Driver(
                        "the kernel driver did not finish the cell after its timeout".into(),
                    )),
                }
            }
            None => self.lines.next_value().await,
        }
    }

    /// Run to the end and gather everything, keeping at most the output cap of text and
    /// rich data (the rest is dropped and [`Execution::truncated`] set).
    pub async fn collect(mut self) -> Result<Execution, InterpError> {
        let mut kept = Kept {
            left: self.cap,
            truncated: false,
        };
        let mut results = Vec::new();
        let mut logs = CodeLogs::default();
        let mut error = None;
        while let Some(event) = self.next().await {
            match event? {
                CodeEvent::Stdout { text } if kept.take(text.len()) => logs.stdout.push(text),
                CodeEvent::Stderr { text } if kept.take(text.len()) => logs.stderr.push(text),
                CodeEvent::Stdout { .. } | CodeEvent::Stderr { .. } => {}
                CodeEvent::Result(r) | CodeEvent::Display(r) => {
                    if kept.take(r.size()) {
                        results.push(r);
                    }
                }
                CodeEvent::Error(e) => error = Some(e),
                CodeEvent::End(end) => {
                    return Ok(Execution {
                        results,
                        logs,
                        error,
                        execution_count: end.execution_count,
                        duration_ms: end.duration_ms,
                        context_id: end.context_id,
                        context_restarted: end.context_restarted,
                        truncated: kept.truncated || end.truncated,
                    })
                }
            }
        }
        Err(InterpError::Driver(
            "the kernel driver hung up before the cell ended".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    async fn run_of(sent: &str, cap: usize) -> CodeRun {
        let (host, mut driver) = tokio::io::duplex(1 << 20);
        driver.write_all(sent.as_bytes()).await.expect("write");
        driver.shutdown().await.expect("end of answer");
        tokio::spawn(async move {
            let mut request = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut driver, &mut request).await;
        });
        let mut lines = DriverLines::send(host, &serde_json::json!({"op": "execute"}), 1 << 16)
            .await
            .expect("send");
        let first = lines.next_value().await.expect("read").expect("a line");
        CodeRun::starting_with(first, lines, None, cap, None)
    }

    const END: &str = r#"{"type": "end", "execution_count": 3, "duration_ms": 5, "context_id": "default-python", "context_restarted": false, "truncated": false}"#;

    #[tokio::test]
    async fn collecting_keeps_the_order_and_the_parts() {
        let sent = format!(
            "{}\n{}\n{}\n{}\n{END}\n",
            r#"{"type": "stdout", "text": "a"}"#,
            r#"{"type": "display", "data": {"image/png": "iVBO"}, "metadata": {}}"#,
            r#"{"type": "result", "data": {"text/plain": "2"}, "is_main_result": true}"#,
            r#"{"type": "error", "name": "E", "value": "v", "traceback": ["t"]}"#,
        );
        let done = run_of(&sent, 1 << 10)
            .await
            .collect()
            .await
            .expect("collect");
        assert_eq!(done.logs.stdout, ["a"]);
        assert_eq!(done.results.len(), 2);
        assert!(!done.results[0].is_main_result && done.results[1].is_main_result);
        assert_eq!(done.error.as_ref().map(|e| e.name.as_str()), Some("E"));
        assert_eq!(done.execution_count, Some(3));
        assert!(!done.truncated);
    }

    #[tokio::test]
    async fn collecting_keeps_no_more_than_the_cap_whatever_the_driver_claims() {
        let chunk = format!(r#"{{"type": "stdout", "text": "{}"}}"#, "x".repeat(600));
        let sent = format!("{chunk}\n{chunk}\n{chunk}\n{END}\n");
        let done = run_of(&sent, 1_000).await.collect().await.expect("collect");
        assert_eq!(done.logs.stdout.len(), 1, "one 600-byte chunk fits in 1000");
        assert!(done.truncated, "the driver said false; the host cut");
    }

    #[tokio::test]
    async fn a_run_without_an_end_is_an_error() {
        let sent = r#"{"type": "stdout", "text": "a"}"#.to_string() + "\n";
        let e = run_of(&sent, 1 << 10)
            .await
            .collect()
            .await
            .expect_err("no end");
        assert!(
            e.to_string().contains("hung up before the cell ended"),
            "{e}"
        );
    }
}
