//! Polled file watchers: a [`FileWatch`] kept by the server, whose events a client collects
//! with one call now and then instead of holding a stream open (E2B's `CreateWatcher`,
//! `GetWatcherEvents`, `RemoveWatcher`).
//!
//! Each watcher has a task that reads its watch into a bounded buffer
//! ([`MAX_BUFFERED_EVENTS`]; past it, events are counted as dropped). A poll takes what is
//! buffered. A watcher is forgotten when it is removed, when its sandbox is gone, or when
//! nobody polled it for [`WATCHER_IDLE`]. A sandbox has at most [`MAX_WATCHERS_PER_SANDBOX`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hutch_proto::{FileEvent, WatchEnd, WatchMessage, WatchReady, WatchWarning};
use serde::Serialize;

use super::watch::{FileWatch, WatchOptions};
use super::Manager;
use crate::error::{CoreError, CoreResult};
use crate::ids::{self, SandboxId};

/// Events a watcher keeps between two polls.
pub const MAX_BUFFERED_EVENTS: usize = 10_000;
/// Watchers one sandbox may have at once.
pub const MAX_WATCHERS_PER_SANDBOX: usize = 64;
/// A watcher nobody polled for this long is removed.
pub const WATCHER_IDLE: Duration = Duration::from_secs(10 * 60);
/// How often a watcher's task looks at its idle time.
const IDLE_CHECK: Duration = Duration::from_secs(30);
/// What watcher ids start with.
pub const WATCHER_ID_PREFIX: &str = "wch_";

/// A watcher, as created.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct WatcherInfo {
    /// Its id (`wch_…`), for polls and removal.
    pub id: String,
    /// What the agent confirmed when the watch was armed.
    #[serde(flatten)]
    pub ready: WatchReady,
}

/// What a poll collects: everything since the previous poll.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct WatcherEvents {
    /// Events, in order.
    pub events: Vec<FileEvent>,
    /// Warnings (events lost in the kernel, directories not watched).
    pub warnings: Vec<WatchWarning>,
    /// Events left out because the buffer was full ([`MAX_BUFFERED_EVENTS`]).
    pub dropped: u64,
    /// Set once the watch is over (the directory went away, the sandbox stopped); every
    /// later poll returns it too. The watcher stays until removed or idle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<WatchEnd>,
}

/// One watcher's buffer.
struct Slot {
    sandbox: SandboxId,
    buffer: WatcherEvents,
    last_poll: Instant,
    /// Ends the watcher's task (and with it the watch in the agent) at once.
    task: Option<tokio::task::AbortHandle>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Every watcher of the server.
#[derive(Default, Clone)]
pub(crate) struct Watchers {
    slots: Arc<Mutex<HashMap<String, Slot>>>,
}

impl Watchers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Manager {
    /// Start a polled watcher of the directory `path` of sandbox `id` (armed when this
    /// returns). Errors as [`Manager::watch_files`], and [`CoreError::Quota`] past
    /// [`MAX_WATCHERS_PER_SANDBOX`].
    pub async fn create_watcher(
        self: &Arc<Self>,
        id: &SandboxId,
        path: &str,
        options: WatchOptions,
    ) -> CoreResult<WatcherInfo> {
        let count = |w: &Watchers| w.lock().values().filter(|s| &s.sandbox == id).count();
        if count(&self.watchers) >= MAX_WATCHERS_PER_SANDBOX {
            return Err(too_many(id));
        }
        let watch = self.watch_files(id, path, options).await?;
        let info = WatcherInfo {
            id: format!("{WATCHER_ID_PREFIX}{}", ids::random_token(20)),
            ready: watch.ready().clone(),
        };
        {
            let mut slots = self.watchers.lock();
            if slots.values().filter(|s| &s.sandbox == id).count() >= MAX_WATCHERS_PER_SANDBOX {
                return Err(too_many(id));
            }
            slots.insert(
                info.id.clone(),
                Slot {
                    sandbox: id.clone(),
                    buffer: WatcherEvents::default(),
                    last_poll: Instant::now(),
                    task: None,
                },
            );
        }
        let task = tokio::spawn(collect(
            Arc::downgrade(self),
            self.watchers.clone(),
            info.id.clone(),
            id.clone(),
            watch,
        ));
        if let Some(slot) = self.watchers.lock().get_mut(&info.id) {
            slot.task = Some(task.abort_handle());
        }
        Ok(info)
    }

    /// Everything watcher `watcher` of sandbox `id` collected since the last poll. An unknown
    /// watcher (or one of another sandbox) is [`CoreError::NotFound`].
    pub fn watcher_events(&self, id: &SandboxId, watcher: &str) -> CoreResult<WatcherEvents> {
        let mut slots = self.watchers.lock();
        let slot = slots
            .get_mut(watcher)
            .filter(|s| &s.sandbox == id)
            .ok_or_else(|| unknown(id, watcher))?;
        slot.last_poll = Instant::now();
        let end = slot.buffer.end.clone();
        Ok(std::mem::replace(
            &mut slot.buffer,
            WatcherEvents {
                end,
                ..WatcherEvents::default()
            },
        ))
    }

    /// Stop and forget watcher `watcher` of sandbox `id`.
    pub fn remove_watcher(&self, id: &SandboxId, watcher: &str) -> CoreResult<()> {
        let mut slots = self.watchers.lock();
        match slots.get(watcher) {
            Some(slot) if &slot.sandbox == id => {
                slots.remove(watcher);
                Ok(())
            }
            _ => Err(unknown(id, watcher)),
        }
    }
}

fn unknown(id: &SandboxId, watcher: &str) -> CoreError {
    CoreError::NotFound(format!("sandbox {id} has no watcher {watcher}"))
}

fn too_many(id: &SandboxId) -> CoreError {
    CoreError::Quota(format!(
        "sandbox {id} already has {MAX_WATCHERS_PER_SANDBOX} watchers: remove one first"
    ))
}

/// The task of one watcher: buffer what its watch reports until the watcher is removed,
/// idle, or its sandbox is gone.
async fn collect(
    mgr: std::sync::Weak<Manager>,
    watchers: Watchers,
    watcher: String,
    sandbox: SandboxId,
    watch: FileWatch,
) {
    let mut watch = Some(watch);
    loop {
        let watching = watch.is_some();
        let next = match watch.as_mut() {
            Some(watch) => tokio::time::timeout(IDLE_CHECK, watch.next()).await.ok(),
            None => {
                tokio::time::sleep(IDLE_CHECK).await;
                None
            }
        };
        let mut check_sandbox = false;
        {
            let mut slots = watchers.lock();
            let Some(slot) = slots.get_mut(&watcher) else {
                return; // removed (and this task aborted, but for a race)
            };
            if slot.last_poll.elapsed() >= WATCHER_IDLE {
                slot.task = None; // this task: ends by returning
                slots.remove(&watcher);
                return;
            }
            let buffer = &mut slot.buffer;
            match next {
                None if watching => {} // no news within the check interval
                None => check_sandbox = true,
                Some(Some(Ok(WatchMessage::Event(event)))) => {
                    if buffer.events.len() < MAX_BUFFERED_EVENTS {
                        buffer.events.push(event);
                    } else {
                        buffer.dropped += 1;
                    }
                }
                Some(Some(Ok(WatchMessage::Warning(warning)))) => buffer.warnings.push(warning),
                Some(Some(Ok(WatchMessage::Ready(_)))) => {}
                Some(Some(Ok(WatchMessage::End(end)))) => {
                    buffer.end = Some(end);
                    watch = None;
                }
                Some(Some(Err(e))) => {
                    buffer.end = Some(WatchEnd {
                        reason: e.to_string(),
                    });
                    watch = None;
                    check_sandbox = true;
                }
                Some(None) => {
                    buffer.end.get_or_insert(WatchEnd {
                        reason: "the watch ended".into(),
                    });
                    watch = None;
                }
            }
        }
        if check_sandbox {
            let gone = match mgr.upgrade() {
                None => true,
                Some(mgr) => mgr.load(&sandbox).await.is_err(),
            };
            if gone {
                if let Some(mut slot) = watchers.lock().remove(&watcher) {
                    slot.task = None;
                }
                return;
            }
        }
    }
}
