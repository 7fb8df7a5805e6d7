//! Keys already checked, and the signal that ends what a revoked key holds open.
//!
//! [`KeyCache`]: a short-lived cache of authenticated keys, so a request does not hash and
//! look up its key in the database every time. Entries are kept under the key's SHA-256,
//! never the key itself, for at most [`KEY_CACHE_TTL`], and at most [`KEY_CACHE_MAX`] of
//! them (the oldest go first). A key revoked through this server is evicted at once
//! ([`KeyCache::evict`]); one removed from the database behind the server's back stops
//! working within [`KEY_CACHE_TTL`]. An expired key is never answered from the cache.
//! While the database cannot be reached at all, a key checked in the last
//! [`KEY_CACHE_STALE_MAX`] is still believed ([`KeyCache::get_while_unreachable`]): a
//! cluster node that lost its database keeps serving the clients it knows.
//!
//! [`Revocations`]: one `watch` channel per key in use; revoking a key fires it, and every
//! request, stream and WebSocket of that key waits on it ([`crate::auth::Revocation`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hutch_core::ids::KeyId;
use hutch_core::tenant::keys::KeyRecord;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// How long a key, once checked against the database, is believed without asking again.
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(5);
/// How many keys the cache holds at most.
pub const KEY_CACHE_MAX: usize = 4096;
/// How long after its last check a key is still believed while the database cannot be
/// reached at all (cluster mode: a node that lost the database keeps serving the keys it
/// saw; [`KeyCache::get_while_unreachable`]).
pub const KEY_CACHE_STALE_MAX: Duration = Duration::from_secs(600);

/// Authenticated keys and when each was checked.
#[derive(Default)]
pub struct KeyCache {
    entries: HashMap<[u8; 32], (Arc<KeyRecord>, Instant)>,
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl KeyCache {
    /// The record of `key` if it was checked less than [`KEY_CACHE_TTL`] before `now` and
    /// has not expired by `now_ms`.
    pub fn get(&mut self, key: &str, now: Instant, now_ms: i64) -> Option<Arc<KeyRecord>> {
        let d = digest(key);
        match self.entries.get(&d) {
            Some((record, at))
                if now.saturating_duration_since(*at) < KEY_CACHE_TTL
                    && !record.expired(now_ms) =>
            {
                Some(record.clone())
            }
            Some((record, at))
                if now.saturating_duration_since(*at) >= KEY_CACHE_STALE_MAX
                    || record.expired(now_ms) =>
            {
                self.entries.remove(&d);
                None
            }
            // Kept for [`KeyCache::get_while_unreachable`].
            _ => None,
        }
    }

    /// The record of `key` if it was checked less than [`KEY_CACHE_STALE_MAX`] before `now`
    /// and has not expired: for when the database cannot be reached to check it again.
    pub fn get_while_unreachable(
        &self,
        key: &str,
        now: Instant,
        now_ms: i64,
    ) -> Option<Arc<KeyRecord>> {
        match self.entries.get(&digest(key)) {
            Some((record, at))
                if now.saturating_duration_since(*at) < KEY_CACHE_STALE_MAX
                    && !record.expired(now_ms) =>
            {
                Some(record.clone())
            }
            _ => None,
        }
    }

    /// Remember that `key` is `record`, as checked at `now`.
    pub fn insert(&mut self, key: &str, record: Arc<KeyRecord>, now: Instant) {
        if self.entries.len() >= KEY_CACHE_MAX {
            self.entries
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < KEY_CACHE_STALE_MAX);
            if self.entries.len() >= KEY_CACHE_MAX {
                if let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(d, _)| *d)
                {
                    self.entries.remove(&oldest);
                }
            }
        }
        self.entries.insert(digest(key), (record, now));
    }

    /// Forget the keys whose ids are `ids` (revoked).
    pub fn evict(&mut self, ids: &[KeyId]) {
        self.entries
            .retain(|_, (record, _)| !ids.contains(&record.id));
    }
}

/// One channel per key in use, fired when it is revoked.
#[derive(Default)]
pub struct Revocations {
    senders: Mutex<HashMap<KeyId, watch::Sender<bool>>>,
}

impl Revocations {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<KeyId, watch::Sender<bool>>> {
        self.senders.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A receiver that turns `true` when key `id` is revoked.
    pub fn watch(&self, id: &KeyId) -> watch::Receiver<bool> {
        let mut senders = self.lock();
        if senders.len() >= KEY_CACHE_MAX {
            // Channels nothing listens to any more go (a key in use makes a new one).
            senders.retain(|_, tx| tx.receiver_count() > 0);
        }
        senders
            .entry(id.clone())
            .or_insert_with(|| watch::channel(false).0)
            .subscribe()
    }

    /// Fire the channels of `ids`: every request and stream of those keys ends.
    pub fn revoke(&self, ids: &[KeyId]) {
        let mut senders = self.lock();
        for id in ids {
            if let Some(tx) = senders.remove(id) {
                tx.send_replace(true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hutch_core::tenant::keys::{KeyFormat, KeyScope, NewKey};
    use hutch_core::tenant::Tenant;

    fn record(expires_at_ms: Option<i64>) -> Arc<KeyRecord> {
        Arc::new(
            NewKey {
                tenant: Tenant::new("a"),
                scope: KeyScope::Full,
                name: None,
                selector: Default::default(),
                expires_at_ms,
                format: KeyFormat::Hutch,
                budget: Default::default(),
            }
            .record("hk_x", 0),
        )
    }

    #[test]
    fn a_key_is_believed_only_for_the_ttl_and_before_it_expires() {
        let mut cache = KeyCache::default();
        let t0 = Instant::now();
        cache.insert("hk_a", record(None), t0);
        assert!(cache.get("hk_a", t0 + Duration::from_secs(1), 0).is_some());
        assert!(cache.get("hk_b", t0, 0).is_none());
        assert!(cache.get("hk_a", t0 + KEY_CACHE_TTL, 0).is_none(), "stale");
        // Kept, for when the database cannot be reached, up to its bound.
        let late = t0 + KEY_CACHE_TTL + Duration::from_secs(60);
        assert!(cache.get_while_unreachable("hk_a", late, 0).is_some());
        assert!(cache.get_while_unreachable("hk_b", late, 0).is_none());
        assert!(cache
            .get_while_unreachable("hk_a", t0 + KEY_CACHE_STALE_MAX, 0)
            .is_none());
        assert!(cache.get("hk_a", t0 + KEY_CACHE_STALE_MAX, 0).is_none());
        assert!(
            cache.entries.is_empty(),
            "an entry past its bound is dropped"
        );
        cache.insert("hk_e", record(Some(100)), t0);
        assert!(cache.get("hk_e", t0, 99).is_some());
        assert!(
            cache.get("hk_e", t0, 100).is_none(),
            "expired in the cache too"
        );
        assert!(
            cache.get_while_unreachable("hk_e", t0, 100).is_none(),
            "and while the database is unreachable"
        );
    }

    #[test]
    fn the_cache_is_bounded_and_never_holds_a_key_in_clear() {
        let mut cache = KeyCache::default();
        let t0 = Instant::now();
        let r = record(None);
        for i in 0..KEY_CACHE_MAX + 10 {
            cache.insert(
                &format!("hk_{i}"),
                r.clone(),
                t0 + Duration::from_micros(i as u64),
            );
        }
        assert_eq!(cache.entries.len(), KEY_CACHE_MAX);
        assert!(cache.get("hk_0", t0, 0).is_none(), "the oldest went first");
        assert!(cache
            .get(&format!("hk_{}", KEY_CACHE_MAX + 9), t0, 0)
            .is_some());
    }

    #[test]
    fn a_revoked_key_leaves_the_cache_and_fires_its_watchers() {
        let mut cache = KeyCache::default();
        let t0 = Instant::now();
        let (a, b) = (record(None), record(None));
        cache.insert("hk_a", a.clone(), t0);
        cache.insert("hk_b", b.clone(), t0);
        let revocations = Revocations::default();
        let watcher = revocations.watch(&a.id);
        let other = revocations.watch(&b.id);
        cache.evict(std::slice::from_ref(&a.id));
        revocations.revoke(std::slice::from_ref(&a.id));
        assert!(cache.get("hk_a", t0, 0).is_none());
        assert!(cache.get("hk_b", t0, 0).is_some());
        assert!(*watcher.borrow(), "fired");
        assert!(!*other.borrow(), "another key's is not");
    }
}
