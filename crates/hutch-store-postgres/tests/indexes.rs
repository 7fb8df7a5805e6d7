//! The lookups of requests, of the reaper and of a node's own loops use an index: each
//! method runs on a server that logs every plan (`auto_explain`) with sequential scans
//! priced out (`enable_seqscan = off`: the planner scans a table whole only when no index
//! can answer), and no plan of theirs scans one of the store's tables whole.

mod support;

use std::collections::BTreeMap;

use hutch_core::audit::AuditQuery;
use hutch_core::model::SandboxState;
use hutch_core::store::{
    AuditStore, PageRequest, SandboxQuery, SandboxRefresh, Store, TenancyStore, UsageStore,
};
use hutch_core::tenant::{Tenant, TenantScope};
use hutch_core::usage::{GroupBy, UsageQuery};
use support::{key, record, sid, snapshot, tenant, volume, Cluster};

/// The tables of the store (migration 2) and those of the cluster it reads.
const TABLES: &[&str] = &[
    "sandboxes",
    "snapshots",
    "volumes",
    "tenants",
    "api_keys",
    "tenant_creates",
    "template_owners",
    "audit_log",
    "usage_intervals",
    "usage_meters",
    "nodes",
    "placements",
];

/// The plans in `log` that scan one of [`TABLES`] whole, with their query.
fn whole_table_scans(log: &str) -> Vec<String> {
    log.split("LOG:  duration:")
        .skip(1)
        .filter(|plan| {
            TABLES.iter().any(|t| {
                plan.contains(&format!("Seq Scan on {t} "))
                    || plan.contains(&format!("Seq Scan on {t}\n"))
            })
        })
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lookups_of_requests_and_of_the_reaper_use_an_index() {
    let cluster = Cluster::start().await;
    let setup = cluster.node("a").await;
    for i in 0..50u32 {
        setup
            .insert_sandbox(&record(&format!("sbx_{i}"), i))
            .await
            .expect("insert");
    }
    for i in 0..20 {
        setup
            .insert_snapshot(&snapshot(&format!("snap_{i}"), "warm", Some("acme"), false))
            .await
            .expect("snapshot");
        setup
            .insert_volume(&volume(&format!("vol_{i}"), &format!("v{i}"), Some("acme")))
            .await
            .expect("volume");
        setup
            .insert_key(&format!("h{i}"), &key(&format!("key_{i}"), "acme"))
            .await
            .expect("key");
    }
    setup.insert_tenant(&tenant("acme")).await.expect("tenant");
    setup.insert_tenant(&tenant("empty")).await.expect("tenant");
    drop(setup);
    for setting in [
        "session_preload_libraries = 'auto_explain'",
        "auto_explain.log_min_duration = 0",
        "auto_explain.log_nested_statements = on",
        "auto_explain.log_analyze = on",
        "enable_seqscan = off",
    ] {
        cluster.sql(&format!("ALTER DATABASE hutch SET {setting}"));
    }
    cluster.sql("ANALYZE");
    // A new pool: its connections take the settings.
    let s = cluster.db();
    let fence = std::sync::Arc::new(hutch_store_postgres::NodeFence::new("a"));
    fence.set_epoch(1);
    let s = hutch_store_postgres::PostgresStore::new(s, fence);
    let from = cluster.pg.log().len();
    let acme = Tenant::new("acme");
    let mine = TenantScope::Only(acme.clone());
    let page = PageRequest::new(Some(10), None).expect("page");
    let q = |scope: TenantScope| SandboxQuery {
        scope,
        state: None,
        metadata: BTreeMap::new(),
    };
    // Requests.
    s.get_sandbox(&sid("sbx_1")).await.expect("q");
    s.get_sandbox_for(&sid("sbx_1"), &mine).await.expect("q");
    let first = s
        .list_sandboxes(&q(TenantScope::All), &page)
        .await
        .expect("q");
    let next = PageRequest::new(Some(10), first.next).expect("page");
    s.list_sandboxes(&q(TenantScope::All), &next)
        .await
        .expect("q");
    s.list_sandboxes(&q(mine.clone()), &page).await.expect("q");
    s.get_snapshot(&"snap_1".parse().expect("id"))
        .await
        .expect("q");
    s.snapshots_named("warm", &mine).await.expect("q");
    s.list_snapshots(&mine, &page).await.expect("q");
    s.find_volume("v1", &mine).await.expect("q");
    s.volume_name_taken("v1", Some(&acme)).await.expect("q");
    s.list_volumes(&mine, &page).await.expect("q");
    s.key_by_secret_hash("h1").await.expect("q");
    s.get_key(&"key_1".parse().expect("id")).await.expect("q");
    s.list_keys(&mine, &page).await.expect("q");
    s.get_tenant(&acme).await.expect("q");
    s.list_tenants(&page).await.expect("q");
    s.tenant_usage(&acme, &[sid("sbx_2")], 0).await.expect("q");
    s.template_owner("web").await.expect("q");
    let audit = AuditQuery {
        scope: mine.clone(),
        key_id: None,
        sandbox: None,
        since_ms: None,
        until_ms: None,
    };
    s.list_audit(&audit, &page).await.expect("q");
    let usage = UsageQuery {
        group_by: GroupBy::Day,
        ..UsageQuery::since(mine.clone(), 0)
    };
    s.usage_groups(&usage).await.expect("q");
    // Writes, their fence and their tenant lock.
    s.insert_sandbox(&record("sbx_new", 100)).await.expect("w");
    s.modify_sandbox(&sid("sbx_new"), Box::new(|_| Ok(())))
        .await
        .expect("w");
    s.update_sandbox(&record("sbx_new", 100)).await.expect("w");
    let refresh = SandboxRefresh {
        expires_at_ms: Some(9),
        last_used_ms: Some(9),
    };
    s.refresh_sandboxes(&[(sid("sbx_new"), refresh)])
        .await
        .expect("w");
    s.delete_sandbox(&sid("sbx_new")).await.expect("w");
    s.record_key_uses(&[("key_1".parse().expect("id"), 5)])
        .await
        .expect("w");
    s.record_create(&acme, 5).await.expect("w");
    s.delete_tenant(&Tenant::new("empty")).await.expect("w");
    // The node's own loops.
    s.all_sandboxes().await.expect("q");
    s.pooled_sandboxes().await.expect("q");
    s.expired_sandboxes(5).await.expect("q");
    s.idle_candidates().await.expect("q");
    s.sandboxes_on_layer("snap_1").await.expect("q");
    let live = [SandboxState::Running, SandboxState::Paused];
    s.sandboxes_with_volume("vol_1", &live).await.expect("q");
    s.volumes_in_use(&live).await.expect("q");
    s.count_by_state().await.expect("q");
    s.all_snapshots().await.expect("q");
    s.all_volumes().await.expect("q");
    s.meter_readings().await.expect("q");
    let log = cluster.pg.log();
    let plans = &log[from..];
    assert!(
        plans.matches("LOG:  duration:").count() > 40,
        "every statement's plan is logged: {plans}"
    );
    let scans = whole_table_scans(plans);
    assert!(
        scans.is_empty(),
        "whole-table scans:\n{}",
        scans.join("\n----\n")
    );
    // The check itself sees a scan.
    let found = whole_table_scans("LOG:  duration: 1 ms plan:\n  ->  Seq Scan on sandboxes s\n");
    assert_eq!(found.len(), 1);
}
