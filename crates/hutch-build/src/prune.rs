//! Pruning the step cache: its index entries and the build snapshots they name, least
//! recently used first (an entry is used when a build writes it or hits it), as
//! `docker builder prune` does.
//!
//! A prune waits for running builds to end and holds new ones back while it works (a
//! build that found a cache hit must still find its snapshot). Build snapshots no entry
//! names (an entry rewritten by a `--no-cache` build leaves its old one) are removed too,
//! once they are older than [`ORPHAN_GRACE`]; entries whose snapshot is gone are dropped.
//! The server prunes by itself every [`AUTO_PRUNE_EVERY`] with its limits (`hutch serve
//! --build-cache-max-mib`, `--build-cache-max-age-hours`), skipping a round while builds
//! run.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use hutch_core::ids::SnapshotId;

use crate::builds::Builder;
use crate::cache::CacheEntry;
use crate::error::BuildError;

/// How often the server prunes by itself.
pub const AUTO_PRUNE_EVERY: Duration = Duration::from_secs(10 * 60);
/// A build snapshot no entry names is kept this long (a step records its entry right
/// after its snapshot is taken).
pub const ORPHAN_GRACE: Duration = Duration::from_secs(10 * 60);
/// A test hook (debug builds only): this many seconds instead of [`ORPHAN_GRACE`].
pub const ORPHAN_GRACE_ENV: &str = "HUTCH_TEST_BUILD_ORPHAN_GRACE_SECONDS";

fn orphan_grace() -> Duration {
    #[cfg(debug_assertions)]
    if let Some(secs) = std::env::var(ORPHAN_GRACE_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return Duration::from_secs(secs);
    }
    ORPHAN_GRACE
}

/// What to prune.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrunePolicy {
    /// Everything.
    pub all: bool,
    /// Entries not used for this long.
    pub unused_for: Option<Duration>,
    /// The least recently used entries until what is left takes at most this many bytes.
    pub keep_bytes: Option<u64>,
}

/// What a prune did, and what the cache holds now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// Entries removed with their snapshots.
    pub removed_entries: usize,
    /// Snapshots removed that no entry named.
    pub removed_orphans: usize,
    /// Bytes of the snapshots removed.
    pub freed_bytes: u64,
    /// What is left.
    pub usage: CacheUsage,
}

/// How much the step cache holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CacheUsage {
    /// Index entries.
    pub entries: usize,
    /// Bytes of the build snapshots they name.
    pub bytes: u64,
    /// When the least recently used entry was last used (RFC 3339), if any.
    pub oldest_used_at: Option<String>,
}

fn rfc3339(t: SystemTime) -> String {
    let ms = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    hutch_core::time::rfc3339(ms)
}

/// The size of each build snapshot, by id.
fn sizes(snapshots: &[hutch_core::snapshot::SnapshotRecord]) -> HashMap<SnapshotId, u64> {
    snapshots
        .iter()
        .map(|s| (s.id.clone(), s.size_bytes))
        .collect()
}

/// What `entries` hold: those whose snapshot exists (in `sizes`), each snapshot's bytes
/// counted once (several entries may name one: a step whose key was made twice).
fn usage_of(entries: &[CacheEntry], sizes: &HashMap<SnapshotId, u64>) -> CacheUsage {
    let named: Vec<&CacheEntry> = entries
        .iter()
        .filter(|e| sizes.contains_key(&e.snapshot))
        .collect();
    let snapshots: HashSet<&SnapshotId> = named.iter().map(|e| &e.snapshot).collect();
    CacheUsage {
        entries: named.len(),
        bytes: snapshots.iter().map(|id| sizes[*id]).sum(),
        oldest_used_at: named.iter().map(|e| e.used).min().map(rfc3339),
    }
}

impl Builder {
    /// How much the step cache holds.
    pub async fn cache_usage(&self) -> Result<CacheUsage, BuildError> {
        let entries = self
            .cache
            .entries()
            .map_err(BuildError::io("reading the step cache"))?;
        let snapshots = self.manager.build_snapshots().await?;
        Ok(usage_of(&entries, &sizes(&snapshots)))
    }

    /// Prune the step cache by `policy`, once running builds are done.
    pub async fn prune_cache(
        self: &Arc<Self>,
        policy: PrunePolicy,
    ) -> Result<PruneReport, BuildError> {
        let _no_builds = self.prune_lock.write().await;
        self.prune_locked(policy).await
    }

    /// [`Builder::prune_cache`] unless a build is running (then `None`): the server's own
    /// rounds.
    pub async fn prune_cache_if_idle(
        self: &Arc<Self>,
        policy: PrunePolicy,
    ) -> Result<Option<PruneReport>, BuildError> {
        let Ok(_no_builds) = self.prune_lock.try_write() else {
            return Ok(None);
        };
        self.prune_locked(policy).await.map(Some)
    }

    /// Prune with the server's limits ([`crate::BuildSettings::auto_prune`]) every
    /// [`AUTO_PRUNE_EVERY`], from now on (nothing when no limit is set). The task holds
    /// only a weak reference: it ends with the builder.
    pub fn spawn_auto_prune(self: &Arc<Self>) {
        let policy = self.settings.auto_prune;
        if policy.unused_for.is_none() && policy.keep_bytes.is_none() {
            return;
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(AUTO_PRUNE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(builder) = weak.upgrade() else {
                    return;
                };
                if let Err(e) = builder.prune_cache_if_idle(policy).await {
                    tracing::warn!(error = %e, "pruning the step cache");
                }
            }
        });
    }

    async fn prune_locked(&self, policy: PrunePolicy) -> Result<PruneReport, BuildError> {
        let now = SystemTime::now();
        let mut entries = self
            .cache
            .entries()
            .map_err(BuildError::io("reading the step cache"))?;
        let snapshots = self.manager.build_snapshots().await?;
        let mut sizes = sizes(&snapshots);
        let mut report = PruneReport::default();

        // Entries whose snapshot is gone name nothing.
        entries.retain(|e| {
            let kept = sizes.contains_key(&e.snapshot);
            if !kept {
                let _ = self.cache.remove(&e.key);
            }
            kept
        });
        // Snapshots no entry names, once past their grace.
        let named: HashSet<_> = entries.iter().map(|e| e.snapshot.clone()).collect();
        let now_ms = hutch_core::time::now_ms();
        let grace = orphan_grace();
        for s in &snapshots {
            let age = Duration::from_millis(now_ms.saturating_sub(s.created_at_ms).max(0) as u64);
            if !named.contains(&s.id) && age >= grace {
                match self.manager.delete_build_snapshot(&s.id).await {
                    Ok(()) => {
                        report.removed_orphans += 1;
                        report.freed_bytes += s.size_bytes;
                    }
                    Err(e) => {
                        tracing::warn!(snapshot = %s.id, error = %e, "pruning an unnamed build snapshot")
                    }
                }
            }
        }

        // The rest, least recently used first.
        entries.sort_by_key(|e| e.used);
        let mut total = usage_of(&entries, &sizes).bytes;
        let mut left = Vec::new();
        for e in entries {
            let stale = policy
                .unused_for
                .is_some_and(|d| now.duration_since(e.used).unwrap_or_default() >= d);
            let over = policy.keep_bytes.is_some_and(|keep| total > keep);
            if !(policy.all || stale || over) {
                left.push(e);
                continue;
            }
            // The snapshot first: a build that reads the entry in between finds no
            // snapshot and runs the step, never a missing base.
            match self.manager.delete_build_snapshot(&e.snapshot).await {
                Ok(()) => {
                    let size = sizes.remove(&e.snapshot).unwrap_or(0);
                    report.freed_bytes += size;
                    total = total.saturating_sub(size);
                }
                Err(hutch_core::CoreError::NotFound(_)) => {}
                Err(e2) => {
                    tracing::warn!(snapshot = %e.snapshot, error = %e2, "pruning a build snapshot");
                    left.push(e);
                    continue;
                }
            }
            self.cache
                .remove(&e.key)
                .map_err(BuildError::io("removing a step cache entry"))?;
            report.removed_entries += 1;
        }
        report.usage = usage_of(&left, &sizes);
        if report.removed_entries + report.removed_orphans > 0 {
            tracing::info!(
                entries = report.removed_entries,
                orphans = report.removed_orphans,
                bytes = report.freed_bytes,
                "pruned the step cache"
            );
        }
        Ok(report)
    }
}
