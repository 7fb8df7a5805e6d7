//! The state store on PostgreSQL: the database every node of a cluster shares
//! (`docs/cluster.md`).
//!
//! - [`Db`]: a pool of connections (`deadpool-postgres` over `tokio-postgres`) and the
//!   versioned schema migrations, applied by the first node that starts under an advisory
//!   lock (`schema.rs`).
//! - [`NodeFence`]: which node this process is and the epoch (fencing token) it registered
//!   with; every write of a node's own rows is guarded by both, so a node the cluster has
//!   declared dead can no longer change anything.
//! - [`PostgresStore`]: Hutch's state store (`hutch_core::store::Store`) on that database:
//!   what each node owns, what every node sees, and how a node declared dead is kept from
//!   writing (`store.rs`). [`db_error`] is how a database failure reads as a core error.
//!
//! The cluster's membership, placement and routing (`hutch-cluster`) use the same [`Db`] and
//! its `nodes` and `placements` tables.

mod db;
mod fence;
pub mod schema;
mod store;
mod tls;

pub use db::{create_database, drop_database, Db, DbError, Listener};
pub use fence::NodeFence;
pub use store::{db_error, PostgresStore};
pub use tls::DbTls;
