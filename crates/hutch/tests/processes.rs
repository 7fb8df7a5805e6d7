//! Process handles through the HTTP API: start, list, attach by pid and by tag with what was
//! written before, late attaches, stdin, signals, PTY resizes, detaching, tags, errors, the
//! ring, back-pressure, the timeout, `exec` with `background`, and the lifecycle.

use std::time::Duration;

use base64::Engine;
use futures_util::StreamExt;
use hutch_testkit::{on, wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// What a process's output stream carried.
#[derive(Debug, Default)]
struct Output {
    names: Vec<String>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    missed: Vec<Value>,
    exit: Option<Value>,
}

impl Output {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

fn data_of(event: &Value) -> Vec<u8> {
    match (event["data"].as_str(), event["data_b64"].as_str()) {
        (Some(text), _) => text.as_bytes().to_vec(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .expect("base64"),
        _ => panic!("an output event without data: {event}"),
    }
}

fn take(out: &mut Output, event: Value) {
    let name = event["event"].as_str().expect("event name").to_string();
    match name.as_str() {
        "stdout" => out.stdout.extend(data_of(&event)),
        "stderr" => out.stderr.extend(data_of(&event)),
        "missed" => out.missed.push(event.clone()),
        "exit" => out.exit = Some(event.clone()),
        "start" => {}
        other => panic!("unexpected event {other}: {event}"),
    }
    out.names.push(name);
}

/// `GET …/processes/{sel}/output{query}` as NDJSON, read until it ends.
async fn output(s: &TestServer, id: &str, sel: &str, query: &str) -> Output {
    let resp = s
        .http
        .get(format!(
            "{}/v1/sandboxes/{id}/processes/{sel}/output{query}",
            s.url
        ))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("output");
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    assert_eq!(
        resp.headers()["content-type"].to_str().expect("type"),
        "application/x-ndjson"
    );
    let body = tokio::time::timeout(Duration::from_secs(60), resp.bytes())
        .await
        .expect("the stream ended in time")
        .expect("body");
    let mut out = Output::default();
    for line in body.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        take(
            &mut out,
            serde_json::from_slice(line).expect("an NDJSON line"),
        );
    }
    out
}

/// Read `…/output` until stdout contains `needle`, then drop the stream (detach).
async fn output_until(s: &TestServer, id: &str, sel: &str, needle: &str) -> String {
    let resp = s
        .http
        .get(format!(
            "{}/v1/sandboxes/{id}/processes/{sel}/output",
            s.url
        ))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("output");
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let (mut pending, mut out) = (Vec::new(), Output::default());
    let read = async {
        while !out.text().contains(needle) {
            let chunk = body.next().await.expect("more output").expect("chunk");
            pending.extend_from_slice(&chunk);
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                take(&mut out, serde_json::from_slice(&line).expect("NDJSON"));
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .unwrap_or_else(|_| panic!("no {needle:?} in time: {:?}", out.text()));
    out.text()
}

/// `POST …/processes` expecting 201; the process's description.
async fn start(s: &TestServer, id: &str, body: Value) -> Value {
    let (status, v) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes"),
            Some(body),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    v
}

async fn info(s: &TestServer, id: &str, sel: &str) -> (u16, Value) {
    s.request(
        Method::GET,
        &format!("/v1/sandboxes/{id}/processes/{sel}"),
        None,
    )
    .await
}

/// Wait until the process has exited; its description.
async fn exited(s: &TestServer, id: &str, sel: &str) -> Value {
    wait_until(Duration::from_secs(30), async || {
        let (_, v) = info(s, id, sel).await;
        (v["state"] == "exited").then_some(v)
    })
    .await
    .unwrap_or_else(|| panic!("{sel} did not exit"))
}

/// `POST …/processes/{sel}/{action}` with a raw body; the status and JSON answer.
async fn post_raw(s: &TestServer, id: &str, sel: &str, action: &str, body: &[u8]) -> (u16, Value) {
    let resp = s
        .http
        .post(format!(
            "{}/v1/sandboxes/{id}/processes/{sel}/{action}",
            s.url
        ))
        .bearer_auth(&s.key)
        .body(body.to_vec())
        .send()
        .await
        .expect("post");
    let status = resp.status().as_u16();
    let bytes = resp.bytes().await.expect("body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn ns_sandbox(s: &TestServer) -> String {
    s.create_id(on("ns", json!({}))).await
}

#[tokio::test]
async fn a_process_is_listed_and_attached_by_pid_and_tag_with_what_it_wrote_before() {
    let s = TestServer::start().await;
    let id = ns_sandbox(&s).await;
    let script = "echo before; echo err-before >&2; touch /tmp/ready; \
                  while [ ! -e /tmp/go ]; do sleep 0.05; done; echo after";
    let v = start(&s, &id, json!({"cmd": script, "tag": "worker"})).await;
    let pid = v["pid"].as_u64().expect("pid");
    let pid_path = pid.to_string();
    assert_eq!(v["tag"], "worker");
    assert_eq!(v["state"], "running");
    assert_eq!(v["cmd"], json!(["/bin/sh", "-c", script]));

    let (status, list) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}/processes"), None)
        .await;
    assert_eq!(status, 200, "{list}");
    let listed = list["processes"].as_array().expect("processes");
    assert!(
        listed
            .iter()
            .any(|p| p["pid"] == pid && p["tag"] == "worker"),
        "{list}"
    );
    let (status, by_tag) = info(&s, &id, "tag:worker").await;
    assert_eq!((status, &by_tag["pid"]), (200, &json!(pid)));

    s.sh_ok(&id, "while [ ! -e /tmp/ready ]; do sleep 0.05; done")
        .await;
    // Attach by pid and by tag, each to the end, while the process waits for /tmp/go.
    let (by_pid, by_tag, ()) = tokio::join!(
        output(&s, &id, &pid_path, ""),
        output(&s, &id, "tag:worker", ""),
        async {
            // Both streams are attached once their first bytes came back.
            output_until(&s, &id, "tag:worker", "before").await;
            s.sh_ok(&id, "touch /tmp/go").await;
        }
    );
    for out in [by_pid, by_tag] {
        assert_eq!(out.text(), "before\nafter\n");
        assert_eq!(out.stderr, b"err-before\n");
        assert!(out.missed.is_empty(), "{:?}", out.missed);
        assert_eq!(out.names.first().map(String::as_str), Some("start"));
        assert_eq!(
            out.exit.as_ref().map(|e| e["exit_code"].clone()),
            Some(json!(0))
        );
    }
    let v = exited(&s, &id, &pid_path).await;
    assert_eq!(v["exit"]["exit_code"], 0);
}

#[tokio::test]
async fn a_late_attach_gets_the_output_and_exit_code_of_a_process_that_is_gone() {
    let s = TestServer::start().await;
    let id = ns_sandbox(&s).await;
    let v = start(&s, &id, json!({"cmd": "echo out; echo err >&2; exit 3"})).await;
    let pid = v["pid"].to_string();
    let v = exited(&s, &id, &pid).await;
    assert_eq!(v["exit"]["exit_code"], 3);
    let out = output(&s, &id, &pid, "").await;
    assert_eq!(
        (out.text().as_str(), out.stderr.as_slice()),
        ("out\n", &b"err\n"[..])
    );
    assert_eq!(out.exit.expect("exit")["exit_code"], 3);

    // The same as SSE.
    let resp = s
        .http
        .get(format!(
            "{}/v1/sandboxes/{id}/processes/{pid}/output",
            s.url
        ))
        .bearer_auth(&s.key)
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("sse");
    assert!(resp.headers()["content-type"]
        .to_str()
        .expect("type")
        .starts_with("text/event-stream"));
    let text = resp.text().await.expect("body");
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(names, ["start", "stdout", "stderr", "exit"], "{text}");
    assert!(text.contains("\"exit_code\":3"), "{text}");

    // Without replay only the exit comes.
    let out = output(&s, &id, &pid, "?replay=false").await;
    assert_eq!(out.names, ["start", "exit"]);
}

#[tokio::test]
async fn stdin_then_close_stdin_ends_a_cat() {
    let s = TestServer::start().await;
    let id = ns_sandbox(&s).await;
    start(
        &s,
        &id,
        json!({"cmd": ["cat"], "stdin": true, "tag": "cat"}),
    )
    .await;
    let (status, v) = post_raw(&s, &id, "tag:cat", "stdin", b"hello\n").await;
    assert_eq!(status, 204, "{v}");
    let (status, v) = post_raw(&s, &id, "tag:cat", "stdin", b"world\n").await;
    assert_eq!(status, 204, "{v}");
    let (_, v) = info(&s, &id, "tag:cat").await;
    assert_eq!(v["state"], "running", "cat waits for more");
    let (status, v) = post_raw(&s, &id, "tag:cat", "close-stdin", b"").await;
    assert_eq!(status, 204, "{v}");
    let out = output(&s, &id, "tag:cat", "").await;
    assert_eq!(out.text(), "hello\nworld\n");
    assert_eq!(out.exit.expect("exit")["exit_code"], 0);

    // No stdin to write to: 400.
    let v = start(&s, &id, json!({"cmd": ["sleep", "30"]})).await;
    let (status, err) = post_raw(&s, &id, &v["pid"].to_string(), "stdin", b"x").await;
    assert_eq!(status, 400, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("without stdin"),
        "{err}"
    );
}

#[tokio::test]
async fn signal_term_ends_a_sleep_with_signal_15_and_delete_kills() {
    let s = TestServer::start().await;
    let id = ns_sandbox(&s).await;
    let v = start(&s, &id, json!({"cmd": ["sleep", "100"]})).await;
    let pid = v["pid"].to_string();
    let (status, v) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes/{pid}/signal"),
            Some(json!({"signal": "TERM"})),
        )
        .await;
    assert_eq!(status, 204, "{v}");
    let out = output(&s, &id, &pid, "").await;
    let exit = out.exit.expect("exit");
    assert_eq!(
        (exit["signal"].clone(), exit["exit_code"].clone()),
        (json!(15), json!(143))
    );

    // Signalling an exited process: 409 process_exited.
    let (status, v) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes/{pid}/signal"),
            Some(json!({"signal": 15})),
        )
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (409, Some("process_exited")),
        "{v}"
    );

    let v = start(&s, &id, json!({"cmd": ["sleep", "100"], "tag": "k"})).await;
    let (status, _) = s
        .request(
            Method::DELETE,
            &format!("/v1/sandboxes/{id}/processes/tag:k"),
            None,
        )
        .await;
    assert_eq!(status, 204);
    let v = exited(&s, &id, &v["pid"].to_string()).await;
    assert_eq!(v["exit"]["signal"], 9);
    let (status, v) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes/tag:k/signal"),
            Some(json!({"signal": "BOGUS"})),
        )
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (422, Some("invalid_argument")),
        "{v}"
    );
}

#[tokio::test]
async fn a_pty_resize_is_seen_by_stty_size() {
    let s = TestServer::start().await;
    let id = ns_sandbox(&s).await;
    let v = start(
        &s,
        &id,
        json!({"cmd": "stty size; read line; stty size", "pty": {"cols": 80, "rows": 24}, "tag": "term"}),
    )
    .await;
    assert_eq!(v["pty"], json!({"cols": 80, "rows": 24}));
    assert_eq!(v["stdin"], true, "a terminal has a stdin");
    output_until(&s, &id, "tag:term", "24 80").await;
    let (status, v) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes/tag:term/resize"),
            Some(json!({"cols": 132, "rows": 43})),
        )
        .await;
    assert_eq!(status, 204, "{v}");
    let (_, v) = info(&s, &id, "tag:term").await;
    assert_eq!(v["pty"], json!({"cols": 132, "rows": 43}));
    let (status, _) = post_raw(&s, &id, "tag:term", "stdin", b"\n").await;
    assert_eq!(status, 204);
    let out = output(&s, &id, "tag:term", "").await;
    assert!(out.text().contains("43 132"), "{:?}", out.text());
    let (status, v) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes/tag:term/resize"),
            Some(json!({"cols": 0, "rows": 43})),
        )
        .await;
    assert_eq!(status, 422, "{v}");
}

#[tokio::test]
async fn dropping_a_stream_detaches_without_killing() {
    let s = TestServer::start().await;
    let id = ns_sandbox(&s).await;
    let v = start(&s, &id, json!({"cmd": "echo up; sleep 1234"})).await;
    let pid = v["pid"].to_string();
    output_until(&s, &id, &pid, "up").await;
    // A background exec/stream is a handle too, and its stream can be dropped.
    s.start_background(&id, json!(["sleep", "4321"])).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, v) = info(&s, &id, &pid).await;
    assert_eq!(v["state"], "running", "{v}");
    let ps = s.sh_ok(&id, "ps -o args").await;
    assert!(
        ps.contains("sleep 1234") && ps.contains("sleep 4321"),
        "{ps}"
    );
    let (_, list) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}/processes"), None)
        .await;
    let cmds: Vec<Value> = list["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .map(|p| p["cmd"].clone())
        .collect();
    assert!(cmds.contains(&json!(["sleep", "4321"])), "{list}");
}

#[tokio::test]
async fn duplicate_tags_unknown_processes_and_bad_input_are_json_errors() {
    let s = TestServer::start().await;
    let id = ns_sandbox(&s).await;
    start(&s, &id, json!({"cmd": ["sleep", "100"], "tag": "one"})).await;
    let (status, v) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes"),
            Some(json!({"cmd": ["sleep", "1"], "tag": "one"})),
        )
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (409, Some("tag_in_use")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("\"one\""),
        "{v}"
    );

    for path in [
        "processes/999999",
        "processes/tag:nobody",
        "processes/999999/output",
    ] {
        let (status, v) = s
            .request(Method::GET, &format!("/v1/sandboxes/{id}/{path}"), None)
            .await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (404, Some("not_found")),
            "{path}: {v}"
        );
    }
    let (status, v) = info(&s, &id, "web").await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{v}"
    );
    let (status, v) = info(&s, "sbx_doesnotexist", "1").await;
    assert_eq!(status, 404, "{v}");
    let (status, v) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes"),
            Some(json!({"cmd": ["true"], "bogus": 1})),
        )
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{v}"
    );
    let (status, v) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/processes"),
            Some(json!({"cmd": ["no-such-program-xyz"]})),
        )
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("command_not_found")),
        "{v}"
    );
}

#[tokio::test]
async fn a_ring_overflow_reports_missed_bytes_and_keeps_the_newest_output() {
    let s = TestServer::start().await;
    let id = ns_sandbox(&s).await;
    let v = start(&s, &id, json!({"cmd": "seq 1 400000; echo LAST"})).await;
    let pid = v["pid"].to_string();
    exited(&s, &id, &pid).await;
    let out = output(&s, &id, &pid, "").await;
    let expected: String = (1..=400_000).map(|i| format!("{i}\n")).collect::<String>() + "LAST\n";
    assert_eq!(out.missed.len(), 1, "{:?}", out.missed);
    let dropped = out.missed[0]["stdout"].as_u64().expect("stdout missed") as usize;
    assert_eq!(out.missed[0]["stderr"], 0);
    assert_eq!(out.stdout.len(), 1 << 20, "the ring keeps 1 MiB");
    assert_eq!(dropped + out.stdout.len(), expected.len());
    assert!(
        out.stdout == expected.as_bytes()[dropped..],
        "not the newest output"
    );
    assert_eq!(out.names[..2], ["start", "missed"]);
}

#[tokio::test]
async fn ten_mib_reach_an_attached_reader_byte_exact() {
    let s = TestServer::start().await;
    let id = ns_sandbox(&s).await;
    let script =
        "mkfifo /tmp/gate; read x < /tmp/gate; head -c 10485760 /dev/urandom | tee /tmp/copy";
    let v = start(&s, &id, json!({"cmd": script})).await;
    let pid = v["pid"].to_string();
    let (out, ()) = tokio::join!(output(&s, &id, &pid, "?replay=false"), async {
        // The reader is attached (its start event is out) before the gate opens.
        tokio::time::sleep(Duration::from_millis(500)).await;
        s.sh_ok(
            &id,
            "while [ ! -p /tmp/gate ]; do sleep 0.05; done; echo go > /tmp/gate",
        )
        .await;
    });
    assert!(out.missed.is_empty(), "{:?}", out.missed);
    assert_eq!(out.exit.expect("exit")["exit_code"], 0);
    let resp = s
        .http
        .get(format!("{}/v1/sandboxes/{id}/files?path=/tmp/copy", s.url))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("read the copy");
    let written = resp.bytes().await.expect("copy");
    assert_eq!(out.stdout.len(), 10 << 20);
    assert!(
        out.stdout == written,
        "the stream differs from what was written"
    );
}

#[tokio::test]
async fn the_timeout_kills_a_process_and_says_so() {
    let s = TestServer::start().await;
    let id = ns_sandbox(&s).await;
    let v = start(
        &s,
        &id,
        json!({"cmd": "echo up; sleep 100", "timeout_seconds": 0.5}),
    )
    .await;
    let v = exited(&s, &id, &v["pid"].to_string()).await;
    assert_eq!(v["exit"]["timed_out"], true, "{v}");
    assert_eq!(v["exit"]["exit_code"], 124, "{v}");
    let ps = s.sh_ok(&id, "ps -o args").await;
    assert!(!ps.contains("sleep 100"), "{ps}");
}

#[tokio::test]
async fn exec_with_background_answers_the_handle() {
    let s = TestServer::start().await;
    let id = ns_sandbox(&s).await;
    let (status, v) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": ["cat"], "background": true, "tag": "bg", "stdin": "fed\n"})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(
        (v["tag"].as_str(), v["stdin"].as_bool()),
        (Some("bg"), Some(true))
    );
    assert!(v["pid"].as_u64().is_some(), "{v}");
    // Its stdin was written and closed: cat ends.
    let out = output(&s, &id, "tag:bg", "").await;
    assert_eq!(out.text(), "fed\n");
    assert_eq!(out.exit.expect("exit")["exit_code"], 0);

    let (status, v) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": ["true"], "tag": "x"})),
        )
        .await;
    assert_eq!(status, 422, "a tag without background: {v}");
}

#[tokio::test]
async fn an_ns_hibernation_ends_the_handles_with_the_processes() {
    let s = TestServer::start().await;
    let id = ns_sandbox(&s).await;
    start(&s, &id, json!({"cmd": ["sleep", "100"], "tag": "gone"})).await;
    s.act(&id, "hibernate").await;
    s.act(&id, "wake").await;
    let (status, list) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}/processes"), None)
        .await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["processes"], json!([]), "a fresh agent has no handles");
}

#[tokio::test]
async fn a_vm_sandbox_keeps_a_process_handle_across_hibernate_and_wake() {
    if hutch_testkit::skip_without_vm(module_path!()) {
        return;
    }
    let s = TestServer::start().await;
    let id = s.create_id(on("vm", json!({}))).await;
    let v = start(
        &s,
        &id,
        json!({"cmd": "echo one; read x; echo two", "stdin": true, "tag": "kept"}),
    )
    .await;
    let pid = v["pid"].clone();
    output_until(&s, &id, "tag:kept", "one").await;
    s.act(&id, "hibernate").await;
    s.act(&id, "wake").await;
    let (status, v) = info(&s, &id, "tag:kept").await;
    assert_eq!(
        (status, &v["pid"], &v["state"]),
        (200, &pid, &json!("running")),
        "{v}"
    );
    let (status, _) = post_raw(&s, &id, "tag:kept", "stdin", b"\n").await;
    assert_eq!(status, 204);
    let out = output(&s, &id, "tag:kept", "").await;
    assert_eq!(out.text(), "one\ntwo\n");
}

/// Run the `hutch` CLI against `s`.
fn hutch(s: &TestServer, args: &[&str]) -> std::process::Output {
    std::process::Command::new(hutch_testkit::hutch_bin())
        .args(args)
        .env("HUTCH_URL", &s.url)
        .env("HUTCH_STATE_DIR", &s.state_dir)
        .env_remove("HUTCH_API_KEY")
        .output()
        .expect("run hutch")
}

#[tokio::test]
async fn the_cli_starts_lists_attaches_and_signals_processes() {
    let s = TestServer::start().await;
    let id = ns_sandbox(&s).await;
    let o = hutch(
        &s,
        &[
            "exec",
            "-d",
            "--tag",
            "cli",
            &id,
            "--",
            "sh",
            "-c",
            "echo from-cli; sleep 100",
        ],
    );
    assert!(o.status.success(), "{o:?}");
    let pid: u32 = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .expect("exec -d prints the pid");
    let o = hutch(&s, &["ps", &id]);
    let ps = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{o:?}");
    let row = ps
        .lines()
        .find(|l| l.starts_with(&pid.to_string()))
        .unwrap_or_else(|| panic!("{pid} not in {ps}"));
    assert!(
        row.contains("cli") && row.contains("running") && row.contains("sleep 100"),
        "{row}"
    );

    let o = hutch(&s, &["process", "signal", &id, "tag:cli", "TERM"]);
    assert!(o.status.success(), "{o:?}");
    let o = hutch(&s, &["attach", &id, &pid.to_string()]);
    assert_eq!(o.status.code(), Some(143), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "from-cli\n");

    let o = hutch(&s, &["process", "kill", &id, "tag:cli"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("has exited"),
        "{o:?}"
    );
    let o = hutch(&s, &["--json", "ps", &id]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["processes"][0]["exit"]["signal"], 15, "{v}");
}
