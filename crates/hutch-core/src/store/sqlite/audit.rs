//! [`AuditStore`] on SQLite: the `audit_log` table (schema 6, `schema.rs`), whose
//! `INTEGER PRIMARY KEY` is each entry's id and a page's cursor; a tenant's, a key's and a
//! sandbox's entries are read through indexes ending in it.

use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter};

use super::{and_where, corrupt, page_clause, SqliteStore};
use crate::audit::{AuditEntry, AuditQuery};
use crate::error::CoreResult;
use crate::store::audit::AuditStore;
use crate::store::{Page, PageRequest};
use crate::tenant::Tenant;

#[async_trait]
impl AuditStore for SqliteStore {
    async fn append_audit(&self, entries: &[AuditEntry]) -> CoreResult<()> {
        let conn = self.lock();
        let tx = conn.unchecked_transaction()?;
        for e in entries {
            let argv = e
                .argv
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(corrupt)?;
            tx.prepare_cached(
                "INSERT INTO audit_log (at_ms, key_id, tenant, method, route, path, sandbox,
                    argv, status) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?
            .execute(params![
                e.at_ms,
                e.key_id.as_ref().map(|k| k.as_str()),
                e.tenant.as_ref().map(Tenant::as_str),
                e.method,
                e.route,
                e.path,
                e.sandbox.as_ref().map(|s| s.as_str()),
                argv,
                e.status,
            ])?;
        }
        tx.commit()?;
        Ok(())
    }

    async fn list_audit(
        &self,
        query: &AuditQuery,
        page: &PageRequest,
    ) -> CoreResult<Page<AuditEntry>> {
        // `rowid` is the id: the shared page clause orders and cuts by it.
        let mut sql = String::from(
            "SELECT id, at_ms, key_id, tenant, method, route, path, sandbox, argv, status
                FROM audit_log WHERE 1",
        );
        let mut params: Vec<Value> = Vec::new();
        if let Some(t) = query.scope.tenant() {
            and_where(
                &mut sql,
                &mut params,
                "tenant",
                "=",
                Value::Text(t.to_string()),
            );
        }
        if let Some(k) = &query.key_id {
            and_where(
                &mut sql,
                &mut params,
                "key_id",
                "=",
                Value::Text(k.to_string()),
            );
        }
        if let Some(s) = &query.sandbox {
            and_where(
                &mut sql,
                &mut params,
                "sandbox",
                "=",
                Value::Text(s.to_string()),
            );
        }
        if let Some(at) = query.since_ms {
            and_where(&mut sql, &mut params, "at_ms", ">=", Value::Integer(at));
        }
        if let Some(at) = query.until_ms {
            and_where(&mut sql, &mut params, "at_ms", "<", Value::Integer(at));
        }
        page_clause("audit_log", page, &mut sql, &mut params)?;
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params_from_iter(params), |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, Option<String>>(2)?,
                r.get::<_, Option<String>>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, String>(6)?,
                r.get::<_, Option<String>>(7)?,
                r.get::<_, Option<String>>(8)?,
                r.get::<_, u16>(9)?,
            ))
        })?;
        let mut items = Vec::new();
        let mut next = None;
        for row in rows {
            let (id, at_ms, key_id, tenant, method, route, path, sandbox, argv, status) = row?;
            if page.limit.is_some_and(|n| items.len() == n) {
                next = items
                    .last()
                    .map(|e: &AuditEntry| super::encode_cursor("audit_log", e.id));
                break;
            }
            items.push(AuditEntry {
                id,
                at_ms,
                key_id: key_id.and_then(|k| k.parse().ok()),
                tenant: tenant.map(Tenant::new),
                method,
                route,
                path,
                sandbox: sandbox.and_then(|s| s.parse().ok()),
                argv: argv
                    .map(|a| serde_json::from_str(&a))
                    .transpose()
                    .map_err(corrupt)?,
                status,
            });
        }
        Ok(Page { items, next })
    }
}
