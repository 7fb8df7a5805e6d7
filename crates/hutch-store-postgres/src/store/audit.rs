//! [`AuditStore`] on PostgreSQL: the `audit_log` table (migration 2), cluster-wide. Its
//! `BIGSERIAL` id is each entry's id and a page's cursor; a tenant's, a key's and a
//! sandbox's entries are read through indexes ending in it. A batch is one `INSERT` of
//! arrays, its rows numbered in the batch's order.

use async_trait::async_trait;
use hutch_core::audit::{AuditEntry, AuditQuery};
use hutch_core::store::audit::AuditStore;
use hutch_core::store::{Page, PageRequest};
use hutch_core::tenant::Tenant;
use hutch_core::CoreResult;
use serde_json::Value;
use tokio_postgres::Row;

use super::rows::to_json;
use super::sql::{corrupt, execute, get, page_of, Query};
use super::PostgresStore;

fn audit_row(row: &Row) -> CoreResult<(i64, AuditEntry)> {
    let id: i64 = get(row, "id")?;
    let argv: Option<Value> = get(row, "argv")?;
    let status: i32 = get(row, "status")?;
    let entry = AuditEntry {
        id,
        at_ms: get(row, "at_ms")?,
        key_id: get::<Option<String>>(row, "key_id")?.and_then(|k| k.parse().ok()),
        tenant: get::<Option<String>>(row, "tenant")?.map(Tenant::new),
        method: get(row, "method")?,
        route: get(row, "route")?,
        path: get(row, "path")?,
        sandbox: get::<Option<String>>(row, "sandbox")?.and_then(|s| s.parse().ok()),
        argv: argv
            .map(serde_json::from_value)
            .transpose()
            .map_err(corrupt)?,
        status: u16::try_from(status).unwrap_or(u16::MAX),
    };
    Ok((id, entry))
}

#[async_trait]
impl AuditStore for PostgresStore {
    async fn append_audit(&self, entries: &[AuditEntry]) -> CoreResult<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut at_ms = Vec::with_capacity(entries.len());
        let mut key_id = Vec::with_capacity(entries.len());
        let mut tenant = Vec::with_capacity(entries.len());
        let mut method = Vec::with_capacity(entries.len());
        let mut route = Vec::with_capacity(entries.len());
        let mut path = Vec::with_capacity(entries.len());
        let mut sandbox = Vec::with_capacity(entries.len());
        let mut argv = Vec::with_capacity(entries.len());
        let mut status = Vec::with_capacity(entries.len());
        for e in entries {
            at_ms.push(e.at_ms);
            key_id.push(e.key_id.as_ref().map(|k| k.to_string()));
            tenant.push(e.tenant.as_ref().map(|t| t.as_str().to_string()));
            method.push(e.method.clone());
            route.push(e.route.clone());
            path.push(e.path.clone());
            sandbox.push(e.sandbox.as_ref().map(|s| s.to_string()));
            argv.push(e.argv.as_ref().map(to_json).transpose()?);
            status.push(i32::from(e.status));
        }
        let client = self.client().await?;
        execute(
            &client,
            "INSERT INTO audit_log (at_ms, key_id, tenant, method, route, path, sandbox, argv,
                status)
            SELECT at_ms, key_id, tenant, method, route, path, sandbox, argv, status
            FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[],
                $6::text[], $7::text[], $8::jsonb[], $9::int[])
                WITH ORDINALITY AS e(at_ms, key_id, tenant, method, route, path, sandbox, argv,
                    status, n)
            ORDER BY n",
            &[
                &at_ms, &key_id, &tenant, &method, &route, &path, &sandbox, &argv, &status,
            ],
        )
        .await?;
        Ok(())
    }

    async fn list_audit(
        &self,
        query: &AuditQuery,
        page: &PageRequest,
    ) -> CoreResult<Page<AuditEntry>> {
        let mut q = Query::new(
            "SELECT id, at_ms, key_id, tenant, method, route, path, sandbox, argv, status
                FROM audit_log WHERE true",
        );
        q.scope(&query.scope);
        if let Some(k) = &query.key_id {
            q.and("key_id =", k.to_string());
        }
        if let Some(s) = &query.sandbox {
            q.and("sandbox =", s.to_string());
        }
        if let Some(at) = query.since_ms {
            q.and("at_ms >=", at);
        }
        if let Some(at) = query.until_ms {
            q.and("at_ms <", at);
        }
        q.page("audit_log", "id", page)?;
        let client = self.client().await?;
        let found = q.rows(&client).await?;
        page_of("audit_log", page.limit, found.iter().map(audit_row))
    }
}
