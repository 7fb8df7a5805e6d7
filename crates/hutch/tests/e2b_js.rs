//! E2B's published JavaScript SDKs (`e2b`, `@e2b/code-interpreter` from npm, installed
//! unmodified by scripts/e2b-js.sh) against Hutch's E2B-compatible API.

use std::process::Command;

use hutch_testkit::{ensure_template, repo_root, TestServer};

#[tokio::test]
async fn e2b_js_sdk_creates_runs_commands_moves_files_and_runs_code() {
    ensure_template("base");
    ensure_template("code-interpreter");
    let s = TestServer::start_with(&["--e2b-listen", "127.0.0.1:0"]).await;
    let url = s.e2b_url.as_deref().expect("started with --e2b-listen");
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
        .env("E2B_API_KEY", &s.key)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .output()
        .expect("run node");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("ok"),
        "the JS scenario failed:\n{text}"
    );
}
