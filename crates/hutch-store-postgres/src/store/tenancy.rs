//! [`TenancyStore`] on PostgreSQL: the `tenants`, `api_keys`, `tenant_creates` and
//! `template_owners` tables (migration 2), all cluster-wide (no node owns a tenant).
//!
//! What must not race is one call, as on SQLite's one connection:
//! [`TenancyStore::delete_tenant`] locks the tenant's row `FOR UPDATE` before it counts what
//! the tenant owns on every node, and every insert of something a tenant owns (a sandbox,
//! a snapshot, a volume, a template claim) locks the same row `FOR KEY SHARE` first, so the
//! count cannot miss a row committed after it. [`TenancyStore::tenant_usage`] is one
//! statement: the tenant's live sandboxes on every node and its placements not yet written
//! by their node (`placements`, by `hutch-cluster`).

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use hutch_core::ids::{KeyId, SandboxId};
use hutch_core::store::tenancy::{TenancyStore, CREATE_WINDOW_MS};
use hutch_core::store::{Page, PageRequest};
use hutch_core::tenant::keys::{KeyBudget, KeyRecord, KeyScope};
use hutch_core::tenant::quota::TenantUsage;
use hutch_core::tenant::settings::TenantRecord;
use hutch_core::tenant::{Tenant, TenantScope};
use hutch_core::{CoreError, CoreResult};
use serde_json::Value;
use tokio_postgres::Row;

use super::rows::{seq_and, to_json};
use super::sql::{corrupt, count, execute, get, one, page_of, pg, rows, Query};
use super::PostgresStore;

/// The columns a key row is read from.
const KEY_COLUMNS: &str =
    "id, tenant, scope, name, selector, prefix, created_at_ms, expires_at_ms, last_used_ms, budget";

fn key_row(row: &Row) -> CoreResult<KeyRecord> {
    let id: String = get(row, "id")?;
    let scope: String = get(row, "scope")?;
    let scope = KeyScope::parse(&scope)
        .ok_or_else(|| CoreError::Database(format!("key {id} has unknown scope {scope:?}")))?;
    let parsed: KeyId = id
        .parse()
        .map_err(|_| CoreError::Database(format!("malformed key id {id:?}")))?;
    Ok(KeyRecord {
        id: parsed,
        tenant: Tenant::new(get::<String>(row, "tenant")?),
        scope,
        name: get(row, "name")?,
        selector: serde_json::from_value(get::<Value>(row, "selector")?).map_err(corrupt)?,
        prefix: get(row, "prefix")?,
        created_at_ms: get(row, "created_at_ms")?,
        expires_at_ms: get(row, "expires_at_ms")?,
        last_used_ms: get(row, "last_used_ms")?,
        budget: serde_json::from_value(get::<Value>(row, "budget")?).map_err(corrupt)?,
    })
}

fn tenant_row(row: &Row) -> CoreResult<TenantRecord> {
    Ok(TenantRecord {
        name: Tenant::new(get::<String>(row, "name")?),
        settings: serde_json::from_value(get::<Value>(row, "settings")?).map_err(corrupt)?,
        created_at_ms: get(row, "created_at_ms")?,
    })
}

/// "2 sandboxes, 1 snapshot and 1 volume" of the counts that are not 0 (the sentence
/// SQLite's store answers).
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

/// What `tenant` (`$1`) uses on every node, leaving out the sandboxes `$2` names, with its
/// creates after `$3`: its sandboxes starting, running or paused (the CPUs and memory of
/// those not paused), and its placements (creates placed on a node, counted as starting)
/// whose sandbox has no row yet and that have not expired, which count as creates too
/// (creates in flight on other nodes, not yet logged in `tenant_creates`).
const USAGE_SQL: &str = "SELECT count(*) AS sandboxes,
        coalesce(sum(cpus) FILTER (WHERE state <> 'paused'), 0)::float8 AS cpus,
        coalesce(sum(memory_mib) FILTER (WHERE state <> 'paused'), 0)::bigint AS memory_mib,
        (SELECT count(*) FROM tenant_creates WHERE tenant = $1 AND at_ms > $3)
            + count(*) FILTER (WHERE placed) AS creates
    FROM (
        SELECT state, (record->>'cpus')::float8 AS cpus,
            (record->>'memory_mib')::bigint AS memory_mib, false AS placed
        FROM sandboxes
        WHERE tenant = $1 AND state IN ('starting', 'running', 'paused') AND id <> ALL($2)
        UNION ALL
        SELECT 'starting', p.cpus, p.memory_mib, true FROM placements AS p
        WHERE p.tenant = $1 AND p.expires_at > now() AND p.sandbox <> ALL($2)
            AND NOT EXISTS (SELECT 1 FROM sandboxes AS s WHERE s.id = p.sandbox)
    ) AS live";

#[async_trait]
impl TenancyStore for PostgresStore {
    async fn insert_tenant(&self, t: &TenantRecord) -> CoreResult<()> {
        let settings = to_json(&t.settings)?;
        let client = self.client().await?;
        let inserted = execute(
            &client,
            "INSERT INTO tenants (name, settings, created_at_ms) VALUES ($1, $2, $3)
                ON CONFLICT (name) DO NOTHING",
            &[&t.name.as_str(), &settings, &t.created_at_ms],
        )
        .await?;
        if inserted == 0 {
            return Err(CoreError::Conflict(format!(
                "tenant {} already exists",
                t.name
            )));
        }
        Ok(())
    }

    async fn get_tenant(&self, name: &Tenant) -> CoreResult<Option<TenantRecord>> {
        let client = self.client().await?;
        let found = rows(
            &client,
            "SELECT name, settings, created_at_ms FROM tenants WHERE name = $1",
            &[&name.as_str()],
        )
        .await?;
        found.first().map(tenant_row).transpose()
    }

    async fn list_tenants(&self, page: &PageRequest) -> CoreResult<Page<TenantRecord>> {
        let mut q = Query::new("SELECT seq, name, settings, created_at_ms FROM tenants WHERE true");
        q.page("tenants", "seq", page)?;
        let client = self.client().await?;
        let found = q.rows(&client).await?;
        page_of(
            "tenants",
            page.limit,
            found.iter().map(|r| seq_and(r, tenant_row)),
        )
    }

    async fn update_tenant(&self, t: &TenantRecord) -> CoreResult<()> {
        let settings = to_json(&t.settings)?;
        let client = self.client().await?;
        let changed = execute(
            &client,
            "UPDATE tenants SET settings = $2 WHERE name = $1",
            &[&t.name.as_str(), &settings],
        )
        .await?;
        if changed == 0 {
            return Err(CoreError::NotFound(format!(
                "tenant {} does not exist",
                t.name
            )));
        }
        Ok(())
    }

    async fn delete_tenant(&self, name: &Tenant) -> CoreResult<Vec<KeyId>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let name_param = name.as_str();
        let exists = rows(
            &tx,
            "SELECT 1 FROM tenants WHERE name = $1 FOR UPDATE",
            &[&name_param],
        )
        .await?;
        if exists.is_empty() {
            return Err(CoreError::NotFound(format!("tenant {name} does not exist")));
        }
        let counts = one(
            &tx,
            "SELECT
                (SELECT count(*) FROM sandboxes WHERE tenant = $1 AND state <> 'pooled') AS sandboxes,
                (SELECT count(*) FROM snapshots WHERE tenant = $1 AND NOT hidden) AS snapshots,
                (SELECT count(*) FROM volumes WHERE tenant = $1) AS volumes,
                (SELECT count(*) FROM template_owners WHERE tenant = $1) AS templates",
            &[&name_param],
        )
        .await?;
        let owned = owned_things(&[
            (get(&counts, "sandboxes")?, "sandbox", "sandboxes"),
            (get(&counts, "snapshots")?, "snapshot", "snapshots"),
            (get(&counts, "volumes")?, "volume", "volumes"),
            (get(&counts, "templates")?, "template", "templates"),
        ]);
        if !owned.is_empty() {
            return Err(CoreError::Conflict(format!(
                "tenant {name} still owns {owned}: delete them first"
            )));
        }
        let keys = rows(
            &tx,
            "SELECT id FROM api_keys WHERE tenant = $1 ORDER BY seq",
            &[&name_param],
        )
        .await?;
        let mut ids = Vec::new();
        for row in &keys {
            if let Ok(id) = get::<String>(row, "id")?.parse() {
                ids.push(id);
            }
        }
        for sql in [
            "DELETE FROM api_keys WHERE tenant = $1",
            "DELETE FROM tenant_creates WHERE tenant = $1",
            "DELETE FROM tenants WHERE name = $1",
        ] {
            execute(&tx, sql, &[&name_param]).await?;
        }
        tx.commit().await.map_err(pg)?;
        Ok(ids)
    }

    async fn tenant_usage(
        &self,
        tenant: &Tenant,
        excluding: &[SandboxId],
        since_ms: i64,
    ) -> CoreResult<TenantUsage> {
        let excluding: Vec<String> = excluding.iter().map(|id| id.to_string()).collect();
        let client = self.client().await?;
        let row = one(
            &client,
            USAGE_SQL,
            &[&tenant.as_str(), &excluding, &since_ms],
        )
        .await?;
        Ok(TenantUsage {
            sandboxes: count(get(&row, "sandboxes")?),
            cpus: get(&row, "cpus")?,
            memory_mib: count(get(&row, "memory_mib")?),
            creates_last_hour: count(get(&row, "creates")?),
        })
    }

    async fn record_create(&self, tenant: &Tenant, at_ms: i64) -> CoreResult<()> {
        let client = self.client().await?;
        execute(
            &client,
            "WITH forgotten AS (
                DELETE FROM tenant_creates WHERE tenant = $1 AND at_ms <= $3)
            INSERT INTO tenant_creates (tenant, at_ms) VALUES ($1, $2)",
            &[&tenant.as_str(), &at_ms, &(at_ms - CREATE_WINDOW_MS)],
        )
        .await?;
        Ok(())
    }

    async fn insert_key(&self, secret_hash: &str, key: &KeyRecord) -> CoreResult<()> {
        let selector = to_json(&key.selector)?;
        let budget = to_json(&key.budget)?;
        let client = self.client().await?;
        execute(
            &client,
            "INSERT INTO api_keys (key_hash, tenant, created_at_ms, id, scope, name, selector,
                prefix, expires_at_ms, last_used_ms, budget)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            &[
                &secret_hash,
                &key.tenant.as_str(),
                &key.created_at_ms,
                &key.id.as_str(),
                &key.scope.as_str(),
                &key.name,
                &selector,
                &key.prefix,
                &key.expires_at_ms,
                &key.last_used_ms,
                &budget,
            ],
        )
        .await?;
        Ok(())
    }

    async fn key_by_secret_hash(&self, secret_hash: &str) -> CoreResult<Option<KeyRecord>> {
        let client = self.client().await?;
        let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE key_hash = $1");
        let found = rows(&client, &sql, &[&secret_hash]).await?;
        found.first().map(key_row).transpose()
    }

    async fn get_key(&self, id: &KeyId) -> CoreResult<Option<KeyRecord>> {
        let client = self.client().await?;
        let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = $1");
        let found = rows(&client, &sql, &[&id.as_str()]).await?;
        found.first().map(key_row).transpose()
    }

    async fn list_keys(
        &self,
        scope: &TenantScope,
        page: &PageRequest,
    ) -> CoreResult<Page<KeyRecord>> {
        let mut q = Query::new(format!(
            "SELECT seq, {KEY_COLUMNS} FROM api_keys WHERE true"
        ));
        q.scope(scope);
        q.page("api_keys", "seq", page)?;
        let client = self.client().await?;
        let found = q.rows(&client).await?;
        page_of(
            "api_keys",
            page.limit,
            found.iter().map(|r| seq_and(r, key_row)),
        )
    }

    async fn set_key_budget(&self, id: &KeyId, budget: &KeyBudget) -> CoreResult<bool> {
        let budget = to_json(budget)?;
        let client = self.client().await?;
        let n = execute(
            &client,
            "UPDATE api_keys SET budget = $2 WHERE id = $1",
            &[&id.as_str(), &budget],
        )
        .await?;
        Ok(n > 0)
    }

    async fn delete_key(&self, id: &KeyId) -> CoreResult<bool> {
        let client = self.client().await?;
        let n = execute(
            &client,
            "DELETE FROM api_keys WHERE id = $1",
            &[&id.as_str()],
        )
        .await?;
        Ok(n > 0)
    }

    async fn record_key_uses(&self, uses: &[(KeyId, i64)]) -> CoreResult<()> {
        if uses.is_empty() {
            return Ok(());
        }
        // One row per key (an UPDATE … FROM changes a row once): its latest use.
        let mut latest: HashMap<&str, i64> = HashMap::new();
        for (id, at) in uses {
            let at_most = latest.entry(id.as_str()).or_insert(*at);
            *at_most = (*at_most).max(*at);
        }
        let (ids, ats): (Vec<String>, Vec<i64>) = latest
            .into_iter()
            .map(|(id, at)| (id.to_string(), at))
            .unzip();
        let client = self.client().await?;
        execute(
            &client,
            "UPDATE api_keys AS k SET last_used_ms = greatest(coalesce(k.last_used_ms, 0), u.at)
                FROM unnest($1::text[], $2::bigint[]) AS u(id, at) WHERE k.id = u.id",
            &[&ids, &ats],
        )
        .await?;
        Ok(())
    }

    async fn template_owner(&self, name: &str) -> CoreResult<Option<Tenant>> {
        let client = self.client().await?;
        let found = rows(
            &client,
            "SELECT tenant FROM template_owners WHERE name = $1",
            &[&name],
        )
        .await?;
        found
            .first()
            .map(|r| get::<String>(r, "tenant").map(Tenant::new))
            .transpose()
    }

    async fn template_owners(&self) -> CoreResult<BTreeMap<String, Tenant>> {
        let client = self.client().await?;
        let found = rows(&client, "SELECT name, tenant FROM template_owners", &[]).await?;
        let mut out = BTreeMap::new();
        for row in &found {
            out.insert(
                get(row, "name")?,
                Tenant::new(get::<String>(row, "tenant")?),
            );
        }
        Ok(out)
    }

    async fn claim_template(&self, name: &str, tenant: &Tenant) -> CoreResult<Tenant> {
        let client = self.client().await?;
        // The claim and the read are two statements: a template forgotten between them
        // (its owner deleted it) is claimed again.
        for _ in 0..3 {
            execute(
                &client,
                "WITH owner AS MATERIALIZED (
                    SELECT 1 FROM tenants WHERE name = $2 FOR KEY SHARE)
                INSERT INTO template_owners (name, tenant)
                    SELECT $1::text, $2::text FROM (SELECT 1) AS one LEFT JOIN owner ON true
                ON CONFLICT (name) DO NOTHING",
                &[&name, &tenant.as_str()],
            )
            .await?;
            let found = rows(
                &client,
                "SELECT tenant FROM template_owners WHERE name = $1",
                &[&name],
            )
            .await?;
            if let Some(row) = found.first() {
                return Ok(Tenant::new(get::<String>(row, "tenant")?));
            }
        }
        Err(CoreError::Conflict(format!(
            "template {name} is being claimed and deleted at once: try again"
        )))
    }

    async fn forget_template(&self, name: &str) -> CoreResult<()> {
        let client = self.client().await?;
        execute(
            &client,
            "DELETE FROM template_owners WHERE name = $1",
            &[&name],
        )
        .await?;
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
