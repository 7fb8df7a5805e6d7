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
    /// How far a blob's download or extraction is (`progress` says; `text` is the same
    /// for people).
    Progress,
}

/// How far one blob's transfer is, in a [`LogStream::Progress`] line.
#[derive(Debug, Clone, Serialize)]
pub struct TransferView {
    /// The blob (`sha256:…`).
    pub id: String,
    /// What it is (`layer 2/3`).
    pub label: String,
    /// `download` or `extract`.
    pub action: &'static str,
    /// Bytes done (of the compressed blob, also while extracting).
    pub current: u64,
    /// Bytes in all.
    pub total: u64,
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
    /// A progress line's numbers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<TransferView>,
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
                progress: None,
                time_ms: hutch_core::time::now_ms(),
            };
            self.append(line);
            rest = &rest[cut..];
            if rest.is_empty() {
                break;
            }
        }
    }

    /// Append a progress line.
    pub fn push_transfer(&mut self, step: Option<usize>, t: hutch_template::Transfer) {
        let short = t.digest.strip_prefix("sha256:").unwrap_or(&t.digest);
        let text = format!(
            "{} {}: {} {} / {}",
            t.label,
            &short[..short.len().min(12)],
            t.action.as_str(),
            human_bytes(t.current),
            human_bytes(t.total)
        );
        let line = BuildLogLine {
            seq: self.next,
            step,
            stream: LogStream::Progress,
            text,
            progress: Some(TransferView {
                id: t.digest,
                label: t.label,
                action: t.action.as_str(),
                current: t.current,
                total: t.total,
            }),
            time_ms: hutch_core::time::now_ms(),
        };
        self.append(line);
    }

    fn append(&mut self, line: BuildLogLine) {
        self.next += 1;
        if self.lines.len() == MAX_LOG_LINES {
            self.lines.pop_front();
        }
        let _ = self.tx.send(line.clone());
        self.lines.push_back(line);
    }

    /// The lines kept, and a receiver of the ones written after them.
    pub fn follow(&self) -> (Vec<BuildLogLine>, broadcast::Receiver<BuildLogLine>) {
        (self.lines.iter().cloned().collect(), self.tx.subscribe())
    }
}

/// `1.5 MiB`, `512 B`.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transfer_is_a_progress_line_with_its_numbers() {
        let mut log = BuildLog::default();
        log.push_transfer(
            None,
            hutch_template::Transfer {
                digest: "sha256:0123456789abcdef0123".into(),
                label: "layer 1/2".into(),
                action: hutch_template::TransferAction::Download,
                current: 1536,
                total: 3 << 20,
            },
        );
        let (lines, _) = log.follow();
        assert_eq!(lines[0].stream, LogStream::Progress);
        assert_eq!(
            lines[0].text,
            "layer 1/2 0123456789ab: download 1.5 KiB / 3.0 MiB"
        );
        let p = lines[0].progress.as_ref().expect("numbers");
        assert_eq!((p.action, p.current, p.total), ("download", 1536, 3 << 20));
    }
}
