//! [`ClusterConfig`]: what `hutch serve --cluster …` tells this node about itself and the
//! cluster, checked once.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ClusterError;

/// What a node does in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeRole {
    /// Serves the API and runs sandboxes.
    All,
    /// Serves the API only: never placed on, forwards every sandbox call.
    Api,
}

impl NodeRole {
    /// The wire name (`all`, `api`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::Api => "api",
        }
    }

    /// Parse a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::All, Self::Api].into_iter().find(|r| r.as_str() == s)
    }
}

/// What a node offers sandboxes: placement never puts more on it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NodeCapacity {
    /// Sandboxes holding processes (starting, running, paused) at once.
    pub sandboxes: u64,
    /// Memory their limits may add up to, in MiB.
    pub memory_mib: u64,
}

/// This node's settings in cluster mode.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The cluster database (`postgres://…`).
    pub database_url: String,
    /// This node's id: lowercase letters, digits and `-`, at most 63.
    pub node_id: String,
    /// `host:port` where the other nodes reach this node's API.
    pub advertise: String,
    /// What this node does.
    pub role: NodeRole,
    /// The credential nodes send each other (every node has the same one): a forwarded call
    /// carries it, and only a call that carries it is served without routing again.
    pub node_secret: String,
    /// How often this node writes its heartbeat.
    pub heartbeat: Duration,
    /// How long after its last heartbeat (by the database's clock) a node is declared dead.
    pub lease: Duration,
    /// What this node offers.
    pub capacity: NodeCapacity,
    /// How long a placement holds its reservation while the create runs on the node.
    pub placement_hold: Duration,
    /// The object store hibernated sandboxes are saved in for other nodes to wake them
    /// (`s3://…` or `file:///…`, `docs/object-store.md`); `None`: they wake only where they
    /// hibernated.
    pub object_store: Option<String>,
    /// PEM roots the database's certificate is verified against when its URL asks for TLS
    /// (`sslmode=require`); `None`: the system's.
    pub database_ca: Option<std::path::PathBuf>,
}

impl ClusterConfig {
    /// The defaults of everything but the database, the id, the address and the secret:
    /// a heartbeat every 2 s, a 10 s lease.
    pub fn new(
        database_url: impl Into<String>,
        node_id: impl Into<String>,
        advertise: impl Into<String>,
        node_secret: impl Into<String>,
        capacity: NodeCapacity,
    ) -> Self {
        Self {
            database_url: database_url.into(),
            node_id: node_id.into(),
            advertise: advertise.into(),
            role: NodeRole::All,
            node_secret: node_secret.into(),
            heartbeat: Duration::from_secs(2),
            lease: Duration::from_secs(10),
            capacity,
            placement_hold: Duration::from_secs(600),
            object_store: None,
            database_ca: None,
        }
    }

    /// Check every field (the messages name the flag to fix).
    pub fn validate(&self) -> Result<(), ClusterError> {
        let id = &self.node_id;
        let id_ok = !id.is_empty()
            && id.len() <= 63
            && id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !id.starts_with('-');
        if !id_ok {
            return Err(ClusterError::Config(format!(
                "--node-id {id:?}: use 1 to 63 lowercase letters, digits and '-', not starting with '-'"
            )));
        }
        let advertise_ok = self.advertise.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !advertise_ok {
            return Err(ClusterError::Config(format!(
                "--advertise {:?}: give the host:port the other nodes reach this node's API at",
                self.advertise
            )));
        }
        if let Some(url) = &self.object_store {
            hutch_object_store::Location::parse(url)
                .map_err(|e| ClusterError::Config(format!("--object-store: {e}")))?;
        }
        if self.node_secret.len() < 16 {
            return Err(ClusterError::Config(
                "--node-secret: at least 16 characters, the same on every node".into(),
            ));
        }
        if self.heartbeat.is_zero() || self.lease < self.heartbeat * 2 {
            return Err(ClusterError::Config(format!(
                "the lease ({:?}) must be at least two heartbeats ({:?})",
                self.lease, self.heartbeat
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ClusterConfig {
        ClusterConfig::new(
            "postgres://h@127.0.0.1/db",
            "n1",
            "10.0.0.1:7700",
            "0123456789abcdef",
            NodeCapacity {
                sandboxes: 10,
                memory_mib: 4096,
            },
        )
    }

    #[test]
    fn a_good_config_passes_and_each_bad_field_is_named() {
        config().validate().expect("valid");
        let mut c = config();
        c.node_id = "N_1".into();
        assert!(c
            .validate()
            .expect_err("bad id")
            .to_string()
            .contains("--node-id"));
        let mut c = config();
        c.advertise = "10.0.0.1".into();
        assert!(c
            .validate()
            .expect_err("no port")
            .to_string()
            .contains("--advertise"));
        let mut c = config();
        c.node_secret = "short".into();
        assert!(c
            .validate()
            .expect_err("short")
            .to_string()
            .contains("--node-secret"));
        let mut c = config();
        c.lease = c.heartbeat;
        assert!(c
            .validate()
            .expect_err("lease")
            .to_string()
            .contains("lease"));
    }

    #[test]
    fn roles_round_trip() {
        for r in [NodeRole::All, NodeRole::Api] {
            assert_eq!(NodeRole::parse(r.as_str()), Some(r));
        }
        assert_eq!(NodeRole::parse("worker"), None);
    }
}
