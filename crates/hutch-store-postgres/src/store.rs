//! [`PostgresStore`]: Hutch's [`Store`] on the cluster's shared PostgreSQL database, the
//! same contract as `SqliteStore` (the same errors for the same cases, the same pagination,
//! the same tenancy transactions), proven by one suite of cases run against both
//! (`tests/contract.rs`).
//!
//! # Tables (migration 2, `schema.rs`)
//! The tables of `SqliteStore`, records as JSONB without their tenant (the `tenant` column
//! is the source of truth) and the columns copied out of each record on every write so they
//! can be indexed (`state`, `tenant`, `expires_at_ms`, `idle_hibernate_seconds`, `layer`).
//! Every listed table has a `seq BIGSERIAL`: listings are in `seq` order (insertion order)
//! and a page's cursor is the last row's `seq`, so a page is one range scan of an index
//! ending in `seq`, and a walk returns every row that existed throughout exactly once,
//! whatever is inserted or deleted meanwhile. (A sequence is not commit order: a row
//! inserted during a walk may be missed, which the contract allows.) A cursor names its
//! table and is refused by any other listing.
//!
//! # What a node owns
//! Sandboxes, snapshots and volumes (and the usage meters of sandboxes) carry a `node_id`:
//! their files live on that node. `insert_*` writes this node's id ([`NodeFence::node_id`]).
//! - Node-side reads return only this node's rows: [`Store::all_sandboxes`],
//!   [`Store::pooled_sandboxes`], [`Store::expired_sandboxes`], [`Store::idle_candidates`],
//!   [`Store::count_by_state`], [`Store::sandboxes_on_layer`],
//!   [`Store::sandboxes_with_volume`], [`Store::volumes_in_use`], [`Store::all_snapshots`],
//!   [`Store::all_volumes`] and [`UsageStore::meter_readings`]: what this node's reaper,
//!   pool, idle checks and start-up act on.
//! - Lookups and listings are cluster-wide: [`Store::get_sandbox`],
//!   [`Store::get_sandbox_for`], [`Store::list_sandboxes`], [`Store::get_snapshot`],
//!   [`Store::snapshots_named`], [`Store::list_snapshots`], [`Store::find_volume`],
//!   [`Store::volume_name_taken`], [`Store::list_volumes`], and all of tenancy, audit and
//!   usage. [`TenancyStore::tenant_usage`] counts the tenant's sandboxes on every node, plus
//!   the `placements` of the tenant (creates placed on a node and not finished) whose
//!   sandbox has no row yet and that have not expired.
//! - uid slots are per node: `UNIQUE (node_id, uid_slot)`; a taken one is `Conflict`.
//! - A node changes only its own rows: the cluster routes every call on a sandbox to the
//!   node that owns it. An update of another node's row is refused as a missing row is
//!   (`NotFound`), and a delete of one deletes nothing (`false`).
//!
//! # Fencing
//! Every write of a node-owned row (insert, update, modify and delete of sandboxes,
//! snapshots and volumes, [`Store::refresh_sandboxes`], [`UsageStore::append_usage`])
//! happens only while the `nodes` row of this node still has the epoch this node holds and
//! is not `dead`, checked in the same statement or transaction that writes: a single
//! statement reads the node row `FOR SHARE` in a CTE (`fence`) its write depends on; a
//! transaction reads it so in its first statement (with the rows it locks, for
//! [`Store::modify_sandbox`] and [`Store::refresh_sandboxes`]). The lock is held until the
//! write commits, so the
//! reaper's `UPDATE nodes SET epoch = epoch + 1, state = 'dead'` waits for a write in
//! flight and every write after it is refused: [`CoreError::NodeFenced`], nothing changed.
//! (The node's heartbeat updates the same row, and so waits for a write in flight too:
//! for a few milliseconds.)
//!
//! # Transactions
//! [`Store::modify_sandbox`] locks the row `SELECT … FOR UPDATE` in a transaction, applies
//! the change and writes the row back, so concurrent changes never undo each other.
//! Inserting a row for a tenant (a sandbox, a snapshot, a volume, a template claim) takes
//! the tenant's row `FOR KEY SHARE`, and [`TenancyStore::delete_tenant`] takes it
//! `FOR UPDATE` before counting what the tenant owns: a delete and an insert for the same
//! tenant are serialized as on SQLite's one connection (`store/tenancy.rs`).
//!
//! # Errors
//! A database that cannot be reached is [`CoreError::StoreUnavailable`] (503); a unique
//! violation [`CoreError::Conflict`]; any other failure [`CoreError::SharedStore`] (500)
//! ([`db_error`]). The pool reconnects by itself: a store keeps working once its database
//! is back. (A pooled connection the server ended can still be handed out until its task
//! has seen it close, so a call or two after a lost connection may fail as unavailable
//! too.) JSONB cannot hold the character U+0000: a record with one in a string is
//! refused (`SharedStore`), where SQLite's store keeps it.

mod audit;
mod handoff;
mod rows;
mod sql;
mod tenancy;
mod usage;

use std::sync::Arc;

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use hutch_core::ids::{SandboxId, SnapshotId, VolumeId};
use hutch_core::model::{SandboxRecord, SandboxState};
use hutch_core::snapshot::SnapshotRecord;
use hutch_core::store::{Page, PageRequest, SandboxChange, SandboxQuery, SandboxRefresh, Store};
#[cfg(doc)]
use hutch_core::store::{TenancyStore, UsageStore};
use hutch_core::tenant::{Tenant, TenantScope};
use hutch_core::volume::VolumeRecord;
use hutch_core::{CoreError, CoreResult};
use tokio_postgres::types::ToSql;

use self::rows::{all, sandbox_row, seq_and, snapshot_row, to_json, volume_row, SandboxColumns};
pub use self::sql::db_error;
use self::sql::{count, execute, get, one, page_of, pg, rows, Query};
use crate::{Db, NodeFence};

/// This node's row, locked `FOR SHARE`, when it still holds its epoch and is not dead
/// (`$1` the node id, `$2` the epoch): what every node-side write is fenced by.
const FENCE: &str =
    "SELECT 1 FROM nodes WHERE id = $1 AND epoch = $2 AND state <> 'dead' FOR SHARE";

/// The columns a sandbox row is read from.
const SANDBOX: &str = "SELECT record, tenant FROM sandboxes";

/// The state store on the cluster database (see the module docs).
pub struct PostgresStore {
    db: Db,
    fence: Arc<NodeFence>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("node", &self.fence.node_id())
            .field("epoch", &self.fence.epoch())
            .finish_non_exhaustive()
    }
}

/// A CTE (after a comma) that locks tenant `$param`'s row `FOR KEY SHARE` if it has one,
/// for an insert that joins it (`… FROM fence LEFT JOIN owner ON true`): a tenant cannot be
/// deleted between its count of what it owns and the insert.
fn owner_cte(param: &str) -> String {
    format!(", owner AS MATERIALIZED (SELECT 1 FROM tenants WHERE name = {param} FOR KEY SHARE)")
}

impl PostgresStore {
    /// The store of node `fence.node_id()` on `db` (migrated: [`Db::migrate`]).
    pub fn new(db: Db, fence: Arc<NodeFence>) -> Self {
        Self { db, fence }
    }

    /// The fence its writes are guarded by.
    pub fn fence(&self) -> &NodeFence {
        &self.fence
    }

    async fn client(&self) -> CoreResult<deadpool_postgres::Client> {
        self.db.client().await.map_err(db_error)
    }

    fn fenced(&self, epoch: i64) -> CoreError {
        CoreError::NodeFenced {
            node: self.fence.node_id().to_string(),
            epoch,
        }
    }

    /// In a transaction: lock this node's row until it ends, or refuse (`NodeFenced`).
    async fn hold_fence<C: GenericClient>(&self, tx: &C) -> CoreResult<()> {
        let epoch = self.fence.epoch();
        let node = self.fence.node_id();
        if rows(tx, FENCE, &[&node, &epoch]).await?.is_empty() {
            return Err(self.fenced(epoch));
        }
        Ok(())
    }

    /// Run `write` (an `INSERT`, `UPDATE` or `DELETE` that depends on the CTE `fence`, and
    /// whose own parameters start at `$3`: `$1` is this node's id, `$2` its epoch) as one
    /// fenced statement, after the extra CTEs `ctes`; the rows written.
    async fn fenced_write(
        &self,
        ctes: &str,
        write: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> CoreResult<u64> {
        let epoch = self.fence.epoch();
        let node = self.fence.node_id();
        let sql = format!(
            "WITH fence AS MATERIALIZED ({FENCE}){ctes}, written AS ({write} RETURNING 1)
            SELECT (SELECT count(*) FROM fence) AS held, (SELECT count(*) FROM written) AS n"
        );
        let mut all: Vec<&(dyn ToSql + Sync)> = vec![&node, &epoch];
        all.extend_from_slice(params);
        let client = self.client().await?;
        let row = one(&client, &sql, &all).await?;
        if get::<i64>(&row, "held")? == 0 {
            return Err(self.fenced(epoch));
        }
        Ok(count(get(&row, "n")?))
    }

    /// In a transaction: this node's sandbox rows (`id`, `record`, `tenant`) that
    /// `condition` (with `$3`… as `params`) selects, locked `FOR UPDATE` in id order by the
    /// statement that also holds the fence; `NodeFenced` when the node's epoch is gone.
    async fn lock_own_sandboxes<C: GenericClient>(
        &self,
        tx: &C,
        condition: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> CoreResult<Vec<tokio_postgres::Row>> {
        let epoch = self.fence.epoch();
        let node = self.fence.node_id();
        let sql = format!(
            "WITH fence AS MATERIALIZED ({FENCE})
            SELECT id, record, tenant FROM sandboxes
            WHERE node_id = $1 AND EXISTS (SELECT 1 FROM fence) AND {condition}
            ORDER BY id FOR UPDATE"
        );
        let mut all: Vec<&(dyn ToSql + Sync)> = vec![&node, &epoch];
        all.extend_from_slice(params);
        let locked = rows(tx, &sql, &all).await?;
        if locked.is_empty() {
            // No row: none selected, or no fence (the rare case asks which).
            self.hold_fence(tx).await?;
        }
        Ok(locked)
    }

    /// This node's sandboxes that `condition` (with `$2`… as `params`) keeps, in `order`.
    async fn own_sandboxes(
        &self,
        condition: &str,
        order: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> CoreResult<Vec<SandboxRecord>> {
        let sql = format!("{SANDBOX} WHERE node_id = $1 AND {condition} ORDER BY {order}");
        let node = self.fence.node_id();
        let mut all_params: Vec<&(dyn ToSql + Sync)> = vec![&node];
        all_params.extend_from_slice(params);
        let client = self.client().await?;
        all(&rows(&client, &sql, &all_params).await?, sandbox_row)
    }
}

/// Write every column of this node's row of `r` in a transaction; the rows changed.
async fn write_sandbox<C: GenericClient>(tx: &C, node: &str, r: &SandboxRecord) -> CoreResult<u64> {
    let c = SandboxColumns::of(r)?;
    execute(
        tx,
        "UPDATE sandboxes SET state = $3, record = $4, tenant = $5, expires_at_ms = $6,
            idle_hibernate_seconds = $7, layer = $8 WHERE id = $1 AND node_id = $2",
        &[
            &c.id,
            &node,
            &c.state,
            &c.record,
            &c.tenant,
            &c.expires_at_ms,
            &c.idle_hibernate_seconds,
            &c.layer,
        ],
    )
    .await
}

fn state_names(states: &[SandboxState]) -> Vec<String> {
    states.iter().map(|s| s.as_str().to_string()).collect()
}

fn missing_sandbox(id: &SandboxId) -> CoreError {
    CoreError::NotFound(format!("sandbox {id} does not exist"))
}

#[async_trait]
impl Store for PostgresStore {
    async fn insert_sandbox(&self, r: &SandboxRecord) -> CoreResult<()> {
        let c = SandboxColumns::of(r)?;
        let written = self
            .fenced_write(
                &owner_cte("$7::text"),
                "INSERT INTO sandboxes (node_id, id, state, uid_slot, record, tenant,
                    expires_at_ms, idle_hibernate_seconds, layer)
                SELECT $1, $3::text, $4::text, $5::bigint, $6::jsonb, $7::text, $8::bigint,
                    $9::bigint, $10::text FROM fence LEFT JOIN owner ON true",
                &[
                    &c.id,
                    &c.state,
                    &c.uid_slot,
                    &c.record,
                    &c.tenant,
                    &c.expires_at_ms,
                    &c.idle_hibernate_seconds,
                    &c.layer,
                ],
            )
            .await;
        match written {
            Ok(_) => Ok(()),
            Err(CoreError::Conflict(_)) => Err(CoreError::Conflict(format!(
                "uid slot {} in use",
                r.uid_slot
            ))),
            Err(e) => Err(e),
        }
    }

    async fn update_sandbox(&self, r: &SandboxRecord) -> CoreResult<()> {
        let c = SandboxColumns::of(r)?;
        let written = self
            .fenced_write(
                "",
                "UPDATE sandboxes SET state = $4, record = $5, tenant = $6, expires_at_ms = $7,
                    idle_hibernate_seconds = $8, layer = $9
                WHERE id = $3 AND node_id = $1 AND EXISTS (SELECT 1 FROM fence)",
                &[
                    &c.id,
                    &c.state,
                    &c.record,
                    &c.tenant,
                    &c.expires_at_ms,
                    &c.idle_hibernate_seconds,
                    &c.layer,
                ],
            )
            .await?;
        if written == 0 {
            return Err(missing_sandbox(&r.id));
        }
        Ok(())
    }

    async fn modify_sandbox(
        &self,
        id: &SandboxId,
        change: SandboxChange<'_>,
    ) -> CoreResult<SandboxRecord> {
        let node = self.fence.node_id();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let locked = self
            .lock_own_sandboxes(&tx, "id = $3", &[&id.as_str()])
            .await?;
        let Some(row) = locked.first() else {
            return Err(missing_sandbox(id));
        };
        let mut record = sandbox_row(row)?;
        change(&mut record)?;
        write_sandbox(&tx, node, &record).await?;
        tx.commit().await.map_err(pg)?;
        Ok(record)
    }

    fn may_be_unreachable(&self) -> bool {
        true
    }

    async fn sandbox_is_here(&self, id: &SandboxId) -> CoreResult<bool> {
        let node = self.fence.node_id();
        let client = self.client().await?;
        let found = rows(
            &client,
            "SELECT 1 FROM sandboxes WHERE id = $1 AND node_id = $2",
            &[&id.as_str(), &node],
        )
        .await?;
        Ok(!found.is_empty())
    }

    async fn take_over_sandbox(
        &self,
        id: &SandboxId,
        uid_slot: u32,
    ) -> CoreResult<Option<SandboxRecord>> {
        self.take_over(id, uid_slot).await
    }

    async fn refresh_sandboxes(&self, batch: &[(SandboxId, SandboxRefresh)]) -> CoreResult<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let node = self.fence.node_id();
        let ids: Vec<String> = batch.iter().map(|(id, _)| id.to_string()).collect();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        // Locked in one order, so two batches never wait on each other in a cycle.
        let locked = self
            .lock_own_sandboxes(&tx, "id = ANY($3)", &[&ids])
            .await?;
        let mut records = std::collections::BTreeMap::new();
        for row in &locked {
            // A record this batch cannot decode is skipped: one bad row must not keep
            // every other refresh from being written.
            if let Ok(r) = sandbox_row(row) {
                records.insert(get::<String>(row, "id")?, r);
            }
        }
        for (id, refresh) in batch {
            if let Some(r) = records.get_mut(id.as_str()) {
                refresh.apply(r);
            }
        }
        let mut ids = Vec::with_capacity(records.len());
        let mut json = Vec::with_capacity(records.len());
        let mut expiry = Vec::with_capacity(records.len());
        for (id, r) in &records {
            let c = SandboxColumns::of(r)?;
            ids.push(id.clone());
            json.push(c.record);
            expiry.push(c.expires_at_ms);
        }
        execute(
            &tx,
            "UPDATE sandboxes AS s SET record = v.record, expires_at_ms = v.expires_at_ms
                FROM unnest($1::text[], $2::jsonb[], $3::bigint[]) AS v(id, record, expires_at_ms)
                WHERE s.id = v.id AND s.node_id = $4",
            &[&ids, &json, &expiry, &node],
        )
        .await?;
        tx.commit().await.map_err(pg)?;
        Ok(())
    }

    async fn get_sandbox(&self, id: &SandboxId) -> CoreResult<Option<SandboxRecord>> {
        let client = self.client().await?;
        let sql = format!("{SANDBOX} WHERE id = $1");
        let found = rows(&client, &sql, &[&id.as_str()]).await?;
        found.first().map(sandbox_row).transpose()
    }

    async fn get_sandbox_for(
        &self,
        id: &SandboxId,
        scope: &TenantScope,
    ) -> CoreResult<Option<SandboxRecord>> {
        let mut q = Query::new(format!("{SANDBOX} WHERE state <> 'pooled'"));
        q.and("id =", id.to_string());
        q.scope(scope);
        let client = self.client().await?;
        q.rows(&client).await?.first().map(sandbox_row).transpose()
    }

    async fn delete_sandbox(&self, id: &SandboxId) -> CoreResult<bool> {
        let deleted = self
            .fenced_write(
                "",
                "DELETE FROM sandboxes WHERE id = $3 AND node_id = $1
                    AND EXISTS (SELECT 1 FROM fence)",
                &[&id.as_str()],
            )
            .await?;
        Ok(deleted > 0)
    }

    async fn list_sandboxes(
        &self,
        query: &SandboxQuery,
        page: &PageRequest,
    ) -> CoreResult<Page<SandboxRecord>> {
        let mut q = Query::new("SELECT seq, record, tenant FROM sandboxes WHERE state <> 'pooled'");
        q.scope(&query.scope);
        if let Some(s) = query.state {
            q.and("state =", s.as_str().to_string());
        }
        for (k, v) in &query.metadata {
            if k == "tenant_id" {
                q.and("tenant =", v.clone());
            } else {
                let key = q.bind(k.clone());
                let value = q.bind(v.clone());
                q.push(&format!(
                    " AND record->'metadata'->>{key}::text = {value}::text"
                ));
            }
        }
        q.page("sandboxes", "seq", page)?;
        let client = self.client().await?;
        let found = q.rows(&client).await?;
        page_of(
            "sandboxes",
            page.limit,
            found.iter().map(|r| seq_and(r, sandbox_row)),
        )
    }

    async fn all_sandboxes(&self) -> CoreResult<Vec<SandboxRecord>> {
        self.own_sandboxes("state <> 'pooled'", "seq", &[]).await
    }

    async fn pooled_sandboxes(&self) -> CoreResult<Vec<SandboxRecord>> {
        self.own_sandboxes("state = 'pooled'", "seq", &[]).await
    }

    async fn expired_sandboxes(&self, now_ms: i64) -> CoreResult<Vec<SandboxRecord>> {
        self.own_sandboxes(
            "expires_at_ms <= $2 AND state <> 'pooled'",
            "expires_at_ms, seq",
            &[&now_ms],
        )
        .await
    }

    async fn idle_candidates(&self) -> CoreResult<Vec<SandboxRecord>> {
        self.own_sandboxes(
            "state = 'running' AND idle_hibernate_seconds IS NOT NULL",
            "seq",
            &[],
        )
        .await
    }

    async fn sandboxes_on_layer(&self, snapshot_id: &str) -> CoreResult<Vec<SandboxRecord>> {
        self.own_sandboxes("layer = $2", "seq", &[&snapshot_id])
            .await
    }

    async fn sandboxes_with_volume(
        &self,
        volume_id: &str,
        states: &[SandboxState],
    ) -> CoreResult<Vec<SandboxRecord>> {
        self.own_sandboxes(
            "state = ANY($2) AND record->'volumes'
                @> jsonb_build_array(jsonb_build_object('volume', $3::text))",
            "seq",
            &[&state_names(states), &volume_id],
        )
        .await
    }

    async fn volumes_in_use(&self, states: &[SandboxState]) -> CoreResult<Vec<String>> {
        let client = self.client().await?;
        let found = rows(
            &client,
            "SELECT DISTINCT m->>'volume' AS volume FROM sandboxes,
                jsonb_array_elements(CASE WHEN jsonb_typeof(record->'volumes') = 'array'
                    THEN record->'volumes' END) AS m
                WHERE node_id = $1 AND state = ANY($2)",
            &[&self.fence.node_id(), &state_names(states)],
        )
        .await?;
        let mut out = Vec::new();
        for row in &found {
            out.extend(get::<Option<String>>(row, "volume")?);
        }
        Ok(out)
    }

    async fn count_by_state(&self) -> CoreResult<Vec<(SandboxState, u64)>> {
        let client = self.client().await?;
        let found = rows(
            &client,
            "SELECT state, count(*) AS n FROM sandboxes WHERE node_id = $1
                GROUP BY state ORDER BY state",
            &[&self.fence.node_id()],
        )
        .await?;
        let mut out = Vec::new();
        for row in &found {
            if let Some(state) = SandboxState::parse(&get::<String>(row, "state")?) {
                out.push((state, count(get(row, "n")?)));
            }
        }
        Ok(out)
    }

    async fn insert_snapshot(&self, r: &SnapshotRecord) -> CoreResult<()> {
        let record = to_json(r)?;
        let tenant = r.tenant_id.as_ref().map(Tenant::as_str);
        self.fenced_write(
            &owner_cte("$5::text"),
            "INSERT INTO snapshots (node_id, id, record, tenant, name, hidden)
            SELECT $1, $3::text, $4::jsonb, $5::text, $6::text, $7::boolean
            FROM fence LEFT JOIN owner ON true",
            &[&r.id.as_str(), &record, &tenant, &r.name, &r.hidden],
        )
        .await?;
        Ok(())
    }

    async fn get_snapshot(&self, id: &SnapshotId) -> CoreResult<Option<SnapshotRecord>> {
        let client = self.client().await?;
        let found = rows(
            &client,
            "SELECT record, tenant FROM snapshots WHERE id = $1",
            &[&id.as_str()],
        )
        .await?;
        found.first().map(snapshot_row).transpose()
    }

    async fn snapshots_named(
        &self,
        name: &str,
        scope: &TenantScope,
    ) -> CoreResult<Vec<SnapshotRecord>> {
        let mut q = Query::new("SELECT record, tenant FROM snapshots WHERE NOT hidden");
        q.and("name =", name.to_string());
        q.scope(scope);
        q.push(" ORDER BY seq");
        let client = self.client().await?;
        all(&q.rows(&client).await?, snapshot_row)
    }

    async fn list_snapshots(
        &self,
        scope: &TenantScope,
        page: &PageRequest,
    ) -> CoreResult<Page<SnapshotRecord>> {
        let mut q = Query::new("SELECT seq, record, tenant FROM snapshots WHERE NOT hidden");
        q.scope(scope);
        q.page("snapshots", "seq", page)?;
        let client = self.client().await?;
        let found = q.rows(&client).await?;
        page_of(
            "snapshots",
            page.limit,
            found.iter().map(|r| seq_and(r, snapshot_row)),
        )
    }

    async fn all_snapshots(&self) -> CoreResult<Vec<SnapshotRecord>> {
        let client = self.client().await?;
        let found = rows(
            &client,
            "SELECT record, tenant FROM snapshots WHERE node_id = $1 ORDER BY seq",
            &[&self.fence.node_id()],
        )
        .await?;
        all(&found, snapshot_row)
    }

    async fn delete_snapshot(&self, id: &SnapshotId) -> CoreResult<bool> {
        let deleted = self
            .fenced_write(
                "",
                "DELETE FROM snapshots WHERE id = $3 AND node_id = $1
                    AND EXISTS (SELECT 1 FROM fence)",
                &[&id.as_str()],
            )
            .await?;
        Ok(deleted > 0)
    }

    async fn insert_volume(&self, r: &VolumeRecord) -> CoreResult<()> {
        let record = to_json(r)?;
        let tenant = r.tenant.as_ref().map(Tenant::as_str);
        self.fenced_write(
            &owner_cte("$5::text"),
            "INSERT INTO volumes (node_id, id, record, tenant, name)
            SELECT $1, $3::text, $4::jsonb, $5::text, $6::text
            FROM fence LEFT JOIN owner ON true",
            &[&r.id.as_str(), &record, &tenant, &r.name],
        )
        .await?;
        Ok(())
    }

    async fn find_volume(
        &self,
        key: &str,
        scope: &TenantScope,
    ) -> CoreResult<Option<VolumeRecord>> {
        let mut q = Query::new("SELECT record, tenant FROM volumes WHERE ");
        let at = q.bind(key.to_string());
        q.push(&format!("(id = {at} OR name = {at})"));
        q.scope(scope);
        q.push(" ORDER BY seq LIMIT 1");
        let client = self.client().await?;
        q.rows(&client).await?.first().map(volume_row).transpose()
    }

    async fn volume_name_taken(&self, name: &str, tenant: Option<&Tenant>) -> CoreResult<bool> {
        let client = self.client().await?;
        let row = one(
            &client,
            "SELECT EXISTS (SELECT 1 FROM volumes
                WHERE name = $1 AND tenant IS NOT DISTINCT FROM $2::text) AS taken",
            &[&name, &tenant.map(Tenant::as_str)],
        )
        .await?;
        get(&row, "taken")
    }

    async fn list_volumes(
        &self,
        scope: &TenantScope,
        page: &PageRequest,
    ) -> CoreResult<Page<VolumeRecord>> {
        let mut q = Query::new("SELECT seq, record, tenant FROM volumes WHERE true");
        q.scope(scope);
        q.page("volumes", "seq", page)?;
        let client = self.client().await?;
        let found = q.rows(&client).await?;
        page_of(
            "volumes",
            page.limit,
            found.iter().map(|r| seq_and(r, volume_row)),
        )
    }

    async fn all_volumes(&self) -> CoreResult<Vec<VolumeRecord>> {
        let client = self.client().await?;
        let found = rows(
            &client,
            "SELECT record, tenant FROM volumes WHERE node_id = $1 ORDER BY seq",
            &[&self.fence.node_id()],
        )
        .await?;
        all(&found, volume_row)
    }

    async fn delete_volume(&self, id: &VolumeId) -> CoreResult<bool> {
        let deleted = self
            .fenced_write(
                "",
                "DELETE FROM volumes WHERE id = $3 AND node_id = $1
                    AND EXISTS (SELECT 1 FROM fence)",
                &[&id.as_str()],
            )
            .await?;
        Ok(deleted > 0)
    }
}
