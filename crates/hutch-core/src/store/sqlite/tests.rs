//! Tests of the SQLite store: persistence, atomic changes, migrations from older schemas,
//! pagination, and that the lookups requests make use an index.

use std::collections::BTreeMap;

use super::*;
use crate::model::Isolation;
use crate::store::{PageRequest, TenancyStore, UsageStore};
use crate::tenant::keys::{hash_secret, KeyRecord, KeyScope};

/// A sandbox id written in a test (well-formed).
fn sid(id: &str) -> SandboxId {
    id.parse().expect("a well-formed sandbox id")
}

fn record(id: &str, slot: u32) -> SandboxRecord {
    SandboxRecord {
        id: sid(id),
        template: "minimal".into(),
        isolation: Isolation::Ns,
        state: SandboxState::Running,
        tenant: Some(Tenant::new("acme")),
        metadata: BTreeMap::new(),
        env: BTreeMap::new(),
        cpus: 1.0,
        memory_mib: 256,
        disk_mib: 1024,
        pids_max: 128,
        ttl_seconds: 300,
        persistent: false,
        created_at_ms: 1,
        expires_at_ms: 2,
        uid_slot: slot,
        init_pid: Some(42),
        init_start_time: Some(7),
        cgroups: vec![],
        error: None,
        network: None,
        layer: None,
        snapshot: None,
        forked_from: None,
        idle_hibernate_seconds: None,
        last_used_ms: 0,
        net_slot: None,
        volumes: vec![],
        start: None,
        template_rev: None,
        exec_defaults: Default::default(),
        created_by: None,
        max_cost_micros: None,
        saved_state: None,
        saving: None,
        arrival: None,
    }
}

/// An admin key's record, as stored.
fn admin_key() -> KeyRecord {
    KeyRecord {
        id: "key_admin1".parse().expect("a key id"),
        tenant: Tenant::new("admin"),
        scope: KeyScope::Admin,
        name: None,
        selector: BTreeMap::new(),
        prefix: "hk_secre…".into(),
        created_at_ms: 5,
        expires_at_ms: None,
        last_used_ms: None,
        budget: Default::default(),
    }
}

fn open(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::open(&dir.path().join("state.db")).expect("open")
}

fn acme() -> TenantScope {
    TenantScope::Only(Tenant::new("acme"))
}

#[tokio::test]
async fn records_and_keys_persist_across_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = open(&dir);
        s.insert_sandbox(&record("sbx_a", 20))
            .await
            .expect("insert");
        assert!(matches!(
            s.insert_sandbox(&record("sbx_b", 20)).await,
            Err(CoreError::Conflict(_))
        ));
        let mut r = record("sbx_a", 20);
        r.state = SandboxState::Failed;
        s.update_sandbox(&r).await.expect("update");
        s.insert_key(&hash_secret("hk_secret"), &admin_key())
            .await
            .expect("key");
    }
    let s = open(&dir);
    let r = s
        .get_sandbox(&sid("sbx_a"))
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(r.state, SandboxState::Failed);
    assert_eq!(r.tenant, Some(Tenant::new("acme")));
    assert_eq!(
        s.count_by_state().await.expect("count"),
        vec![(SandboxState::Failed, 1)]
    );
    assert_eq!(
        s.key_by_secret_hash(&hash_secret("hk_secret"))
            .await
            .expect("q"),
        Some(admin_key())
    );
    assert_eq!(
        s.key_by_secret_hash(&hash_secret("hk_wrong"))
            .await
            .expect("q"),
        None
    );
    assert!(s.delete_sandbox(&sid("sbx_a")).await.expect("delete"));
    assert!(!s.delete_sandbox(&sid("sbx_a")).await.expect("delete again"));
    assert!(s.get_sandbox(&sid("sbx_a")).await.expect("get").is_none());
}

#[tokio::test]
async fn modify_changes_one_record_and_can_refuse() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(&dir);
    let s: &dyn Store = &s;
    s.insert_sandbox(&record("sbx_a", 20))
        .await
        .expect("insert");
    let r = s
        .modify(&sid("sbx_a"), |r| {
            r.state = SandboxState::Paused;
            Ok(())
        })
        .await
        .expect("modify");
    assert_eq!(r.state, SandboxState::Paused);
    assert_eq!(
        s.count_by_state().await.expect("count"),
        vec![(SandboxState::Paused, 1)]
    );
    let refused = s
        .modify(&sid("sbx_a"), |r| {
            r.state = SandboxState::Failed;
            Err(CoreError::Conflict("no".into()))
        })
        .await;
    assert!(matches!(refused, Err(CoreError::Conflict(_))));
    assert_eq!(
        s.get_sandbox(&sid("sbx_a"))
            .await
            .expect("get")
            .expect("row")
            .state,
        SandboxState::Paused
    );
    assert!(matches!(
        s.modify(&sid("sbx_zz"), |_| Ok(())).await,
        Err(CoreError::NotFound(_))
    ));
}

#[tokio::test]
async fn a_version_1_database_is_migrated_and_keeps_its_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    {
        let conn = Connection::open(&path).expect("open raw");
        conn.execute_batch(MIGRATIONS[0]).expect("v1 schema");
        let json = serde_json::to_string(&record("sbx_old", 21)).expect("json");
        conn.execute(
            "INSERT INTO sandboxes (id, state, uid_slot, record) VALUES ('sbx_old', 'running', 21, ?1)",
            [json],
        )
        .expect("row");
        conn.pragma_update(None, "user_version", 1)
            .expect("version");
    }
    let s = SqliteStore::open(&path).expect("migrate");
    let version: i64 = s
        .lock()
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION);
    assert!(s.get_sandbox(&sid("sbx_old")).await.expect("get").is_some());
    assert!(s.all_snapshots().await.expect("snapshots").is_empty());
    // A database from a newer hutch is refused.
    s.lock()
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .expect("bump");
    drop(s);
    assert!(matches!(
        SqliteStore::open(&path),
        Err(CoreError::Database(_))
    ));
}

/// A version 3 database (the schema before the tenant column) written the way the hutch of
/// that schema wrote it: the tenant only as `metadata.tenant_id` inside the record JSON.
#[tokio::test]
async fn a_version_3_database_moves_each_tenant_from_metadata_into_the_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    {
        let conn = Connection::open(&path).expect("open raw");
        for step in &MIGRATIONS[..3] {
            conn.execute_batch(step).expect("old schema");
        }
        let mut tenanted = serde_json::to_value(record("sbx_old", 21)).expect("json");
        tenanted["metadata"] = serde_json::json!({"tenant_id": "acme", "role": "ci"});
        tenanted["idle_hibernate_seconds"] = 60.into();
        let mut admins = serde_json::to_value(record("sbx_adm", 22)).expect("json");
        admins["persistent"] = true.into();
        for (id, slot, json) in [("sbx_old", 21, &tenanted), ("sbx_adm", 22, &admins)] {
            assert!(
                json.get("tenant").is_none(),
                "old records had no tenant field"
            );
            conn.execute(
                "INSERT INTO sandboxes (id, state, uid_slot, record) VALUES (?1, 'running', ?2, ?3)",
                params![id, slot, json.to_string()],
            )
            .expect("sandbox row");
        }
        conn.execute(
            "INSERT INTO snapshots (id, record) VALUES ('snap_old', ?1)",
            [serde_json::json!({
                "id": "snap_old", "name": "warm", "sandbox_id": "sbx_old", "kind": "filesystem",
                "isolation": "ns", "template": "minimal", "size_bytes": 1,
                "created_at_ms": 1, "tenant_id": "acme", "hidden": false,
                "defaults": {"cpus": 1.0, "memory_mib": 256, "disk_mib": 1024, "pids_max": 128, "env": {}}
            })
            .to_string()],
        )
        .expect("snapshot row");
        conn.execute(
            "INSERT INTO volumes (id, record) VALUES ('vol_old', ?1)",
            [serde_json::json!({
                "id": "vol_old", "name": "data", "size_mib": 64, "created_at_ms": 1, "tenant": "acme"
            })
            .to_string()],
        )
        .expect("volume row");
        conn.pragma_update(None, "user_version", 3)
            .expect("version");
    }
    let s = SqliteStore::open(&path).expect("migrate");
    let column: Option<String> = s
        .lock()
        .query_row(
            "SELECT tenant FROM sandboxes WHERE id = 'sbx_old'",
            [],
            |r| r.get(0),
        )
        .expect("row");
    assert_eq!(
        column.as_deref(),
        Some("acme"),
        "the tenant is in the column"
    );
    let json: String = s
        .lock()
        .query_row(
            "SELECT record FROM sandboxes WHERE id = 'sbx_old'",
            [],
            |r| r.get(0),
        )
        .expect("row");
    assert!(
        !json.contains("tenant_id"),
        "the column is the only copy of the tenant: {json}"
    );
    let r = s
        .get_sandbox(&sid("sbx_old"))
        .await
        .expect("get")
        .expect("row");
    assert_eq!(r.tenant, Some(Tenant::new("acme")));
    assert_eq!(r.metadata.get("role").map(String::as_str), Some("ci"));
    assert_eq!(
        r.view().metadata.get("tenant_id").map(String::as_str),
        Some("acme"),
        "the API still shows the tenant as metadata.tenant_id"
    );
    let adm = s
        .get_sandbox(&sid("sbx_adm"))
        .await
        .expect("get")
        .expect("row");
    assert_eq!(adm.tenant, None);
    assert!(!adm.view().metadata.contains_key("tenant_id"));
    // The indexed columns came out of the records.
    let seen = s
        .get_sandbox_for(&sid("sbx_old"), &acme())
        .await
        .expect("scoped");
    assert_eq!(seen.map(|r| r.id).as_deref(), Some("sbx_old"));
    let expired: Vec<String> = s
        .expired_sandboxes(10)
        .await
        .expect("expired")
        .into_iter()
        .map(|r| r.id.to_string())
        .collect();
    assert_eq!(expired, ["sbx_old"], "a persistent sandbox never expires");
    let idle: Vec<String> = s
        .idle_candidates()
        .await
        .expect("idle")
        .into_iter()
        .map(|r| r.id.to_string())
        .collect();
    assert_eq!(idle, ["sbx_old"]);
    let snaps = s.snapshots_named("warm", &acme()).await.expect("named");
    assert_eq!(snaps.len(), 1);
    assert_eq!(snaps[0].tenant_id, Some(Tenant::new("acme")));
    let vol = s.find_volume("data", &acme()).await.expect("find");
    assert_eq!(vol.map(|v| v.id).as_deref(), Some("vol_old"));
    let other = TenantScope::Only(Tenant::new("other"));
    assert!(s.find_volume("data", &other).await.expect("find").is_none());
}

#[tokio::test]
async fn a_scoped_lookup_finds_only_the_tenants_sandbox_and_never_a_warm_guest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(&dir);
    s.insert_sandbox(&record("sbx_a", 20))
        .await
        .expect("insert");
    let mut pooled = record("sbx_p", 21);
    pooled.state = SandboxState::Pooled;
    s.insert_sandbox(&pooled).await.expect("insert");
    let other = TenantScope::Only(Tenant::new("other"));
    assert!(s
        .get_sandbox_for(&sid("sbx_a"), &acme())
        .await
        .expect("q")
        .is_some());
    assert!(s
        .get_sandbox_for(&sid("sbx_a"), &TenantScope::All)
        .await
        .expect("q")
        .is_some());
    assert!(s
        .get_sandbox_for(&sid("sbx_a"), &other)
        .await
        .expect("q")
        .is_none());
    assert!(s
        .get_sandbox_for(&sid("sbx_p"), &TenantScope::All)
        .await
        .expect("q")
        .is_none());
    assert!(s.get_sandbox(&sid("sbx_p")).await.expect("q").is_some());
}

#[tokio::test]
async fn pages_return_every_row_once_while_rows_are_inserted_and_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(&dir);
    let mut before = Vec::new();
    for i in 0..25u32 {
        let id = format!("sbx_{i:03}");
        s.insert_sandbox(&record(&id, 100 + i))
            .await
            .expect("insert");
        before.push(id);
    }
    let query = SandboxQuery {
        scope: acme(),
        state: None,
        metadata: BTreeMap::new(),
    };
    let mut seen = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let page = PageRequest::new(Some(4), after.take()).expect("page");
        let got = s.list_sandboxes(&query, &page).await.expect("page");
        assert!(got.items.len() <= 4);
        seen.extend(got.items.into_iter().map(|r| r.id));
        pages += 1;
        // Between pages: a new row, and one row not yet seen deleted.
        let id = format!("sbx_new{pages:03}");
        s.insert_sandbox(&record(&id, 1000 + pages))
            .await
            .expect("insert");
        if pages == 2 {
            assert!(s.delete_sandbox(&sid("sbx_024")).await.expect("delete"));
        }
        match got.next {
            Some(c) => after = Some(c),
            None => break,
        }
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "no row twice: {seen:?}");
    for id in before.iter().filter(|id| id.as_str() != "sbx_024") {
        assert!(seen.iter().any(|s| s == id), "{id} missing from {seen:?}");
    }
    // Without a limit: every row in one answer, no cursor (as before pagination).
    let all = s
        .list_sandboxes(&query, &PageRequest::default())
        .await
        .expect("all");
    assert!(all.next.is_none());
    assert_eq!(all.items.len(), 24 + pages as usize);
}

#[tokio::test]
async fn listings_filter_by_state_and_metadata_in_the_query() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(&dir);
    let mut a = record("sbx_a", 1);
    a.metadata.insert("role".into(), "ci".into());
    s.insert_sandbox(&a).await.expect("a");
    let mut b = record("sbx_b", 2);
    b.state = SandboxState::Paused;
    b.tenant = Some(Tenant::new("other"));
    s.insert_sandbox(&b).await.expect("b");
    let ids = |q: SandboxQuery| {
        let s = &s;
        async move {
            s.list_sandboxes(&q, &PageRequest::default())
                .await
                .expect("list")
                .items
                .into_iter()
                .map(|r| r.id)
                .collect::<Vec<_>>()
        }
    };
    let q = |state, metadata: &[(&str, &str)]| SandboxQuery {
        scope: TenantScope::All,
        state,
        metadata: metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    assert_eq!(ids(q(None, &[])).await, ["sbx_a", "sbx_b"]);
    assert_eq!(ids(q(Some(SandboxState::Paused), &[])).await, ["sbx_b"]);
    assert_eq!(ids(q(None, &[("role", "ci")])).await, ["sbx_a"]);
    assert_eq!(ids(q(None, &[("tenant_id", "other")])).await, ["sbx_b"]);
    assert!(ids(q(None, &[("role", "cd")])).await.is_empty());
    let bad = PageRequest::new(Some(2), Some(Cursor::from_client("garbage")));
    let err = s
        .list_sandboxes(&q(None, &[]), &bad.expect("limit is fine"))
        .await;
    assert!(matches!(err, Err(CoreError::InvalidArgument(_))), "{err:?}");
    assert!(PageRequest::new(Some(0), None).is_err());
    assert!(PageRequest::new(Some(MAX_LIMIT_PLUS_ONE), None).is_err());
}

const MAX_LIMIT_PLUS_ONE: usize = crate::store::MAX_PAGE_LIMIT + 1;

/// `EXPLAIN QUERY PLAN` of `sql`: one line per step.
fn plan(s: &SqliteStore, sql: &str, params: &[Value]) -> Vec<String> {
    let conn = s.lock();
    let mut stmt = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .expect("explain");
    let rows = stmt
        .query_map(params_from_iter(params), |r| r.get::<_, String>(3))
        .expect("plan");
    rows.map(|r| r.expect("row")).collect()
}

/// Every table step of the plan searches by an index or the primary key: no `SCAN` of a
/// table (a scan of `json_each`'s virtual table is over one record's array, not the table).
fn assert_indexed(what: &str, steps: &[String]) {
    let table_steps: Vec<&String> = steps
        .iter()
        .filter(|s| !s.contains("json_each") && !s.contains("TEMP B-TREE"))
        .collect();
    assert!(!table_steps.is_empty(), "{what}: no plan: {steps:?}");
    for step in table_steps {
        assert!(
            step.starts_with("SEARCH")
                && (step.contains("USING INDEX")
                    || step.contains("USING PRIMARY KEY")
                    || step.contains("USING INTEGER PRIMARY KEY")
                    || step.contains("USING COVERING INDEX")),
            "{what} does not use an index: {steps:?}"
        );
    }
}

#[tokio::test]
async fn the_lookups_of_requests_and_of_the_reaper_use_an_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(&dir);
    for i in 0..50u32 {
        s.insert_sandbox(&record(&format!("sbx_{i}"), i))
            .await
            .expect("insert");
    }
    let text = |v: &str| Value::Text(v.to_string());
    let by_id = format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = ?1 AND state != 'pooled' AND tenant = ?2");
    assert_indexed(
        "a tenant's sandbox by id",
        &plan(&s, &by_id, &[text("sbx_1"), text("acme")]),
    );
    assert_indexed(
        "the reaper's expired rows",
        &plan(&s, EXPIRED_SQL, &[Value::Integer(5)]),
    );
    assert_indexed("idle hibernation's running rows", &plan(&s, IDLE_SQL, &[]));
    assert_indexed(
        "the users of a snapshot",
        &plan(&s, LAYER_SQL, &[text("snap_x")]),
    );
    let next = Some(encode_cursor("sandboxes", 10));
    for (what, scope) in [
        ("an admin's page", TenantScope::All),
        ("a tenant's page", acme()),
    ] {
        let query = SandboxQuery {
            scope,
            state: None,
            metadata: BTreeMap::new(),
        };
        let page = PageRequest::new(Some(100), next.clone()).expect("page");
        let (sql, params) = sandbox_page_sql(&query, &page).expect("sql");
        assert_indexed(what, &plan(&s, &sql, &params));
    }
    let page = PageRequest::new(Some(100), None).expect("page");
    let (sql, params) = snapshot_page_sql(&acme(), &page).expect("sql");
    assert_indexed("a tenant's snapshots", &plan(&s, &sql, &params));
    let (sql, params) = volume_page_sql(&acme(), &page).expect("sql");
    assert_indexed("a tenant's volumes", &plan(&s, &sql, &params));
    // The plan checker itself refuses a scan.
    let scan = plan(
        &s,
        "SELECT record FROM sandboxes WHERE json_extract(record, '$.cpus') = 1",
        &[],
    );
    assert!(
        std::panic::catch_unwind(|| assert_indexed("a scan", &scan)).is_err(),
        "{scan:?}"
    );
}

#[tokio::test]
async fn a_batch_of_refreshes_moves_times_only_later_and_skips_deleted_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(&dir);
    let mut kept = record("sbx_a", 16);
    kept.expires_at_ms = 1_000;
    kept.last_used_ms = 500;
    let mut persistent = record("sbx_b", 17);
    persistent.persistent = true;
    s.insert_sandbox(&kept).await.expect("insert");
    s.insert_sandbox(&persistent).await.expect("insert");
    let refresh = |expires, used| SandboxRefresh {
        expires_at_ms: Some(expires),
        last_used_ms: Some(used),
    };
    s.refresh_sandboxes(&[
        (sid("sbx_a"), refresh(5_000, 100)),
        (sid("sbx_b"), refresh(5_000, 900)),
        (sid("sbx_gone"), refresh(5_000, 900)),
    ])
    .await
    .expect("refresh");
    let a = s.get_sandbox(&sid("sbx_a")).await.expect("get").expect("a");
    // The expiry moved later, the older use did not move the idle clock back.
    assert_eq!((a.expires_at_ms, a.last_used_ms), (5_000, 500));
    let b = s.get_sandbox(&sid("sbx_b")).await.expect("get").expect("b");
    // A persistent sandbox has no expiry to move; its idle clock moves.
    assert_eq!((b.expires_at_ms, b.last_used_ms), (2, 900));
    // The reaper's column follows the record.
    let due = s.expired_sandboxes(4_999).await.expect("due");
    assert!(due.is_empty(), "{due:?}");
}

/// A version 4 database (before tenants and scoped keys): every tenant something names gets
/// a row, old admin keys become `admin` keys and tenant keys `full` ones, each with an id.
#[tokio::test]
async fn a_version_4_database_gets_tenants_and_scoped_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    {
        let conn = Connection::open(&path).expect("open raw");
        for step in &MIGRATIONS[..4] {
            conn.execute_batch(step).expect("old schema");
        }
        for (hash, tenant, admin) in [("h_admin", "admin", 1), ("h_beta", "beta", 0)] {
            conn.execute(
                "INSERT INTO api_keys (key_hash, tenant, admin, created_at_ms) VALUES (?1, ?2, ?3, 7)",
                params![hash, tenant, admin],
            )
            .expect("key row");
        }
        let json = serde_json::to_string(&record("sbx_old", 21)).expect("json");
        conn.execute(
            "INSERT INTO sandboxes (id, state, uid_slot, record, tenant) VALUES ('sbx_old', 'running', 21, ?1, 'acme')",
            [json],
        )
        .expect("sandbox row");
        conn.pragma_update(None, "user_version", 4)
            .expect("version");
    }
    let s = SqliteStore::open(&path).expect("migrate");
    let admin = s
        .key_by_secret_hash("h_admin")
        .await
        .expect("q")
        .expect("kept");
    assert_eq!(admin.scope, KeyScope::Admin);
    assert!(admin.id.starts_with("key_"), "{}", admin.id);
    let beta = s
        .key_by_secret_hash("h_beta")
        .await
        .expect("q")
        .expect("kept");
    assert_eq!((beta.scope, beta.tenant.as_str()), (KeyScope::Full, "beta"));
    assert_ne!(admin.id, beta.id);
    let names: Vec<String> = s
        .list_tenants(&PageRequest::default())
        .await
        .expect("tenants")
        .items
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names, ["acme", "beta"], "no tenant row for admin keys");
    let acme = s
        .get_tenant(&Tenant::new("acme"))
        .await
        .expect("q")
        .expect("row");
    assert_eq!(
        acme.settings,
        crate::tenant::settings::TenantSettings::default()
    );
    assert!(acme.created_at_ms > 1_600_000_000_000, "made now, in ms");
}

#[tokio::test]
async fn usage_rows_sum_by_group_and_window_and_meters_come_back() {
    use crate::store::usage::MeterReading;
    use crate::usage::{GroupBy, ResourceKind, UsageInterval, UsageQuery, UsageTotals};
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(&dir.path().join("state.db")).expect("open");
    let day = 86_400_000;
    let row = |id: &str, tenant: &str, key: Option<&str>, end_ms: i64, cpu: f64| UsageInterval {
        kind: ResourceKind::Sandbox,
        resource: id.into(),
        tenant: Some(Tenant::new(tenant)),
        key_id: key.map(|k| k.parse().expect("key id")),
        start_ms: end_ms - 1000,
        end_ms,
        usage: UsageTotals {
            cpu_seconds: cpu,
            memory_gib_seconds: 0.5,
            disk_gib_hours: 0.0,
            egress_bytes: 10,
        },
    };
    let k = "key_00000000000000000001";
    store
        .append_usage(
            &[
                row("sbx_a", "acme", Some(k), day + 5, 1.0),
                row("sbx_a", "acme", Some(k), 2 * day + 5, 2.0),
                row("sbx_b", "other", None, 2 * day + 6, 4.0),
            ],
            &[(
                sid("sbx_a"),
                Some(MeterReading {
                    cpu_ns: 9,
                    egress_bytes: 3,
                    at_ms: 7,
                }),
            )],
        )
        .await
        .expect("append");
    let q = |scope, group_by, from_ms, to_ms| UsageQuery {
        group_by,
        from_ms,
        to_ms,
        ..UsageQuery::since(scope, 0)
    };
    let all = store
        .usage_groups(&q(TenantScope::All, GroupBy::Nothing, None, None))
        .await
        .expect("sum");
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].usage.cpu_seconds, 7.0);
    assert_eq!(all[0].usage.egress_bytes, 30);
    assert_eq!(all[0].intervals, 3);
    let acme = store
        .usage_groups(&q(
            TenantScope::Only(Tenant::new("acme")),
            GroupBy::Day,
            None,
            None,
        ))
        .await
        .expect("by day");
    let days: Vec<(Option<&str>, f64)> = acme
        .iter()
        .map(|g| (g.key.as_deref(), g.usage.cpu_seconds))
        .collect();
    assert_eq!(days, [(Some("1970-01-02"), 1.0), (Some("1970-01-03"), 2.0)]);
    // The window is (from, to] on each interval's end.
    let window = store
        .usage_groups(&q(
            TenantScope::All,
            GroupBy::Tenant,
            Some(day + 5),
            Some(2 * day + 5),
        ))
        .await
        .expect("window");
    assert_eq!(window.len(), 1);
    assert_eq!(window[0].key.as_deref(), Some("acme"));
    assert_eq!(window[0].usage.cpu_seconds, 2.0);
    let by_key = store
        .usage_groups(&q(TenantScope::All, GroupBy::Key, None, None))
        .await
        .expect("by key");
    assert_eq!(by_key.len(), 2, "{by_key:?}");
    let by_sandbox = store
        .usage_groups(&q(TenantScope::All, GroupBy::Sandbox, None, None))
        .await
        .expect("by sandbox");
    assert_eq!(by_sandbox[0].kind, Some(ResourceKind::Sandbox));
    let none = store
        .usage_groups(&q(
            TenantScope::Only(Tenant::new("nobody")),
            GroupBy::Nothing,
            None,
            None,
        ))
        .await
        .expect("empty");
    assert!(none.is_empty());
    let meters = store.meter_readings().await.expect("meters");
    assert_eq!(meters[&sid("sbx_a")].cpu_ns, 9);
    store
        .append_usage(&[], &[(sid("sbx_a"), None)])
        .await
        .expect("forget");
    assert!(store.meter_readings().await.expect("meters").is_empty());
}
