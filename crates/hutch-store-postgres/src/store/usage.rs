//! [`UsageStore`] on PostgreSQL: `usage_intervals` (cluster-wide: one row per interval of
//! one sandbox, snapshot or volume, indexed by the interval's end alone and after the
//! tenant, the key and the resource) and `usage_meters` (each live sandbox's last reading,
//! owned by the sandbox's node), migration 2.
//!
//! A batch is one fenced transaction: a node the cluster declared dead appends no usage and
//! moves no meter. Sums group and order as SQLite's store does: groups in the byte order of
//! their key, the group of no key (no tenant, no key) first.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use hutch_core::ids::SandboxId;
use hutch_core::store::usage::{MeterReading, UsageStore};
use hutch_core::usage::{
    GroupBy, ResourceKind, UsageGroup, UsageInterval, UsageQuery, UsageTotals,
};
use hutch_core::CoreResult;

use super::sql::{big, count, execute, get, pg, rows, Query};
use super::PostgresStore;

#[async_trait]
impl UsageStore for PostgresStore {
    async fn append_usage(
        &self,
        intervals: &[UsageInterval],
        meters: &[(SandboxId, Option<MeterReading>)],
    ) -> CoreResult<()> {
        if intervals.is_empty() && meters.is_empty() {
            return Ok(());
        }
        let node = self.fence.node_id();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        self.hold_fence(&tx).await?;
        if !intervals.is_empty() {
            let n = intervals.len();
            let (mut kind, mut resource, mut tenant, mut key_id) = (
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
            );
            let (mut start, mut end) = (Vec::with_capacity(n), Vec::with_capacity(n));
            let (mut cpu, mut memory, mut disk, mut egress) = (
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
            );
            for i in intervals {
                kind.push(i.kind.as_str().to_string());
                resource.push(i.resource.clone());
                tenant.push(i.tenant.as_ref().map(|t| t.as_str().to_string()));
                key_id.push(i.key_id.as_ref().map(|k| k.to_string()));
                start.push(i.start_ms);
                end.push(i.end_ms);
                cpu.push(i.usage.cpu_seconds);
                memory.push(i.usage.memory_gib_seconds);
                disk.push(i.usage.disk_gib_hours);
                egress.push(big(i.usage.egress_bytes));
            }
            execute(
                &tx,
                "INSERT INTO usage_intervals (kind, resource, tenant, key_id, start_ms, end_ms,
                    cpu_seconds, memory_gib_seconds, disk_gib_hours, egress_bytes)
                SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[],
                    $5::bigint[], $6::bigint[], $7::float8[], $8::float8[], $9::float8[],
                    $10::bigint[])",
                &[
                    &kind, &resource, &tenant, &key_id, &start, &end, &cpu, &memory, &disk, &egress,
                ],
            )
            .await?;
        }
        // The last word on each sandbox, as if the batch were applied in its order (one
        // upsert cannot change a row twice).
        let mut last: BTreeMap<&str, Option<MeterReading>> = BTreeMap::new();
        for (id, reading) in meters {
            last.insert(id.as_str(), *reading);
        }
        let (mut set, mut forget) = (Vec::new(), Vec::new());
        for (id, reading) in last {
            match reading {
                Some(m) => set.push((id.to_string(), m)),
                None => forget.push(id.to_string()),
            }
        }
        if !set.is_empty() {
            let ids: Vec<&str> = set.iter().map(|(id, _)| id.as_str()).collect();
            let cpu: Vec<i64> = set.iter().map(|(_, m)| big(m.cpu_ns)).collect();
            let egress: Vec<i64> = set.iter().map(|(_, m)| big(m.egress_bytes)).collect();
            let at: Vec<i64> = set.iter().map(|(_, m)| m.at_ms).collect();
            execute(
                &tx,
                "INSERT INTO usage_meters (sandbox, node_id, cpu_ns, egress_bytes, at_ms)
                SELECT m.sandbox, $5, m.cpu_ns, m.egress_bytes, m.at_ms
                FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[])
                    AS m(sandbox, cpu_ns, egress_bytes, at_ms)
                ON CONFLICT (sandbox) DO UPDATE SET cpu_ns = excluded.cpu_ns,
                    egress_bytes = excluded.egress_bytes, at_ms = excluded.at_ms
                    WHERE usage_meters.node_id = excluded.node_id",
                &[&ids, &cpu, &egress, &at, &node],
            )
            .await?;
        }
        if !forget.is_empty() {
            execute(
                &tx,
                "DELETE FROM usage_meters WHERE sandbox = ANY($1) AND node_id = $2",
                &[&forget, &node],
            )
            .await?;
        }
        tx.commit().await.map_err(pg)?;
        Ok(())
    }

    async fn usage_groups(&self, query: &UsageQuery) -> CoreResult<Vec<UsageGroup>> {
        // Ordered by `COLLATE "C"` (byte order, as SQLite compares text), no key first.
        const DAY: &str = "to_char(to_timestamp(end_ms / 1000) AT TIME ZONE 'UTC', 'YYYY-MM-DD')";
        let (key, kind, grouping) = match query.group_by {
            GroupBy::Nothing => ("NULL::text", "NULL::text", None),
            GroupBy::Sandbox => (
                "resource",
                "kind",
                Some((
                    "resource, kind",
                    "resource COLLATE \"C\", kind COLLATE \"C\"",
                )),
            ),
            GroupBy::Tenant => (
                "tenant",
                "NULL::text",
                Some(("tenant", "tenant COLLATE \"C\" NULLS FIRST")),
            ),
            GroupBy::Key => (
                "key_id",
                "NULL::text",
                Some(("key_id", "key_id COLLATE \"C\" NULLS FIRST")),
            ),
            GroupBy::Day => (DAY, "NULL::text", Some((DAY, DAY))),
        };
        let mut q = Query::new(format!(
            "SELECT {key} AS key, {kind} AS kind,
                coalesce(sum(cpu_seconds), 0)::float8 AS cpu_seconds,
                coalesce(sum(memory_gib_seconds), 0)::float8 AS memory_gib_seconds,
                coalesce(sum(disk_gib_hours), 0)::float8 AS disk_gib_hours,
                coalesce(sum(egress_bytes), 0)::float8 AS egress_bytes,
                count(*) AS intervals
            FROM usage_intervals WHERE true"
        ));
        q.scope(&query.scope);
        if let Some(k) = &query.key_id {
            q.and("key_id =", k.to_string());
        }
        if let Some(r) = &query.resource {
            q.and("resource =", r.clone());
        }
        if let Some(at) = query.from_ms {
            q.and("end_ms >", at);
        }
        if let Some(at) = query.to_ms {
            q.and("end_ms <=", at);
        }
        if let Some((group, order)) = grouping {
            q.push(&format!(" GROUP BY {group} ORDER BY {order}"));
        }
        let client = self.client().await?;
        let found = q.rows(&client).await?;
        let mut groups = Vec::new();
        for row in &found {
            let intervals = count(get(row, "intervals")?);
            // An empty selection is one row of zeros without grouping: no group at all.
            if intervals == 0 {
                continue;
            }
            groups.push(UsageGroup {
                key: get(row, "key")?,
                kind: get::<Option<String>>(row, "kind")?.and_then(|k| ResourceKind::parse(&k)),
                usage: UsageTotals {
                    cpu_seconds: get(row, "cpu_seconds")?,
                    memory_gib_seconds: get(row, "memory_gib_seconds")?,
                    disk_gib_hours: get(row, "disk_gib_hours")?,
                    egress_bytes: get::<f64>(row, "egress_bytes")? as u64,
                },
                intervals,
            });
        }
        Ok(groups)
    }

    async fn meter_readings(&self) -> CoreResult<HashMap<SandboxId, MeterReading>> {
        let client = self.client().await?;
        let found = rows(
            &client,
            "SELECT sandbox, cpu_ns, egress_bytes, at_ms FROM usage_meters WHERE node_id = $1",
            &[&self.fence.node_id()],
        )
        .await?;
        let mut out = HashMap::new();
        for row in &found {
            if let Ok(id) = get::<String>(row, "sandbox")?.parse::<SandboxId>() {
                out.insert(
                    id,
                    MeterReading {
                        cpu_ns: count(get(row, "cpu_ns")?),
                        egress_bytes: count(get(row, "egress_bytes")?),
                        at_ms: get(row, "at_ms")?,
                    },
                );
            }
        }
        Ok(out)
    }
}
