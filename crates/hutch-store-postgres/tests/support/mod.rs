//! What the store tests share: records to store, and the stores themselves: a
//! `SqliteStore` in a temporary directory, and `PostgresStore`s of registered nodes on a
//! PostgreSQL server of the test's own (`hutch_testkit::PrivatePostgres`, removed with it).

#![allow(dead_code)]

use std::sync::Arc;

use hutch_core::ids::SandboxId;
use hutch_core::model::{SandboxRecord, SandboxState};
use hutch_core::snapshot::SnapshotRecord;
use hutch_core::store::{SqliteStore, Store};
use hutch_core::tenant::keys::KeyRecord;
use hutch_core::tenant::settings::TenantRecord;
use hutch_core::tenant::Tenant;
use hutch_core::volume::VolumeRecord;
use hutch_store_postgres::{Db, NodeFence, PostgresStore};
use hutch_testkit::PrivatePostgres;

/// A sandbox id written in a test.
pub fn sid(id: &str) -> SandboxId {
    id.parse().expect("a well-formed sandbox id")
}

/// A running sandbox of tenant `acme` in uid slot `slot`.
pub fn record(id: &str, slot: u32) -> SandboxRecord {
    let json = serde_json::json!({
        "id": id, "template": "minimal", "isolation": "ns", "state": "running",
        "metadata": {}, "env": {"A": "1"}, "cpus": 1.0, "memory_mib": 256, "disk_mib": 1024,
        "pids_max": 128, "ttl_seconds": 300, "persistent": false, "created_at_ms": 1,
        "expires_at_ms": 2, "uid_slot": slot, "init_pid": 42, "init_start_time": 7,
        "cgroups": [], "last_used_ms": 0
    });
    let mut r: SandboxRecord = serde_json::from_value(json).expect("a sandbox record");
    r.tenant = Some(Tenant::new("acme"));
    r
}

/// A sandbox of `tenant` in `state` with `cpus` CPUs and 100 MiB.
pub fn sandbox_of(
    id: &str,
    slot: u32,
    tenant: &str,
    state: SandboxState,
    cpus: f64,
) -> SandboxRecord {
    let mut r = record(id, slot);
    r.tenant = Some(Tenant::new(tenant));
    r.state = state;
    r.cpus = cpus;
    r.memory_mib = 100;
    r
}

/// A snapshot named `name` of `tenant` (`None`: an admin's).
pub fn snapshot(id: &str, name: &str, tenant: Option<&str>, hidden: bool) -> SnapshotRecord {
    serde_json::from_value(serde_json::json!({
        "id": id, "name": name, "sandbox_id": "sbx_src", "kind": "filesystem",
        "isolation": "ns", "template": "minimal", "size_bytes": 1, "created_at_ms": 1,
        "tenant_id": tenant, "hidden": hidden,
        "defaults": {"cpus": 1.0, "memory_mib": 256, "disk_mib": 1024, "pids_max": 128, "env": {}}
    }))
    .expect("a snapshot record")
}

/// A volume named `name` of `tenant`.
pub fn volume(id: &str, name: &str, tenant: Option<&str>) -> VolumeRecord {
    VolumeRecord {
        id: id.parse().expect("a volume id"),
        name: name.into(),
        size_mib: 64,
        created_at_ms: 1,
        tenant: tenant.map(Tenant::new),
    }
}

/// A tenant with nothing set.
pub fn tenant(name: &str) -> TenantRecord {
    TenantRecord {
        name: Tenant::new(name),
        settings: Default::default(),
        created_at_ms: 1,
    }
}

/// An exec key of `tenant`.
pub fn key(id: &str, tenant: &str) -> KeyRecord {
    KeyRecord {
        id: id.parse().expect("key id"),
        tenant: Tenant::new(tenant),
        scope: hutch_core::tenant::keys::KeyScope::Exec,
        name: Some("ci".into()),
        selector: [("team".to_string(), "ml".to_string())].into(),
        prefix: "hk_x…".into(),
        created_at_ms: 2,
        expires_at_ms: Some(99),
        last_used_ms: None,
        budget: Default::default(),
    }
}

/// The ids of `records`, in their order.
pub fn ids(records: &[SandboxRecord]) -> Vec<String> {
    records.iter().map(|r| r.id.to_string()).collect()
}

/// A store under test and what it lives in (dropped with it).
pub enum Backend {
    /// SQLite in a temporary directory.
    Sqlite(SqliteStore, tempfile::TempDir),
    /// PostgreSQL: node `a`'s store on a server of the test's own.
    Postgres(PostgresStore, Cluster),
}

impl Backend {
    /// A fresh SQLite store.
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("state.db")).expect("open");
        Backend::Sqlite(store, dir)
    }

    /// A fresh PostgreSQL store of registered node `a`.
    pub async fn postgres() -> Self {
        let cluster = Cluster::start().await;
        let store = cluster.node("a").await;
        Backend::Postgres(store, cluster)
    }

    /// The store.
    pub fn store(&self) -> &dyn Store {
        match self {
            Backend::Sqlite(s, _) => s,
            Backend::Postgres(s, _) => s,
        }
    }
}

/// A PostgreSQL server with a migrated database `hutch`, on which nodes register.
pub struct Cluster {
    /// The server.
    pub pg: PrivatePostgres,
    /// The database's URL.
    pub url: String,
}

impl Cluster {
    /// Start a server and migrate its database.
    pub async fn start() -> Self {
        let pg = PrivatePostgres::start();
        let url = pg.create_database("hutch");
        Db::connect(&url, 1)
            .expect("pool")
            .migrate()
            .await
            .expect("migrate");
        Self { pg, url }
    }

    /// A pool of its database.
    pub fn db(&self) -> Db {
        Db::connect(&self.url, 8).expect("pool")
    }

    /// Register node `id` (its `nodes` row, `ready`, epoch 1) and make its store.
    pub async fn node(&self, id: &str) -> PostgresStore {
        self.sql(&format!(
            "INSERT INTO nodes (id, advertise, epoch, state, role, capacity, profile,
                lease_ms) VALUES ('{id}', '127.0.0.1:1', 1, 'ready', 'all', '{{}}', '{{}}', 10000)"
        ));
        let fence = Arc::new(NodeFence::new(id));
        fence.set_epoch(1);
        PostgresStore::new(self.db(), fence)
    }

    /// Run one statement with psql; what it printed.
    pub fn sql(&self, sql: &str) -> String {
        self.pg.psql("hutch", sql)
    }
}
