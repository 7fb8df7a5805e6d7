//! [`SqliteStore`]: the state database of one host (embedded SQLite).
//!
//! Schema version 7 (`PRAGMA user_version`; `sqlite/schema.rs`):
//! - `sandboxes(id PRIMARY KEY, state, uid_slot UNIQUE, record JSON, tenant, expires_at_ms,
//!   idle_hibernate_seconds, layer)`: one row per sandbox; `record` is a serialized
//!   [`SandboxRecord`] without its tenant. `tenant` is the source of truth for who owns it;
//!   the other columns are copied out of the record on every write so they can be indexed:
//!   `state` (idle checks, counts), `tenant` (a tenant's listing), `expires_at_ms` (the
//!   reaper; `NULL` for persistent sandboxes), `layer` (who uses a snapshot).
//! - `api_keys(key_hash PRIMARY KEY, tenant, admin, created_at_ms, id UNIQUE, scope, name,
//!   selector JSON, prefix, expires_at_ms, last_used_ms)`: SHA-256 of each key's secret and
//!   what the key may do (`sqlite/tenancy.rs`).
//! - `tenants(name PRIMARY KEY, settings JSON, created_at_ms)`: quotas, defaults, allowed
//!   templates; `tenant_creates(tenant, at_ms)`: the creates of the last hour;
//!   `template_owners(name PRIMARY KEY, tenant)`: tenant-private templates.
//! - `audit_log(id PRIMARY KEY, at_ms, key_id, tenant, method, route, path, sandbox, argv,
//!   status)`: the audit log (`sqlite/audit.rs`).
//! - `snapshots(id PRIMARY KEY, record JSON, tenant, name, hidden)`: one row per snapshot.
//! - `volumes(id PRIMARY KEY, record JSON, tenant, name)`: one row per volume.
//!
//! Migrations run in order inside one transaction when the database is opened: 0 → 1 creates
//! the first two tables, 1 → 2 adds `snapshots`, 2 → 3 adds `volumes`, 3 → 4 adds the
//! columns above and their indexes, moving each sandbox's `metadata.tenant_id` into its
//! `tenant` column, 4 → 5 adds the tenancy tables and key columns (a tenant row for every
//! tenant a record names; old admin keys become `admin` keys, others `full`), 5 → 6 adds
//! `audit_log`, 6 → 7 adds `usage_intervals` and `usage_meters` (`sqlite/usage.rs`) and
//! the keys' `budget` column. A database
//! newer than this binary is refused.
//!
//! Listings are ordered by `rowid` (insertion order); a cursor is the last row's `rowid`, so
//! a page is one range scan of the primary key or of an index (which ends in `rowid`).
//!
//! The database is opened in WAL mode, and every call is one short statement or transaction
//! on the one connection behind a mutex, run inline on the calling task: a lookup by index
//! takes tens of microseconds, less than handing it to the blocking pool would (measured in
//! `hutch bench` `api_scale`), and the mutex is never held across an `.await`.
//! [`Store::modify_sandbox`] reads, changes and writes one record under that mutex, so
//! concurrent changes to different fields of a sandbox (its TTL and its state, say) never
//! undo each other.

use std::path::Path;
use std::sync::Mutex;

use async_trait::async_trait;
use base64::Engine as _;
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, Connection, OptionalExtension};

use self::schema::{MIGRATIONS, SCHEMA_VERSION};
use super::{Cursor, Page, PageRequest, SandboxChange, SandboxQuery, SandboxRefresh, Store};
use crate::error::{CoreError, CoreResult};
use crate::ids::{SandboxId, SnapshotId, VolumeId};
use crate::model::{SandboxRecord, SandboxState};
use crate::snapshot::SnapshotRecord;
use crate::tenant::{Tenant, TenantScope};
use crate::volume::VolumeRecord;

/// The columns a sandbox row is read from: its record, then its tenant.
const SANDBOX_COLUMNS: &str = "record, tenant";
/// The reaper's query: rows whose TTL ran out (`expires_at_ms` is `NULL` when persistent).
const EXPIRED_SQL: &str = "SELECT record, tenant FROM sandboxes
    WHERE expires_at_ms <= ?1 AND state != 'pooled' ORDER BY expires_at_ms";
/// Idle hibernation's query: running rows with a policy.
const IDLE_SQL: &str = "SELECT record, tenant FROM sandboxes
    WHERE state = 'running' AND idle_hibernate_seconds IS NOT NULL ORDER BY rowid";
/// Who uses a snapshot.
const LAYER_SQL: &str = "SELECT record, tenant FROM sandboxes WHERE layer = ?1 ORDER BY rowid";

/// The state database of one host.
pub struct SqliteStore {
    conn: Mutex<Connection>,
}

fn corrupt(e: serde_json::Error) -> CoreError {
    CoreError::CorruptRecord(e)
}

/// The database (sandbox records, key hashes, metadata and environment of sandboxes) is for
/// root only: create it 0600 before SQLite does (its `-wal` and `-shm` files take the main
/// file's mode), and close one an earlier version left world-readable.
fn restrict_database_files(path: &Path) -> CoreResult<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let io = |e: std::io::Error| CoreError::io("open the state database", path)(e);
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        match std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            other => other.map_err(io)?,
        }
    }
    Ok(())
}

/// A sandbox row: the record with its tenant put back from the `tenant` column.
fn sandbox_row(json: String, tenant: Option<String>) -> CoreResult<SandboxRecord> {
    let mut r: SandboxRecord = serde_json::from_str(&json).map_err(corrupt)?;
    r.tenant = tenant.map(Tenant::new);
    Ok(r)
}

fn snapshot_row(json: String, tenant: Option<String>) -> CoreResult<SnapshotRecord> {
    let mut s: SnapshotRecord = serde_json::from_str(&json).map_err(corrupt)?;
    s.tenant_id = tenant.map(Tenant::new);
    Ok(s)
}

fn volume_row(json: String, tenant: Option<String>) -> CoreResult<VolumeRecord> {
    let mut v: VolumeRecord = serde_json::from_str(&json).map_err(corrupt)?;
    v.tenant = tenant.map(Tenant::new);
    Ok(v)
}

/// Run a query of `(json, tenant)` rows and decode each with `decode`.
fn rows_of<T>(
    conn: &Connection,
    sql: &str,
    params: &[Value],
    decode: fn(String, Option<String>) -> CoreResult<T>,
) -> CoreResult<Vec<T>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(params_from_iter(params), |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (json, tenant) = row?;
        out.push(decode(json, tenant)?);
    }
    Ok(out)
}

/// Run a page query: rows are `(rowid, json, tenant)`, at most `limit + 1` of them.
fn page_of<T>(
    conn: &Connection,
    sql: &str,
    params: &[Value],
    table: &str,
    limit: Option<usize>,
    decode: fn(String, Option<String>) -> CoreResult<T>,
) -> CoreResult<Page<T>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(params_from_iter(params), |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Option<String>>(2)?,
        ))
    })?;
    let mut items = Vec::new();
    let mut last = None;
    let mut more = false;
    for row in rows {
        let (rowid, json, tenant) = row?;
        if limit.is_some_and(|n| items.len() == n) {
            more = true;
            break;
        }
        items.push(decode(json, tenant)?);
        last = Some(rowid);
    }
    let next = match (more, last) {
        (true, Some(rowid)) => Some(encode_cursor(table, rowid)),
        _ => None,
    };
    Ok(Page { items, next })
}

fn encode_cursor(table: &str, rowid: i64) -> Cursor {
    Cursor::from_client(
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{table}:{rowid}")),
    )
}

/// The `rowid` a cursor of `table` stands for; 400 for anything this store did not issue.
fn decode_cursor(table: &str, cursor: &Cursor) -> CoreResult<i64> {
    let invalid = || {
        CoreError::InvalidArgument(format!(
            "invalid cursor {:?}: pass back the next_cursor of the previous page as it came",
            cursor.as_str()
        ))
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor.as_str())
        .map_err(|_| invalid())?;
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
    text.strip_prefix(table)
        .and_then(|r| r.strip_prefix(':'))
        .and_then(|n| n.parse::<i64>().ok())
        .ok_or_else(invalid)
}

/// `?, ?, …` for `n` values.
fn placeholders(from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn state_values(states: &[SandboxState]) -> Vec<Value> {
    states
        .iter()
        .map(|s| Value::Text(s.as_str().to_string()))
        .collect()
}

/// Adds `AND tenant = ?` for a one-tenant scope.
fn scope_clause(scope: &TenantScope, sql: &mut String, params: &mut Vec<Value>) {
    if let Some(t) = scope.tenant() {
        and_where(
            sql,
            params,
            "tenant",
            "=",
            Value::Text(t.as_str().to_string()),
        );
    }
}

/// Appends ` AND {column} {op} ?N` to `sql`, with `value` as its parameter N.
fn and_where(sql: &mut String, params: &mut Vec<Value>, column: &str, op: &str, value: Value) {
    params.push(value);
    sql.push_str(&format!(" AND {column} {op} ?{}", params.len()));
}

/// Adds the cursor and the limit (one row more than asked, to know whether more follow).
fn page_clause(
    table: &str,
    page: &PageRequest,
    sql: &mut String,
    params: &mut Vec<Value>,
) -> CoreResult<()> {
    if let Some(after) = &page.after {
        params.push(Value::Integer(decode_cursor(table, after)?));
        sql.push_str(&format!(" AND rowid > ?{}", params.len()));
    }
    sql.push_str(" ORDER BY rowid");
    if let Some(n) = page.limit {
        params.push(Value::Integer(i64::try_from(n).unwrap_or(i64::MAX) + 1));
        sql.push_str(&format!(" LIMIT ?{}", params.len()));
    }
    Ok(())
}

/// The SQL and parameters of one page of sandboxes.
fn sandbox_page_sql(query: &SandboxQuery, page: &PageRequest) -> CoreResult<(String, Vec<Value>)> {
    let mut sql =
        String::from("SELECT rowid, record, tenant FROM sandboxes WHERE state != 'pooled'");
    let mut params = Vec::new();
    scope_clause(&query.scope, &mut sql, &mut params);
    if let Some(s) = query.state {
        let state = Value::Text(s.as_str().to_string());
        and_where(&mut sql, &mut params, "state", "=", state);
    }
    for (k, v) in &query.metadata {
        if k == "tenant_id" {
            and_where(&mut sql, &mut params, "tenant", "=", Value::Text(v.clone()));
        } else {
            params.push(Value::Text(k.clone()));
            params.push(Value::Text(v.clone()));
            sql.push_str(&format!(
                " AND EXISTS (SELECT 1 FROM json_each(record, '$.metadata') \
                 WHERE key = ?{} AND value = ?{})",
                params.len() - 1,
                params.len()
            ));
        }
    }
    page_clause("sandboxes", page, &mut sql, &mut params)?;
    Ok((sql, params))
}

/// The SQL and parameters of one page of `table`'s rows that `condition` keeps, within
/// `scope` (snapshots and volumes: no filters of their own).
fn scoped_page_sql(
    table: &str,
    condition: &str,
    scope: &TenantScope,
    page: &PageRequest,
) -> CoreResult<(String, Vec<Value>)> {
    let mut sql = format!("SELECT rowid, record, tenant FROM {table} WHERE {condition}");
    let mut params = Vec::new();
    scope_clause(scope, &mut sql, &mut params);
    page_clause(table, page, &mut sql, &mut params)?;
    Ok((sql, params))
}

/// One page of the snapshots the API lists (hidden fork snapshots are not).
fn snapshot_page_sql(scope: &TenantScope, page: &PageRequest) -> CoreResult<(String, Vec<Value>)> {
    scoped_page_sql("snapshots", "hidden = 0", scope, page)
}

/// One page of volumes.
fn volume_page_sql(scope: &TenantScope, page: &PageRequest) -> CoreResult<(String, Vec<Value>)> {
    scoped_page_sql("volumes", "1", scope, page)
}

/// A record as JSON without its tenant (that is the `tenant` column).
fn sandbox_json(r: &SandboxRecord) -> CoreResult<String> {
    serde_json::to_string(r).map_err(corrupt)
}

/// Write every column of an existing row from `r`; the number of rows changed.
fn write_sandbox(conn: &Connection, r: &SandboxRecord) -> CoreResult<usize> {
    let json = sandbox_json(r)?;
    Ok(conn.execute(
        "UPDATE sandboxes SET state = ?2, record = ?3, tenant = ?4, expires_at_ms = ?5,
            idle_hibernate_seconds = ?6, layer = ?7 WHERE id = ?1",
        params![
            r.id.as_str(),
            r.state.as_str(),
            json,
            r.tenant.as_ref().map(Tenant::as_str),
            (!r.persistent).then_some(r.expires_at_ms),
            r.idle_hibernate_seconds
                .map(|s| i64::try_from(s).unwrap_or(i64::MAX)),
            r.layer,
        ],
    )?)
}

impl SqliteStore {
    /// Open (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> CoreResult<Self> {
        restrict_database_files(path)?;
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version > SCHEMA_VERSION {
            return Err(CoreError::Database(format!(
                "state database schema {version} is newer than this hutch ({SCHEMA_VERSION})"
            )));
        }
        if version < SCHEMA_VERSION {
            let tx = conn.unchecked_transaction()?;
            for step in &MIGRATIONS[usize::try_from(version.max(0)).unwrap_or(0)..] {
                tx.execute_batch(step)?;
            }
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
            tx.commit()?;
        }
        Ok(Self {
            conn: Mutex::new(conn),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite consistent (each call is one
        // statement or transaction), so a poisoned lock is safe to reuse.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn sandboxes(&self, sql: &str, params: &[Value]) -> CoreResult<Vec<SandboxRecord>> {
        rows_of(&self.lock(), sql, params, sandbox_row)
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn insert_sandbox(&self, r: &SandboxRecord) -> CoreResult<()> {
        let json = sandbox_json(r)?;
        let res = self.lock().execute(
            "INSERT INTO sandboxes (id, state, uid_slot, record, tenant, expires_at_ms,
                idle_hibernate_seconds, layer) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                r.id.as_str(),
                r.state.as_str(),
                r.uid_slot,
                json,
                r.tenant.as_ref().map(Tenant::as_str),
                (!r.persistent).then_some(r.expires_at_ms),
                r.idle_hibernate_seconds
                    .map(|s| i64::try_from(s).unwrap_or(i64::MAX)),
                r.layer,
            ],
        );
        match res {
            Ok(_) => Ok(()),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(CoreError::Conflict(format!(
                    "uid slot {} in use",
                    r.uid_slot
                )))
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn update_sandbox(&self, r: &SandboxRecord) -> CoreResult<()> {
        if write_sandbox(&self.lock(), r)? == 0 {
            return Err(CoreError::NotFound(format!(
                "sandbox {} does not exist",
                r.id
            )));
        }
        Ok(())
    }

    async fn modify_sandbox(
        &self,
        id: &SandboxId,
        change: SandboxChange<'_>,
    ) -> CoreResult<SandboxRecord> {
        let conn = self.lock();
        let row: Option<(String, Option<String>)> = conn
            .query_row(
                "SELECT record, tenant FROM sandboxes WHERE id = ?1",
                [id.as_str()],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((json, tenant)) = row else {
            return Err(CoreError::NotFound(format!("sandbox {id} does not exist")));
        };
        let mut record = sandbox_row(json, tenant)?;
        change(&mut record)?;
        write_sandbox(&conn, &record)?;
        Ok(record)
    }

    async fn refresh_sandboxes(&self, batch: &[(SandboxId, SandboxRefresh)]) -> CoreResult<()> {
        let conn = self.lock();
        let tx = conn.unchecked_transaction()?;
        for (id, refresh) in batch {
            let row: Option<(String, Option<String>)> = tx
                .query_row(
                    "SELECT record, tenant FROM sandboxes WHERE id = ?1",
                    [id.as_str()],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            // Deleted meanwhile, or a record this batch cannot decode (one bad row must not
            // keep every other refresh from being written).
            let Some(Ok(mut record)) = row.map(|(json, tenant)| sandbox_row(json, tenant)) else {
                continue;
            };
            refresh.apply(&mut record);
            write_sandbox(&tx, &record)?;
        }
        tx.commit()?;
        Ok(())
    }

    async fn get_sandbox(&self, id: &SandboxId) -> CoreResult<Option<SandboxRecord>> {
        let sql = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = ?1");
        Ok(self.sandboxes(&sql, &[Value::Text(id.to_string())])?.pop())
    }

    async fn get_sandbox_for(
        &self,
        id: &SandboxId,
        scope: &TenantScope,
    ) -> CoreResult<Option<SandboxRecord>> {
        let mut sql =
            format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = ?1 AND state != 'pooled'");
        let mut params = vec![Value::Text(id.to_string())];
        scope_clause(scope, &mut sql, &mut params);
        Ok(self.sandboxes(&sql, &params)?.pop())
    }

    async fn delete_sandbox(&self, id: &SandboxId) -> CoreResult<bool> {
        Ok(self
            .lock()
            .execute("DELETE FROM sandboxes WHERE id = ?1", [id.as_str()])?
            > 0)
    }

    async fn list_sandboxes(
        &self,
        query: &SandboxQuery,
        page: &PageRequest,
    ) -> CoreResult<Page<SandboxRecord>> {
        let (sql, params) = sandbox_page_sql(query, page)?;
        page_of(
            &self.lock(),
            &sql,
            &params,
            "sandboxes",
            page.limit,
            sandbox_row,
        )
    }

    async fn all_sandboxes(&self) -> CoreResult<Vec<SandboxRecord>> {
        self.sandboxes(
            "SELECT record, tenant FROM sandboxes WHERE state != 'pooled' ORDER BY rowid",
            &[],
        )
    }

    async fn pooled_sandboxes(&self) -> CoreResult<Vec<SandboxRecord>> {
        self.sandboxes(
            "SELECT record, tenant FROM sandboxes WHERE state = 'pooled' ORDER BY rowid",
            &[],
        )
    }

    async fn expired_sandboxes(&self, now_ms: i64) -> CoreResult<Vec<SandboxRecord>> {
        self.sandboxes(EXPIRED_SQL, &[Value::Integer(now_ms)])
    }

    async fn idle_candidates(&self) -> CoreResult<Vec<SandboxRecord>> {
        self.sandboxes(IDLE_SQL, &[])
    }

    async fn sandboxes_on_layer(&self, snapshot_id: &str) -> CoreResult<Vec<SandboxRecord>> {
        self.sandboxes(LAYER_SQL, &[Value::Text(snapshot_id.to_string())])
    }

    async fn sandboxes_with_volume(
        &self,
        volume_id: &str,
        states: &[SandboxState],
    ) -> CoreResult<Vec<SandboxRecord>> {
        let sql = format!(
            "SELECT record, tenant FROM sandboxes WHERE state IN ({}) AND EXISTS (
                SELECT 1 FROM json_each(record, '$.volumes')
                WHERE json_extract(value, '$.volume') = ?1) ORDER BY rowid",
            placeholders(2, states.len())
        );
        let mut params = vec![Value::Text(volume_id.to_string())];
        params.extend(state_values(states));
        self.sandboxes(&sql, &params)
    }

    async fn volumes_in_use(&self, states: &[SandboxState]) -> CoreResult<Vec<String>> {
        let sql = format!(
            "SELECT DISTINCT json_extract(m.value, '$.volume') FROM sandboxes,
                json_each(sandboxes.record, '$.volumes') AS m WHERE state IN ({})",
            placeholders(1, states.len())
        );
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params_from_iter(state_values(states)), |r| {
            r.get::<_, Option<String>>(0)
        })?;
        let mut out = Vec::new();
        for row in rows {
            out.extend(row?);
        }
        Ok(out)
    }

    async fn count_by_state(&self) -> CoreResult<Vec<(SandboxState, u64)>> {
        let conn = self.lock();
        let mut stmt =
            conn.prepare_cached("SELECT state, COUNT(*) FROM sandboxes GROUP BY state")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (s, n) = row?;
            if let Some(st) = SandboxState::parse(&s) {
                out.push((st, n.max(0) as u64));
            }
        }
        Ok(out)
    }

    async fn insert_snapshot(&self, r: &SnapshotRecord) -> CoreResult<()> {
        let json = serde_json::to_string(r).map_err(corrupt)?;
        self.lock().execute(
            "INSERT INTO snapshots (id, record, tenant, name, hidden) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                r.id.as_str(),
                json,
                r.tenant_id.as_ref().map(Tenant::as_str),
                r.name,
                r.hidden
            ],
        )?;
        Ok(())
    }

    async fn get_snapshot(&self, id: &SnapshotId) -> CoreResult<Option<SnapshotRecord>> {
        Ok(rows_of(
            &self.lock(),
            "SELECT record, tenant FROM snapshots WHERE id = ?1",
            &[Value::Text(id.to_string())],
            snapshot_row,
        )?
        .pop())
    }

    async fn snapshots_named(
        &self,
        name: &str,
        scope: &TenantScope,
    ) -> CoreResult<Vec<SnapshotRecord>> {
        let mut sql =
            String::from("SELECT record, tenant FROM snapshots WHERE name = ?1 AND hidden = 0");
        let mut params = vec![Value::Text(name.to_string())];
        scope_clause(scope, &mut sql, &mut params);
        sql.push_str(" ORDER BY rowid");
        rows_of(&self.lock(), &sql, &params, snapshot_row)
    }

    async fn list_snapshots(
        &self,
        scope: &TenantScope,
        page: &PageRequest,
    ) -> CoreResult<Page<SnapshotRecord>> {
        let (sql, params) = snapshot_page_sql(scope, page)?;
        page_of(
            &self.lock(),
            &sql,
            &params,
            "snapshots",
            page.limit,
            snapshot_row,
        )
    }

    async fn all_snapshots(&self) -> CoreResult<Vec<SnapshotRecord>> {
        rows_of(
            &self.lock(),
            "SELECT record, tenant FROM snapshots ORDER BY rowid",
            &[],
            snapshot_row,
        )
    }

    async fn delete_snapshot(&self, id: &SnapshotId) -> CoreResult<bool> {
        Ok(self
            .lock()
            .execute("DELETE FROM snapshots WHERE id = ?1", [id.as_str()])?
            > 0)
    }

    async fn insert_volume(&self, r: &VolumeRecord) -> CoreResult<()> {
        let json = serde_json::to_string(r).map_err(corrupt)?;
        self.lock().execute(
            "INSERT INTO volumes (id, record, tenant, name) VALUES (?1, ?2, ?3, ?4)",
            params![
                r.id.as_str(),
                json,
                r.tenant.as_ref().map(Tenant::as_str),
                r.name
            ],
        )?;
        Ok(())
    }

    async fn find_volume(
        &self,
        key: &str,
        scope: &TenantScope,
    ) -> CoreResult<Option<VolumeRecord>> {
        let mut sql =
            String::from("SELECT record, tenant FROM volumes WHERE (id = ?1 OR name = ?1)");
        let mut params = vec![Value::Text(key.to_string())];
        scope_clause(scope, &mut sql, &mut params);
        sql.push_str(" ORDER BY rowid LIMIT 1");
        Ok(rows_of(&self.lock(), &sql, &params, volume_row)?.pop())
    }

    async fn volume_name_taken(&self, name: &str, tenant: Option<&Tenant>) -> CoreResult<bool> {
        let n: i64 = self.lock().query_row(
            "SELECT COUNT(*) FROM volumes WHERE name = ?1 AND tenant IS ?2",
            params![name, tenant.map(Tenant::as_str)],
            |r| r.get(0),
        )?;
        Ok(n > 0)
    }

    async fn list_volumes(
        &self,
        scope: &TenantScope,
        page: &PageRequest,
    ) -> CoreResult<Page<VolumeRecord>> {
        let (sql, params) = volume_page_sql(scope, page)?;
        page_of(
            &self.lock(),
            &sql,
            &params,
            "volumes",
            page.limit,
            volume_row,
        )
    }

    async fn all_volumes(&self) -> CoreResult<Vec<VolumeRecord>> {
        rows_of(
            &self.lock(),
            "SELECT record, tenant FROM volumes ORDER BY rowid",
            &[],
            volume_row,
        )
    }

    async fn delete_volume(&self, id: &VolumeId) -> CoreResult<bool> {
        Ok(self
            .lock()
            .execute("DELETE FROM volumes WHERE id = ?1", [id.as_str()])?
            > 0)
    }
}

mod audit;
mod schema;
mod tenancy;
#[cfg(test)]
mod tests;
mod usage;
