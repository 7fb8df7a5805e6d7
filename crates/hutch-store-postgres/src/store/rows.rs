//! Records in and out of rows: each record is a JSONB column without its tenant (the
//! `tenant` column is the source of truth, as in SQLite's store), and a sandbox's indexed
//! columns are copied out of its record on every write ([`SandboxColumns`]).

use hutch_core::model::SandboxRecord;
use hutch_core::snapshot::SnapshotRecord;
use hutch_core::tenant::Tenant;
use hutch_core::volume::VolumeRecord;
use hutch_core::CoreResult;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::Row;

use super::sql::{big, corrupt, get};

/// A record as the JSONB of its `record` column.
pub(crate) fn to_json<T: Serialize>(record: &T) -> CoreResult<Value> {
    serde_json::to_value(record).map_err(corrupt)
}

/// The `record` column of `row`, decoded, and its `tenant` column.
fn record_and_tenant<T: DeserializeOwned>(row: &Row) -> CoreResult<(T, Option<Tenant>)> {
    let json: Value = get(row, "record")?;
    let record = serde_json::from_value(json).map_err(corrupt)?;
    let tenant: Option<String> = get(row, "tenant")?;
    Ok((record, tenant.map(Tenant::new)))
}

/// A sandbox row (`record`, `tenant`): the record with its tenant put back.
pub(crate) fn sandbox_row(row: &Row) -> CoreResult<SandboxRecord> {
    let (mut r, tenant): (SandboxRecord, _) = record_and_tenant(row)?;
    r.tenant = tenant;
    Ok(r)
}

/// A snapshot row (`record`, `tenant`).
pub(crate) fn snapshot_row(row: &Row) -> CoreResult<SnapshotRecord> {
    let (mut s, tenant): (SnapshotRecord, _) = record_and_tenant(row)?;
    s.tenant_id = tenant;
    Ok(s)
}

/// A volume row (`record`, `tenant`).
pub(crate) fn volume_row(row: &Row) -> CoreResult<VolumeRecord> {
    let (mut v, tenant): (VolumeRecord, _) = record_and_tenant(row)?;
    v.tenant = tenant;
    Ok(v)
}

/// A row of a page: its `seq` and its record decoded by `decode`.
pub(crate) fn seq_and<T>(row: &Row, decode: fn(&Row) -> CoreResult<T>) -> CoreResult<(i64, T)> {
    Ok((get(row, "seq")?, decode(row)?))
}

/// Every row decoded by `decode`.
pub(crate) fn all<T>(rows: &[Row], decode: fn(&Row) -> CoreResult<T>) -> CoreResult<Vec<T>> {
    rows.iter().map(decode).collect()
}

/// The columns of a sandbox's row, out of its record: `state` (idle checks, counts),
/// `tenant` (listings, quotas), `expires_at_ms` (the reaper; `NULL` for a persistent
/// sandbox), `idle_hibernate_seconds` (idle hibernation), `layer` (who uses a snapshot).
pub(crate) struct SandboxColumns {
    pub(crate) id: String,
    pub(crate) state: String,
    pub(crate) uid_slot: i64,
    pub(crate) record: Value,
    pub(crate) tenant: Option<String>,
    pub(crate) expires_at_ms: Option<i64>,
    pub(crate) idle_hibernate_seconds: Option<i64>,
    pub(crate) layer: Option<String>,
}

impl SandboxColumns {
    /// The columns of `r`.
    pub(crate) fn of(r: &SandboxRecord) -> CoreResult<Self> {
        Ok(Self {
            id: r.id.to_string(),
            state: r.state.as_str().to_string(),
            uid_slot: i64::from(r.uid_slot),
            record: to_json(r)?,
            tenant: r.tenant.as_ref().map(|t| t.as_str().to_string()),
            expires_at_ms: (!r.persistent).then_some(r.expires_at_ms),
            idle_hibernate_seconds: r.idle_hibernate_seconds.map(big),
            layer: r.layer.clone(),
        })
    }
}
