//! The state database (embedded SQLite).
//!
//! Schema version 2 (`PRAGMA user_version`):
//! - `sandboxes(id PRIMARY KEY, state, uid_slot UNIQUE, record JSON)`: one row per sandbox;
//!   `record` is a serialized [`SandboxRecord`]; `state` and `uid_slot` are copied out so
//!   they can be indexed and constrained.
//! - `api_keys(key_hash PRIMARY KEY, tenant, admin, created_at_ms)`: SHA-256 of each key.
//! - `snapshots(id PRIMARY KEY, record JSON)` (since version 2): one row per snapshot, a
//!   serialized [`SnapshotRecord`].
//!
//! Migrations run in order inside one transaction when the database is opened: 0 → 1 creates
//! the first two tables, 1 → 2 adds `snapshots`. A database newer than this binary is refused.
//!
//! The database is opened in WAL mode; every call is a short transaction, so the one
//! connection behind a mutex is never held across an `.await`. [`Store::modify`] reads,
//! changes and writes one record under that mutex, so concurrent changes to different fields
//! of a sandbox (its TTL and its state, say) never undo each other.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};
use sha2::{Digest, Sha256};

use crate::error::{CoreError, CoreResult};
use crate::model::{SandboxRecord, SandboxState};
use crate::snapshot::SnapshotRecord;
use crate::volume::VolumeRecord;

const SCHEMA_VERSION: i64 = 3;

/// The statements that bring a database from version `i` to `i + 1`.
const MIGRATIONS: [&str; 3] = [
    "CREATE TABLE IF NOT EXISTS sandboxes (
        id TEXT PRIMARY KEY,
        state TEXT NOT NULL,
        uid_slot INTEGER NOT NULL UNIQUE,
        record TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS api_keys (
        key_hash TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        admin INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL
    );",
    "CREATE TABLE IF NOT EXISTS snapshots (
        id TEXT PRIMARY KEY,
        record TEXT NOT NULL
    );",
    "CREATE TABLE IF NOT EXISTS volumes (
        id TEXT PRIMARY KEY,
        record TEXT NOT NULL
    );",
];

/// The state database.
pub struct Store {
    conn: Mutex<Connection>,
}

/// The tenant an API key belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyOwner {
    /// Tenant name.
    pub tenant: String,
    /// Admin keys see every tenant.
    pub admin: bool,
}

fn hash_key(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
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

impl Store {
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

    /// Insert a new record. Fails with `Conflict` if its uid slot is taken.
    pub fn insert(&self, r: &SandboxRecord) -> CoreResult<()> {
        let json = serde_json::to_string(r).map_err(corrupt)?;
        let res = self.lock().execute(
            "INSERT INTO sandboxes (id, state, uid_slot, record) VALUES (?1, ?2, ?3, ?4)",
            params![r.id, r.state.as_str(), r.uid_slot, json],
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

    /// Replace a record.
    pub fn update(&self, r: &SandboxRecord) -> CoreResult<()> {
        let json = serde_json::to_string(r).map_err(corrupt)?;
        let n = self.lock().execute(
            "UPDATE sandboxes SET state = ?2, record = ?3 WHERE id = ?1",
            params![r.id, r.state.as_str(), json],
        )?;
        if n == 0 {
            return Err(CoreError::NotFound(format!(
                "sandbox {} does not exist",
                r.id
            )));
        }
        Ok(())
    }

    /// Change one record atomically: `change` sees the current record and edits it; the result
    /// is written back unless `change` fails. `NotFound` when there is no such sandbox.
    pub fn modify(
        &self,
        id: &str,
        change: impl FnOnce(&mut SandboxRecord) -> CoreResult<()>,
    ) -> CoreResult<SandboxRecord> {
        let conn = self.lock();
        let json: Option<String> = conn
            .query_row("SELECT record FROM sandboxes WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .optional()?;
        let Some(json) = json else {
            return Err(CoreError::NotFound(format!("sandbox {id} does not exist")));
        };
        let mut record: SandboxRecord = serde_json::from_str(&json).map_err(corrupt)?;
        change(&mut record)?;
        let json = serde_json::to_string(&record).map_err(corrupt)?;
        conn.execute(
            "UPDATE sandboxes SET state = ?2, record = ?3 WHERE id = ?1",
            params![record.id, record.state.as_str(), json],
        )?;
        Ok(record)
    }

    /// Insert a snapshot record.
    pub fn insert_snapshot(&self, r: &SnapshotRecord) -> CoreResult<()> {
        let json = serde_json::to_string(r).map_err(corrupt)?;
        self.lock().execute(
            "INSERT INTO snapshots (id, record) VALUES (?1, ?2)",
            params![r.id, json],
        )?;
        Ok(())
    }

    /// Fetch one snapshot record.
    pub fn get_snapshot(&self, id: &str) -> CoreResult<Option<SnapshotRecord>> {
        let json: Option<String> = self
            .lock()
            .query_row("SELECT record FROM snapshots WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .optional()?;
        json.map(|j| serde_json::from_str(&j).map_err(corrupt))
            .transpose()
    }

    /// Every snapshot record, oldest first.
    pub fn snapshots(&self) -> CoreResult<Vec<SnapshotRecord>> {
        let conn = self.lock();
        let mut stmt = conn.prepare("SELECT record FROM snapshots ORDER BY rowid")?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(serde_json::from_str(&row?).map_err(corrupt)?);
        }
        Ok(out)
    }

    /// Delete a snapshot record; returns whether it existed.
    pub fn delete_snapshot(&self, id: &str) -> CoreResult<bool> {
        Ok(self
            .lock()
            .execute("DELETE FROM snapshots WHERE id = ?1", [id])?
            > 0)
    }

    /// Insert a volume record.
    pub fn insert_volume(&self, r: &VolumeRecord) -> CoreResult<()> {
        let json = serde_json::to_string(r).map_err(corrupt)?;
        self.lock().execute(
            "INSERT INTO volumes (id, record) VALUES (?1, ?2)",
            params![r.id, json],
        )?;
        Ok(())
    }

    /// Every volume record, oldest first.
    pub fn volumes(&self) -> CoreResult<Vec<VolumeRecord>> {
        let conn = self.lock();
        let mut stmt = conn.prepare("SELECT record FROM volumes ORDER BY rowid")?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(serde_json::from_str(&row?).map_err(corrupt)?);
        }
        Ok(out)
    }

    /// Delete a volume record; returns whether it existed.
    pub fn delete_volume(&self, id: &str) -> CoreResult<bool> {
        Ok(self
            .lock()
            .execute("DELETE FROM volumes WHERE id = ?1", [id])?
            > 0)
    }

    /// Fetch one record.
    pub fn get(&self, id: &str) -> CoreResult<Option<SandboxRecord>> {
        let json: Option<String> = self
            .lock()
            .query_row("SELECT record FROM sandboxes WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .optional()?;
        json.map(|j| serde_json::from_str(&j).map_err(corrupt))
            .transpose()
    }

    /// Every sandbox, oldest first (the pool's warm guests left out: [`Store::pooled`]).
    pub fn all(&self) -> CoreResult<Vec<SandboxRecord>> {
        self.select("SELECT record FROM sandboxes WHERE state != 'pooled' ORDER BY rowid")
    }

    /// The warm guests of the pool (state `pooled`), which [`Store::all`] leaves out.
    pub fn pooled(&self) -> CoreResult<Vec<SandboxRecord>> {
        self.select("SELECT record FROM sandboxes WHERE state = 'pooled' ORDER BY rowid")
    }

    fn select(&self, sql: &str) -> CoreResult<Vec<SandboxRecord>> {
        let conn = self.lock();
        let mut stmt = conn.prepare(sql)?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for row in rows {
            out.push(serde_json::from_str(&row?).map_err(corrupt)?);
        }
        Ok(out)
    }

    /// Count sandboxes per state.
    pub fn count_by_state(&self) -> CoreResult<Vec<(SandboxState, u64)>> {
        let conn = self.lock();
        let mut stmt = conn.prepare("SELECT state, COUNT(*) FROM sandboxes GROUP BY state")?;
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

    /// Delete a record; returns whether it existed.
    pub fn delete(&self, id: &str) -> CoreResult<bool> {
        Ok(self
            .lock()
            .execute("DELETE FROM sandboxes WHERE id = ?1", [id])?
            > 0)
    }

    /// Register an API key (stored hashed).
    pub fn add_api_key(&self, key: &str, owner: &KeyOwner) -> CoreResult<()> {
        self.lock().execute(
            "INSERT OR REPLACE INTO api_keys (key_hash, tenant, admin, created_at_ms) VALUES (?1, ?2, ?3, ?4)",
            params![hash_key(key), owner.tenant, owner.admin, crate::time::now_ms()],
        )?;
        Ok(())
    }

    /// Who owns `key`, if anyone.
    pub fn key_owner(&self, key: &str) -> CoreResult<Option<KeyOwner>> {
        Ok(self
            .lock()
            .query_row(
                "SELECT tenant, admin FROM api_keys WHERE key_hash = ?1",
                [hash_key(key)],
                |r| {
                    Ok(KeyOwner {
                        tenant: r.get(0)?,
                        admin: r.get(1)?,
                    })
                },
            )
            .optional()?)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::Isolation;

    fn record(id: &str, slot: u32) -> SandboxRecord {
        SandboxRecord {
            id: id.into(),
            template: "minimal".into(),
            isolation: Isolation::Ns,
            state: SandboxState::Running,
            metadata: BTreeMap::from([("tenant_id".into(), "acme".into())]),
            env: BTreeMap::new(),
            cpus: 1.0,
            memory_mib: 256,
            disk_mib: 1024,
            pids_max: 128,
            ttl_seconds: 300,
            persistent: false,
            created_at_ms: 1,
            expires_at_ms: 2,
            uid_slot: slot,
            init_pid: Some(42),
            init_start_time: Some(7),
            cgroups: vec![],
            error: None,
            network: None,
            layer: None,
            snapshot: None,
            forked_from: None,
            idle_hibernate_seconds: None,
            last_used_ms: 0,
            net_slot: None,
            volumes: vec![],
        }
    }

    #[test]
    fn records_and_keys_persist_across_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        {
            let s = Store::open(&path).expect("open");
            s.insert(&record("sbx_a", 20)).expect("insert");
            assert!(matches!(
                s.insert(&record("sbx_b", 20)),
                Err(CoreError::Conflict(_))
            ));
            let mut r = record("sbx_a", 20);
            r.state = SandboxState::Failed;
            s.update(&r).expect("update");
            s.add_api_key(
                "hk_secret",
                &KeyOwner {
                    tenant: "t".into(),
                    admin: true,
                },
            )
            .expect("key");
        }
        let s = Store::open(&path).expect("reopen");
        let r = s.get("sbx_a").expect("get").expect("exists");
        assert_eq!(r.state, SandboxState::Failed);
        assert_eq!(
            s.count_by_state().expect("count"),
            vec![(SandboxState::Failed, 1)]
        );
        assert_eq!(
            s.key_owner("hk_secret").expect("q").map(|o| o.admin),
            Some(true)
        );
        assert_eq!(s.key_owner("hk_wrong").expect("q"), None);
        assert!(s.delete("sbx_a").expect("delete"));
        assert!(!s.delete("sbx_a").expect("delete again"));
        assert!(s.get("sbx_a").expect("get").is_none());
    }

    #[test]
    fn modify_changes_one_record_and_can_refuse() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Store::open(&dir.path().join("state.db")).expect("open");
        s.insert(&record("sbx_a", 20)).expect("insert");
        let r = s
            .modify("sbx_a", |r| {
                r.state = SandboxState::Paused;
                Ok(())
            })
            .expect("modify");
        assert_eq!(r.state, SandboxState::Paused);
        assert_eq!(
            s.count_by_state().expect("count"),
            vec![(SandboxState::Paused, 1)]
        );
        let refused = s.modify("sbx_a", |r| {
            r.state = SandboxState::Failed;
            Err(CoreError::Conflict("no".into()))
        });
        assert!(matches!(refused, Err(CoreError::Conflict(_))));
        assert_eq!(
            s.get("sbx_a").expect("get").expect("row").state,
            SandboxState::Paused
        );
        assert!(matches!(
            s.modify("sbx_zz", |_| Ok(())),
            Err(CoreError::NotFound(_))
        ));
    }

    #[test]
    fn a_version_1_database_is_migrated_and_keeps_its_rows() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.db");
        {
            let conn = Connection::open(&path).expect("open raw");
            conn.execute_batch(MIGRATIONS[0]).expect("v1 schema");
            let json = serde_json::to_string(&record("sbx_old", 21)).expect("json");
            conn.execute(
                "INSERT INTO sandboxes (id, state, uid_slot, record) VALUES ('sbx_old', 'running', 21, ?1)",
                [json],
            )
            .expect("row");
            conn.pragma_update(None, "user_version", 1)
                .expect("version");
        }
        let s = Store::open(&path).expect("migrate");
        let version: i64 = s
            .lock()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .expect("version");
        assert_eq!(version, SCHEMA_VERSION);
        assert!(s.get("sbx_old").expect("get").is_some());
        assert!(s.snapshots().expect("snapshots").is_empty());
        // A database from a newer hutch is refused.
        s.lock()
            .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .expect("bump");
        drop(s);
        assert!(matches!(Store::open(&path), Err(CoreError::Database(_))));
    }
}
