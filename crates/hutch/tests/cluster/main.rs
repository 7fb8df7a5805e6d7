//! Cluster mode on one machine: a private PostgreSQL of the test's own and three real
//! `hutch serve --cluster` nodes on loopback, each with its own state directory
//! (`docs/cluster.md`). Heartbeats are 300 ms and leases 2.5 s so that failures are seen
//! within seconds.

mod e2b;
mod failures;
mod handoff;
mod placement;
mod routing;
mod tls;

use std::net::TcpListener;
use std::time::Duration;

use hutch_testkit::{PrivatePostgres, TestServer};
use reqwest::Method;
use serde_json::Value;

/// The secret the test's nodes share.
const NODE_SECRET: &str = "test-node-secret-0123456789";

/// Heartbeat and lease of the test's nodes, in milliseconds.
const HEARTBEAT_MS: u64 = 300;
const LEASE_MS: u64 = 2500;

/// A database and the nodes on it.
pub struct TestCluster {
    pub nodes: Vec<TestServer>,
    pub pg: PrivatePostgres,
    pub db_url: String,
    /// Each node's own templates directory, when not the shared one.
    _templates: Vec<tempfile::TempDir>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The flags of node `name` listening on `port` with room for `capacity` sandboxes.
fn node_args(db_url: &str, name: &str, port: u16, capacity: u64) -> Vec<String> {
    let addr = format!("127.0.0.1:{port}");
    [
        "--cluster",
        db_url,
        "--node-id",
        name,
        "--listen",
        &addr,
        "--advertise",
        &addr,
        "--preview-listen",
        "off",
        "--capacity-sandboxes",
        &capacity.to_string(),
        "--heartbeat-ms",
        &HEARTBEAT_MS.to_string(),
        "--lease-ms",
        &LEASE_MS.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

impl TestCluster {
    /// A database and one node per entry of `capacities` (`n1`, `n2`, …).
    pub async fn start(capacities: &[u64]) -> Self {
        Self::start_with(capacities, &[], &[]).await
    }

    /// [`TestCluster::start`], every node with the flags `extra` and the environment `env`
    /// too.
    pub async fn start_with(capacities: &[u64], extra: &[&str], env: &[(&str, &str)]) -> Self {
        let pg = PrivatePostgres::start();
        let db_url = pg.create_database("hutch");
        Self::start_on(pg, db_url, capacities, extra, env).await
    }

    /// Nodes on the database `db_url` of `pg`.
    pub async fn start_on(
        pg: PrivatePostgres,
        db_url: String,
        capacities: &[u64],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let mut nodes = Vec::new();
        let mut env = env.to_vec();
        env.push(("HUTCH_NODE_SECRET", NODE_SECRET));
        for (i, cap) in capacities.iter().enumerate() {
            let mut args = node_args(&db_url, &format!("n{}", i + 1), free_port(), *cap);
            if extra.contains(&"--preview-listen") {
                // The test's own preview listener instead of none.
                if let Some(at) = args.iter().position(|a| a == "--preview-listen") {
                    args.drain(at..at + 2);
                }
            }
            args.extend(extra.iter().map(|s| s.to_string()));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            nodes.push(TestServer::start_with_env(&args, &env).await);
        }
        Self {
            nodes,
            pg,
            db_url,
            _templates: Vec::new(),
        }
    }

    /// [`TestCluster::start`], each node with a templates directory of its own holding
    /// `minimal` only (as separate hosts have).
    pub async fn start_with_own_templates(capacities: &[u64]) -> Self {
        let pg = PrivatePostgres::start();
        let db_url = pg.create_database("hutch");
        let (mut nodes, mut templates) = (Vec::new(), Vec::new());
        for (i, cap) in capacities.iter().enumerate() {
            let dir = tempfile::tempdir().expect("a templates directory");
            hutch_testkit::private_templates(dir.path());
            let args = node_args(&db_url, &format!("n{}", i + 1), free_port(), *cap);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let env = [("HUTCH_NODE_SECRET", NODE_SECRET)];
            nodes.push(TestServer::start_in_with_env(dir.path().to_path_buf(), &args, &env).await);
            templates.push(dir);
        }
        Self {
            nodes,
            pg,
            db_url,
            _templates: templates,
        }
    }

    /// Make the next create land on node `name` by cordoning the others (then uncordon
    /// them); the new sandbox's id.
    pub async fn create_on(&self, name: &str) -> String {
        let others: Vec<String> = (1..=self.nodes.len())
            .map(|i| format!("n{i}"))
            .filter(|n| n != name)
            .collect();
        for n in &others {
            let (status, v) = self.nodes[0]
                .post(&format!("/v1/cluster/nodes/{n}/cordon"), Value::Null)
                .await;
            assert_eq!(status, 200, "{v}");
            assert_eq!(v["state"], "cordoned", "{v}");
        }
        let id = self.nodes[0].create_id(serde_json::json!({})).await;
        assert_eq!(self.owner(&id), name);
        for n in &others {
            let (status, v) = self.nodes[0]
                .post(&format!("/v1/cluster/nodes/{n}/uncordon"), Value::Null)
                .await;
            assert_eq!((status, v["state"].as_str()), (200, Some("ready")), "{v}");
        }
        id
    }

    /// `GET /v1/cluster/nodes` through node `i`.
    pub async fn node_list(&self, i: usize) -> Value {
        let (status, v) = self.nodes[i]
            .request(Method::GET, "/v1/cluster/nodes", None)
            .await;
        assert_eq!(status, 200, "{v}");
        v
    }

    /// Node `id`'s entry in the list through node `via`.
    pub async fn node(&self, via: usize, id: &str) -> Value {
        let v = self.node_list(via).await;
        v["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .find(|n| n["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no node {id} in {v}"))
    }

    /// The node that owns sandbox `id`, from the database.
    pub fn owner(&self, id: &str) -> String {
        self.pg.psql(
            "hutch",
            &format!("SELECT node_id FROM sandboxes WHERE id = '{id}'"),
        )
    }

    /// Index of node `name` (`n2` → 1).
    pub fn index(name: &str) -> usize {
        name.trim_start_matches('n')
            .parse::<usize>()
            .expect("node name")
            - 1
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        // Each node deletes the sandboxes (through routing: every node's), then stops; the
        // database goes last.
        while let Some(node) = self.nodes.pop() {
            drop(node);
        }
    }
}

/// How long to wait for the cluster to notice something (a few leases).
pub const NOTICE: Duration = Duration::from_secs(20);

/// Wait until `f` holds, at most [`NOTICE`]; panics naming `what` otherwise.
pub async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    hutch_testkit::wait_until(NOTICE, async || f().await.then_some(()))
        .await
        .unwrap_or_else(|| panic!("{what}: not within {NOTICE:?}"));
}
