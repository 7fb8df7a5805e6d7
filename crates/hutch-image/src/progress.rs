//! What a pull or an unpack reports as it goes: log lines, and the bytes of each blob moved
//! so far (what a client draws progress bars from, like `docker pull`'s).

use std::time::{Duration, Instant};

/// One report of a pull ([`crate::pull`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullEvent {
    /// A line for the log (`manifest sha256:… (3 layers)`, `layer 1/3 … already stored`).
    Line(String),
    /// How far one blob's transfer is.
    Transfer(Transfer),
}

/// What is being done to a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferAction {
    /// Downloaded from the registry.
    Download,
    /// Decompressed and applied to the root (the count is of compressed bytes read).
    Extract,
}

impl TransferAction {
    /// `download`, `extract`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Download => "download",
            Self::Extract => "extract",
        }
    }
}

/// How far one blob's transfer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// The blob's digest (`sha256:…`).
    pub digest: String,
    /// What it is (`layer 2/3`, `config`).
    pub label: String,
    /// What is being done.
    pub action: TransferAction,
    /// Bytes done.
    pub current: u64,
    /// Bytes in all.
    pub total: u64,
}

/// Least time between two reports of one transfer (its first and last always go).
pub const REPORT_EVERY: Duration = Duration::from_millis(200);

/// Reports one transfer at most every [`REPORT_EVERY`], and always its start and end.
#[derive(Debug)]
pub struct Throttle {
    transfer: Transfer,
    last: Option<Instant>,
}

impl Throttle {
    /// A transfer of `total` bytes starting at 0.
    pub fn new(digest: &str, label: &str, action: TransferAction, total: u64) -> Self {
        Self {
            transfer: Transfer {
                digest: digest.to_owned(),
                label: label.to_owned(),
                action,
                current: 0,
                total,
            },
            last: None,
        }
    }

    /// `n` more bytes done: the report to send now, if one is due.
    pub fn advance(&mut self, n: u64) -> Option<Transfer> {
        let was_done = self.last.is_some() && self.transfer.current >= self.transfer.total;
        self.transfer.current = self.transfer.current.saturating_add(n);
        if was_done && n == 0 {
            // The end was reported; an empty read after it says nothing new.
            return None;
        }
        let done = self.transfer.current >= self.transfer.total;
        let due = self.last.is_none_or(|t| t.elapsed() >= REPORT_EVERY);
        (done || due).then(|| self.report())
    }

    /// The transfer ended: its last report, at the full size (unless it was already sent).
    pub fn finish(&mut self) -> Option<Transfer> {
        if self.last.is_some() && self.transfer.current >= self.transfer.total {
            return None;
        }
        self.transfer.current = self.transfer.total.max(self.transfer.current);
        Some(self.report())
    }

    fn report(&mut self) -> Transfer {
        self.last = Some(Instant::now());
        self.transfer.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transfer_reports_its_start_its_end_and_not_every_chunk() {
        let mut t = Throttle::new("sha256:ab", "layer 1/1", TransferAction::Download, 1000);
        let first = t.advance(10).expect("the first chunk is reported");
        assert_eq!((first.current, first.total), (10, 1000));
        // Chunks within the interval are not.
        assert_eq!(t.advance(10), None);
        assert_eq!(t.advance(10), None);
        let last = t.advance(970).expect("the last chunk is");
        assert_eq!(last.current, 1000);
        assert_eq!(t.advance(0), None, "the end's empty read repeats nothing");
        assert_eq!(t.finish(), None, "the end was reported already");
        let mut short = Throttle::new("sha256:cd", "config", TransferAction::Extract, 50);
        assert!(short.advance(1).is_some());
        assert_eq!(short.finish().map(|r| r.current), Some(50));
    }
}
