//! [`UsageStore`] on SQLite: `usage_intervals` (one row per interval of one sandbox,
//! snapshot or volume; indexed by the interval's end, alone and after the tenant, the key
//! and the resource, so a sum over a time range of one of them is one index range) and
//! `usage_meters` (each live sandbox's last reading), schema 7 (`schema.rs`).

use std::collections::HashMap;

use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::{params, params_from_iter};

use super::{and_where, SqliteStore};
use crate::error::CoreResult;
use crate::ids::SandboxId;
use crate::store::usage::{MeterReading, UsageStore};
use crate::tenant::Tenant;
use crate::usage::{GroupBy, ResourceKind, UsageGroup, UsageInterval, UsageQuery, UsageTotals};

#[async_trait]
impl UsageStore for SqliteStore {
    async fn append_usage(
        &self,
        intervals: &[UsageInterval],
        meters: &[(SandboxId, Option<MeterReading>)],
    ) -> CoreResult<()> {
        let conn = self.lock();
        let tx = conn.unchecked_transaction()?;
        for i in intervals {
            tx.prepare_cached(
                "INSERT INTO usage_intervals (kind, resource, tenant, key_id, start_ms, end_ms,
                    cpu_seconds, memory_gib_seconds, disk_gib_hours, egress_bytes)
                    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )?
            .execute(params![
                i.kind.as_str(),
                i.resource,
                i.tenant.as_ref().map(Tenant::as_str),
                i.key_id.as_ref().map(|k| k.as_str()),
                i.start_ms,
                i.end_ms,
                i.usage.cpu_seconds,
                i.usage.memory_gib_seconds,
                i.usage.disk_gib_hours,
                i64::try_from(i.usage.egress_bytes).unwrap_or(i64::MAX),
            ])?;
        }
        for (id, reading) in meters {
            match reading {
                Some(m) => {
                    tx.prepare_cached(
                        "INSERT INTO usage_meters (sandbox, cpu_ns, egress_bytes, at_ms)
                            VALUES (?1, ?2, ?3, ?4)
                            ON CONFLICT(sandbox) DO UPDATE SET cpu_ns = excluded.cpu_ns,
                            egress_bytes = excluded.egress_bytes, at_ms = excluded.at_ms",
                    )?
                    .execute(params![
                        id.as_str(),
                        i64::try_from(m.cpu_ns).unwrap_or(i64::MAX),
                        i64::try_from(m.egress_bytes).unwrap_or(i64::MAX),
                        m.at_ms
                    ])?;
                }
                None => {
                    tx.prepare_cached("DELETE FROM usage_meters WHERE sandbox = ?1")?
                        .execute(params![id.as_str()])?;
                }
            }
        }
        tx.commit()?;
        Ok(())
    }

    async fn usage_groups(&self, query: &UsageQuery) -> CoreResult<Vec<UsageGroup>> {
        let key = match query.group_by {
            GroupBy::Nothing => "NULL",
            GroupBy::Sandbox => "resource",
            GroupBy::Tenant => "tenant",
            GroupBy::Key => "key_id",
            GroupBy::Day => "date(end_ms / 1000, 'unixepoch')",
        };
        let kind = if query.group_by == GroupBy::Sandbox {
            "kind"
        } else {
            "NULL"
        };
        let mut sql = format!(
            "SELECT {key}, {kind}, total(cpu_seconds), total(memory_gib_seconds),
                total(disk_gib_hours), total(egress_bytes), count(*)
                FROM usage_intervals WHERE 1"
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
        if let Some(r) = &query.resource {
            and_where(
                &mut sql,
                &mut params,
                "resource",
                "=",
                Value::Text(r.clone()),
            );
        }
        if let Some(at) = query.from_ms {
            and_where(&mut sql, &mut params, "end_ms", ">", Value::Integer(at));
        }
        if let Some(at) = query.to_ms {
            and_where(&mut sql, &mut params, "end_ms", "<=", Value::Integer(at));
        }
        if query.group_by != GroupBy::Nothing {
            sql.push_str(&format!(" GROUP BY {key}, {kind} ORDER BY {key}"));
        }
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params_from_iter(params), |r| {
            Ok(UsageGroup {
                key: r.get::<_, Option<String>>(0)?,
                kind: r
                    .get::<_, Option<String>>(1)?
                    .and_then(|k| ResourceKind::parse(&k)),
                usage: UsageTotals {
                    cpu_seconds: r.get(2)?,
                    memory_gib_seconds: r.get(3)?,
                    disk_gib_hours: r.get(4)?,
                    egress_bytes: r.get::<_, f64>(5)? as u64,
                },
                intervals: r.get::<_, i64>(6)?.max(0) as u64,
            })
        })?;
        let mut groups = Vec::new();
        for row in rows {
            let g = row?;
            // An empty selection is one row of zeros without grouping: no group at all.
            if g.intervals > 0 {
                groups.push(g);
            }
        }
        Ok(groups)
    }

    async fn meter_readings(&self) -> CoreResult<HashMap<SandboxId, MeterReading>> {
        let conn = self.lock();
        let mut stmt =
            conn.prepare_cached("SELECT sandbox, cpu_ns, egress_bytes, at_ms FROM usage_meters")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })?;
        let mut out = HashMap::new();
        for row in rows {
            let (id, cpu_ns, egress_bytes, at_ms) = row?;
            if let Ok(id) = id.parse::<SandboxId>() {
                out.insert(
                    id,
                    MeterReading {
                        cpu_ns: cpu_ns.max(0) as u64,
                        egress_bytes: egress_bytes.max(0) as u64,
                        at_ms,
                    },
                );
            }
        }
        Ok(out)
    }
}
