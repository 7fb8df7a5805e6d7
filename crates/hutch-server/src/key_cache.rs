//! A short-lived cache of authenticated keys, so a request does not hash and look up its key
//! in the database every time, while a key removed from the database stops working within
//! [`KEY_CACHE_TTL`]. Entries are kept under the key's SHA-256, never the key itself, and at
//! most [`KEY_CACHE_MAX`] of them (the oldest go first).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::extract::Caller;

/// How long a key, once checked against the database, is believed without asking again.
pub const KEY_CACHE_TTL: Duration = Duration::from_secs(5);
/// How many keys the cache holds at most.
pub const KEY_CACHE_MAX: usize = 4096;

/// Authenticated keys and when each was checked.
#[derive(Default)]
pub struct KeyCache {
    entries: HashMap<[u8; 32], (Caller, Instant)>,
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl KeyCache {
    /// The caller of `key` if it was checked less than [`KEY_CACHE_TTL`] before `now`.
    pub fn get(&mut self, key: &str, now: Instant) -> Option<Caller> {
        let d = digest(key);
        match self.entries.get(&d) {
            Some((caller, at)) if now.saturating_duration_since(*at) < KEY_CACHE_TTL => {
                Some(caller.clone())
            }
            Some(_) => {
                self.entries.remove(&d);
                None
            }
            None => None,
        }
    }

    /// Remember that `key` belongs to `caller`, as checked at `now`.
    pub fn insert(&mut self, key: &str, caller: Caller, now: Instant) {
        if self.entries.len() >= KEY_CACHE_MAX {
            self.entries
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < KEY_CACHE_TTL);
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
        self.entries.insert(digest(key), (caller, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(tenant: &str) -> Caller {
        Caller {
            tenant: hutch_core::tenant::Tenant::new(tenant),
            admin: false,
        }
    }

    #[test]
    fn a_key_is_believed_only_for_the_ttl() {
        let mut cache = KeyCache::default();
        let t0 = Instant::now();
        cache.insert("hk_a", caller("a"), t0);
        assert_eq!(
            cache
                .get("hk_a", t0 + Duration::from_secs(1))
                .map(|c| c.tenant),
            Some(hutch_core::tenant::Tenant::new("a"))
        );
        assert!(cache.get("hk_b", t0).is_none());
        assert!(cache.get("hk_a", t0 + KEY_CACHE_TTL).is_none(), "expired");
        assert!(cache.entries.is_empty(), "an expired entry is dropped");
    }

    #[test]
    fn the_cache_is_bounded_and_never_holds_a_key_in_clear() {
        let mut cache = KeyCache::default();
        let t0 = Instant::now();
        for i in 0..KEY_CACHE_MAX + 10 {
            cache.insert(
                &format!("hk_{i}"),
                caller("t"),
                t0 + Duration::from_micros(i as u64),
            );
        }
        assert_eq!(cache.entries.len(), KEY_CACHE_MAX);
        assert!(cache.get("hk_0", t0).is_none(), "the oldest went first");
        assert!(cache
            .get(&format!("hk_{}", KEY_CACHE_MAX + 9), t0)
            .is_some());
    }
}
