//! `GET /v1/events`: lifecycle and exec events (argv, exit code, duration — never output),
//! with sequence numbers and a replay window a reconnecting client reads from.

use std::time::{Duration, Instant};

use hutch_testkit::TestServer;
use serde_json::{json, Value};

/// Read the event stream from `since` (query, or the `Last-Event-ID` header) until `done`
/// says so or 20 s pass; returns the events' JSON and the raw text.
async fn read_events(
    s: &TestServer,
    since: Option<u64>,
    as_header: bool,
    done: impl Fn(&[Value]) -> bool,
) -> (Vec<Value>, String) {
    let mut req = s
        .http
        .get(format!("{}/v1/events", s.url))
        .bearer_auth(&s.key);
    match (since, as_header) {
        (Some(n), true) => req = req.header("Last-Event-ID", n.to_string()),
        (Some(n), false) => req = req.query(&[("since", n)]),
        (None, _) => {}
    }
    let mut resp = req.send().await.expect("events");
    assert_eq!(resp.status().as_u16(), 200);
    let mut text = String::new();
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(500), resp.chunk()).await {
            Ok(Ok(Some(chunk))) => {
                text.push_str(&String::from_utf8_lossy(&chunk));
                events = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter_map(|d| serde_json::from_str(d).ok())
                    .collect();
                if done(&events) {
                    break;
                }
            }
            Ok(_) => break,
            Err(_) if done(&events) => break,
            Err(_) => {}
        }
    }
    (events, text)
}

fn exec_event<'a>(events: &'a [Value], id: &str, mode: &str) -> Option<&'a Value> {
    events
        .iter()
        .find(|e| e["type"] == "sandbox.exec" && e["sandbox_id"] == id && e["exec"]["mode"] == mode)
}

#[tokio::test]
async fn execs_are_events_without_their_output_and_a_reconnect_misses_nothing() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let v = s
        .exec(
            &id,
            json!({"cmd": "echo secret-output; echo secret-err >&2; exit 3"}),
        )
        .await;
    assert_eq!(v["exit_code"], 3, "{v}");

    let (events, text) = read_events(&s, Some(0), false, |e| {
        exec_event(e, &id, "collected").is_some()
    })
    .await;
    let created = events
        .iter()
        .find(|e| e["type"] == "sandbox.created" && e["sandbox_id"] == id.as_str())
        .unwrap_or_else(|| panic!("no created event: {text}"));
    let exec = exec_event(&events, &id, "collected").unwrap_or_else(|| panic!("{text}"));
    assert_eq!(
        exec["exec"]["argv"],
        json!([
            "/bin/sh",
            "-c",
            "echo secret-output; echo secret-err >&2; exit 3"
        ])
    );
    assert_eq!(exec["exec"]["exit_code"], 3, "{exec}");
    assert_eq!(exec["exec"]["timed_out"], false, "{exec}");
    assert!(exec["exec"]["duration_ms"].is_u64(), "{exec}");
    assert!(
        exec["seq"].as_u64() > created["seq"].as_u64(),
        "sequence numbers increase: {text}"
    );
    assert!(
        text.contains(&format!("id: {}", exec["seq"])),
        "the SSE id is the sequence number: {text}"
    );
    let without_argv = text.replace("secret-output; echo secret-err", "");
    assert!(
        !without_argv.contains("secret-output") && !without_argv.contains("secret-err"),
        "output leaked into events: {text}"
    );

    // While no client listens: a streamed exec. A client reconnecting with the last id it
    // saw gets exactly what came after.
    let last = exec["seq"].as_u64().expect("seq");
    let resp = s
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec/stream", s.url))
        .bearer_auth(&s.key)
        .json(&json!({"cmd": "exit 5"}))
        .send()
        .await
        .expect("stream");
    let body = resp.text().await.expect("stream body");
    assert!(body.contains("event: exit"), "{body}");
    let (events, text) = read_events(&s, Some(last), true, |e| {
        exec_event(e, &id, "stream").is_some()
    })
    .await;
    let streamed = exec_event(&events, &id, "stream").unwrap_or_else(|| panic!("{text}"));
    assert_eq!(streamed["exec"]["exit_code"], 5, "{streamed}");
    assert!(
        events.iter().all(|e| e["seq"].as_u64() > Some(last)),
        "only events after {last}: {text}"
    );
    // A malformed Last-Event-ID is a clear 400.
    let bad = s
        .http
        .get(format!("{}/v1/events", s.url))
        .bearer_auth(&s.key)
        .header("Last-Event-ID", "yesterday")
        .send()
        .await
        .expect("events");
    assert_eq!(bad.status().as_u16(), 400);
    s.kill(&id).await;
}
