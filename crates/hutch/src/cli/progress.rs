//! Progress on stderr. What a create is waiting for: while `hutch create` or `hutch run`
//! waits for a sandbox, the server's `sandbox.preparing` events (a vm create building the
//! guest kernel, a template's disk image or its baked snapshot on first use) are printed.
//! And the bytes of an upload sent so far ([`UploadProgress`], a build context), on a
//! terminal only.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::Method;

use crate::client::Api;

/// Subscribe to the server's events (before the create is sent, so nothing is missed) and
/// print `sandbox.preparing` ones until the returned task is aborted. `None` when the
/// subscription fails: progress is a courtesy, never a reason to fail a create.
pub async fn watch(api: &Api) -> Option<tokio::task::JoinHandle<()>> {
    let resp = api.raw(Method::GET, "/v1/events", None, None).await.ok()?;
    Some(tokio::spawn(async move {
        let mut stream = resp.bytes_stream();
        let mut pending = String::new();
        while let Some(Ok(chunk)) = stream.next().await {
            pending.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = pending.find('\n') {
                let line: String = pending.drain(..=end).collect();
                if let Some(detail) = preparing_detail(line.trim_end()) {
                    eprintln!("hutch: {detail}");
                }
            }
        }
    }))
}

/// The detail of a `sandbox.preparing` event from one SSE `data:` line.
fn preparing_detail(line: &str) -> Option<String> {
    let data = line.strip_prefix("data:")?.trim_start();
    let event: serde_json::Value = serde_json::from_str(data).ok()?;
    (event["type"] == "sandbox.preparing")
        .then(|| event["detail"].as_str().map(String::from))
        .flatten()
}

/// How often the upload line is rewritten.
const UPLOAD_REFRESH: Duration = Duration::from_millis(100);

/// The bytes of an upload sent so far, as one stderr line rewritten in place (`sending the
/// build context: 12.5 MiB`) when stderr is a terminal; nothing otherwise.
pub struct UploadProgress {
    what: &'static str,
    terminal: bool,
    sent: AtomicU64,
    shown: Mutex<Instant>,
}

impl UploadProgress {
    /// Progress of sending `what`.
    pub fn new(what: &'static str) -> Self {
        Self {
            what,
            terminal: std::io::stderr().is_terminal(),
            sent: AtomicU64::new(0),
            shown: Mutex::new(Instant::now()),
        }
    }

    /// `n` more bytes went out.
    pub fn sent(&self, n: u64) {
        let total = self.sent.fetch_add(n, Ordering::Relaxed) + n;
        if !self.terminal {
            return;
        }
        let mut shown = self.shown.lock().unwrap_or_else(|p| p.into_inner());
        if shown.elapsed() >= UPLOAD_REFRESH {
            *shown = Instant::now();
            eprint!("\rsending {}: {}   ", self.what, human_bytes(total));
        }
    }

    /// Bytes sent in all.
    pub fn total(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// The upload ended: the line is replaced by `sent {what}: {bytes}{detail}` (on a
    /// terminal), or cleared when it failed (`detail` `None`).
    pub fn finish(&self, detail: Option<&str>) {
        if !self.terminal {
            return;
        }
        eprint!("\r\x1b[K");
        if let Some(detail) = detail {
            eprintln!("sent {}: {}{detail}", self.what, human_bytes(self.total()));
        }
    }
}

/// Bars for the transfers a build reports (`"stream": "progress"` lines of its log), one
/// per blob and action, like `docker pull`'s, when stderr is a terminal. Elsewhere (a log
/// file, CI) only each finished transfer is printed, as one line.
pub struct TransferBars {
    multi: indicatif::MultiProgress,
    bars: std::collections::HashMap<(String, String), indicatif::ProgressBar>,
    terminal: bool,
}

impl Default for TransferBars {
    fn default() -> Self {
        Self {
            multi: indicatif::MultiProgress::new(),
            bars: Default::default(),
            terminal: std::io::stderr().is_terminal(),
        }
    }
}

impl TransferBars {
    /// Show one progress line (`text`, and `progress`: `{id, label, action, current, total}`).
    pub fn update(&mut self, text: &str, progress: &serde_json::Value) {
        let (Some(current), Some(total)) =
            (progress["current"].as_u64(), progress["total"].as_u64())
        else {
            return;
        };
        if !self.terminal {
            if current >= total {
                eprintln!("{text}");
            }
            return;
        }
        let id = progress["id"].as_str().unwrap_or("").to_string();
        let action = progress["action"].as_str().unwrap_or("").to_string();
        let key = (id.clone(), action.clone());
        let multi = &self.multi;
        let bar = self.bars.entry(key).or_insert_with(|| {
            let bar = multi.add(indicatif::ProgressBar::new(total));
            let style = indicatif::ProgressStyle::with_template(
                "{prefix} {msg:9} [{bar:30}] {bytes}/{total_bytes}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            let short = id.strip_prefix("sha256:").unwrap_or(&id);
            bar.set_prefix(format!(
                "{} {}",
                progress["label"].as_str().unwrap_or(""),
                &short[..short.len().min(12)]
            ));
            bar.set_message(action);
            bar
        });
        bar.set_length(total);
        bar.set_position(current);
        if current >= total {
            bar.finish();
        }
    }

    /// Print a line above the bars (without breaking them).
    pub fn println(&self, line: &str) {
        if self.terminal && !self.bars.is_empty() {
            let _ = self.multi.println(line);
        } else {
            eprintln!("{line}");
        }
    }
}

/// `1536` → `1.5 KiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::{human_bytes, preparing_detail, UploadProgress};

    #[test]
    fn uploads_count_their_bytes_and_sizes_read_as_people_write_them() {
        let p = UploadProgress::new("the build context");
        p.sent(1000);
        p.sent(536);
        assert_eq!(p.total(), 1536);
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }

    #[test]
    fn only_preparing_events_are_shown() {
        let line = r#"data: {"type":"sandbox.preparing","sandbox_id":"sbx_a","at":"x","detail":"baking…"}"#;
        assert_eq!(preparing_detail(line).as_deref(), Some("baking…"));
        let other = r#"data: {"type":"sandbox.created","sandbox_id":"sbx_a","at":"x"}"#;
        assert_eq!(preparing_detail(other), None);
        assert_eq!(preparing_detail("event: sandbox.preparing"), None);
        assert_eq!(preparing_detail(": keep-alive"), None);
    }
}
