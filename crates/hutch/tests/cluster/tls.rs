//! A node on a database that speaks TLS only: `--cluster …?sslmode=require` with
//! `--cluster-ca` registers, places, serves and routes as on plain TCP.

use hutch_testkit::{PrivatePostgres, TestCa};
use serde_json::json;

use crate::TestCluster;

#[tokio::test]
async fn nodes_work_on_a_database_that_speaks_tls_only() {
    let ca = TestCa::new();
    let pg = PrivatePostgres::start_with_tls(&ca);
    let url = format!("{}?sslmode=require", pg.create_database("hutch"));
    let ca_path = ca.root().display().to_string();
    let c = TestCluster::start_on(pg, url, &[2, 2], &["--cluster-ca", &ca_path], &[]).await;
    let nodes = c.node_list(0).await;
    assert_eq!(nodes["nodes"].as_array().map(Vec::len), Some(2), "{nodes}");
    let id = c.nodes[1].create_id(json!({})).await;
    // Through both nodes: one serves it, the other forwards.
    for node in &c.nodes {
        assert_eq!(node.sh_ok(&id, "echo over-tls").await, "over-tls\n");
    }
    // Every session the nodes hold is encrypted.
    let plain = c.pg.psql(
        "hutch",
        "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s ON s.pid = a.pid
          WHERE a.application_name = 'hutch' AND NOT s.ssl",
    );
    assert_eq!(plain, "0");
    let encrypted = c.pg.psql(
        "hutch",
        "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s ON s.pid = a.pid
          WHERE a.application_name = 'hutch' AND s.ssl",
    );
    assert!(
        encrypted.parse::<u32>().expect("a count") >= 2,
        "{encrypted}"
    );
}
