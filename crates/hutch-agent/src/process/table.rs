//! The process table: every process handle by pid and by tag, live or recently exited.
//!
//! A tag is unique among live handles: it is reserved before the process is spawned (so two
//! starts with one tag cannot both succeed) and freed when the process exits. Exited
//! handles are kept for late attaches: the last [`MAX_EXITED`], none longer than
//! [`EXITED_RETENTION`], and no more than [`MAX_EXITED_BYTES`] of output between them
//! (the oldest go first). A pid or tag names the live handle that has it, else the most
//! recently exited one.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hutch_proto::{ProcessInfo, ProcessSelector};
use tokio::time::Instant;

use super::Process;
use crate::error::Failure;

/// Exited handles kept at most.
pub const MAX_EXITED: usize = 64;
/// How long an exited handle is kept.
pub const EXITED_RETENTION: Duration = Duration::from_secs(600);
/// Output kept by exited handles together.
pub const MAX_EXITED_BYTES: usize = 32 << 20;

#[derive(Debug, Default)]
struct Inner {
    live: BTreeMap<u32, Arc<Process>>,
    /// Tag → the live pid that has it; `None` while its start is under way.
    tags: HashMap<String, Option<u32>>,
    /// Oldest first, with when each exited.
    exited: VecDeque<(Instant, Arc<Process>)>,
}

/// Every process handle of the agent (see the module docs).
#[derive(Debug, Default)]
pub struct ProcessTable {
    inner: Mutex<Inner>,
}

/// A tag held for a start under way; freed on drop unless the process was registered.
#[derive(Debug)]
pub struct TagReservation<'a> {
    table: &'a ProcessTable,
    tag: Option<String>,
}

impl Drop for TagReservation<'_> {
    fn drop(&mut self) {
        if let Some(tag) = self.tag.take() {
            let mut inner = self.table.lock();
            if inner.tags.get(&tag) == Some(&None) {
                inner.tags.remove(&tag);
            }
        }
    }
}

impl ProcessTable {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Single inserts and removes cannot leave the table inconsistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hold `tag` for a process about to start; `already_exists` when a live handle (or
    /// another start) has it.
    pub fn reserve_tag(&self, tag: &str) -> Result<TagReservation<'_>, Failure> {
        let mut inner = self.lock();
        if let Some(owner) = inner.tags.get(tag) {
            let who = owner.map_or_else(
                || "a process being started".into(),
                |p| format!("process {p}"),
            );
            return Err(Failure::AlreadyExists(format!(
                "the tag {tag:?} is taken by {who}: tags are unique among running processes"
            )));
        }
        inner.tags.insert(tag.to_string(), None);
        Ok(TagReservation {
            table: self,
            tag: Some(tag.to_string()),
        })
    }

    /// Register a started process (under its reserved tag, if any).
    pub fn insert(&self, process: Arc<Process>, mut tag: Option<TagReservation<'_>>) {
        let mut inner = self.lock();
        if let Some(tag) = tag.as_mut().and_then(|t| t.tag.take()) {
            inner.tags.insert(tag, Some(process.pid));
        }
        inner.live.insert(process.pid, process);
        drop(inner);
        drop(tag);
    }

    /// The process `pid` has exited: keep it for late attaches, free its tag.
    pub fn exited(self: &Arc<Self>, pid: u32) {
        let mut inner = self.lock();
        let Some(process) = inner.live.remove(&pid) else {
            return;
        };
        if let Some(tag) = &process.tag {
            if inner.tags.get(tag) == Some(&Some(pid)) {
                inner.tags.remove(tag);
            }
        }
        inner.exited.push_back((Instant::now(), process));
        prune(&mut inner);
        drop(inner);
        // Forget it when its time is up, whether or not anyone asks meanwhile.
        let table = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(EXITED_RETENTION).await;
            prune(&mut table.lock());
        });
    }

    /// The handle `selector` names (live first, else the most recently exited).
    pub fn find(&self, selector: &ProcessSelector) -> Option<Arc<Process>> {
        let mut inner = self.lock();
        prune(&mut inner);
        let live = match selector {
            ProcessSelector::Pid(pid) => inner.live.get(pid).cloned(),
            ProcessSelector::Tag(tag) => match inner.tags.get(tag) {
                Some(Some(pid)) => inner.live.get(pid).cloned(),
                _ => None,
            },
        };
        live.or_else(|| {
            inner
                .exited
                .iter()
                .rev()
                .map(|(_, p)| p)
                .find(|p| match selector {
                    ProcessSelector::Pid(pid) => p.pid == *pid,
                    ProcessSelector::Tag(tag) => p.tag.as_deref() == Some(tag.as_str()),
                })
                .cloned()
        })
    }

    /// Every handle kept: live ones by pid, then exited ones oldest first.
    pub fn list(&self) -> Vec<ProcessInfo> {
        let mut inner = self.lock();
        prune(&mut inner);
        let live = inner.live.values();
        let exited = inner.exited.iter().map(|(_, p)| p);
        live.chain(exited).map(|p| p.info()).collect()
    }
}

/// Forget exited handles past the count, the age or the bytes allowed.
fn prune(inner: &mut Inner) {
    let now = Instant::now();
    let mut bytes: usize = inner
        .exited
        .iter()
        .map(|(_, p)| p.output.kept_bytes())
        .sum();
    while let Some((at, process)) = inner.exited.front() {
        let too_many = inner.exited.len() > MAX_EXITED;
        let too_old = now.duration_since(*at) >= EXITED_RETENTION;
        if !(too_many || too_old || bytes > MAX_EXITED_BYTES) {
            break;
        }
        bytes -= process.output.kept_bytes();
        inner.exited.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::tests::process;

    #[tokio::test]
    async fn tags_are_unique_among_live_handles_only() {
        let table = Arc::new(ProcessTable::default());
        let reservation = table.reserve_tag("web").expect("free");
        assert!(table.reserve_tag("web").is_err(), "reserved while starting");
        table.insert(process(10, Some("web")), Some(reservation));
        let taken = table.reserve_tag("web").expect_err("live");
        assert_eq!(
            taken.to_string(),
            "the tag \"web\" is taken by process 10: tags are unique among running processes"
        );
        // A failed start gives its tag back.
        drop(table.reserve_tag("other").expect("free"));
        assert!(table.reserve_tag("other").is_ok());

        table.exited(10);
        let again = table.reserve_tag("web").expect("free once it exited");
        table.insert(process(11, Some("web")), Some(again));
        let by_tag = table.find(&ProcessSelector::Tag("web".into()));
        assert_eq!(by_tag.map(|p| p.pid), Some(11), "the live one first");
        table.exited(11);
        let by_tag = table.find(&ProcessSelector::Tag("web".into()));
        assert_eq!(by_tag.map(|p| p.pid), Some(11), "then the latest exited");
        assert_eq!(
            table.find(&ProcessSelector::Pid(10)).map(|p| p.pid),
            Some(10)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn exited_handles_are_forgotten_by_count_and_by_age() {
        let table = Arc::new(ProcessTable::default());
        for pid in 1..=(MAX_EXITED as u32 + 5) {
            table.insert(process(pid, None), None);
            table.exited(pid);
        }
        let kept = table.list();
        assert_eq!(kept.len(), MAX_EXITED);
        assert_eq!(kept[0].pid, 6, "the oldest went first");
        assert!(table.find(&ProcessSelector::Pid(5)).is_none());
        tokio::time::sleep(EXITED_RETENTION + Duration::from_secs(1)).await;
        assert!(table.list().is_empty());
    }
}
