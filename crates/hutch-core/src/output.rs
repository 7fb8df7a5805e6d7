//! Collected exec output, and the server-wide budget that bounds how much of it is held.
//!
//! A collected exec keeps its output in memory until its answer has been written to the
//! client. Each stream is kept once, as the chunks that arrived ([`OutputChunks`]), and every
//! byte kept is first reserved from the server's [`OutputBudget`]; the reservation is held by
//! an [`OutputLease`] that travels with the result and is given back when the result is
//! dropped (its answer written, or the client gone).
//!
//! Past the budget the reading side waits (back-pressure): the collector stops reading the
//! agent's stream, HTTP/2 flow control stops the agent, and the process blocks on its full
//! pipe until memory is given back. Waiting alone could deadlock (every exec holding part of
//! the budget, each waiting for more), so one exec at a time may overdraw: the first that
//! finds the budget spent while no other exec overdraws takes the rest of its output past
//! the budget, finishes, and hands the privilege on when its result is dropped. Held output
//! therefore never exceeds the budget plus one exec's cap (both streams).
//!
//! Output also sits, before it is read, in the HTTP/2 receive window of the exec's stream
//! from the agent (up to [`STREAM_WINDOW`] bytes while the reader waits). So a collected exec
//! reserves that window before it starts and gives it back when its output is collected;
//! the bound above includes it: budget + one window + one exec's cap.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
pub use hutch_proto::client::STREAM_WINDOW;
use hutch_proto::client::{ClientError, ClientResult, ExecEvent, PipedExec};
use hutch_proto::ExecExit;
use tokio::sync::Notify;

/// One stream's output as it arrived: chunks, never copied into one buffer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputChunks {
    chunks: Vec<Bytes>,
    len: usize,
}

impl OutputChunks {
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunks, in order.
    pub fn chunks(&self) -> &[Bytes] {
        &self.chunks
    }

    /// Output made of these chunks, in order.
    pub fn from_chunks(chunks: Vec<Bytes>) -> Self {
        let len = chunks.iter().map(Bytes::len).sum();
        Self { chunks, len }
    }

    /// All bytes in one buffer (a copy: for small outputs).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len);
        for c in &self.chunks {
            v.extend_from_slice(c);
        }
        v
    }

    fn push(&mut self, chunk: Bytes) {
        self.len += chunk.len();
        self.chunks.push(chunk);
    }
}

impl From<&[u8]> for OutputChunks {
    fn from(data: &[u8]) -> Self {
        let mut out = Self::default();
        if !data.is_empty() {
            out.push(Bytes::copy_from_slice(data));
        }
        out
    }
}

#[derive(Debug, Default)]
struct BudgetState {
    /// Bytes reserved by every lease.
    used: usize,
    /// The lease overdrawing the budget, if any.
    overdraft: Option<u64>,
    next_lease: u64,
}

#[derive(Debug)]
struct BudgetInner {
    limit: usize,
    state: Mutex<BudgetState>,
    released: Notify,
    /// Highest `used` seen.
    peak: AtomicU64,
    /// Times a collector had to wait for memory.
    waits: AtomicU64,
}

/// The server-wide budget of buffered exec output. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct OutputBudget {
    inner: Arc<BudgetInner>,
}

impl OutputBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            inner: Arc::new(BudgetInner {
                limit: limit.max(1),
                state: Mutex::new(BudgetState::default()),
                released: Notify::new(),
                peak: AtomicU64::new(0),
                waits: AtomicU64::new(0),
            }),
        }
    }

    /// The budget, in bytes.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.inner.lock().used
    }

    /// Highest reservation seen, in bytes.
    pub fn peak(&self) -> u64 {
        self.inner.peak.load(Ordering::Relaxed)
    }

    /// Times a collector waited for memory.
    pub fn waits(&self) -> u64 {
        self.inner.waits.load(Ordering::Relaxed)
    }

    /// A lease holding nothing yet.
    pub fn lease(&self) -> OutputLease {
        let id = {
            let mut st = self.inner.lock();
            st.next_lease += 1;
            st.next_lease
        };
        OutputLease {
            inner: Arc::clone(&self.inner),
            id,
            held: 0,
            overdraft: false,
        }
    }
}

impl BudgetInner {
    fn lock(&self) -> std::sync::MutexGuard<'_, BudgetState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One exec's share of the budget; dropping it gives the share back.
#[derive(Debug)]
pub struct OutputLease {
    inner: Arc<BudgetInner>,
    id: u64,
    held: usize,
    overdraft: bool,
}

impl OutputLease {
    /// Bytes this lease holds.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Give back `n` of the bytes held (at most all of them).
    pub fn release(&mut self, n: usize) {
        let n = n.min(self.held);
        self.held -= n;
        {
            let mut st = self.inner.lock();
            st.used = st.used.saturating_sub(n);
        }
        self.inner.released.notify_waiters();
    }

    /// Reserve `n` more bytes, waiting while the budget is spent (see the module docs).
    pub async fn reserve(&mut self, n: usize) {
        let mut waited = false;
        loop {
            let released = self.inner.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut st = self.inner.lock();
                let fits = st.used.saturating_add(n) <= self.inner.limit;
                if !fits && !self.overdraft && st.overdraft.is_none() {
                    st.overdraft = Some(self.id);
                    self.overdraft = true;
                }
                if fits || self.overdraft {
                    st.used += n;
                    self.held += n;
                    self.inner.peak.fetch_max(st.used as u64, Ordering::Relaxed);
                    return;
                }
            }
            if !waited {
                waited = true;
                self.inner.waits.fetch_add(1, Ordering::Relaxed);
            }
            released.await;
        }
    }
}

impl Drop for OutputLease {
    fn drop(&mut self) {
        {
            let mut st = self.inner.lock();
            st.used = st.used.saturating_sub(self.held);
            if st.overdraft == Some(self.id) {
                st.overdraft = None;
            }
        }
        self.inner.released.notify_waiters();
    }
}

/// What [`collect`] returns.
#[derive(Debug)]
pub struct Collected {
    /// Stdout, up to the cap.
    pub stdout: OutputChunks,
    /// Stderr, up to the cap.
    pub stderr: OutputChunks,
    /// Stdout went over the cap; the rest was read and discarded.
    pub stdout_truncated: bool,
    /// Stderr went over the cap.
    pub stderr_truncated: bool,
    /// How the process ended.
    pub exit: ExecExit,
}

/// One stream being kept, up to its cap.
struct Capture {
    out: OutputChunks,
    cap: usize,
    truncated: bool,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Self {
            out: OutputChunks::default(),
            cap,
            truncated: false,
        }
    }

    /// The part of `data` to keep (the rest is over the cap).
    fn room_for(&mut self, data: &[u8]) -> usize {
        let room = self.cap.saturating_sub(self.out.len());
        if data.len() > room {
            self.truncated = true;
        }
        data.len().min(room)
    }
}

/// Run `exec` to its exit (its stdin is written meanwhile, see [`PipedExec`]): keep up to
/// `cap` bytes of each stream, each byte reserved from `lease` first (so this waits while
/// the budget is spent, and the process with it, while its stdin keeps flowing as it reads).
pub async fn collect(
    mut exec: PipedExec,
    cap: usize,
    lease: &mut OutputLease,
) -> ClientResult<Collected> {
    let mut stdout = Capture::new(cap);
    let mut stderr = Capture::new(cap);
    while let Some(event) = exec.next().await {
        let (capture, data) = match event? {
            // A plain exec is never told of missed output (only attaches are).
            ExecEvent::Started { .. } | ExecEvent::Missed(_) => continue,
            ExecEvent::Stdout(data) => (&mut stdout, data),
            ExecEvent::Stderr(data) => (&mut stderr, data),
            ExecEvent::Error(e) => return Err(ClientError::Agent(e)),
            ExecEvent::Exit(exit) => {
                return Ok(Collected {
                    stdout_truncated: stdout.truncated,
                    stderr_truncated: stderr.truncated,
                    stdout: stdout.out,
                    stderr: stderr.out,
                    exit,
                })
            }
        };
        let keep = capture.room_for(&data);
        if keep > 0 {
            lease.reserve(keep).await;
            // A copy of exactly the kept bytes: the frame's buffer is freed at once.
            capture.out.push(Bytes::copy_from_slice(&data[..keep]));
        }
    }
    Err(ClientError::Protocol(
        "exec stream ended without an exit".into(),
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn leases_reserve_within_the_budget_and_give_it_back() {
        let budget = OutputBudget::new(100);
        let mut a = budget.lease();
        a.reserve(60).await;
        assert_eq!(budget.used(), 60);
        let mut b = budget.lease();
        b.reserve(40).await;
        b.release(30);
        assert_eq!((b.held(), budget.used()), (10, 70));
        drop(a);
        drop(b);
        assert_eq!(budget.used(), 0);
        assert_eq!(budget.peak(), 100);
    }

    #[tokio::test]
    async fn past_the_budget_one_lease_overdraws_and_the_others_wait() {
        let budget = OutputBudget::new(100);
        let mut a = budget.lease();
        let mut b = budget.lease();
        a.reserve(80).await;
        b.reserve(20).await;
        // Spent: the first to ask overdraws (and may keep doing so)...
        a.reserve(50).await;
        a.reserve(50).await;
        assert_eq!(budget.used(), 200);
        // ...while any other waits until memory comes back.
        let waiting = tokio::time::timeout(Duration::from_millis(50), b.reserve(10)).await;
        assert!(waiting.is_err(), "b must wait while a overdraws");
        assert_eq!(budget.waits(), 1);
        drop(a);
        tokio::time::timeout(Duration::from_secs(5), b.reserve(10))
            .await
            .expect("b proceeds once a's share is back");
        assert_eq!(budget.used(), 30);
    }

    #[tokio::test]
    async fn a_waiting_lease_takes_the_overdraft_when_it_is_handed_back() {
        let budget = OutputBudget::new(10);
        let mut a = budget.lease();
        let mut b = budget.lease();
        a.reserve(10).await;
        a.reserve(5).await; // a overdraws
        let b_task = tokio::spawn(async move {
            b.reserve(20).await;
            b
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!b_task.is_finished());
        drop(a);
        let b = tokio::time::timeout(Duration::from_secs(5), b_task)
            .await
            .expect("b is woken")
            .expect("b's task");
        assert_eq!(b.held(), 20);
    }

    #[test]
    fn chunks_keep_bytes_in_order() {
        let mut c = OutputChunks::default();
        c.push(Bytes::from_static(b"ab"));
        c.push(Bytes::from_static(b"cd"));
        assert_eq!(c.len(), 4);
        assert_eq!(c.to_vec(), b"abcd");
        assert_eq!(OutputChunks::from(&b""[..]).chunks().len(), 0);
    }

    #[test]
    fn capture_keeps_the_cap_and_flags_the_rest() {
        let mut c = Capture::new(5);
        assert_eq!(c.room_for(b"abc"), 3);
        c.out.push(Bytes::from_static(b"abc"));
        assert!(!c.truncated);
        assert_eq!(c.room_for(b"defg"), 2);
        assert!(c.truncated);
    }
}
