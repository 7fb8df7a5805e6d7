//! What only a shared store has: two nodes' `PostgresStore`s on one database. Each sees
//! only its own rows in node-side reads and every row in lookups and listings, a uid slot
//! is per node, a node cannot change another's rows, a node declared dead changes nothing,
//! quotas count the cluster's placements, and a database that goes away is reported
//! unavailable until it is back.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use hutch_core::model::SandboxState;
use hutch_core::store::usage::MeterReading;
use hutch_core::store::{
    PageRequest, SandboxQuery, SandboxRefresh, Store, TenancyStore, UsageStore,
};
use hutch_core::tenant::{Tenant, TenantScope};
use hutch_core::usage::{ResourceKind, UsageInterval, UsageTotals};
use hutch_core::volume::VolumeMount;
use hutch_core::CoreError;
use hutch_store_postgres::PostgresStore;
use support::{ids, record, sandbox_of, sid, snapshot, volume, Cluster};

/// Wait until a session waits on a lock: the call under test is blocked.
async fn until_a_session_waits_on_a_lock(cluster: &Cluster) {
    let waiting = hutch_testkit::wait_until(Duration::from_secs(10), async || {
        let sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'";
        (cluster.sql(sql) != "0").then_some(())
    })
    .await;
    assert!(waiting.is_some(), "no session waits on a lock");
}

fn everything() -> SandboxQuery {
    SandboxQuery {
        scope: TenantScope::All,
        state: None,
        metadata: BTreeMap::new(),
    }
}

fn reading(cpu_ns: u64) -> MeterReading {
    MeterReading {
        cpu_ns,
        egress_bytes: 1,
        at_ms: 2,
    }
}

/// A running sandbox that every node-side read selects: on layer `snap_x`, mounting
/// `vol_x`, expired, with an idle policy.
fn sandbox(id: &str, slot: u32) -> hutch_core::model::SandboxRecord {
    let mut r = record(id, slot);
    r.layer = Some("snap_x".into());
    r.idle_hibernate_seconds = Some(60);
    r.volumes = vec![VolumeMount {
        volume: "vol_x".into(),
        path: "/data".into(),
        read_only: false,
    }];
    r
}

/// Two nodes' stores, each with a sandbox in uid slot 3, a warm guest, a snapshot, a volume
/// and a meter reading.
async fn two_nodes(cluster: &Cluster) -> (PostgresStore, PostgresStore) {
    let a = cluster.node("a").await;
    let b = cluster.node("b").await;
    for (s, n) in [(&a, "a"), (&b, "b")] {
        s.insert_sandbox(&sandbox(&format!("sbx_{n}"), 3))
            .await
            .expect("uid slot 3 is free on each node");
        let mut pooled = record(&format!("sbx_{n}pool"), 4);
        pooled.state = SandboxState::Pooled;
        s.insert_sandbox(&pooled).await.expect("pooled");
        s.insert_snapshot(&snapshot(&format!("snap_{n}"), "warm", Some("acme"), false))
            .await
            .expect("snapshot");
        s.insert_volume(&volume(
            &format!("vol_{n}"),
            &format!("data{n}"),
            Some("acme"),
        ))
        .await
        .expect("volume");
        s.append_usage(&[], &[(sid(&format!("sbx_{n}")), Some(reading(7)))])
            .await
            .expect("meter");
    }
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_reads_its_own_rows_and_every_lookup_reads_all() {
    let cluster = Cluster::start().await;
    let (a, b) = two_nodes(&cluster).await;
    match a.insert_sandbox(&record("sbx_a2", 3)).await {
        Err(CoreError::Conflict(m)) => assert_eq!(m, "uid slot 3 in use"),
        other => panic!("slot 3 is taken on node a: {other:?}"),
    }
    for (s, n) in [(&a, "a"), (&b, "b")] {
        let own = vec![format!("sbx_{n}")];
        assert_eq!(ids(&s.all_sandboxes().await.expect("all")), own);
        assert_eq!(
            ids(&s.pooled_sandboxes().await.expect("pool")),
            [format!("sbx_{n}pool")]
        );
        assert_eq!(ids(&s.expired_sandboxes(10).await.expect("expired")), own);
        assert_eq!(ids(&s.idle_candidates().await.expect("idle")), own);
        assert_eq!(
            ids(&s.sandboxes_on_layer("snap_x").await.expect("layer")),
            own
        );
        let running = [SandboxState::Running];
        assert_eq!(
            ids(&s
                .sandboxes_with_volume("vol_x", &running)
                .await
                .expect("users")),
            own
        );
        assert_eq!(s.volumes_in_use(&running).await.expect("in use"), ["vol_x"]);
        assert_eq!(
            s.count_by_state().await.expect("count"),
            [(SandboxState::Running, 1)]
        );
        let snaps: Vec<String> = s
            .all_snapshots()
            .await
            .expect("snapshots")
            .into_iter()
            .map(|r| r.id.to_string())
            .collect();
        assert_eq!(snaps, [format!("snap_{n}")]);
        let vols: Vec<String> = s
            .all_volumes()
            .await
            .expect("volumes")
            .into_iter()
            .map(|r| r.id.to_string())
            .collect();
        assert_eq!(vols, [format!("vol_{n}")]);
        let meters = s.meter_readings().await.expect("meters");
        assert_eq!(
            meters.keys().map(|k| k.to_string()).collect::<Vec<_>>(),
            own
        );
        // Lookups and listings are the cluster's.
        for id in ["sbx_a", "sbx_b", "sbx_apool"] {
            assert!(
                s.get_sandbox(&sid(id)).await.expect("get").is_some(),
                "{id}"
            );
        }
        let acme = TenantScope::Only(Tenant::new("acme"));
        for id in ["sbx_a", "sbx_b"] {
            assert!(s
                .get_sandbox_for(&sid(id), &acme)
                .await
                .expect("get")
                .is_some());
        }
        let listed = s
            .list_sandboxes(&everything(), &PageRequest::default())
            .await
            .expect("list");
        assert_eq!(ids(&listed.items), ["sbx_a", "sbx_b"]);
        for id in ["snap_a", "snap_b"] {
            assert!(s
                .get_snapshot(&id.parse().expect("id"))
                .await
                .expect("get")
                .is_some());
        }
        assert_eq!(
            s.snapshots_named("warm", &acme).await.expect("named").len(),
            2
        );
        let page = s
            .list_snapshots(&acme, &PageRequest::default())
            .await
            .expect("list");
        assert_eq!(page.items.len(), 2);
        for key in ["vol_a", "datab"] {
            assert!(
                s.find_volume(key, &acme).await.expect("find").is_some(),
                "{key}"
            );
        }
        assert!(s
            .volume_name_taken("dataa", Some(&Tenant::new("acme")))
            .await
            .expect("q"));
        let page = s
            .list_volumes(&acme, &PageRequest::default())
            .await
            .expect("list");
        assert_eq!(page.items.len(), 2);
        let usage = s
            .tenant_usage(&Tenant::new("acme"), &[], 0)
            .await
            .expect("usage");
        assert_eq!(usage.sandboxes, 2, "quotas count the tenant on every node");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cannot_change_another_nodes_rows() {
    let cluster = Cluster::start().await;
    let (a, b) = two_nodes(&cluster).await;
    let before = cluster.sql("SELECT record FROM sandboxes WHERE id = 'sbx_a'");
    let mut changed = sandbox("sbx_a", 3);
    changed.state = SandboxState::Failed;
    match b.update_sandbox(&changed).await {
        Err(CoreError::NotFound(m)) => assert_eq!(m, "sandbox sbx_a does not exist"),
        other => panic!("node b updating node a's row: {other:?}"),
    }
    let modified = b
        .modify_sandbox(
            &sid("sbx_a"),
            Box::new(|r| {
                r.state = SandboxState::Failed;
                Ok(())
            }),
        )
        .await;
    assert!(
        matches!(modified, Err(CoreError::NotFound(_))),
        "{modified:?}"
    );
    let refresh = SandboxRefresh {
        expires_at_ms: Some(9_999),
        last_used_ms: Some(9_999),
    };
    b.refresh_sandboxes(&[(sid("sbx_a"), refresh)])
        .await
        .expect("skipped");
    assert!(!b.delete_sandbox(&sid("sbx_a")).await.expect("delete"));
    assert!(!b
        .delete_snapshot(&"snap_a".parse().expect("id"))
        .await
        .expect("delete"));
    assert!(!b
        .delete_volume(&"vol_a".parse().expect("id"))
        .await
        .expect("delete"));
    b.append_usage(
        &[],
        &[(sid("sbx_a"), Some(reading(99))), (sid("sbx_a"), None)],
    )
    .await
    .expect("meters");
    b.append_usage(&[], &[(sid("sbx_a"), Some(reading(99)))])
        .await
        .expect("meters");
    assert_eq!(
        cluster.sql("SELECT record FROM sandboxes WHERE id = 'sbx_a'"),
        before,
        "node a's row is as it was"
    );
    assert!(a
        .get_snapshot(&"snap_a".parse().expect("id"))
        .await
        .expect("get")
        .is_some());
    assert!(a
        .find_volume("vol_a", &TenantScope::All)
        .await
        .expect("get")
        .is_some());
    assert_eq!(
        a.meter_readings().await.expect("meters")[&sid("sbx_a")],
        reading(7)
    );
    // Its owner still can.
    a.update_sandbox(&changed)
        .await
        .expect("node a updates its own row");
    assert!(a.delete_sandbox(&sid("sbx_a")).await.expect("delete"));
}

/// What `cluster`'s state tables hold, to compare before and after refused writes.
fn contents(cluster: &Cluster) -> String {
    [
        "SELECT id, node_id, state, record FROM sandboxes ORDER BY id",
        "SELECT id, node_id FROM snapshots ORDER BY id",
        "SELECT id, node_id FROM volumes ORDER BY id",
        "SELECT sandbox, node_id, cpu_ns FROM usage_meters ORDER BY sandbox",
        "SELECT count(*) FROM usage_intervals",
    ]
    .map(|q| cluster.sql(q))
    .join("\n")
}

fn interval(id: &str) -> UsageInterval {
    UsageInterval {
        kind: ResourceKind::Sandbox,
        resource: id.into(),
        tenant: Some(Tenant::new("acme")),
        key_id: None,
        start_ms: 1,
        end_ms: 2,
        usage: UsageTotals::default(),
    }
}

/// Every node-side write of `s`, each of which must be refused as `NodeFenced` of `node`
/// at `epoch`.
async fn assert_every_write_is_fenced(s: &PostgresStore, node: &str, epoch: i64) {
    let fenced = |what: &str, r: Result<(), CoreError>| match r {
        Err(CoreError::NodeFenced { node: n, epoch: e }) => {
            assert_eq!((n.as_str(), e), (node, epoch), "{what}");
        }
        other => panic!("{what} of a fenced node: {other:?}"),
    };
    let id = format!("sbx_{node}");
    let mut changed = sandbox(&id, 3);
    changed.state = SandboxState::Failed;
    fenced("insert", s.insert_sandbox(&record("sbx_new", 9)).await);
    fenced("update", s.update_sandbox(&changed).await);
    let modified = s
        .modify_sandbox(
            &sid(&id),
            Box::new(|r| {
                r.state = SandboxState::Failed;
                Ok(())
            }),
        )
        .await;
    fenced("modify", modified.map(|_| ()));
    let refresh = SandboxRefresh {
        expires_at_ms: Some(9_999),
        last_used_ms: Some(9_999),
    };
    fenced("refresh", s.refresh_sandboxes(&[(sid(&id), refresh)]).await);
    fenced("delete", s.delete_sandbox(&sid(&id)).await.map(|_| ()));
    fenced(
        "insert snapshot",
        s.insert_snapshot(&snapshot("snap_new", "x", None, false))
            .await,
    );
    let snap = format!("snap_{node}").parse().expect("id");
    fenced(
        "delete snapshot",
        s.delete_snapshot(&snap).await.map(|_| ()),
    );
    fenced(
        "insert volume",
        s.insert_volume(&volume("vol_new", "x", None)).await,
    );
    let vol = format!("vol_{node}").parse().expect("id");
    fenced("delete volume", s.delete_volume(&vol).await.map(|_| ()));
    fenced("append usage", s.append_usage(&[interval(&id)], &[]).await);
    fenced(
        "write a meter",
        s.append_usage(&[], &[(sid(&id), Some(reading(99)))]).await,
    );
    fenced(
        "forget a meter",
        s.append_usage(&[], &[(sid(&id), None)]).await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_declared_dead_changes_nothing() {
    let cluster = Cluster::start().await;
    let (a, b) = two_nodes(&cluster).await;
    let before = contents(&cluster);
    cluster.sql("UPDATE nodes SET epoch = epoch + 1, state = 'dead' WHERE id = 'a'");
    assert_every_write_is_fenced(&a, "a", 1).await;
    assert_eq!(contents(&cluster), before, "a fenced node changed nothing");
    // It still reads; the cluster-wide tables are no node's.
    assert_eq!(ids(&a.all_sandboxes().await.expect("reads")), ["sbx_a"]);
    a.record_create(&Tenant::new("acme"), 1)
        .await
        .expect("not a node's row");
    // Node b is still a member.
    b.insert_sandbox(&record("sbx_b2", 5))
        .await
        .expect("b writes");
    assert!(b.delete_sandbox(&sid("sbx_b2")).await.expect("b deletes"));
    // Registered again (a new epoch: a restarted node), it writes again; a node back to
    // `ready` with the epoch it held before cannot.
    cluster.sql("UPDATE nodes SET state = 'ready' WHERE id = 'a'");
    let e = a.insert_sandbox(&record("sbx_new", 9)).await;
    assert!(
        matches!(e, Err(CoreError::NodeFenced { epoch: 1, .. })),
        "{e:?}"
    );
    a.fence().set_epoch(2);
    a.insert_sandbox(&record("sbx_new", 9))
        .await
        .expect("registered again");
    assert!(a.delete_sandbox(&sid("sbx_new")).await.expect("delete"));
    // A fence that never registered (epoch 0) matches no row.
    let unregistered = cluster.node("c").await;
    unregistered.fence().set_epoch(0);
    let e = unregistered.insert_sandbox(&record("sbx_c", 1)).await;
    assert!(
        matches!(e, Err(CoreError::NodeFenced { epoch: 0, .. })),
        "{e:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_in_flight_holds_off_the_reaper_and_none_slips_in_after_it() {
    let cluster = Cluster::start().await;
    let a = cluster.node("a").await;
    a.insert_sandbox(&record("sbx_a", 1)).await.expect("insert");
    // The reaper's transaction: the node declared dead, not yet committed.
    let db = cluster.db();
    let mut reaper = db.client().await.expect("client");
    let tx = reaper.transaction().await.expect("begin");
    tx.execute(
        "UPDATE nodes SET epoch = epoch + 1, state = 'dead' WHERE id = 'a'",
        &[],
    )
    .await
    .expect("declare dead");
    // A write of node a now waits on the node row, and is refused once the reaper commits.
    let write = tokio::spawn(async move {
        let r = a.insert_sandbox(&record("sbx_late", 2)).await;
        (a, r)
    });
    until_a_session_waits_on_a_lock(&cluster).await;
    assert!(
        !write.is_finished(),
        "the write waits for the reaper's transaction"
    );
    tx.commit().await.expect("commit");
    let (a, r) = write.await.expect("join");
    assert!(
        matches!(r, Err(CoreError::NodeFenced { epoch: 1, .. })),
        "{r:?}"
    );
    assert!(a
        .get_sandbox(&sid("sbx_late"))
        .await
        .expect("get")
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_usage_counts_the_placements_not_yet_written() {
    let cluster = Cluster::start().await;
    let (a, b) = (cluster.node("a").await, cluster.node("b").await);
    a.insert_sandbox(&sandbox_of(
        "sbx_run",
        1,
        "acme",
        SandboxState::Running,
        1.0,
    ))
    .await
    .expect("insert");
    b.insert_sandbox(&sandbox_of(
        "sbx_paused",
        1,
        "acme",
        SandboxState::Paused,
        4.0,
    ))
    .await
    .expect("insert");
    let placement = |sandbox: &str, node: &str, tenant: &str, expires: &str| {
        cluster.sql(&format!(
            "INSERT INTO placements (sandbox, node_id, tenant, cpus, memory_mib, expires_at)
                VALUES ('{sandbox}', '{node}', '{tenant}', 0.5, 64, now() + interval '{expires}')"
        ));
    };
    placement("sbx_placed", "b", "acme", "1 minute");
    placement("sbx_placed2", "a", "acme", "1 minute");
    placement("sbx_old", "a", "acme", "-1 second");
    placement("sbx_run", "a", "acme", "1 minute");
    placement("sbx_beta", "a", "beta", "1 minute");
    let acme = Tenant::new("acme");
    let u = a.tenant_usage(&acme, &[], 0).await.expect("usage");
    // sbx_run (1 CPU, 100 MiB), sbx_paused (no CPUs), two live placements (0.5, 64 each):
    // not the expired one, not the one whose sandbox has its row, not another tenant's.
    assert_eq!((u.sandboxes, u.cpus, u.memory_mib), (4, 2.0, 228));
    // The live placements are creates in flight: counted against creates per hour too.
    assert_eq!(u.creates_last_hour, 2);
    let u = b
        .tenant_usage(&acme, &[sid("sbx_placed"), sid("sbx_run")], 0)
        .await
        .expect("usage");
    assert_eq!(
        (u.sandboxes, u.cpus, u.memory_mib, u.creates_last_hour),
        (2, 0.5, 64, 1),
        "excluded ones left out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_database_is_unavailable_and_the_same_store_recovers() {
    let mut cluster = Cluster::start().await;
    let a = cluster.node("a").await;
    a.insert_sandbox(&record("sbx_a", 1)).await.expect("insert");
    cluster.pg.stop();
    let unavailable = |what: &str, e: CoreError| {
        assert!(matches!(e, CoreError::StoreUnavailable(_)), "{what}: {e:?}");
        assert!(
            e.to_string().starts_with("cluster database unreachable: "),
            "{e}"
        );
    };
    unavailable(
        "a read",
        a.get_sandbox(&sid("sbx_a")).await.expect_err("down"),
    );
    unavailable(
        "a write",
        a.insert_sandbox(&record("sbx_b", 2))
            .await
            .expect_err("down"),
    );
    unavailable(
        "a tenancy read",
        a.get_tenant(&Tenant::new("acme")).await.expect_err("down"),
    );
    cluster.pg.start_again();
    let back = a
        .get_sandbox(&sid("sbx_a"))
        .await
        .expect("the same store, reconnected");
    assert!(back.is_some());
    a.insert_sandbox(&record("sbx_b", 2))
        .await
        .expect("writes again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_delete_and_an_insert_for_that_tenant_never_interleave() {
    let cluster = Cluster::start().await;
    let a = cluster.node("a").await;
    a.insert_tenant(&support::tenant("acme"))
        .await
        .expect("tenant");
    let db = cluster.db();
    // An insert in flight for acme (what `insert_sandbox` does in one statement, held
    // open here): the tenant's row locked FOR KEY SHARE, the row written, not committed.
    let mut inserting = db.client().await.expect("client");
    let tx = inserting.transaction().await.expect("begin");
    tx.execute(
        "SELECT 1 FROM tenants WHERE name = 'acme' FOR KEY SHARE",
        &[],
    )
    .await
    .expect("lock");
    tx.execute(
        "INSERT INTO sandboxes (id, node_id, state, uid_slot, record, tenant)
            SELECT 'sbx_x', 'a', 'running', 1, record, 'acme' FROM (SELECT $1::jsonb AS record) r",
        &[&serde_json::to_value(record("sbx_x", 1)).expect("json")],
    )
    .await
    .expect("insert");
    let delete = tokio::spawn(async move {
        let r = a.delete_tenant(&Tenant::new("acme")).await;
        (a, r)
    });
    until_a_session_waits_on_a_lock(&cluster).await;
    assert!(!delete.is_finished(), "the delete waits for the insert");
    tx.commit().await.expect("commit");
    let (a, r) = delete.await.expect("join");
    let e = r.expect_err("the sandbox committed before the count");
    assert_eq!(
        e.to_string(),
        "tenant acme still owns 1 sandbox: delete them first"
    );
    // The other way round: a delete in flight holds off an insert for its tenant.
    assert!(a.delete_sandbox(&sid("sbx_x")).await.expect("delete"));
    let tx = inserting.transaction().await.expect("begin");
    tx.execute("SELECT 1 FROM tenants WHERE name = 'acme' FOR UPDATE", &[])
        .await
        .expect("lock");
    let insert = tokio::spawn(async move {
        let r = a.insert_sandbox(&record("sbx_y", 2)).await;
        (a, r)
    });
    until_a_session_waits_on_a_lock(&cluster).await;
    assert!(!insert.is_finished(), "the insert waits for the delete");
    tx.execute("DELETE FROM tenants WHERE name = 'acme'", &[])
        .await
        .expect("delete");
    tx.commit().await.expect("commit");
    let (_a, r) = insert.await.expect("join");
    r.expect("the insert goes on after the delete, as it would after it on SQLite");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_the_server_cuts_off_is_unavailable_and_the_store_reconnects() {
    let cluster = Cluster::start().await;
    let a = cluster.node("a").await;
    a.insert_sandbox(&record("sbx_a", 1)).await.expect("insert");
    // Another session holds the row, so node a's modify waits on it...
    let db = cluster.db();
    let mut other = db.client().await.expect("client");
    let tx = other.transaction().await.expect("begin");
    tx.execute("SELECT 1 FROM sandboxes WHERE id = 'sbx_a' FOR UPDATE", &[])
        .await
        .expect("lock");
    let modify = tokio::spawn(async move {
        let r = a.modify_sandbox(&sid("sbx_a"), Box::new(|_| Ok(()))).await;
        (a, r)
    });
    until_a_session_waits_on_a_lock(&cluster).await;
    // ... until the server ends its session, as a server shutting down does (57P01).
    cluster.sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
    );
    let (a, r) = modify.await.expect("join");
    assert!(matches!(r, Err(CoreError::StoreUnavailable(_))), "{r:?}");
    tx.rollback().await.expect("rollback");
    // The pool drops the lost connection once it has seen it closed: until then a call on
    // it fails as unavailable too, never otherwise.
    let back = hutch_testkit::wait_until(Duration::from_secs(10), async || {
        match a.get_sandbox(&sid("sbx_a")).await {
            Ok(r) => Some(r),
            Err(CoreError::StoreUnavailable(_)) => None,
            Err(e) => panic!("a lost connection is StoreUnavailable: {e:?}"),
        }
    })
    .await;
    let back = back.expect("the pool replaced the lost connection");
    assert!(back.is_some());
}
