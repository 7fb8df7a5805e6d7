//! The cluster database's schema: migration `i` brings version `i` to `i + 1`
//! (`hutch_schema` records each one applied). Never edit a migration that has shipped; add
//! one.

/// The migrations, oldest first.
pub const MIGRATIONS: &[&str] = &[
    // Membership (`hutch-cluster`). A node's row is upserted at every start with a new epoch
    // (its fencing token) and heartbeated by the database clock; the reaper marks a node
    // whose heartbeat is older than its lease `dead` and bumps its epoch.
    "CREATE TABLE nodes (
        id TEXT PRIMARY KEY,
        advertise TEXT NOT NULL,
        epoch BIGINT NOT NULL,
        state TEXT NOT NULL,
        role TEXT NOT NULL,
        capacity JSONB NOT NULL,
        profile JSONB NOT NULL,
        lease_ms BIGINT NOT NULL,
        registered_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    -- Creates placed on a node and not finished: counted against the node's capacity and
    -- the tenant's quotas until the node's own row for the sandbox is written.
    CREATE TABLE placements (
        id BIGSERIAL PRIMARY KEY,
        sandbox TEXT NOT NULL UNIQUE,
        node_id TEXT NOT NULL REFERENCES nodes(id),
        tenant TEXT,
        cpus DOUBLE PRECISION NOT NULL,
        memory_mib BIGINT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL
    );
    CREATE INDEX placements_node ON placements(node_id);
    CREATE INDEX placements_tenant ON placements(tenant);",
    // The state store (`store.rs`): the tables of `SqliteStore` with a `node_id` on the rows
    // whose files live on one node, a `seq` (insertion order: listings and their cursors)
    // on every listed table, records as JSONB and the columns copied out of them to index.
    "CREATE TABLE sandboxes (
        id TEXT PRIMARY KEY,
        seq BIGSERIAL NOT NULL UNIQUE,
        node_id TEXT NOT NULL,
        state TEXT NOT NULL,
        uid_slot BIGINT NOT NULL,
        record JSONB NOT NULL,
        tenant TEXT,
        expires_at_ms BIGINT,
        idle_hibernate_seconds BIGINT,
        layer TEXT,
        UNIQUE (node_id, uid_slot)
    );
    CREATE INDEX sandboxes_node ON sandboxes(node_id, seq);
    CREATE INDEX sandboxes_node_state ON sandboxes(node_id, state);
    CREATE INDEX sandboxes_node_expiry ON sandboxes(node_id, expires_at_ms);
    CREATE INDEX sandboxes_tenant ON sandboxes(tenant, seq);
    CREATE INDEX sandboxes_layer ON sandboxes(layer);
    CREATE TABLE snapshots (
        id TEXT PRIMARY KEY,
        seq BIGSERIAL NOT NULL UNIQUE,
        node_id TEXT NOT NULL,
        record JSONB NOT NULL,
        tenant TEXT,
        name TEXT NOT NULL,
        hidden BOOLEAN NOT NULL
    );
    CREATE INDEX snapshots_node ON snapshots(node_id, seq);
    CREATE INDEX snapshots_tenant ON snapshots(tenant, seq);
    CREATE INDEX snapshots_name ON snapshots(name);
    CREATE TABLE volumes (
        id TEXT PRIMARY KEY,
        seq BIGSERIAL NOT NULL UNIQUE,
        node_id TEXT NOT NULL,
        record JSONB NOT NULL,
        tenant TEXT,
        name TEXT NOT NULL
    );
    CREATE INDEX volumes_node ON volumes(node_id, seq);
    CREATE INDEX volumes_tenant ON volumes(tenant, seq);
    CREATE INDEX volumes_name ON volumes(name, tenant);
    CREATE TABLE tenants (
        name TEXT PRIMARY KEY,
        seq BIGSERIAL NOT NULL UNIQUE,
        settings JSONB NOT NULL,
        created_at_ms BIGINT NOT NULL
    );
    CREATE TABLE api_keys (
        key_hash TEXT PRIMARY KEY,
        seq BIGSERIAL NOT NULL UNIQUE,
        id TEXT NOT NULL UNIQUE,
        tenant TEXT NOT NULL,
        scope TEXT NOT NULL,
        name TEXT,
        selector JSONB NOT NULL,
        prefix TEXT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        expires_at_ms BIGINT,
        last_used_ms BIGINT,
        budget JSONB NOT NULL
    );
    CREATE INDEX api_keys_tenant ON api_keys(tenant, seq);
    CREATE TABLE tenant_creates (tenant TEXT NOT NULL, at_ms BIGINT NOT NULL);
    CREATE INDEX tenant_creates_at ON tenant_creates(tenant, at_ms);
    CREATE TABLE template_owners (name TEXT PRIMARY KEY, tenant TEXT NOT NULL);
    CREATE INDEX template_owners_tenant ON template_owners(tenant);
    CREATE TABLE audit_log (
        id BIGSERIAL PRIMARY KEY,
        at_ms BIGINT NOT NULL,
        key_id TEXT,
        tenant TEXT,
        method TEXT NOT NULL,
        route TEXT NOT NULL,
        path TEXT NOT NULL,
        sandbox TEXT,
        argv JSONB,
        status INTEGER NOT NULL
    );
    CREATE INDEX audit_tenant ON audit_log(tenant, id);
    CREATE INDEX audit_key ON audit_log(key_id, id);
    CREATE INDEX audit_sandbox ON audit_log(sandbox, id);
    CREATE TABLE usage_intervals (
        id BIGSERIAL PRIMARY KEY,
        kind TEXT NOT NULL,
        resource TEXT NOT NULL,
        tenant TEXT,
        key_id TEXT,
        start_ms BIGINT NOT NULL,
        end_ms BIGINT NOT NULL,
        cpu_seconds DOUBLE PRECISION NOT NULL,
        memory_gib_seconds DOUBLE PRECISION NOT NULL,
        disk_gib_hours DOUBLE PRECISION NOT NULL,
        egress_bytes BIGINT NOT NULL
    );
    CREATE INDEX usage_end ON usage_intervals(end_ms);
    CREATE INDEX usage_tenant ON usage_intervals(tenant, end_ms);
    CREATE INDEX usage_key ON usage_intervals(key_id, end_ms);
    CREATE INDEX usage_resource ON usage_intervals(resource, end_ms);
    CREATE TABLE usage_meters (
        sandbox TEXT PRIMARY KEY,
        node_id TEXT NOT NULL,
        cpu_ns BIGINT NOT NULL,
        egress_bytes BIGINT NOT NULL,
        at_ms BIGINT NOT NULL
    );
    CREATE INDEX usage_meters_node ON usage_meters(node_id);",
    // 3: the templates each node holds ready, written by its heartbeat, for placement to
    // prefer a node that has the template a create names.
    "ALTER TABLE nodes ADD COLUMN templates TEXT[] NOT NULL DEFAULT '{}'",
];
