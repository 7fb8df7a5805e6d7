//! A build's log: every line its steps printed, with its step, kept in memory (bounded)
//! and sent to followers as it is written.

use std::collections::VecDeque;

use serde::Serialize;
use tokio::sync::broadcast;

/// Most lines a build keeps; older ones are dropped (followers saw them live).
pub const MAX_LOG_LINES: usize = 20_000;
/// Longest line kept; longer output is cut into lines of this size.
pub const MAX_LINE: usize = 16 << 10;

/// What a line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LogStream {
    /// The builder's own account (`step 3/9 : RUN make`, `CACHED`, `done in 1.2 s`).
    Status,
    /// A step's stdout.
    Stdout,
    /// A step's stderr.
    Stderr,
}

/// One line of a build's log.
#[derive(Debug, Clone, Serialize)]
pub struct BuildLogLine {
    /// Its number in the build's log (from 1).
    pub seq: u64,
    /// The step that printed it (`None`: the build itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<usize>,
    /// What it is.
    pub stream: LogStream,
    /// The text, without its newline.
    pub text: String,
    /// When it was written (ms since the epoch).
    pub time_ms: i64,
}

/// The log of one build.
#[derive(Debug)]
pub(crate) struct BuildLog {
    lines: VecDeque<BuildLogLine>,
    next: u64,
    tx: broadcast::Sender<BuildLogLine>,
}

impl Default for BuildLog {
    fn default() -> Self {
        Self {
            lines: VecDeque::new(),
            next: 1,
            tx: broadcast::channel(4096).0,
        }
    }
}

impl BuildLog {
    /// Append a line (cut at [`MAX_LINE`]).
    pub fn push(&mut self, step: Option<usize>, stream: LogStream, text: &str) {
        let mut rest = text;
        loop {
            let cut = if rest.len() > MAX_LINE {
                let mut at = MAX_LINE;
                while !rest.is_char_boundary(at) {
                    at -= 1;
                }
                at
            } else {
                rest.len()
            };
            let line = BuildLogLine {
                seq: self.next,
                step,
                stream,
                text: rest[..cut].to_string(),
                time_ms: hutch_core::time::now_ms(),
            };
            self.next += 1;
            if self.lines.len() == MAX_LOG_LINES {
                self.lines.pop_front();
            }
            let _ = self.tx.send(line.clone());
            self.lines.push_back(line);
            rest = &rest[cut..];
            if rest.is_empty() {
                break;
            }
        }
    }

    /// The lines kept, and a receiver of the ones written after them.
    pub fn follow(&self) -> (Vec<BuildLogLine>, broadcast::Receiver<BuildLogLine>) {
        (self.lines.iter().cloned().collect(), self.tx.subscribe())
    }
}
