//! E2B's published JavaScript SDKs (`e2b`, `@e2b/code-interpreter` from npm, installed
//! unmodified by scripts/e2b-js.sh) against Hutch's E2B-compatible API, in plaintext and
//! over TLS served by Hutch (the CA in `NODE_EXTRA_CA_CERTS`).

use std::path::Path;
use std::process::Command;

use hutch_testkit::{ensure_template, repo_root, TestCa, TestServer};

/// Run `scenario.mjs` against `server`'s E2B listener with `env` added, and fail with its
/// output unless it passes.
fn run_scenario(server: &TestServer, env: &[(&str, &Path)]) {
    let url = server
        .e2b_url
        .as_deref()
        .expect("started with --e2b-listen");
    let dir = repo_root().join("crates/hutch/tests/e2b/js");
    assert!(
        dir.join("node_modules/e2b").is_dir(),
        "the e2b npm packages are missing: run scripts/e2b-js.sh"
    );
    let out = Command::new("node")
        .arg("scenario.mjs")
        .current_dir(&dir)
        .env("E2B_API_URL", url)
        .env("E2B_SANDBOX_URL", url)
        .env("E2B_API_KEY", &server.key)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .envs(env.iter().copied())
        .output()
        .expect("run node");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("ok"),
        "the JS scenario failed against {url}:\n{text}"
    );
}

#[tokio::test]
async fn e2b_js_sdk_creates_runs_commands_moves_files_and_runs_code() {
    ensure_template("base");
    ensure_template("code-interpreter");
    let s = TestServer::start_with(&["--e2b-listen", "127.0.0.1:0"]).await;
    run_scenario(&s, &[]);
}

#[tokio::test]
async fn e2b_js_sdk_works_over_tls() {
    ensure_template("base");
    ensure_template("code-interpreter");
    let ca = TestCa::new();
    let s = TestServer::start_with_tls(&ca, &["--e2b-listen", "127.0.0.1:0"]).await;
    assert!(s
        .e2b_url
        .as_deref()
        .is_some_and(|u| u.starts_with("https://")));
    run_scenario(&s, &[("NODE_EXTRA_CA_CERTS", &ca.root())]);
}
