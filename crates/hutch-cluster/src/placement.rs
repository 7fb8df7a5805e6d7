//! Placement: which node a create runs on, decided in one transaction.
//!
//! The transaction takes the cluster-wide advisory lock [`PLACEMENT_LOCK`] (placements are
//! short: two indexed reads and an insert), counts what every candidate node's sandboxes
//! hold (rows in `starting`, `running`, `paused`) plus the creates already placed there and
//! not finished (`placements` rows still in their hold), keeps the nodes where one more
//! sandbox of this memory fits their capacity, and picks the least loaded (this node first
//! on a tie: no hop). It inserts a `placements` row for the create, which counts against the
//! node until [`release`] deletes it once the create answered — so twenty creates through
//! three nodes at once never put more on a node than it offers.
//!
//! A tenant's create is also checked against the tenant's quotas in the same transaction:
//! what its sandboxes hold on every node plus its creates placed and not finished
//! (`TenancyStore::tenant_usage` counts both), so creates through different nodes never
//! overshoot a quota together. The placement row carries the id the sandbox will have
//! ([`PlacedSandboxId`](hutch_server::PlacedSandboxId)), so the node that creates it leaves
//! its own reservation out of its own admission, and counts every other.
//!
//! Candidates are the nodes in state `ready`, of role `all`, whose heartbeat is within their
//! lease by the database's clock, and not excluded (a node a create just failed on); of
//! those, only the node a create is pinned to, and preferably the ones that hold its
//! template (`affinity.rs`).

use hutch_core::ids::SandboxId;
use hutch_core::store::tenancy::CREATE_WINDOW_MS;
use hutch_core::store::Store;
use hutch_core::tenant::quota::Footprint;
use hutch_core::tenant::settings::Quotas;
use hutch_core::tenant::Tenant;
use hutch_core::CoreError;
use hutch_store_postgres::Db;

use crate::affinity::Affinity;
use crate::config::ClusterConfig;
use crate::error::ClusterError;
use crate::membership::ACTIVE_STATES;

/// The advisory lock that serializes placements (any constant every node agrees on).
pub const PLACEMENT_LOCK: i64 = 0x6875_7463_6803;

/// What a create asks of a node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    /// Its CPUs.
    pub cpus: f64,
    /// Its memory limit in MiB.
    pub memory_mib: u64,
}

/// The tenant a create is for, with its quotas and the store to count its use in.
pub struct TenantCheck<'a> {
    /// The tenant.
    pub tenant: &'a Tenant,
    /// Its quotas.
    pub quotas: &'a Quotas,
    /// The cluster's store.
    pub store: &'a dyn Store,
}

/// Where a create was placed, holding its reservation until [`release`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The node.
    pub node: String,
    /// Its API address.
    pub advertise: String,
    /// The reservation's key in `placements`: the id the sandbox will have.
    pub sandbox: SandboxId,
}

/// Place the create of sandbox `sandbox` (see the module docs). `NoCapacity` when no
/// candidate has room; `QuotaExceeded` (in [`ClusterError::Core`]) when the tenant's quotas
/// do not take it.
pub async fn place(
    db: &Db,
    cfg: &ClusterConfig,
    (demand, affinity): (Demand, &Affinity),
    exclude: &[String],
    sandbox: &SandboxId,
    tenant: Option<TenantCheck<'_>>,
) -> Result<Placement, ClusterError> {
    let mut client = db.client().await?;
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&PLACEMENT_LOCK])
        .await?;
    if let Some(t) = &tenant {
        let since = hutch_core::time::now_ms() - CREATE_WINDOW_MS;
        let usage = t.store.tenant_usage(t.tenant, &[], since).await?;
        let adding = Footprint {
            sandboxes: 1,
            cpus: demand.cpus,
            memory_mib: demand.memory_mib,
            creates: 1,
        };
        t.quotas
            .check_usage(t.tenant, &usage, &adding)
            .map_err(CoreError::from)?;
    }
    let active: Vec<&str> = ACTIVE_STATES.to_vec();
    let rows = tx
        .query(
            "SELECT n.id, n.advertise,
                    (n.capacity->>'sandboxes')::bigint, (n.capacity->>'memory_mib')::bigint,
                    coalesce(s.active, 0) + coalesce(p.placed, 0),
                    coalesce(s.memory, 0) + coalesce(p.memory, 0),
                    $3::text = ANY(n.templates)
             FROM nodes n
             LEFT JOIN (
                SELECT node_id, count(*) AS active,
                       sum((record->>'memory_mib')::bigint)::bigint AS memory
                FROM sandboxes WHERE state = ANY($1) GROUP BY node_id
             ) s ON s.node_id = n.id
             LEFT JOIN (
                SELECT node_id, count(*) AS placed, sum(memory_mib)::bigint AS memory
                FROM placements WHERE expires_at > now() GROUP BY node_id
             ) p ON p.node_id = n.id
             WHERE n.state = 'ready' AND n.role = 'all'
               AND n.heartbeat_at > now() - n.lease_ms * interval '1 millisecond'
               AND NOT (n.id = ANY($2))",
            &[&active, &exclude, &affinity.template],
        )
        .await?;
    let rows: Vec<_> = match &affinity.pinned {
        Some(pin) => rows
            .into_iter()
            .filter(|r| r.get::<_, String>(0) == pin.node)
            .collect(),
        None => rows,
    };
    // Nodes holding the template, when any candidate does.
    let holds = |r: &tokio_postgres::Row| r.get::<_, Option<bool>>(6).unwrap_or(false);
    let rows: Vec<_> = if rows.iter().any(holds) {
        rows.into_iter().filter(holds).collect()
    } else {
        rows
    };
    let want = demand.memory_mib as i64;
    let mut best: Option<(f64, bool, String, String)> = None;
    let mut seen = Vec::new();
    for row in &rows {
        let id: String = row.get(0);
        let cap_sandboxes: i64 = row.get(2);
        let cap_memory: i64 = row.get(3);
        let used: i64 = row.get(4);
        let used_memory: i64 = row.get(5);
        seen.push(format!(
            "{id}: {used}/{cap_sandboxes} sandboxes, {used_memory}/{cap_memory} MiB"
        ));
        if used + 1 > cap_sandboxes || used_memory + want > cap_memory {
            continue;
        }
        let load = (used + 1) as f64 / cap_sandboxes.max(1) as f64;
        let remote = id != cfg.node_id;
        let better = match &best {
            None => true,
            Some((l, r, bid, _)) => (load, remote, &id) < (*l, *r, bid),
        };
        if better {
            best = Some((load, remote, id, row.get(1)));
        }
    }
    let Some((_, _, node, advertise)) = best else {
        tx.commit().await?;
        let why = match (&affinity.pinned, seen.is_empty()) {
            (Some(pin), true) => format!("{}, which is not ready to take sandboxes", pin.why),
            (Some(pin), false) => format!("{}: {}", pin.why, seen.join("; ")),
            (None, true) => "no node that runs sandboxes is ready".to_string(),
            (None, false) => format!("{} MiB asked; {}", demand.memory_mib, seen.join("; ")),
        };
        return Err(ClusterError::NoCapacity(why));
    };
    let hold_ms = cfg.placement_hold.as_millis() as f64;
    let tenant_name = tenant.as_ref().map(|t| t.tenant.as_str());
    tx.execute(
        "INSERT INTO placements (sandbox, node_id, tenant, cpus, memory_mib, expires_at)
         VALUES ($1, $2, $3, $4, $5, now() + $6::float8 * interval '1 millisecond')",
        &[
            &sandbox.as_str(),
            &node,
            &tenant_name,
            &demand.cpus,
            &want,
            &hold_ms,
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(Placement {
        node,
        advertise,
        sandbox: sandbox.clone(),
    })
}

/// Drop a placement's reservation (its create answered: its row counts from now on, or it
/// failed).
pub async fn release(db: &Db, placement: &Placement) -> Result<(), ClusterError> {
    db.client()
        .await?
        .execute(
            "DELETE FROM placements WHERE sandbox = $1",
            &[&placement.sandbox.as_str()],
        )
        .await?;
    Ok(())
}
