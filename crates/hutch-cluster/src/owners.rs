//! Which node owns a sandbox, cached: routing asks on every call, and most calls need no
//! round trip to the database.
//!
//! A sandbox changes node only when a hibernated one is taken over from a dead or draining
//! node (`handoff.rs`), and its id is never reused, so the owner of an id, once read,
//! stays right until then; what also changes is the owner *node*: declared dead by the
//! reaper, draining, or registered again (with another address, say). Nodes are therefore
//! cached whole, reloaded whenever a `NOTIFY` arrives on the cluster's channel (the reaper,
//! every registration and every state change send one); a take-over sends `moved:<id>`,
//! which drops that sandbox's entry. The sandbox → node map is bounded (emptied when
//! full). A stale entry for a deleted sandbox costs nothing: its owner answers the 404.
//!
//! The database is the fallback: while the listening connection is down, or before the
//! nodes were first loaded, every lookup goes to the database as if there were no cache,
//! and entries are trusted again only after a reload that followed a working `LISTEN`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use hutch_store_postgres::Db;

use crate::error::ClusterError;
use crate::reaper::CHANNEL;
use crate::Owner;

/// The payload prefix of a take-over's notification: `moved:<sandbox id>`.
pub const MOVED: &str = "moved:";

/// Sandbox entries kept before the map is emptied.
const MAX_ENTRIES: usize = 100_000;

#[derive(Debug, Clone)]
struct NodeAddr {
    advertise: String,
    dead: bool,
    draining: bool,
}

/// The cache (see the module docs).
#[derive(Default)]
pub struct OwnerCache {
    /// Whether the listener is up and `nodes` was loaded after it began listening.
    synced: AtomicBool,
    nodes: Mutex<HashMap<String, NodeAddr>>,
    sandboxes: Mutex<HashMap<String, String>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl OwnerCache {
    /// Who owns sandbox `id` (`None`: no row), from the cache when it is in sync.
    pub async fn owner_of(&self, db: &Db, id: &str) -> Result<Option<Owner>, ClusterError> {
        if self.synced.load(Ordering::Acquire) {
            if let Some(owner) = self.cached(id) {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(Some(owner));
            }
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let found = match read_owner(db, id).await {
            Ok(found) => found,
            // The database is gone for now: an owner read before is still the owner (a
            // sandbox moves only through the database).
            Err(e) if e.is_db_unreachable() => match self.cached(id) {
                Some(owner) => return Ok(Some(owner)),
                None => return Err(e),
            },
            Err(e) => return Err(e),
        };
        if let Some(owner) = &found {
            let mut map = self
                .sandboxes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if map.len() >= MAX_ENTRIES {
                map.clear();
            }
            map.insert(id.to_string(), owner.node.clone());
        }
        Ok(found)
    }

    fn cached(&self, id: &str) -> Option<Owner> {
        let node = self
            .sandboxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()?;
        let nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        let addr = nodes.get(&node)?;
        Some(Owner {
            node,
            advertise: addr.advertise.clone(),
            dead: addr.dead,
            draining: addr.draining,
        })
    }

    /// Lookups answered from the cache and from the database, since start.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    /// Forget which node owns sandbox `id` (it moved, or its owner did not know it).
    pub fn forget(&self, id: &str) {
        self.sandboxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
    }

    /// Forget node `node`'s entry until the next reload (a forward to it failed: its row
    /// may say more than the cache).
    pub fn distrust(&self, node: &str) {
        self.nodes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(node);
    }

    /// Keep the cache in sync for as long as the node runs: listen, load, reload on every
    /// notification; on a lost connection, fall back to the database and listen again
    /// after `retry`.
    pub async fn keep_in_sync(&self, db: &Db, retry: Duration) {
        loop {
            if let Err(e) = self.listen_once(db, retry).await {
                tracing::warn!(error = %e, "the owner cache's listener (lookups go to the database until it is back)");
            }
            self.synced.store(false, Ordering::Release);
            tokio::time::sleep(retry).await;
        }
    }

    async fn listen_once(&self, db: &Db, ping_every: Duration) -> Result<(), ClusterError> {
        let mut listener = db.listen(CHANNEL).await?;
        self.reload(db).await?;
        self.synced.store(true, Ordering::Release);
        let mut tick = tokio::time::interval(ping_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                got = listener.recv() => {
                    let Some(payload) = got else {
                        return Ok(());
                    };
                    match payload.strip_prefix(MOVED) {
                        Some(id) => self.forget(id),
                        None => self.reload(db).await?,
                    }
                }
                _ = tick.tick() => {
                    let ping = tokio::time::timeout(ping_every.max(Duration::from_secs(1)), listener.ping());
                    match ping.await {
                        Ok(r) => r?,
                        Err(_) => return Ok(()),
                    }
                    // A reload now and then covers a notification lost in a reconnect of
                    // the sender's.
                    self.reload(db).await?;
                }
            }
        }
    }

    async fn reload(&self, db: &Db) -> Result<(), ClusterError> {
        let client = db.client().await?;
        let rows = client
            .query(
                "SELECT id, advertise, state = 'dead', state = 'draining' FROM nodes",
                &[],
            )
            .await?;
        let nodes: HashMap<String, NodeAddr> = rows
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    NodeAddr {
                        advertise: r.get(1),
                        dead: r.get(2),
                        draining: r.get(3),
                    },
                )
            })
            .collect();
        *self.nodes.lock().unwrap_or_else(PoisonError::into_inner) = nodes;
        Ok(())
    }
}

/// The owner of sandbox `id`, read from the database.
async fn read_owner(db: &Db, id: &str) -> Result<Option<Owner>, ClusterError> {
    let client = db.client().await?;
    let row = client
        .query_opt(
            "SELECT s.node_id, n.advertise, n.state = 'dead', n.state = 'draining'
             FROM sandboxes s JOIN nodes n ON n.id = s.node_id WHERE s.id = $1",
            &[&id],
        )
        .await?;
    Ok(row.map(|r| Owner {
        node: r.get(0),
        advertise: r.get(1),
        dead: r.get(2),
        draining: r.get(3),
    }))
}
