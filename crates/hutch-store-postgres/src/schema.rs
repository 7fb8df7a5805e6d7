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
];
