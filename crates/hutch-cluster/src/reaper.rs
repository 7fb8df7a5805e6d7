//! The reaper: one node at a time declares dead the nodes whose lease ran out.
//!
//! Every node runs a [`Reaper`]; the one that holds the advisory lock [`REAPER_LOCK`] (on a
//! connection of its own, kept out of the pool, so the lock lives exactly as long as that
//! session) does the work. Each tick it marks `dead` every node whose last heartbeat is
//! older than its lease by the database's clock, bumps the node's epoch (so the node's own
//! writes are refused from then on: it is fenced), moves that node's sandboxes that still
//! held something to `lost` (their files are on the dead host) — except hibernated ones
//! whose saved state is in the object store, which stay `hibernated` for another node to
//! take over and wake (`handoff.rs`) —, drops its warm guests and
//! placements, and notifies `hutch_cluster`. All of it in one transaction.
//!
//! **A database restart must not kill the cluster.** After a restart every heartbeat in the
//! table is as old as the outage. So the holder declares nobody dead until it has held the
//! lock (on this connection) for a full lease: by then every live node has heartbeated
//! again. A connection that fails is dropped, and with it the lock.
//!
//! The lock's session asks the server to probe it with TCP keepalives and to give up on
//! unacknowledged data after a few seconds, so that a holder cut off from the database
//! loses the lock in seconds and another node takes over.

use std::time::{Duration, Instant};

use hutch_store_postgres::Db;

use crate::error::ClusterError;

/// The advisory lock whose holder is the reaper (any constant every node agrees on).
pub const REAPER_LOCK: i64 = 0x6875_7463_6802;

/// The notification channel of membership changes.
pub const CHANNEL: &str = "hutch_cluster";

/// The reaper of this node (see the module docs).
pub struct Reaper {
    db: Db,
    lease: Duration,
    held: Option<Held>,
}

struct Held {
    client: deadpool_postgres::ClientWrapper,
    since: Instant,
}

/// What one tick did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Nodes declared dead.
    pub nodes: Vec<String>,
    /// Their sandboxes moved to `lost`.
    pub sandboxes_lost: u64,
}

impl Reaper {
    /// A reaper that waits a full `lease` after taking the lock before it declares anyone
    /// dead.
    pub fn new(db: Db, lease: Duration) -> Self {
        Self {
            db,
            lease,
            held: None,
        }
    }

    /// Whether this node holds the lock now.
    pub fn is_holder(&self) -> bool {
        self.held.is_some()
    }

    /// One tick: take the lock if free, and as its holder for a full lease, declare the
    /// expired nodes dead. A failure drops the lock's connection (and the lock).
    pub async fn tick(&mut self) -> Result<Reaped, ClusterError> {
        let result = self.tick_inner().await;
        if result.is_err() {
            self.held = None;
        }
        result
    }

    async fn tick_inner(&mut self) -> Result<Reaped, ClusterError> {
        if self.held.is_none() {
            let client = deadpool_postgres::Object::take(self.db.client().await?);
            client
                .batch_execute(
                    "SET tcp_keepalives_idle = 2; SET tcp_keepalives_interval = 1;
                     SET tcp_keepalives_count = 3; SET tcp_user_timeout = 5000",
                )
                .await?;
            let got: bool = client
                .query_one("SELECT pg_try_advisory_lock($1)", &[&REAPER_LOCK])
                .await?
                .get(0);
            if !got {
                return Ok(Reaped::default());
            }
            tracing::info!("this node is the cluster's reaper");
            self.held = Some(Held {
                client,
                since: Instant::now(),
            });
        }
        let held = self.held.as_mut().expect("held just above");
        if held.since.elapsed() < self.lease {
            // Still checking the lock's session is alive.
            held.client.simple_query("SELECT 1").await?;
            return Ok(Reaped::default());
        }
        declare_dead(&mut held.client).await
    }
}

async fn declare_dead(client: &mut tokio_postgres::Client) -> Result<Reaped, ClusterError> {
    let tx = client.transaction().await?;
    let nodes: Vec<String> = tx
        .query(
            "UPDATE nodes SET state = 'dead', epoch = epoch + 1
             WHERE state <> 'dead' AND heartbeat_at < now() - lease_ms * interval '1 millisecond'
             RETURNING id",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if nodes.is_empty() {
        tx.commit().await?;
        return Ok(Reaped::default());
    }
    let sandboxes_lost = tx
        .execute(
            "UPDATE sandboxes SET state = 'lost',
                record = jsonb_set(jsonb_set(record, '{state}', '\"lost\"'), '{error}',
                    to_jsonb('its node ' || node_id || ' was declared dead at '
                        || to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')
                        || ' (no heartbeat within its lease)'))
             WHERE node_id = ANY($1) AND state NOT IN ('stopped', 'failed', 'lost', 'pooled')
               AND NOT (state = 'hibernated' AND record ? 'saved_state')",
            &[&nodes],
        )
        .await?;
    tx.execute(
        "DELETE FROM sandboxes WHERE node_id = ANY($1) AND state = 'pooled'",
        &[&nodes],
    )
    .await?;
    tx.execute("DELETE FROM placements WHERE node_id = ANY($1)", &[&nodes])
        .await?;
    tx.execute("SELECT pg_notify($1, 'dead')", &[&CHANNEL])
        .await?;
    tx.commit().await?;
    for node in &nodes {
        tracing::warn!(
            node,
            sandboxes_lost,
            "declared a node dead: its lease ran out"
        );
    }
    Ok(Reaped {
        nodes,
        sandboxes_lost,
    })
}
