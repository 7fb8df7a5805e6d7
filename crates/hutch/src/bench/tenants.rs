//! `tenants`: what authentication, the tenant check and quota accounting cost per request
//! (issue 21's benchmark), in the same run on one server:
//!
//! - the warm exec round trip with one of 5,000 tenant keys (100 tenants × 50 keys, written
//!   into the server's store as `api_scale` does) versus the admin key, on the same sandbox,
//!   requests alternating so the machine's noise falls on both alike (target ≤ 1.05×);
//! - 50 concurrent creates by a tenant with quotas (sandboxes, CPUs, memory, creates per
//!   hour; all roomy enough to admit the 50) versus 50 by the admin key with none, rounds
//!   alternating: the time until every create answered.

use std::time::Instant;

use anyhow::Context;
use futures_util::future::join_all;
use hutch_core::store::{SqliteStore, TenancyStore};
use hutch_core::tenant::keys::{hash_secret, KeyFormat, KeyScope, NewKey};
use hutch_core::tenant::settings::{Quotas, TenantRecord, TenantSettings};
use hutch_core::tenant::Tenant;
use serde::Serialize;

use super::api_scale::TenantClient;
use super::server::BenchServer;
use super::stats::{summarize, Summary};

/// Tenants and keys per tenant written into the store.
const TENANTS: usize = 100;
const KEYS_PER_TENANT: usize = 50;

/// What [`run`] measured.
#[derive(Debug, Clone, Serialize)]
pub struct TenantsBench {
    /// Keys in the store besides the admin key.
    pub keys: usize,
    /// Concurrent creates per round.
    pub concurrent: usize,
    /// The series.
    pub series: Vec<Summary>,
    /// Tenant key over admin key, warm exec p50 (target ≤ 1.05).
    pub exec_ratio_p50: f64,
    /// Creates under quotas over creates without, p50 of a round's wall time.
    pub concurrent_create_ratio_p50: f64,
}

impl TenantsBench {
    /// The report lines.
    pub fn lines(&self) -> Vec<String> {
        let mut out = super::stats::series_lines(&self.series);
        out.push(format!(
            "tenants: exec with a tenant key (of {}) / admin key = {:.3} at p50",
            self.keys, self.exec_ratio_p50
        ));
        out.push(format!(
            "tenants: {} concurrent creates under quotas / without = {:.3} at p50",
            self.concurrent, self.concurrent_create_ratio_p50
        ));
        out
    }
}

/// `n` creates at once by `caller`; the wall time until all answered, and their ids.
async fn concurrent_creates(
    caller: &TenantClient<'_>,
    template: &str,
    n: usize,
) -> anyhow::Result<(f64, Vec<String>)> {
    let t0 = Instant::now();
    let made = join_all((0..n).map(|_| caller.create(template))).await;
    let took = t0.elapsed().as_secs_f64() * 1000.0;
    let mut ids = Vec::with_capacity(n);
    let mut failed = None;
    for m in made {
        match m {
            Ok(id) => ids.push(id),
            Err(e) => failed = Some(e),
        }
    }
    if let Some(e) = failed {
        for id in &ids {
            let _ = caller.kill(id).await;
        }
        return Err(e);
    }
    Ok((took, ids))
}

/// Write the tenants and their keys into the store; the first tenant's first key, whose
/// tenant has the quotas, is returned.
async fn fill(store: &SqliteStore, concurrent: usize) -> anyhow::Result<String> {
    let now = hutch_core::time::now_ms();
    let room = u64::try_from(concurrent.max(1) * 2).unwrap_or(u64::MAX);
    let mut measured = None;
    for t in 0..TENANTS {
        let name = Tenant::new(format!("bench-tenant-{t}"));
        let quotas = if t == 0 {
            Quotas {
                max_sandboxes: Some(room + 1),
                max_creates_per_hour: Some(room * 100),
                max_cpus: Some(room as f64 * 4.0),
                max_memory_mib: Some(room * 4096),
                ..Quotas::default()
            }
        } else {
            Quotas::default()
        };
        store
            .insert_tenant(&TenantRecord {
                name: name.clone(),
                settings: TenantSettings {
                    quotas,
                    ..TenantSettings::default()
                },
                created_at_ms: now,
            })
            .await?;
        for k in 0..KEYS_PER_TENANT {
            let secret = KeyFormat::Hutch.generate();
            let record = NewKey {
                tenant: name.clone(),
                scope: KeyScope::Full,
                name: Some(format!("bench {t}/{k}")),
                selector: Default::default(),
                expires_at_ms: None,
                format: KeyFormat::Hutch,
                budget: Default::default(),
            }
            .record(&secret, now);
            store.insert_key(&hash_secret(&secret), &record).await?;
            if measured.is_none() {
                measured = Some(secret);
            }
        }
    }
    measured.context("no key was made")
}

fn ratio(series: &[Summary], over: &str, under: &str) -> f64 {
    let find = |name: &str| series.iter().find(|s| s.name == name).map(|s| s.p50);
    match (find(over), find(under)) {
        (Some(a), Some(b)) if b > 0.0 => a / b,
        _ => f64::NAN,
    }
}

/// Measure on `srv`: `samples` warm execs per key, `rounds` rounds of `concurrent` creates
/// per caller.
pub async fn run(
    srv: &BenchServer,
    samples: usize,
    concurrent: usize,
    rounds: usize,
) -> anyhow::Result<TenantsBench> {
    let store =
        SqliteStore::open(&srv.state_dir().join("state.db")).context("the bench server's store")?;
    let tenant_key = fill(&store, concurrent).await?;
    let (url, admin_key, http) = srv.endpoint();
    let admin = TenantClient {
        url,
        key: admin_key.to_string(),
        http,
    };
    let tenant = TenantClient {
        url,
        key: tenant_key,
        http,
    };
    let template = srv.template();
    let id = tenant.create(template).await?;
    let measured = async {
        tenant.exec_true(&id).await?;
        admin.exec_true(&id).await?;
        let (mut by_tenant, mut by_admin) = (Vec::new(), Vec::new());
        for _ in 0..samples {
            let t0 = Instant::now();
            tenant.exec_true(&id).await?;
            by_tenant.push(t0.elapsed().as_secs_f64() * 1000.0);
            let t0 = Instant::now();
            admin.exec_true(&id).await?;
            by_admin.push(t0.elapsed().as_secs_f64() * 1000.0);
        }
        let (mut quota, mut free) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            for (caller, out) in [(&tenant, &mut quota), (&admin, &mut free)] {
                let (took, ids) = concurrent_creates(caller, template, concurrent).await?;
                out.push(took);
                for id in ids {
                    caller.kill(&id).await?;
                }
            }
        }
        Ok::<_, anyhow::Error>(vec![
            summarize("tenants_exec_round_trip_tenant_key", "ms", &by_tenant),
            summarize("tenants_exec_round_trip_admin_key", "ms", &by_admin),
            summarize(
                &format!("tenants_concurrent_{concurrent}_creates_quota"),
                "ms",
                &quota,
            ),
            summarize(
                &format!("tenants_concurrent_{concurrent}_creates_no_quota"),
                "ms",
                &free,
            ),
        ])
    }
    .await;
    tenant.kill(&id).await?;
    let series = measured?;
    Ok(TenantsBench {
        keys: TENANTS * KEYS_PER_TENANT,
        concurrent,
        exec_ratio_p50: ratio(
            &series,
            "tenants_exec_round_trip_tenant_key",
            "tenants_exec_round_trip_admin_key",
        ),
        concurrent_create_ratio_p50: ratio(
            &series,
            &format!("tenants_concurrent_{concurrent}_creates_quota"),
            &format!("tenants_concurrent_{concurrent}_creates_no_quota"),
        ),
        series,
    })
}
