//! Lifecycle events, broadcast to `/v1/events` subscribers, with a replay window.
//!
//! Every event gets a sequence number (`seq`, increasing from 1 for the server's life; the
//! SSE `id`). The bus keeps the last [`REPLAY_WINDOW`] events, so a client that reconnects
//! with `?since=N` (or `Last-Event-ID: N`) gets every event after `N` that is still kept,
//! then the live ones, each exactly once; events it missed beyond the window are counted in a
//! `events.lost` event instead of being silently skipped.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;
use tokio::sync::broadcast;

/// How many past events the bus keeps for reconnecting clients.
pub const REPLAY_WINDOW: usize = 4096;

/// What an exec was, for `sandbox.exec` events: never its output, stdin or environment.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ExecInfo {
    /// The program and its arguments (`["sh", "-c", script]` for shell commands).
    pub argv: Vec<String>,
    /// How it ran: `collected` (`/exec`), `stream` (`/exec/stream`), `pty`, or `process`
    /// (a process handle started: its exit is there only when the starting call streamed
    /// it to the end).
    pub mode: &'static str,
    /// Its exit code, if it exited (`None`: killed with the sandbox, or the client left).
    pub exit_code: Option<i32>,
    /// Killed by the exec's timeout.
    pub timed_out: bool,
    /// From start to end, in milliseconds.
    pub duration_ms: u64,
}

/// One lifecycle event.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Increasing from 1 for the server's life (the SSE event id).
    pub seq: u64,
    /// `sandbox.created`, `sandbox.killed`, `sandbox.expired`, `sandbox.failed`, `sandbox.oom`,
    /// `sandbox.exec`, `sandbox.preparing` (a create building vm assets on first use; `detail`
    /// says which)…
    #[serde(rename = "type")]
    pub kind: String,
    /// The sandbox concerned.
    pub sandbox_id: String,
    /// Its `tenant_id` metadata, if any (events are filtered by tenant).
    pub tenant_id: Option<String>,
    /// RFC 3339.
    pub at: String,
    /// Extra detail (e.g. the failure reason).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// For `sandbox.exec`: what ran and how it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecInfo>,
}

/// The kept events and the next sequence number, changed together.
struct Window {
    next_seq: u64,
    kept: VecDeque<Event>,
}

/// Fan-out of events to any number of subscribers, with the last [`REPLAY_WINDOW`] kept.
pub struct EventBus {
    tx: broadcast::Sender<Event>,
    window: Mutex<Window>,
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new()
    }
}

/// What [`EventBus::subscribe_since`] hands a subscriber.
pub struct Subscription {
    /// Kept events after the asked-for one, oldest first.
    pub replay: Vec<Event>,
    /// How many events after the asked-for one are no longer kept.
    pub lost: u64,
    /// The live events from here on (none of `replay` again).
    pub live: broadcast::Receiver<Event>,
}

impl EventBus {
    /// A bus keeping the last [`REPLAY_WINDOW`] events (and as many for slow live readers).
    pub fn new() -> Self {
        Self {
            tx: broadcast::channel(1024).0,
            window: Mutex::new(Window {
                next_seq: 1,
                kept: VecDeque::with_capacity(REPLAY_WINDOW),
            }),
        }
    }

    /// Publish an event (dropped silently when nobody listens).
    pub fn publish(
        &self,
        kind: &str,
        sandbox_id: &str,
        tenant_id: Option<String>,
        detail: Option<String>,
    ) {
        self.publish_event(kind, sandbox_id, tenant_id, detail, None);
    }

    /// Publish a `sandbox.exec` event.
    pub fn publish_exec(&self, sandbox_id: &str, tenant_id: Option<String>, exec: ExecInfo) {
        self.publish_event("sandbox.exec", sandbox_id, tenant_id, None, Some(exec));
    }

    fn publish_event(
        &self,
        kind: &str,
        sandbox_id: &str,
        tenant_id: Option<String>,
        detail: Option<String>,
        exec: Option<ExecInfo>,
    ) {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let event = Event {
            seq: w.next_seq,
            kind: kind.into(),
            sandbox_id: sandbox_id.into(),
            tenant_id,
            at: crate::time::rfc3339(crate::time::now_ms()),
            detail,
            exec,
        };
        w.next_seq += 1;
        if w.kept.len() == REPLAY_WINDOW {
            w.kept.pop_front();
        }
        w.kept.push_back(event.clone());
        // Sent under the lock: a subscriber taking the lock sees each event either in its
        // replay or on its receiver, never both and never neither.
        let _ = self.tx.send(event);
    }

    /// Subscribe to live events.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    /// Subscribe, replaying the kept events after `since` first (`None`: live only).
    pub fn subscribe_since(&self, since: Option<u64>) -> Subscription {
        let w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        let live = self.tx.subscribe();
        let Some(since) = since else {
            return Subscription {
                replay: Vec::new(),
                lost: 0,
                live,
            };
        };
        let replay: Vec<Event> = w.kept.iter().filter(|e| e.seq > since).cloned().collect();
        let first_kept = w.kept.front().map_or(w.next_seq, |e| e.seq);
        let lost = first_kept.saturating_sub(since.saturating_add(1));
        Subscription { replay, lost, live }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish_n(bus: &EventBus, n: usize) {
        for i in 0..n {
            bus.publish("sandbox.created", &format!("sbx_{i}"), None, None);
        }
    }

    #[test]
    fn a_reconnecting_subscriber_gets_what_it_missed_once_then_live_events() {
        let bus = EventBus::new();
        publish_n(&bus, 5);
        let mut sub = bus.subscribe_since(Some(3));
        assert_eq!(sub.replay.iter().map(|e| e.seq).collect::<Vec<_>>(), [4, 5]);
        assert_eq!(sub.lost, 0);
        bus.publish("sandbox.killed", "sbx_x", None, None);
        let live = sub.live.try_recv().expect("live event");
        assert_eq!((live.seq, live.kind.as_str()), (6, "sandbox.killed"));
        assert!(sub.live.try_recv().is_err(), "nothing twice");
        // Live only, and a client that saw everything.
        assert!(bus.subscribe_since(None).replay.is_empty());
        let caught_up = bus.subscribe_since(Some(6));
        assert!(caught_up.replay.is_empty() && caught_up.lost == 0);
    }

    #[test]
    fn events_older_than_the_window_are_counted_as_lost() {
        let bus = EventBus::new();
        publish_n(&bus, REPLAY_WINDOW + 10);
        let sub = bus.subscribe_since(Some(0));
        assert_eq!(sub.replay.len(), REPLAY_WINDOW);
        assert_eq!(sub.replay[0].seq, 11);
        assert_eq!(sub.lost, 10);
        let sub = bus.subscribe_since(Some(5));
        assert_eq!(sub.lost, 5);
    }
}
