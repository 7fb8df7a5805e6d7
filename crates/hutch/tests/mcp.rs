//! `hutch mcp` driven by a real MCP client (the `mcp` package from PyPI) over stdio and
//! Streamable HTTP, with the OpenAI Agents SDK's strict-schema conversion run on its tools.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use hutch_testkit::{hutch_bin, repo_root, wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// Run `tests/mcp/client.py ARGS` against `s` and return the JSON it printed.
async fn client(s: &TestServer, args: &[&str]) -> Value {
    let script = repo_root().join("crates/hutch/tests/mcp/client.py");
    let url = s.url.clone();
    let state = s.state_dir.clone();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || run_client(&script, &url, &state, &args))
        .await
        .expect("join");
    assert!(
        out.status.success(),
        "MCP client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(
        out.stdout
            .split(|b| *b == b'\n')
            .rfind(|l| !l.is_empty())
            .expect("output"),
    )
    .expect("json")
}

fn run_client(
    script: &std::path::Path,
    url: &str,
    state: &std::path::Path,
    args: &[String],
) -> std::process::Output {
    // The tests' virtual environment (scripts/venv.sh, set by scripts/test.sh).
    let python = std::env::var_os("HUTCH_TEST_PYTHON").unwrap_or_else(|| "python3".into());
    Command::new(python)
        .arg(script)
        .args(args)
        .env("HUTCH_BIN", hutch_bin())
        .env("HUTCH_URL", url)
        .env("HUTCH_STATE_DIR", state)
        .env_remove("HUTCH_API_KEY")
        .output()
        .expect("run python (HUTCH_TEST_PYTHON from scripts/venv.sh, with mcp and openai-agents)")
}

#[tokio::test]
async fn a_real_mcp_client_lists_tools_runs_commands_and_moves_files() {
    let s = TestServer::start().await;
    let seen = client(&s, &["stdio"]).await;
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
        "run_code",
        "snapshot_sandbox",
        "write_file",
    ] {
        assert!(tools.contains(&t), "missing tool {t}: {tools:?}");
    }
    // Item 3: every schema passes the Agents SDK's strict conversion, and unchanged (so a
    // strict model sees our schema, with every optional field nullable).
    assert_eq!(seen["strict_failures"], json!({}), "{seen}");
    assert_eq!(seen["strict_changed"], json!([]), "{seen}");
    assert_eq!(
        seen["create_is_error"], false,
        "a create with every optional field null, as a strict model sends it: {seen}"
    );
    assert_eq!(seen["env_stdout"], "bar baz\n", "env as name/value pairs");

    // Item 1: the model gets the operator's policy, `deny` by default, and no wider. This
    // server gives sandboxes no network, so the default falls back to the narrower `none`.
    assert!(
        seen["create_description"].as_str().is_some_and(
            |d| d.contains("egress deny: only these destinations are reachable: nothing")
        ),
        "{seen}"
    );
    assert_eq!(seen["wider_is_error"], true, "{seen}");
    assert!(
        seen["wider_text"]
            .as_str()
            .is_some_and(|t| t.contains("at most egress \"deny\"")),
        "{seen}"
    );
    assert_eq!(seen["network"]["egress"], "none", "{seen}");

    // Item 2: 14.9 MB of `seq` comes back as about 20 KB, head and tail kept, the cut marked
    // with its byte counts and the file in the sandbox holding all of it.
    let big_len = seen["big_len"].as_u64().expect("len");
    assert!(big_len <= 20_000, "{big_len} bytes returned");
    assert_eq!(seen["big_exit"], 0);
    assert!(
        seen["big_head"]
            .as_str()
            .is_some_and(|h| h.starts_with("1\n2\n3\n")),
        "{seen}"
    );
    assert!(
        seen["big_tail"]
            .as_str()
            .is_some_and(|t| t.ends_with("1999999\n2000000\n")),
        "{seen}"
    );
    let marker = seen["big_marker"].as_str().expect("marker");
    let total = seen["seq_bytes"].as_u64().expect("bytes");
    assert!(
        marker.contains(&format!("of {total} bytes of stdout")),
        "{marker}"
    );
    assert!(marker.contains("/tmp/hutch-mcp/1.stdout"), "{marker}");
    assert_eq!(
        seen["saved_size"], total,
        "the saved file holds the whole stdout"
    );
    assert_eq!(
        seen["range_matches"], true,
        "read_file offset/length reads the cut part"
    );
    assert!(
        seen["read_big_len"].as_u64().expect("len") <= 20_000,
        "{seen}"
    );
    assert_eq!(
        seen["read_big_marker"], true,
        "read_file cuts a big file too"
    );

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

/// Item 1 on a server that gives sandboxes a network: a model's sandboxes get `deny` with
/// the operator's allow list, from `create_sandbox` and from a `run_command` that makes its
/// own sandbox, and cannot widen it. The server runs in a network namespace of this test's
/// own with nothing but loopback, so no packet can leave it.
#[test]
fn the_models_sandboxes_get_the_operators_deny_policy_on_a_networked_server() {
    let ns = format!("hzmcp{:08x}", std::process::id());
    let ip = |args: &[&str]| {
        let st = Command::new("ip").args(args).status().expect("ip");
        assert!(st.success(), "ip {args:?}");
    };
    ip(&["netns", "add", &ns]);
    ip(&["-n", &ns, "link", "set", "lo", "up"]);
    let path = format!("/run/netns/{ns}");
    let result = std::thread::spawn(move || {
        let f = std::fs::File::open(&path).expect("open netns");
        // SAFETY: setns on an open namespace descriptor; it moves this thread only.
        let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&f), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let s = TestServer::start_with(&["--network", "on"]).await;
            client(&s, &["network", "--allow", "pypi.org"]).await
        })
    })
    .join();
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    let seen = result.unwrap_or_else(|p| std::panic::resume_unwind(p));
    let policy = |n: &Value| (n["egress"].clone(), n["allow"].clone());
    let expected = (json!("deny"), json!(["pypi.org"]));
    assert_eq!(
        policy(&seen["auto_network"]),
        expected,
        "run_command's own sandbox: {seen}"
    );
    assert_eq!(policy(&seen["created"]["network"]), expected, "{seen}");
    assert_eq!(
        seen["narrowed"]["egress"], "none",
        "a model may narrow: {seen}"
    );
    assert_eq!(seen["foreign_allow_is_error"], true, "{seen}");
    assert!(
        seen["foreign_allow_text"]
            .as_str()
            .is_some_and(|t| t.contains("evil.test") && t.contains("--allow")),
        "{seen}"
    );
}

/// Item 4: `hutch mcp --http` answers 401 without a valid Hutch key, serves a whole session
/// to the `mcp` package's Streamable HTTP client with one, and destroys the session's
/// sandboxes when the client closes it.
#[tokio::test]
async fn mcp_over_streamable_http_needs_a_hutch_key() {
    let s = TestServer::start().await;
    let mut mcp = Command::new(hutch_bin())
        .args(["mcp", "--http", "127.0.0.1:0"])
        .env("HUTCH_URL", &s.url)
        .env("HUTCH_STATE_DIR", &s.state_dir)
        .env_remove("HUTCH_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn hutch mcp --http");
    let mut line = String::new();
    BufReader::new(mcp.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read");
    let url = line
        .trim()
        .strip_prefix("hutch mcp listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    let seen = client(&s, &["http", &url, &s.key]).await;
    // SAFETY: signalling the child we spawned, by its pid.
    unsafe { libc::kill(mcp.id() as i32, libc::SIGTERM) };
    let _ = mcp.wait();
    assert_eq!(seen["no_key_status"], 401, "{seen}");
    assert_eq!(seen["bad_key_status"], 401, "{seen}");
    assert_eq!(seen["server_name"], "hutch");
    assert!(
        seen["tools"].as_array().is_some_and(|t| t.len() == 11),
        "{seen}"
    );
    assert_eq!(seen["run"]["stdout"], "over-http\n", "{seen}");
    let id = seen["sandbox_id"].as_str().expect("id").to_string();
    let gone = wait_until(Duration::from_secs(10), async || {
        let (status, _) = s
            .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
            .await;
        (status == 404).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the HTTP session's sandbox outlived the session"
    );
}

#[tokio::test]
async fn run_code_keeps_state_and_returns_charts_as_image_content() {
    hutch_testkit::ensure_template("code-interpreter");
    let s = TestServer::start().await;
    let seen = client(&s, &["code"]).await;
    assert_eq!(seen["first_is_error"], false, "{seen}");
    assert!(seen["first_error"].is_null(), "{seen}");
    assert_eq!(
        seen["template"], "code-interpreter",
        "the sandbox run_code made: {seen}"
    );
    assert_eq!(seen["second_results"][0]["text"], "42", "{seen}");
    assert_eq!(seen["images"], json!(["image/png"]), "{seen}");
    assert_eq!(seen["image_head"], "89504e470d0a1a0a", "a PNG: {seen}");
    let len = seen["big_len"].as_u64().expect("len");
    assert!(len <= 20_000, "cut to the default cap: {len}");
    assert_eq!(seen["big_cut"], true, "{seen}");
    assert_eq!(
        seen["bash_stdout"], "1\n",
        "bash has its own session: {seen}"
    );
}
