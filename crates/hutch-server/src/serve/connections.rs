//! The table of open client connections: the connection cap, who is evicted when it is
//! reached, and the header and idle timeouts.
//!
//! A reserve for authenticated clients cannot be decided when a connection is accepted (its
//! key is in the headers, which have not arrived), so the cap is kept by eviction instead of
//! refusal. Every connection not serving a request right now is evictable, in this order:
//!
//! 1. connections that never made an authenticated request, those still waiting for their
//!    first request head before those that finished one, oldest first;
//! 2. idle keep-alive connections of authenticated clients, longest idle first.
//!
//! A connection serving a request (an exec, a file transfer, an upgraded WebSocket or
//! tunnel) is never evicted; when every slot is busy like that, a new connection is closed
//! at once. So thousands of half-sent request heads cost an attacker their own connections,
//! never a client that sends a complete request: the newcomer always displaces the oldest
//! idle stranger.
//!
//! Timeouts are kept here too (one clock for both): a connection must deliver its first
//! request head within the header timeout of being accepted, and a keep-alive connection
//! must deliver its next request head within the idle timeout of the previous response.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// Accepted; no complete request head yet.
    AwaitingFirstHead,
    /// Has delivered at least one complete request head.
    Established,
}

/// One open connection.
#[derive(Debug)]
struct Entry {
    phase: Phase,
    /// Made at least one request that passed authentication.
    authenticated: bool,
    /// Requests being served (head read, response body not yet finished).
    in_flight: u32,
    /// When the connection was accepted, or when its last response finished.
    idle_since: Instant,
    /// hyper still drives the connection (false once it was upgraded or has ended).
    serving: bool,
    /// Told to close (evicted or timed out); no longer counted against the cap.
    closing: bool,
    /// Tells the connection's task to close it.
    close: Option<oneshot::Sender<()>>,
}

impl Entry {
    fn evictable(&self) -> bool {
        self.serving && !self.closing && self.in_flight == 0
    }

    /// Lower is evicted first.
    fn eviction_rank(&self) -> (bool, Phase, Instant) {
        (self.authenticated, self.phase, self.idle_since)
    }
}

/// Counters of the table, for `/metrics`.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Idle connections closed to make room for a new one.
    pub evicted: AtomicU64,
    /// New connections closed because every slot was serving a request.
    pub refused: AtomicU64,
    /// Connections closed for not sending a request head in time.
    pub timed_out: AtomicU64,
}

#[derive(Debug)]
struct Table {
    next_id: u64,
    entries: BTreeMap<u64, Entry>,
    /// Entries not `closing`.
    open: usize,
}

/// The connection table (shared by the accept loop, every connection and the watchdog).
#[derive(Debug)]
pub struct Connections {
    table: Mutex<Table>,
    cap: usize,
    header_timeout: Duration,
    idle_timeout: Duration,
    /// Counters.
    pub stats: Arc<ConnectionStats>,
}

impl Connections {
    /// A table holding at most `cap` open connections.
    pub fn new(
        cap: usize,
        header_timeout: Duration,
        idle_timeout: Duration,
        stats: Arc<ConnectionStats>,
    ) -> Arc<Self> {
        Arc::new(Self {
            table: Mutex::new(Table {
                next_id: 0,
                entries: BTreeMap::new(),
                open: 0,
            }),
            cap: cap.max(1),
            header_timeout,
            idle_timeout,
            stats,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Open connections (those being closed not counted).
    pub fn open(&self) -> usize {
        self.lock().open
    }

    /// Make room for and register a just-accepted connection: evicts the first idle
    /// connection in eviction order when the table is full. `None` when every slot is
    /// serving a request (the caller closes the new connection).
    pub fn admit(self: &Arc<Self>) -> Option<(ConnectionHandle, oneshot::Receiver<()>)> {
        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        let mut t = self.lock();
        if t.open >= self.cap {
            if !Self::evict_one(&mut t) {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            self.stats.evicted.fetch_add(1, Ordering::Relaxed);
        }
        let id = t.next_id;
        t.next_id += 1;
        let (tx, rx) = oneshot::channel();
        t.entries.insert(
            id,
            Entry {
                phase: Phase::AwaitingFirstHead,
                authenticated: false,
                in_flight: 0,
                idle_since: Instant::now(),
                serving: true,
                closing: false,
                close: Some(tx),
            },
        );
        t.open += 1;
        self.stats.open.store(t.open as u64, Ordering::Relaxed);
        Some((
            ConnectionHandle {
                table: Arc::clone(self),
                id,
            },
            rx,
        ))
    }

    /// Render the counters in Prometheus text format.
    pub fn render(stats: &ConnectionStats) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "# HELP hutch_http_connections Client connections open now.\n# TYPE hutch_http_connections gauge\nhutch_http_connections {}\n\
             # HELP hutch_http_connections_accepted_total Client connections accepted.\n# TYPE hutch_http_connections_accepted_total counter\nhutch_http_connections_accepted_total {}\n\
             # HELP hutch_http_connections_evicted_total Idle connections closed to make room at the connection cap.\n# TYPE hutch_http_connections_evicted_total counter\nhutch_http_connections_evicted_total {}\n\
             # HELP hutch_http_connections_refused_total Connections closed at once because every slot was serving a request.\n# TYPE hutch_http_connections_refused_total counter\nhutch_http_connections_refused_total {}\n\
             # HELP hutch_http_connections_timed_out_total Connections closed by the header or idle timeout.\n# TYPE hutch_http_connections_timed_out_total counter\nhutch_http_connections_timed_out_total {}\n",
            get(&stats.open),
            get(&stats.accepted),
            get(&stats.evicted),
            get(&stats.refused),
            get(&stats.timed_out),
        )
    }

    /// Close the first evictable connection in eviction order; false if there is none.
    fn evict_one(t: &mut Table) -> bool {
        let victim = t
            .entries
            .iter()
            .filter(|(_, e)| e.evictable())
            .min_by_key(|(_, e)| e.eviction_rank())
            .map(|(id, _)| *id);
        match victim {
            Some(id) => {
                Self::close(t, id);
                true
            }
            None => false,
        }
    }

    fn close(t: &mut Table, id: u64) {
        if let Some(e) = t.entries.get_mut(&id) {
            if !e.closing {
                e.closing = true;
                t.open -= 1;
                if let Some(tx) = e.close.take() {
                    let _ = tx.send(());
                }
            }
        }
    }

    /// Close one idle connection to free a descriptor (the accept loop ran out of them).
    pub fn evict_for_descriptor(&self) -> bool {
        let mut t = self.lock();
        let evicted = Self::evict_one(&mut t);
        self.stats.open.store(t.open as u64, Ordering::Relaxed);
        if evicted {
            self.stats.evicted.fetch_add(1, Ordering::Relaxed);
        }
        evicted
    }

    /// Close connections past their header or idle timeout; returns how many.
    pub fn expire(&self, now: Instant) -> usize {
        let mut t = self.lock();
        let expired: Vec<u64> = t
            .entries
            .iter()
            .filter(|(_, e)| e.evictable())
            .filter(|(_, e)| {
                let limit = match e.phase {
                    Phase::AwaitingFirstHead => self.header_timeout,
                    Phase::Established => self.idle_timeout,
                };
                now.saturating_duration_since(e.idle_since) >= limit
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            Self::close(&mut t, *id);
        }
        self.stats.open.store(t.open as u64, Ordering::Relaxed);
        self.stats
            .timed_out
            .fetch_add(expired.len() as u64, Ordering::Relaxed);
        expired.len()
    }

    /// How often [`Connections::expire`] should run.
    pub fn tick(&self) -> Duration {
        (self.header_timeout.min(self.idle_timeout) / 10)
            .clamp(Duration::from_millis(50), Duration::from_secs(1))
    }
}

/// A connection's entry in the table, also placed in each of its requests' extensions so
/// authentication can mark it. Dropping the last [`SlotGuard`] removes the entry.
#[derive(Debug, Clone)]
pub struct ConnectionHandle {
    table: Arc<Connections>,
    id: u64,
}

impl ConnectionHandle {
    fn with<R>(&self, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        self.table.lock().entries.get_mut(&self.id).map(f)
    }

    /// The connection made a request that passed authentication.
    pub fn mark_authenticated(&self) {
        self.with(|e| e.authenticated = true);
    }

    /// A complete request head arrived: the connection serves it until the returned guard
    /// (held by the response body) is dropped.
    pub fn request_started(&self) -> RequestGuard {
        self.with(|e| {
            e.phase = Phase::Established;
            e.in_flight += 1;
        });
        RequestGuard {
            handle: self.clone(),
        }
    }

    /// hyper stopped driving the connection (it ended, or was upgraded and now belongs to
    /// the handler that took it over): never evictable again.
    pub fn stopped_serving(&self) {
        self.with(|e| e.serving = false);
    }

    /// Guard that removes the entry when the socket is closed.
    pub fn slot(&self) -> SlotGuard {
        SlotGuard {
            handle: self.clone(),
        }
    }
}

/// Held while one request is served; its drop makes the connection idle again.
#[derive(Debug)]
pub struct RequestGuard {
    handle: ConnectionHandle,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.handle.with(|e| {
            e.in_flight = e.in_flight.saturating_sub(1);
            if e.in_flight == 0 {
                e.idle_since = Instant::now();
            }
        });
    }
}

/// Held by the socket: the entry lives exactly as long as the descriptor.
#[derive(Debug)]
pub struct SlotGuard {
    handle: ConnectionHandle,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut t = self.handle.table.lock();
        if let Some(e) = t.entries.remove(&self.handle.id) {
            if !e.closing {
                t.open -= 1;
                self.handle
                    .table
                    .stats
                    .open
                    .store(t.open as u64, Ordering::Relaxed);
            }
        }
    }
}

/// An accepted socket that frees its slot in the table when dropped (also after an
/// upgrade, when hyper has handed it to a WebSocket or tunnel handler).
#[derive(Debug)]
pub struct TrackedStream {
    inner: TcpStream,
    _slot: SlotGuard,
}

impl TrackedStream {
    /// Tie `inner` to its slot.
    pub fn new(inner: TcpStream, slot: SlotGuard) -> Self {
        Self { inner, _slot: slot }
    }
}

impl AsyncRead for TrackedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for TrackedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(cap: usize) -> Arc<Connections> {
        Connections::new(
            cap,
            Duration::from_secs(10),
            Duration::from_secs(60),
            Arc::default(),
        )
    }

    #[test]
    fn a_full_table_evicts_the_oldest_stranger_not_an_authenticated_client() {
        let t = table(3);
        let (client, _client_rx) = t.admit().expect("room");
        let _req = client.request_started();
        client.mark_authenticated();
        drop(_req);
        let (_a, mut a_rx) = t.admit().expect("room");
        let (_b, mut b_rx) = t.admit().expect("room");
        // Full: the fourth evicts the oldest stranger, `a`, not the idle client.
        let (_c, _c_rx) = t.admit().expect("room by eviction");
        assert!(a_rx.try_recv().is_ok(), "a was told to close");
        assert!(b_rx.try_recv().is_err(), "b stays");
        assert_eq!(t.open(), 3);
    }

    #[test]
    fn connections_serving_a_request_are_never_evicted() {
        let t = table(2);
        let (a, mut a_rx) = t.admit().expect("room");
        let (b, mut b_rx) = t.admit().expect("room");
        let _ra = a.request_started();
        let _rb = b.request_started();
        assert!(t.admit().is_none(), "every slot is busy: refuse");
        assert!(a_rx.try_recv().is_err() && b_rx.try_recv().is_err());
        assert_eq!(t.stats.refused.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn strangers_waiting_for_a_head_go_before_idle_keepalive_strangers() {
        let t = table(2);
        let (idle, mut idle_rx) = t.admit().expect("room");
        drop(idle.request_started());
        let (_half, mut half_rx) = t.admit().expect("room");
        let _new = t.admit().expect("room by eviction");
        assert!(
            half_rx.try_recv().is_ok(),
            "the half-open one is evicted first"
        );
        assert!(idle_rx.try_recv().is_err());
    }

    #[test]
    fn heads_and_idle_connections_time_out() {
        let t = table(8);
        let (_half, mut half_rx) = t.admit().expect("room");
        let (idle, mut idle_rx) = t.admit().expect("room");
        drop(idle.request_started());
        let (busy, mut busy_rx) = t.admit().expect("room");
        let _r = busy.request_started();
        let now = Instant::now();
        assert_eq!(t.expire(now + Duration::from_secs(11)), 1);
        assert!(half_rx.try_recv().is_ok());
        assert_eq!(t.expire(now + Duration::from_secs(61)), 1);
        assert!(idle_rx.try_recv().is_ok());
        assert!(
            busy_rx.try_recv().is_err(),
            "a request in flight never times out here"
        );
    }

    #[test]
    fn dropping_the_slot_frees_it() {
        let t = table(1);
        let (a, _rx) = t.admit().expect("room");
        let slot = a.slot();
        let _r = a.request_started();
        assert!(t.admit().is_none());
        drop(_r);
        drop(slot);
        assert_eq!(t.open(), 0);
        assert!(t.admit().is_some());
    }
}
