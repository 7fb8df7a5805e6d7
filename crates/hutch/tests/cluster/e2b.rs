//! The E2B API in cluster mode: E2B's published Python SDK pointed at a node that has no
//! room creates a sandbox that lands on another node, uses it (commands, files, info,
//! timeout, listing) through the first node, and a third node connects to it, reads its
//! files and kills it.

use hutch_testkit::{e2b_python, e2b_scenario, ensure_template, TestServer};

use crate::TestCluster;

/// Run scenario `name` of `tests/e2b/scenarios.py` through `node`'s E2B listener; its
/// output.
fn scenario(node: &TestServer, name: &str, env: &[(&str, &str)]) -> String {
    let url = node.e2b_url.as_deref().expect("started with --e2b-listen");
    let env: Vec<(&str, &std::ffi::OsStr)> = env
        .iter()
        .map(|(k, v)| (*k, std::ffi::OsStr::new(*v)))
        .collect();
    e2b_scenario(&e2b_python(), url, &node.key, name, &env)
}

#[tokio::test]
async fn e2bs_sdk_works_through_nodes_that_do_not_run_the_sandbox() {
    if std::env::var_os("HUTCH_TEST_PYTHON").is_none() {
        eprintln!("skipped: HUTCH_TEST_PYTHON is unset (scripts/venv.sh installs e2b)");
        return;
    }
    ensure_template("base");
    // Only n2 has room: creates through n1 and n3 are placed there.
    let c = TestCluster::start_with(&[0, 4, 0], &["--e2b-listen", "127.0.0.1:0"], &[]).await;
    let made = scenario(&c.nodes[0], "cluster_create", &[]);
    let id = made
        .lines()
        .find_map(|l| l.strip_prefix("SANDBOX "))
        .expect("the scenario printed the sandbox's id")
        .trim()
        .to_string();
    assert_eq!(c.owner(&id), "n2", "placed on the node with room");
    scenario(&c.nodes[2], "cluster_finish", &[("SANDBOX_ID", &id)]);
    assert_eq!(c.owner(&id), "", "killed through n3: its row is gone");
}
