//! The schema of the state database and the migrations that bring older ones to it (see
//! the module docs of `store/sqlite.rs` for what each table holds).

/// The schema this binary reads and writes (`PRAGMA user_version`).
pub(super) const SCHEMA_VERSION: i64 = 7;

/// The statements that bring a database from version `i` to `i + 1`.
pub(super) const MIGRATIONS: [&str; 7] = [
    "CREATE TABLE IF NOT EXISTS sandboxes (
        id TEXT PRIMARY KEY,
        state TEXT NOT NULL,
        uid_slot INTEGER NOT NULL UNIQUE,
        record TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS api_keys (
        key_hash TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        admin INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL
    );",
    "CREATE TABLE IF NOT EXISTS snapshots (
        id TEXT PRIMARY KEY,
        record TEXT NOT NULL
    );",
    "CREATE TABLE IF NOT EXISTS volumes (
        id TEXT PRIMARY KEY,
        record TEXT NOT NULL
    );",
    // In an UPDATE every expression reads the row as it was, so `record` is still the old
    // JSON (with its `metadata.tenant_id`) in each `json_extract`.
    "ALTER TABLE sandboxes ADD COLUMN tenant TEXT;
    ALTER TABLE sandboxes ADD COLUMN expires_at_ms INTEGER;
    ALTER TABLE sandboxes ADD COLUMN idle_hibernate_seconds INTEGER;
    ALTER TABLE sandboxes ADD COLUMN layer TEXT;
    UPDATE sandboxes SET
        tenant = json_extract(record, '$.metadata.tenant_id'),
        expires_at_ms = CASE WHEN json_extract(record, '$.persistent')
            THEN NULL ELSE json_extract(record, '$.expires_at_ms') END,
        idle_hibernate_seconds = json_extract(record, '$.idle_hibernate_seconds'),
        layer = json_extract(record, '$.layer'),
        record = json_remove(record, '$.metadata.tenant_id');
    CREATE INDEX sandboxes_tenant ON sandboxes(tenant);
    CREATE INDEX sandboxes_expiry ON sandboxes(expires_at_ms);
    CREATE INDEX sandboxes_state ON sandboxes(state);
    CREATE INDEX sandboxes_layer ON sandboxes(layer);
    ALTER TABLE snapshots ADD COLUMN tenant TEXT;
    ALTER TABLE snapshots ADD COLUMN name TEXT;
    ALTER TABLE snapshots ADD COLUMN hidden INTEGER NOT NULL DEFAULT 0;
    UPDATE snapshots SET
        tenant = json_extract(record, '$.tenant_id'),
        name = json_extract(record, '$.name'),
        hidden = coalesce(json_extract(record, '$.hidden'), 0);
    CREATE INDEX snapshots_tenant ON snapshots(tenant);
    CREATE INDEX snapshots_name ON snapshots(name);
    ALTER TABLE volumes ADD COLUMN tenant TEXT;
    ALTER TABLE volumes ADD COLUMN name TEXT;
    UPDATE volumes SET
        tenant = json_extract(record, '$.tenant'),
        name = json_extract(record, '$.name');
    CREATE INDEX volumes_tenant_name ON volumes(tenant, name);
    CREATE INDEX volumes_name ON volumes(name);",
    // Tenants, scoped keys, the create log of hourly quotas and private templates. Every
    // tenant something already names gets a row with nothing set; existing keys keep
    // working (admin keys as `admin`, tenant keys as `full`).
    "ALTER TABLE api_keys ADD COLUMN id TEXT;
    ALTER TABLE api_keys ADD COLUMN scope TEXT NOT NULL DEFAULT 'full';
    ALTER TABLE api_keys ADD COLUMN name TEXT;
    ALTER TABLE api_keys ADD COLUMN selector TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE api_keys ADD COLUMN prefix TEXT NOT NULL DEFAULT '';
    ALTER TABLE api_keys ADD COLUMN expires_at_ms INTEGER;
    ALTER TABLE api_keys ADD COLUMN last_used_ms INTEGER;
    UPDATE api_keys SET id = 'key_' || lower(hex(randomblob(10))),
        scope = CASE WHEN admin THEN 'admin' ELSE 'full' END;
    CREATE UNIQUE INDEX api_keys_id ON api_keys(id);
    CREATE INDEX api_keys_tenant ON api_keys(tenant);
    CREATE TABLE tenants (
        name TEXT PRIMARY KEY,
        settings TEXT NOT NULL DEFAULT '{}',
        created_at_ms INTEGER NOT NULL
    );
    INSERT OR IGNORE INTO tenants (name, created_at_ms)
        SELECT t, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) FROM (
            SELECT tenant AS t FROM api_keys WHERE admin = 0
            UNION SELECT tenant FROM sandboxes
            UNION SELECT tenant FROM snapshots
            UNION SELECT tenant FROM volumes)
        WHERE t IS NOT NULL AND t != 'admin';
    CREATE TABLE tenant_creates (tenant TEXT NOT NULL, at_ms INTEGER NOT NULL);
    CREATE INDEX tenant_creates_at ON tenant_creates(tenant, at_ms);
    CREATE TABLE template_owners (name TEXT PRIMARY KEY, tenant TEXT NOT NULL);
    CREATE INDEX template_owners_tenant ON template_owners(tenant);",
    // The audit log (`crate::audit`).
    "CREATE TABLE audit_log (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at_ms INTEGER NOT NULL,
        key_id TEXT,
        tenant TEXT,
        method TEXT NOT NULL,
        route TEXT NOT NULL,
        path TEXT NOT NULL,
        sandbox TEXT,
        argv TEXT,
        status INTEGER NOT NULL
    );
    CREATE INDEX audit_tenant ON audit_log(tenant, id);
    CREATE INDEX audit_key ON audit_log(key_id, id);
    CREATE INDEX audit_sandbox ON audit_log(sandbox, id);",
    // Usage metering (`crate::usage`) and spending caps of keys.
    "CREATE TABLE usage_intervals (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        kind TEXT NOT NULL,
        resource TEXT NOT NULL,
        tenant TEXT,
        key_id TEXT,
        start_ms INTEGER NOT NULL,
        end_ms INTEGER NOT NULL,
        cpu_seconds REAL NOT NULL,
        memory_gib_seconds REAL NOT NULL,
        disk_gib_hours REAL NOT NULL,
        egress_bytes INTEGER NOT NULL
    );
    CREATE INDEX usage_end ON usage_intervals(end_ms);
    CREATE INDEX usage_tenant ON usage_intervals(tenant, end_ms);
    CREATE INDEX usage_key ON usage_intervals(key_id, end_ms);
    CREATE INDEX usage_resource ON usage_intervals(resource, end_ms);
    CREATE TABLE usage_meters (
        sandbox TEXT PRIMARY KEY,
        cpu_ns INTEGER NOT NULL,
        egress_bytes INTEGER NOT NULL,
        at_ms INTEGER NOT NULL
    );
    ALTER TABLE api_keys ADD COLUMN budget TEXT NOT NULL DEFAULT '{}';",
];
