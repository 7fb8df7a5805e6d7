//! Exec: output apart, exit codes, timeouts, signals, stdin, streaming, concurrency.

use futures_util::StreamExt;
use hutch_testkit::{both_backends, on, TestServer};
use reqwest::Method;
use serde_json::json;

both_backends!(
    argv_and_shell_keep_stdout_stderr_and_exit_code_apart,
    missing_command_is_127_with_a_message,
    timeout_kills_the_process_group_and_reports_124,
    killed_by_signal_is_128_plus_n,
    stdin_env_cwd_and_user,
    stream_delivers_events_in_order_before_exit,
    a_stream_client_that_disconnects_kills_its_process,
);

async fn argv_and_shell_keep_stdout_stderr_and_exit_code_apart(isolation: &str) {
    let s = TestServer::start().await;
    let id = s.create_id(on(isolation, json!({}))).await;
    let v = s
        .exec(
            &id,
            json!({"cmd": ["sh", "-c", "echo out; echo err >&2; exit 3"]}),
        )
        .await;
    assert_eq!(v["stdout"], "out\n");
    assert_eq!(v["stderr"], "err\n");
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["timed_out"], false);

    // An argv is not interpreted by a shell.
    let v = s
        .exec(&id, json!({"cmd": ["echo", "$HOME; rm -rf /"]}))
        .await;
    assert_eq!(v["stdout"], "$HOME; rm -rf /\n");
    // A string is.
    let v = s.exec(&id, json!({"cmd": "echo $((6*7))"})).await;
    assert_eq!(v["stdout"], "42\n");
}

async fn missing_command_is_127_with_a_message(isolation: &str) {
    let s = TestServer::start().await;
    let id = s.create_id(on(isolation, json!({}))).await;
    let v = s.exec(&id, json!({"cmd": ["no-such-program", "x"]})).await;
    assert_eq!(v["exit_code"], 127, "{v}");
    assert!(
        v["stderr"]
            .as_str()
            .unwrap_or("")
            .contains("no-such-program"),
        "{v}"
    );
}

async fn timeout_kills_the_process_group_and_reports_124(isolation: &str) {
    let s = TestServer::start().await;
    let id = s.create_id(on(isolation, json!({}))).await;
    let v = s
        .exec(
            &id,
            json!({"cmd": "sleep 30 & echo started; sleep 30", "timeout_seconds": 0.5}),
        )
        .await;
    assert_eq!(v["exit_code"], 124, "{v}");
    assert_eq!(v["timed_out"], true);
    assert_eq!(v["stdout"], "started\n");
    // The background sleep of the same group is gone too.
    let (ps, _) = s.sh(&id, "ps -o comm | grep -c '^sleep' || true").await;
    assert_eq!(ps.trim(), "0", "a sleep survived the timeout");
}

async fn killed_by_signal_is_128_plus_n(isolation: &str) {
    let s = TestServer::start().await;
    let id = s.create_id(on(isolation, json!({}))).await;
    let v = s.exec(&id, json!({"cmd": "kill -9 $$"})).await;
    assert_eq!(v["exit_code"], 137, "{v}");
    let v = s.exec(&id, json!({"cmd": "kill -15 $$"})).await;
    assert_eq!(v["exit_code"], 143, "{v}");
}

async fn stdin_env_cwd_and_user(isolation: &str) {
    let s = TestServer::start().await;
    let id = s
        .create_id(on(isolation, json!({"env": {"FROM_CREATE": "c"}})))
        .await;
    let v = s
        .exec(&id, json!({"cmd": ["sh", "-c", "cat; echo \"[$FOO $FROM_CREATE $(pwd)]\""], "stdin": "piped\n", "env": {"FOO": "bar"}, "cwd": "/tmp"}))
        .await;
    assert_eq!(v["stdout"], "piped\n[bar c /tmp]\n", "{v}");
    let v = s
        .exec(&id, json!({"cmd": ["id", "-u"], "user": "user"}))
        .await;
    assert_eq!(v["stdout"], "1000\n", "{v}");
    let v = s.exec(&id, json!({"cmd": ["id", "-u"]})).await;
    assert_eq!(v["stdout"], "0\n", "{v}");
}

#[tokio::test]
async fn two_hundred_concurrent_execs_on_one_sandbox() {
    // The server allows 32 execs at once per sandbox by default (docs/limits.md); the agent
    // itself runs many more, which is what this checks.
    let s = TestServer::start_with(&["--max-execs-per-sandbox", "256"]).await;
    let id = s.create_id(json!({"pids_max": 1024})).await;
    let futs = (0..200).map(|i| {
        let s = &s;
        let id = id.clone();
        async move {
            let v = s.exec(&id, json!({"cmd": ["echo", format!("n{i}")]})).await;
            assert_eq!(v["stdout"], format!("n{i}\n"));
            assert_eq!(v["exit_code"], 0);
        }
    });
    futures_util::future::join_all(futs).await;
}

#[tokio::test]
async fn output_over_the_cap_is_truncated_and_flagged() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    // 17 MiB of stdout, a little stderr.
    let v = s
        .exec(
            &id,
            json!({"cmd": "head -c 17825792 /dev/zero | tr '\\0' 'a'; echo done >&2"}),
        )
        .await;
    assert_eq!(v["stdout_truncated"], true);
    assert_eq!(v["stderr_truncated"], false);
    assert_eq!(v["stdout"].as_str().map(str::len), Some(16 << 20));
    assert_eq!(v["stderr"], "done\n");
    assert_eq!(v["exit_code"], 0);
}

async fn stream_delivers_events_in_order_before_exit(isolation: &str) {
    let s = TestServer::start().await;
    let id = s.create_id(on(isolation, json!({}))).await;
    let resp = s
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec/stream", s.url))
        .bearer_auth(&s.key)
        .json(&json!({"cmd": "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three; exit 5"}))
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.status(), 200);
    assert!(resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .starts_with("text/event-stream"));
    let mut body = resp.bytes_stream();
    let mut text = String::new();
    let mut first_stdout_at = None;
    let t0 = std::time::Instant::now();
    while let Some(chunk) = body.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
        if first_stdout_at.is_none() && text.contains("event: stdout") {
            first_stdout_at = Some(t0.elapsed());
        }
    }
    let events: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(
        events,
        ["start", "stdout", "stderr", "stdout", "exit"],
        "{text}"
    );
    assert!(text.contains("{\"data\":\"one\\n\"}"), "{text}");
    assert!(text.contains("\"exit_code\":5"), "{text}");
    // The first line arrived while the command was still running (~0.6 s in all).
    assert!(
        first_stdout_at.expect("stdout event")
            < t0.elapsed() - std::time::Duration::from_millis(300)
    );
}

async fn a_stream_client_that_disconnects_kills_its_process(isolation: &str) {
    let s = TestServer::start().await;
    let id = s.create_id(on(isolation, json!({}))).await;
    let resp = s
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec/stream", s.url))
        .bearer_auth(&s.key)
        .json(&json!({"cmd": ["sleep", "1234"]}))
        .send()
        .await
        .expect("stream");
    let mut body = resp.bytes_stream();
    let _ = body.next().await; // the start event
    drop(body);
    let gone = hutch_testkit::wait_until(std::time::Duration::from_secs(5), async || {
        let (out, _) = s
            .sh(&id, "ps -o args | grep -c '^sleep 1234' || true")
            .await;
        (out.trim() == "0").then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the process outlived its disconnected client"
    );
    let (status, _) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 200);
}
