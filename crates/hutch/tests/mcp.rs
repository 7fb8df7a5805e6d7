//! `hutch mcp` driven by a real MCP client (the `mcp` package from PyPI) over stdio.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{hutch_bin, repo_root, wait_until, TestServer};
use reqwest::Method;

#[tokio::test]
async fn a_real_mcp_client_lists_tools_runs_commands_and_moves_files() {
    let s = TestServer::start().await;
    let script = repo_root().join("crates/hutch/tests/mcp/client.py");
    let out = tokio::task::spawn_blocking({
        let url = s.url.clone();
        let state = s.state_dir.clone();
        move || {
            // The tests' virtual environment (scripts/venv.sh, set by scripts/test.sh).
            let python = std::env::var_os("HUTCH_TEST_PYTHON").unwrap_or_else(|| "python3".into());
            Command::new(python)
                .arg(script)
                .env("HUTCH_BIN", hutch_bin())
                .env("HUTCH_URL", url)
                .env("HUTCH_STATE_DIR", state)
                .env_remove("HUTCH_API_KEY")
                .output()
                .expect("run python (HUTCH_TEST_PYTHON from scripts/venv.sh, with mcp)")
        }
    })
    .await
    .expect("join");
    assert!(
        out.status.success(),
        "MCP client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: serde_json::Value = serde_json::from_slice(
        out.stdout
            .split(|b| *b == b'\n')
            .rfind(|l| !l.is_empty())
            .expect("output"),
    )
    .expect("json");
    assert_eq!(seen["server_name"], "hutch");
    let tools: Vec<&str> = seen["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t.as_str())
        .collect();
    for t in [
        "create_sandbox",
        "fork_sandbox",
        "kill_sandbox",
        "list_files",
        "list_sandboxes",
        "read_file",
        "run_command",
        "run_python",
        "snapshot_sandbox",
        "write_file",
    ] {
        assert!(tools.contains(&t), "missing tool {t}: {tools:?}");
    }
    assert_eq!(seen["run_command"]["stdout"], "hello-42\n", "{seen}");
    assert_eq!(seen["run_command"]["stderr"], "err\n");
    assert_eq!(seen["run_command"]["exit_code"], 3);
    assert_eq!(
        seen["run_argv"]["stdout"], "$HOME;x\n",
        "argv must not go through a shell"
    );
    assert_eq!(seen["write_is_error"], false);
    assert_eq!(seen["read_file"], "from mcp\n");
    assert!(seen["list_names"]
        .as_array()
        .expect("names")
        .iter()
        .any(|n| n == "note.txt"));
    assert_eq!(seen["missing_is_error"], true, "{seen}");
    assert!(
        seen["missing_text"]
            .as_str()
            .unwrap_or("")
            .contains("not_found"),
        "{seen}"
    );
    let id = seen["sandbox_id"].as_str().expect("id").to_string();
    assert_eq!(seen["snapshot"]["name"], "mcp-snap", "{seen}");
    assert_eq!(
        seen["fork_children"].as_array().map(Vec::len),
        Some(2),
        "{seen}"
    );
    assert_eq!(
        seen["child_read"], "from mcp\n",
        "a fork carries the parent's files"
    );
    assert_eq!(seen["kill_is_error"], false);
    let mut listed: Vec<String> = seen["session_sandboxes"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|s| s.as_str().map(String::from))
        .collect();
    listed.sort();
    let mut expected = vec![
        id.clone(),
        seen["fork_children"][0]
            .as_str()
            .expect("child")
            .to_string(),
    ];
    expected.sort();
    assert_eq!(listed, expected, "the session lists its own live sandboxes");

    // The session ended: its ephemeral sandbox is gone.
    let gone = wait_until(Duration::from_secs(10), async || {
        let (status, _) = s.request(Method::GET, "/v1/sandboxes", None).await;
        let (_, v) = s.request(Method::GET, "/v1/sandboxes", None).await;
        (status == 200 && v["sandboxes"].as_array().is_some_and(|a| a.is_empty())).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the MCP session's sandbox outlived the session"
    );
}
