//! [`ClusterError`]: what cluster mode's membership, placement and routing fail with.

use hutch_store_postgres::DbError;

/// A failure of cluster mode.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A setting is wrong (the message names the flag).
    #[error("cluster configuration: {0}")]
    Config(String),
    /// The cluster database failed or could not be reached.
    #[error(transparent)]
    Db(#[from] DbError),
    /// This node was declared dead: its epoch is no longer the cluster's.
    #[error("node {node} (epoch {epoch}) was declared dead by the cluster")]
    Fenced {
        /// The node.
        node: String,
        /// The epoch it held.
        epoch: i64,
    },
    /// The object store could not be opened or its upload queue set up.
    #[error("object store: {0}")]
    ObjectStore(String),
    /// The manager's store refused (a tenant's quota, among others).
    #[error(transparent)]
    Core(#[from] hutch_core::CoreError),
    /// No node that runs sandboxes has room for the create.
    #[error("no node has room for this sandbox ({0})")]
    NoCapacity(String),
    /// A node to forward to did not answer.
    #[error("node {node} at {addr} did not answer: {source}")]
    Peer {
        /// The node.
        node: String,
        /// Its address.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A node to forward to broke HTTP.
    #[error("node {node} at {addr}: {source}")]
    PeerHttp {
        /// The node.
        node: String,
        /// Its address.
        addr: String,
        /// Why.
        #[source]
        source: hyper::Error,
    },
}

impl From<tokio_postgres::Error> for ClusterError {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Db(DbError::Query(e))
    }
}

impl ClusterError {
    /// Whether the database could not be reached.
    pub fn is_db_unreachable(&self) -> bool {
        matches!(self, Self::Db(e) if e.is_unreachable())
    }
}
