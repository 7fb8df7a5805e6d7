//! E2B's published Python SDKs (`e2b`, `e2b-code-interpreter`, installed unmodified by
//! scripts/venv.sh) against Hutch's E2B-compatible API (`hutch serve --e2b-listen`): one
//! scenario of `tests/e2b/scenarios.py` per test, each on a server of its own.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use hutch_testkit::{
    e2b_python, e2b_scenario, ensure_template, skip_without_vm, TestCa, TestServer,
};
use serde_json::json;

/// Run scenario `name` with the SDK pointed at `server`'s E2B listener, as a user would
/// (only environment variables), and fail with its output unless it passes.
fn scenario(server: &TestServer, name: &str) {
    scenario_with(server, name, &test_python());
}

/// The Python with the SDKs (`HUTCH_TEST_PYTHON`, from scripts/venv.sh).
fn test_python() -> PathBuf {
    e2b_python()
}

/// [`scenario`] with the SDK of the Python at `python`.
fn scenario_with(server: &TestServer, name: &str, python: &Path) {
    scenario_env(server, name, python, &[]);
}

/// [`scenario_with`] with more environment variables (which win over the defaults, e.g.
/// another `E2B_API_KEY`).
fn scenario_env(server: &TestServer, name: &str, python: &Path, env: &[(&str, &OsStr)]) {
    let url = server
        .e2b_url
        .as_deref()
        .expect("the server was started with --e2b-listen");
    e2b_scenario(python, url, &server.key, name, env);
}

async fn server() -> TestServer {
    ensure_template("base");
    TestServer::start_with(&["--e2b-listen", "127.0.0.1:0"]).await
}

#[tokio::test]
async fn e2b_sdk_creates_with_metadata_and_envs_and_runs_commands() {
    let s = server().await;
    scenario(&s, "commands");
}

#[tokio::test]
async fn e2b_sdk_reads_writes_lists_moves_and_signs_files() {
    let s = server().await;
    scenario(&s, "files");
}

#[tokio::test]
async fn e2b_sdk_drives_a_terminal() {
    let s = server().await;
    scenario(&s, "pty");
}

#[tokio::test]
async fn e2b_sdk_pauses_connects_times_out_and_kills() {
    let s = server().await;
    scenario(&s, "lifecycle");
}

#[tokio::test]
async fn e2b_sdk_lists_by_metadata_and_state_across_pages() {
    let s = server().await;
    scenario(&s, "listing");
}

#[tokio::test]
async fn e2b_sdk_forks_and_creates_from_a_snapshot() {
    let s = server().await;
    scenario(&s, "fork_and_snapshots");
}

#[tokio::test]
async fn e2b_sdk_get_host_reaches_a_service_in_the_sandbox() {
    let s = server().await;
    scenario(&s, "host");
}

#[tokio::test]
async fn e2b_code_interpreter_keeps_state_and_returns_a_png_chart() {
    ensure_template("code-interpreter");
    let s = server().await;
    scenario(&s, "code_interpreter");
}

#[tokio::test]
async fn e2b_api_refuses_wrong_tokens_and_keys_and_names_gone_sandboxes() {
    let s = server().await;
    scenario(&s, "refused");
}

#[tokio::test]
async fn the_oldest_supported_e2b_sdk_creates_runs_commands_and_moves_files() {
    // scripts/venv.sh makes it beside the tests' own environment: `<venv>-e2b-oldest`.
    let python = std::env::var_os("HUTCH_TEST_PYTHON").map(PathBuf::from);
    let oldest = python
        .as_deref()
        .and_then(|p| p.parent()?.parent())
        .map(|venv| PathBuf::from(format!("{}-e2b-oldest/bin/python", venv.display())))
        .filter(|p| p.exists())
        .expect("the oldest e2b's environment (scripts/venv.sh makes <venv>-e2b-oldest)");
    let s = server().await;
    scenario_with(&s, "basics", &oldest);
}

#[tokio::test]
async fn e2b_sdk_basics() {
    let s = server().await;
    scenario(&s, "basics");
}

#[tokio::test]
async fn e2b_template_builder_builds_a_hutch_template_from_steps_and_files() {
    let s = server().await;
    scenario(&s, "template_build");
}

#[tokio::test]
async fn e2b_sdk_watches_directories_by_polling_and_streaming() {
    let s = server().await;
    scenario(&s, "watch");
}

#[tokio::test]
async fn e2b_api_speaks_http2_with_prior_knowledge_too() {
    let s = server().await;
    scenario(&s, "h2c");
}

#[tokio::test]
async fn e2b_sdk_speaks_http2_by_alpn_over_tls() {
    ensure_template("base");
    ensure_template("code-interpreter");
    let ca = TestCa::new();
    let s = TestServer::start_with_tls(&ca, &["--e2b-listen", "127.0.0.1:0"]).await;
    // The SDK's transport trusts the system's roots, which SSL_CERT_FILE replaces.
    let root = ca.root();
    scenario_env(
        &s,
        "tls",
        &test_python(),
        &[("SSL_CERT_FILE", root.as_os_str())],
    );
}

#[tokio::test]
async fn e2b_sdk_pauses_a_vm_sandbox_and_connect_finds_its_processes_running() {
    if skip_without_vm("e2b_sdk_pauses_a_vm_sandbox_and_connect_finds_its_processes_running") {
        return;
    }
    let s = server().await;
    // E2B's create names no isolation: the key's tenant makes its sandboxes vm.
    s.tenant("vm-team", json!({"defaults": {"isolation": "vm"}}))
        .await;
    let key = s
        .key_with(json!({"tenant": "vm-team", "scope": "full", "format": "e2b"}))
        .await;
    scenario_env(
        &s,
        "vm_pause",
        &test_python(),
        &[
            ("E2B_API_KEY", key.as_ref()),
            ("HUTCH_URL", s.url.as_ref()),
            ("HUTCH_ADMIN_KEY", s.key.as_ref()),
        ],
    );
}
