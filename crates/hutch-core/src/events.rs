//! Lifecycle events, broadcast to `/v1/events` subscribers.

use serde::Serialize;
use tokio::sync::broadcast;

/// One lifecycle event.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// `sandbox.created`, `sandbox.killed`, `sandbox.expired`, `sandbox.failed`, `sandbox.oom`,
    /// `sandbox.preparing` (a create building vm assets on first use; `detail` says which)…
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
}

/// The event bus: a bounded broadcast; slow subscribers lose old events, never block.
#[derive(Debug, Clone)]
pub struct EventBus {
    tx: broadcast::Sender<Event>,
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new()
    }
}

impl EventBus {
    /// A bus keeping the last 1024 events for slow readers.
    pub fn new() -> Self {
        Self {
            tx: broadcast::channel(1024).0,
        }
    }

    /// Publish (dropped if nobody listens).
    pub fn publish(
        &self,
        kind: &str,
        sandbox_id: &str,
        tenant_id: Option<String>,
        detail: Option<String>,
    ) {
        let _ = self.tx.send(Event {
            kind: kind.into(),
            sandbox_id: sandbox_id.into(),
            tenant_id,
            at: crate::time::rfc3339(crate::time::now_ms()),
            detail,
        });
    }

    /// A new subscription.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }
}
