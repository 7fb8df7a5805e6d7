//! [`TenancyStore`] on SQLite: the `tenants`, `api_keys`, `tenant_creates` and
//! `template_owners` tables (schema 5, `schema.rs`).
//!
//! Keys are rows of columns (no JSON record but the selector), looked up by the SHA-256 of
//! their secret (the primary key) or by id (a unique index). A tenant's listing of keys and
//! its quota counts use the `tenant` indexes.

use std::collections::BTreeMap;

use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter, Connection, OptionalExtension, Row};

use super::{corrupt, encode_cursor, page_clause, placeholders, scope_clause, SqliteStore};
use crate::error::{CoreError, CoreResult};
use crate::ids::{KeyId, SandboxId};
use crate::store::tenancy::{TenancyStore, CREATE_WINDOW_MS};
use crate::store::{Page, PageRequest};
use crate::tenant::keys::{KeyBudget, KeyRecord, KeyScope};
use crate::tenant::quota::TenantUsage;
use crate::tenant::settings::{TenantRecord, TenantSettings};
use crate::tenant::{Tenant, TenantScope};

/// The columns a key row is read from (after its `rowid`).
const KEY_COLUMNS: &str =
    "id, tenant, scope, name, selector, prefix, created_at_ms, expires_at_ms, last_used_ms, budget";

/// A key row of [`KEY_COLUMNS`] starting at column `at`.
fn key_row(r: &Row<'_>, at: usize) -> rusqlite::Result<KeyRecordColumns> {
    Ok(KeyRecordColumns {
        id: r.get(at)?,
        tenant: r.get(at + 1)?,
        scope: r.get(at + 2)?,
        name: r.get(at + 3)?,
        selector: r.get(at + 4)?,
        prefix: r.get(at + 5)?,
        created_at_ms: r.get(at + 6)?,
        expires_at_ms: r.get(at + 7)?,
        last_used_ms: r.get(at + 8)?,
        budget: r.get(at + 9)?,
    })
}

/// A key row as SQLite gives it, before its values are checked.
struct KeyRecordColumns {
    id: String,
    tenant: String,
    scope: String,
    name: Option<String>,
    selector: String,
    prefix: String,
    created_at_ms: i64,
    expires_at_ms: Option<i64>,
    last_used_ms: Option<i64>,
    budget: String,
}

impl KeyRecordColumns {
    fn decode(self) -> CoreResult<KeyRecord> {
        let scope = KeyScope::parse(&self.scope).ok_or_else(|| {
            CoreError::Database(format!(
                "key {} has unknown scope {:?}",
                self.id, self.scope
            ))
        })?;
        let id: KeyId = self
            .id
            .parse()
            .map_err(|_| CoreError::Database(format!("malformed key id {:?}", self.id)))?;
        Ok(KeyRecord {
            id,
            tenant: Tenant::new(self.tenant),
            scope,
            name: self.name,
            selector: serde_json::from_str(&self.selector).map_err(corrupt)?,
            prefix: self.prefix,
            created_at_ms: self.created_at_ms,
            expires_at_ms: self.expires_at_ms,
            last_used_ms: self.last_used_ms,
            budget: serde_json::from_str(&self.budget).map_err(corrupt)?,
        })
    }
}

fn one_key(conn: &Connection, condition: &str, value: &str) -> CoreResult<Option<KeyRecord>> {
    let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE {condition} = ?1");
    let row = conn
        .prepare_cached(&sql)?
        .query_row([value], |r| key_row(r, 0))
        .optional()?;
    row.map(KeyRecordColumns::decode).transpose()
}

fn tenant_row(name: String, settings: &str, created_at_ms: i64) -> CoreResult<TenantRecord> {
    Ok(TenantRecord {
        name: Tenant::new(name),
        settings: serde_json::from_str::<TenantSettings>(settings).map_err(corrupt)?,
        created_at_ms,
    })
}

/// "2 sandboxes, 1 snapshot and 1 volume" of the counts that are not 0.
fn owned_things(counts: &[(i64, &str, &str)]) -> String {
    let parts: Vec<String> = counts
        .iter()
        .filter(|(n, _, _)| *n > 0)
        .map(|(n, one, many)| format!("{n} {}", if *n == 1 { one } else { many }))
        .collect();
    match parts.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

#[async_trait]
impl TenancyStore for SqliteStore {
    async fn insert_tenant(&self, t: &TenantRecord) -> CoreResult<()> {
        let settings = serde_json::to_string(&t.settings).map_err(corrupt)?;
        let inserted = self.lock().execute(
            "INSERT OR IGNORE INTO tenants (name, settings, created_at_ms) VALUES (?1, ?2, ?3)",
            params![t.name.as_str(), settings, t.created_at_ms],
        )?;
        if inserted == 0 {
            return Err(CoreError::Conflict(format!(
                "tenant {} already exists",
                t.name
            )));
        }
        Ok(())
    }

    async fn get_tenant(&self, name: &Tenant) -> CoreResult<Option<TenantRecord>> {
        let row: Option<(String, String, i64)> = self
            .lock()
            .prepare_cached("SELECT name, settings, created_at_ms FROM tenants WHERE name = ?1")?
            .query_row([name.as_str()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()?;
        row.map(|(n, s, at)| tenant_row(n, &s, at)).transpose()
    }

    async fn list_tenants(&self, page: &PageRequest) -> CoreResult<Page<TenantRecord>> {
        let mut sql =
            String::from("SELECT rowid, name, settings, created_at_ms FROM tenants WHERE 1");
        let mut params = Vec::new();
        page_clause("tenants", page, &mut sql, &mut params)?;
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params_from_iter(params), |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get(1)?,
                r.get::<_, String>(2)?,
                r.get(3)?,
            ))
        })?;
        let mut items = Vec::new();
        let mut next = None;
        for row in rows {
            let (rowid, name, settings, at) = row?;
            if page.limit.is_some_and(|n| items.len() == n) {
                next = items.last().map(|(id, _)| encode_cursor("tenants", *id));
                break;
            }
            items.push((rowid, tenant_row(name, &settings, at)?));
        }
        Ok(Page {
            items: items.into_iter().map(|(_, t)| t).collect(),
            next,
        })
    }

    async fn update_tenant(&self, t: &TenantRecord) -> CoreResult<()> {
        let settings = serde_json::to_string(&t.settings).map_err(corrupt)?;
        let changed = self.lock().execute(
            "UPDATE tenants SET settings = ?2 WHERE name = ?1",
            params![t.name.as_str(), settings],
        )?;
        if changed == 0 {
            return Err(CoreError::NotFound(format!(
                "tenant {} does not exist",
                t.name
            )));
        }
        Ok(())
    }

    async fn delete_tenant(&self, name: &Tenant) -> CoreResult<Vec<KeyId>> {
        let conn = self.lock();
        let tx = conn.unchecked_transaction()?;
        let exists = tx
            .query_row(
                "SELECT 1 FROM tenants WHERE name = ?1",
                [name.as_str()],
                |_| Ok(()),
            )
            .optional()?
            .is_some();
        if !exists {
            return Err(CoreError::NotFound(format!("tenant {name} does not exist")));
        }
        let count = |sql: &str| -> CoreResult<i64> {
            Ok(tx.query_row(sql, [name.as_str()], |r| r.get(0))?)
        };
        let owned = owned_things(&[
            (
                count("SELECT COUNT(*) FROM sandboxes WHERE tenant = ?1 AND state != 'pooled'")?,
                "sandbox",
                "sandboxes",
            ),
            (
                count("SELECT COUNT(*) FROM snapshots WHERE tenant = ?1 AND hidden = 0")?,
                "snapshot",
                "snapshots",
            ),
            (
                count("SELECT COUNT(*) FROM volumes WHERE tenant = ?1")?,
                "volume",
                "volumes",
            ),
            (
                count("SELECT COUNT(*) FROM template_owners WHERE tenant = ?1")?,
                "template",
                "templates",
            ),
        ]);
        if !owned.is_empty() {
            return Err(CoreError::Conflict(format!(
                "tenant {name} still owns {owned}: delete them first"
            )));
        }
        let mut ids = Vec::new();
        {
            let mut stmt = tx.prepare_cached("SELECT id FROM api_keys WHERE tenant = ?1")?;
            for id in stmt.query_map([name.as_str()], |r| r.get::<_, String>(0))? {
                if let Ok(id) = id?.parse() {
                    ids.push(id);
                }
            }
        }
        tx.execute("DELETE FROM api_keys WHERE tenant = ?1", [name.as_str()])?;
        tx.execute(
            "DELETE FROM tenant_creates WHERE tenant = ?1",
            [name.as_str()],
        )?;
        tx.execute("DELETE FROM tenants WHERE name = ?1", [name.as_str()])?;
        tx.commit()?;
        Ok(ids)
    }

    async fn tenant_usage(
        &self,
        tenant: &Tenant,
        excluding: &[SandboxId],
        since_ms: i64,
    ) -> CoreResult<TenantUsage> {
        let sql = format!(
            "SELECT COUNT(*),
                COALESCE(SUM(CASE WHEN state != 'paused' THEN json_extract(record, '$.cpus') END), 0),
                COALESCE(SUM(CASE WHEN state != 'paused'
                    THEN json_extract(record, '$.memory_mib') END), 0)
            FROM sandboxes WHERE tenant = ?1 AND state IN ('starting', 'running', 'paused')
                AND id NOT IN ({})",
            placeholders(2, excluding.len())
        );
        let mut params = vec![Value::Text(tenant.as_str().to_string())];
        params.extend(excluding.iter().map(|id| Value::Text(id.to_string())));
        let conn = self.lock();
        let (sandboxes, cpus, memory_mib): (i64, f64, i64) = conn
            .prepare_cached(&sql)?
            .query_row(params_from_iter(params), |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?;
        let creates: i64 = conn
            .prepare_cached("SELECT COUNT(*) FROM tenant_creates WHERE tenant = ?1 AND at_ms > ?2")?
            .query_row(params![tenant.as_str(), since_ms], |r| r.get(0))?;
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok(TenantUsage {
            sandboxes: count(sandboxes),
            cpus,
            memory_mib: count(memory_mib),
            creates_last_hour: count(creates),
        })
    }

    async fn record_create(&self, tenant: &Tenant, at_ms: i64) -> CoreResult<()> {
        let conn = self.lock();
        let tx = conn.unchecked_transaction()?;
        tx.execute(
            "INSERT INTO tenant_creates (tenant, at_ms) VALUES (?1, ?2)",
            params![tenant.as_str(), at_ms],
        )?;
        tx.execute(
            "DELETE FROM tenant_creates WHERE tenant = ?1 AND at_ms <= ?2",
            params![tenant.as_str(), at_ms - CREATE_WINDOW_MS],
        )?;
        tx.commit()?;
        Ok(())
    }

    async fn insert_key(&self, secret_hash: &str, key: &KeyRecord) -> CoreResult<()> {
        let selector = serde_json::to_string(&key.selector).map_err(corrupt)?;
        let budget = serde_json::to_string(&key.budget).map_err(corrupt)?;
        self.lock().execute(
            "INSERT INTO api_keys (key_hash, tenant, admin, created_at_ms, id, scope, name,
                selector, prefix, expires_at_ms, last_used_ms, budget)
                VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            params![
                secret_hash,
                key.tenant.as_str(),
                key.is_admin(),
                key.created_at_ms,
                key.id.as_str(),
                key.scope.as_str(),
                key.name,
                selector,
                key.prefix,
                key.expires_at_ms,
                key.last_used_ms,
                budget,
            ],
        )?;
        Ok(())
    }

    async fn set_key_budget(&self, id: &KeyId, budget: &KeyBudget) -> CoreResult<bool> {
        let budget = serde_json::to_string(budget).map_err(corrupt)?;
        let n = self.lock().execute(
            "UPDATE api_keys SET budget = ?2 WHERE id = ?1",
            params![id.as_str(), budget],
        )?;
        Ok(n > 0)
    }

    async fn key_by_secret_hash(&self, secret_hash: &str) -> CoreResult<Option<KeyRecord>> {
        one_key(&self.lock(), "key_hash", secret_hash)
    }

    async fn get_key(&self, id: &KeyId) -> CoreResult<Option<KeyRecord>> {
        one_key(&self.lock(), "id", id.as_str())
    }

    async fn list_keys(
        &self,
        scope: &TenantScope,
        page: &PageRequest,
    ) -> CoreResult<Page<KeyRecord>> {
        let mut sql = format!("SELECT rowid, {KEY_COLUMNS} FROM api_keys WHERE 1");
        let mut params = Vec::new();
        scope_clause(scope, &mut sql, &mut params);
        page_clause("api_keys", page, &mut sql, &mut params)?;
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params_from_iter(params), |r| {
            Ok((r.get::<_, i64>(0)?, key_row(r, 1)?))
        })?;
        let mut items = Vec::new();
        let mut last = None;
        let mut next = None;
        for row in rows {
            let (rowid, columns) = row?;
            if page.limit.is_some_and(|n| items.len() == n) {
                next = last.map(|id| encode_cursor("api_keys", id));
                break;
            }
            items.push(columns.decode()?);
            last = Some(rowid);
        }
        Ok(Page { items, next })
    }

    async fn delete_key(&self, id: &KeyId) -> CoreResult<bool> {
        Ok(self
            .lock()
            .execute("DELETE FROM api_keys WHERE id = ?1", [id.as_str()])?
            > 0)
    }

    async fn record_key_uses(&self, uses: &[(KeyId, i64)]) -> CoreResult<()> {
        let conn = self.lock();
        let tx = conn.unchecked_transaction()?;
        for (id, at) in uses {
            tx.execute(
                "UPDATE api_keys SET last_used_ms = max(coalesce(last_used_ms, 0), ?2)
                    WHERE id = ?1",
                params![id.as_str(), at],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    async fn template_owner(&self, name: &str) -> CoreResult<Option<Tenant>> {
        Ok(self
            .lock()
            .prepare_cached("SELECT tenant FROM template_owners WHERE name = ?1")?
            .query_row([name], |r| r.get::<_, String>(0))
            .optional()?
            .map(Tenant::new))
    }

    async fn template_owners(&self) -> CoreResult<BTreeMap<String, Tenant>> {
        let conn = self.lock();
        let mut stmt = conn.prepare_cached("SELECT name, tenant FROM template_owners")?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        let mut out = BTreeMap::new();
        for row in rows {
            let (name, tenant) = row?;
            out.insert(name, Tenant::new(tenant));
        }
        Ok(out)
    }

    async fn claim_template(&self, name: &str, tenant: &Tenant) -> CoreResult<Tenant> {
        let conn = self.lock();
        conn.execute(
            "INSERT OR IGNORE INTO template_owners (name, tenant) VALUES (?1, ?2)",
            params![name, tenant.as_str()],
        )?;
        let owner: String = conn.query_row(
            "SELECT tenant FROM template_owners WHERE name = ?1",
            [name],
            |r| r.get(0),
        )?;
        Ok(Tenant::new(owner))
    }

    async fn forget_template(&self, name: &str) -> CoreResult<()> {
        self.lock()
            .execute("DELETE FROM template_owners WHERE name = ?1", [name])?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::owned_things;

    #[test]
    fn what_a_tenant_owns_reads_as_a_sentence() {
        assert_eq!(
            owned_things(&[
                (2, "sandbox", "sandboxes"),
                (0, "x", "xs"),
                (1, "volume", "volumes")
            ]),
            "2 sandboxes and 1 volume"
        );
        assert_eq!(
            owned_things(&[(1, "a", "as"), (3, "b", "bs"), (1, "c", "cs")]),
            "1 a, 3 bs and 1 c"
        );
        assert_eq!(owned_things(&[(0, "a", "as")]), "");
    }
}

#[cfg(test)]
mod store_tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::SandboxState;
    use crate::store::Store;
    use crate::tenant::quota::TenantUsage;
    use crate::tenant::settings::Quotas;

    fn open(dir: &tempfile::TempDir) -> SqliteStore {
        SqliteStore::open(&dir.path().join("state.db")).expect("open")
    }

    fn tenant(name: &str) -> TenantRecord {
        TenantRecord {
            name: Tenant::new(name),
            settings: TenantSettings::default(),
            created_at_ms: 1,
        }
    }

    fn key(id: &str, tenant: &str) -> KeyRecord {
        KeyRecord {
            id: id.parse().expect("key id"),
            tenant: Tenant::new(tenant),
            scope: KeyScope::Exec,
            name: Some("ci".into()),
            selector: [("team".to_string(), "ml".to_string())].into(),
            prefix: "hk_x…".into(),
            created_at_ms: 2,
            expires_at_ms: Some(99),
            last_used_ms: None,
            budget: Default::default(),
        }
    }

    /// A sandbox record of `tenant` in `state` with `cpus` and `memory_mib`.
    fn sandbox(
        id: &str,
        slot: u32,
        tenant: &str,
        state: SandboxState,
        cpus: f64,
    ) -> crate::model::SandboxRecord {
        let json = serde_json::json!({
            "id": id, "template": "minimal", "isolation": "ns", "state": state,
            "metadata": {}, "env": {}, "cpus": cpus, "memory_mib": 100, "disk_mib": 1,
            "pids_max": 8, "ttl_seconds": 60, "persistent": false, "created_at_ms": 1,
            "expires_at_ms": 2, "uid_slot": slot, "cgroups": [], "last_used_ms": 0
        });
        let mut r: crate::model::SandboxRecord = serde_json::from_value(json).expect("record");
        r.tenant = Some(Tenant::new(tenant));
        r
    }

    #[tokio::test]
    async fn tenants_are_made_changed_and_deleted_with_their_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(&dir);
        s.insert_tenant(&tenant("acme")).await.expect("insert");
        assert!(matches!(
            s.insert_tenant(&tenant("acme")).await,
            Err(CoreError::Conflict(_))
        ));
        let mut changed = tenant("acme");
        changed.settings.quotas = Quotas {
            max_sandboxes: Some(3),
            ..Quotas::default()
        };
        s.update_tenant(&changed).await.expect("update");
        assert_eq!(
            s.get_tenant(&Tenant::new("acme")).await.expect("q"),
            Some(changed)
        );
        assert!(matches!(
            s.update_tenant(&tenant("nobody")).await,
            Err(CoreError::NotFound(_))
        ));
        s.insert_key("hash_a", &key("key_a", "acme"))
            .await
            .expect("key");
        s.insert_key("hash_b", &key("key_b", "beta"))
            .await
            .expect("key");
        s.insert_sandbox(&sandbox("sbx_a", 20, "acme", SandboxState::Hibernated, 1.0))
            .await
            .expect("sandbox");
        let e = s
            .delete_tenant(&Tenant::new("acme"))
            .await
            .expect_err("owns");
        assert_eq!(
            e.to_string(),
            "tenant acme still owns 1 sandbox: delete them first"
        );
        assert!(s
            .delete_sandbox(&"sbx_a".parse().expect("id"))
            .await
            .expect("delete"));
        assert_eq!(
            s.delete_tenant(&Tenant::new("acme")).await.expect("delete"),
            vec!["key_a".parse::<KeyId>().expect("id")]
        );
        assert!(s
            .get_tenant(&Tenant::new("acme"))
            .await
            .expect("q")
            .is_none());
        assert!(s.key_by_secret_hash("hash_a").await.expect("q").is_none());
        assert!(
            s.key_by_secret_hash("hash_b").await.expect("q").is_some(),
            "others stay"
        );
        assert!(matches!(
            s.delete_tenant(&Tenant::new("acme")).await,
            Err(CoreError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn usage_counts_live_sandboxes_leaves_out_the_excluded_and_windows_creates() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(&dir);
        for (id, slot, state, cpus) in [
            ("sbx_run", 20, SandboxState::Running, 0.5),
            ("sbx_start", 21, SandboxState::Starting, 0.25),
            ("sbx_pause", 22, SandboxState::Paused, 2.0),
            ("sbx_hib", 23, SandboxState::Hibernated, 4.0),
            ("sbx_fail", 24, SandboxState::Failed, 4.0),
        ] {
            s.insert_sandbox(&sandbox(id, slot, "acme", state, cpus))
                .await
                .expect("insert");
        }
        s.insert_sandbox(&sandbox(
            "sbx_other",
            25,
            "beta",
            SandboxState::Running,
            8.0,
        ))
        .await
        .expect("insert");
        let acme = Tenant::new("acme");
        let u = s.tenant_usage(&acme, &[], 0).await.expect("usage");
        assert_eq!(
            u,
            TenantUsage {
                sandboxes: 3,
                cpus: 0.75,
                memory_mib: 200,
                creates_last_hour: 0
            },
            "paused counts as a sandbox, not as running CPUs"
        );
        let u = s
            .tenant_usage(&acme, &["sbx_run".parse().expect("id")], 0)
            .await
            .expect("usage");
        assert_eq!((u.sandboxes, u.cpus), (2, 0.25));
        let hour = CREATE_WINDOW_MS;
        s.record_create(&acme, 1_000).await.expect("log");
        s.record_create(&acme, 2_000).await.expect("log");
        s.record_create(&Tenant::new("beta"), 2_000)
            .await
            .expect("log");
        assert_eq!(
            s.tenant_usage(&acme, &[], 1_500)
                .await
                .expect("u")
                .creates_last_hour,
            1
        );
        // A create an hour later forgets the ones before its window.
        s.record_create(&acme, 2_000 + hour).await.expect("log");
        let kept: i64 = s
            .lock()
            .query_row(
                "SELECT COUNT(*) FROM tenant_creates WHERE tenant = 'acme'",
                [],
                |r| r.get(0),
            )
            .expect("count");
        assert_eq!(kept, 1);
    }

    #[tokio::test]
    async fn keys_list_by_tenant_in_pages_and_uses_only_move_later() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(&dir);
        for (id, t) in [
            ("key_a1", "acme"),
            ("key_b1", "beta"),
            ("key_a2", "acme"),
            ("key_a3", "acme"),
        ] {
            s.insert_key(&format!("h_{id}"), &key(id, t))
                .await
                .expect("key");
        }
        let acme = TenantScope::Only(Tenant::new("acme"));
        let first = s
            .list_keys(&acme, &PageRequest::new(Some(2), None).expect("page"))
            .await
            .expect("page");
        let ids =
            |p: &Page<KeyRecord>| p.items.iter().map(|k| k.id.to_string()).collect::<Vec<_>>();
        assert_eq!(ids(&first), ["key_a1", "key_a2"]);
        let second = s
            .list_keys(
                &acme,
                &PageRequest::new(Some(2), first.next.clone()).expect("page"),
            )
            .await
            .expect("page");
        assert_eq!(ids(&second), ["key_a3"]);
        assert!(second.next.is_none());
        assert_eq!(
            s.list_keys(&TenantScope::All, &PageRequest::default())
                .await
                .expect("all")
                .items
                .len(),
            4
        );
        let a1: KeyId = "key_a1".parse().expect("id");
        assert_eq!(
            s.get_key(&a1).await.expect("q"),
            Some(key("key_a1", "acme"))
        );
        s.record_key_uses(&[(a1.clone(), 50)]).await.expect("uses");
        s.record_key_uses(&[(a1.clone(), 40)]).await.expect("uses");
        assert_eq!(
            s.get_key(&a1)
                .await
                .expect("q")
                .and_then(|k| k.last_used_ms),
            Some(50)
        );
        assert!(s.delete_key(&a1).await.expect("delete"));
        assert!(!s.delete_key(&a1).await.expect("again"));
        let _: BTreeMap<String, String> = key("key_z", "x").selector;
    }

    #[tokio::test]
    async fn a_template_name_is_claimed_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(&dir);
        let (acme, beta) = (Tenant::new("acme"), Tenant::new("beta"));
        assert_eq!(s.claim_template("web", &acme).await.expect("claim"), acme);
        assert_eq!(s.claim_template("web", &beta).await.expect("claim"), acme);
        assert_eq!(
            s.template_owner("web").await.expect("q"),
            Some(acme.clone())
        );
        assert_eq!(s.template_owners().await.expect("q").len(), 1);
        s.insert_tenant(&tenant("acme")).await.expect("tenant");
        assert!(matches!(
            s.delete_tenant(&acme).await,
            Err(CoreError::Conflict(_))
        ));
        s.forget_template("web").await.expect("forget");
        assert_eq!(s.template_owner("web").await.expect("q"), None);
        s.delete_tenant(&acme).await.expect("nothing owned now");
    }
}
