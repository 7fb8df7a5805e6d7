//! File watches through the API (`ns`; the first case on `vm` too): `GET …/files/watch` as SSE and NDJSON, changes made
//! by execs reported in order with their names and types, recursive and not, entries, the
//! errors for a missing path and a file, no inotify instance left in the agent once the
//! client goes away, and the polled watchers.

use std::time::Duration;

use futures_util::StreamExt;
use hutch_testkit::{both_backends, on, wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// A watch answer read message by message: `(name, data)` for SSE (`event:` and `data:`),
/// `(kind, line)` for NDJSON.
struct WatchReader {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buffer: String,
    ndjson: bool,
}

impl WatchReader {
    async fn open(s: &TestServer, id: &str, query: &str, accept: &str) -> Self {
        let resp = s
            .http
            .get(format!("{}/v1/sandboxes/{id}/files/watch?{query}", s.url))
            .bearer_auth(&s.key)
            .header("accept", accept)
            .send()
            .await
            .expect("watch");
        assert_eq!(resp.status(), 200, "watch {query}");
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let ndjson = accept == "application/x-ndjson";
        let wanted = if ndjson {
            "application/x-ndjson"
        } else {
            "text/event-stream"
        };
        assert!(content_type.starts_with(wanted), "{content_type}");
        Self {
            body: Box::pin(resp.bytes_stream()),
            buffer: String::new(),
            ndjson,
        }
    }

    /// The next message, or `None` when the answer ended or nothing came within `wait`.
    async fn next(&mut self, wait: Duration) -> Option<(String, Value)> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(message) = self.take() {
                return Some(message);
            }
            let chunk = tokio::time::timeout_at(deadline, self.body.next())
                .await
                .ok()??;
            self.buffer
                .push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
        }
    }

    fn take(&mut self) -> Option<(String, Value)> {
        if self.ndjson {
            let end = self.buffer.find('\n')?;
            let line: String = self.buffer.drain(..=end).collect();
            let value: Value = serde_json::from_str(line.trim()).expect("a JSON line");
            let kind = value["kind"].as_str().expect("kind").to_string();
            return Some((kind, value));
        }
        loop {
            let end = self.buffer.find("\n\n")?;
            let block: String = self.buffer.drain(..end + 2).collect();
            let mut name = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str(d).expect("JSON data"));
                }
            }
            if let (Some(name), Some(data)) = (name, data) {
                return Some((name, data));
            }
            // A keep-alive comment: read on.
        }
    }

    /// The file events until none arrives for `quiet`.
    async fn events_until_quiet(&mut self, quiet: Duration) -> Vec<Value> {
        let mut events = Vec::new();
        while let Some((name, data)) = self.next(quiet).await {
            assert_eq!(name, "event", "{data}");
            events.push(data);
        }
        events
    }
}

fn names(events: &[Value]) -> Vec<(String, String)> {
    events
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap_or("").to_string(),
                e["name"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// inotify instances open in the process `pid` (the sandbox's agent, seen from the host).
fn inotify_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.flatten()
                .filter(|fd| {
                    std::fs::read_link(fd.path())
                        .map(|t| t.to_string_lossy().contains("inotify"))
                        .unwrap_or(false)
                })
                .count()
        })
        .unwrap_or(0)
}

both_backends!(changes_made_by_an_exec_arrive_in_order_as_sse);

async fn changes_made_by_an_exec_arrive_in_order_as_sse(isolation: &str) {
    let s = TestServer::start().await;
    let id = s.create_id(on(isolation, json!({}))).await;
    s.sh_ok(&id, "mkdir /w").await;
    let mut watch = WatchReader::open(&s, &id, "path=/w", "text/event-stream").await;
    let (name, ready) = watch.next(Duration::from_secs(10)).await.expect("ready");
    assert_eq!(name, "ready", "{ready}");
    assert_eq!(ready["path"], "/w");
    assert_eq!(ready["watched_dirs"], 1);

    s.sh_ok(
        &id,
        "echo hi > /w/a.txt && chmod 600 /w/a.txt && mv /w/a.txt /w/b.txt && rm /w/b.txt && mkdir /w/d",
    )
    .await;
    let events = watch.events_until_quiet(Duration::from_secs(1)).await;
    assert_eq!(
        names(&events),
        [
            ("create", "a.txt"),
            ("write", "a.txt"),
            ("chmod", "a.txt"),
            ("rename", "b.txt"),
            ("remove", "b.txt"),
            ("create", "d"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string())),
        "{events:?}"
    );
    assert_eq!(events[0]["path"], "/w/a.txt");
    assert_eq!(events[0]["type"], "file");
    assert!(
        events[0].get("entry").is_none(),
        "entries only when asked for"
    );
    assert_eq!(events[3]["old_name"], "a.txt");
    assert_eq!(events[3]["old_path"], "/w/a.txt");
    assert_eq!(events[5]["type"], "dir");
}

#[tokio::test]
async fn recursive_watches_see_new_subdirectories_and_plain_ones_do_not() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    s.sh_ok(&id, "mkdir -p /w/old").await;
    let mut plain = WatchReader::open(&s, &id, "path=/w", "application/x-ndjson").await;
    let mut deep = WatchReader::open(
        &s,
        &id,
        "path=/w&recursive=true&include_entry=true",
        "application/x-ndjson",
    )
    .await;
    let (kind, ready) = deep.next(Duration::from_secs(10)).await.expect("ready");
    assert_eq!(kind, "ready");
    assert_eq!(ready["recursive"], true);
    assert_eq!(ready["watched_dirs"], 2, "/w and /w/old");
    assert_eq!(
        plain.next(Duration::from_secs(10)).await.expect("ready").0,
        "ready"
    );

    s.sh_ok(
        &id,
        "mkdir -p /w/sub/inner && printf 12345 > /w/sub/inner/f && touch /w/old/g",
    )
    .await;
    let events = deep.events_until_quiet(Duration::from_secs(1)).await;
    let seen = names(&events);
    for wanted in ["sub", "sub/inner", "sub/inner/f", "old/g"] {
        assert!(
            seen.iter().any(|(k, n)| k == "create" && n == wanted),
            "create {wanted} in {seen:?}"
        );
    }
    assert!(
        events
            .iter()
            .any(|e| e["name"] == "sub/inner/f" && e["entry"]["size"] == 5),
        "an event of sub/inner/f carries its entry with its size: {events:?}"
    );
    assert_eq!(events[0]["entry"]["type"], "dir", "{events:?}");
    let shallow = plain.events_until_quiet(Duration::from_millis(500)).await;
    assert_eq!(
        names(&shallow),
        [("create".to_string(), "sub".to_string())],
        "a plain watch sees its own directory only"
    );
}

#[tokio::test]
async fn a_dropped_watch_leaves_no_inotify_instance_in_the_agent() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    s.sh_ok(&id, "mkdir -p /w/a/b").await;
    let agent = s.init_pid(&id).expect("the sandbox's agent");
    assert_eq!(inotify_fds(agent), 0, "no watch yet");
    let mut watch = WatchReader::open(&s, &id, "path=/w&recursive=true", "text/event-stream").await;
    assert_eq!(
        watch.next(Duration::from_secs(10)).await.expect("ready").0,
        "ready"
    );
    assert_eq!(inotify_fds(agent), 1, "one instance while watching");
    drop(watch);
    let closed = wait_until(Duration::from_secs(10), async || {
        (inotify_fds(agent) == 0).then_some(())
    })
    .await;
    assert!(
        closed.is_some(),
        "the agent keeps {} inotify fds",
        inotify_fds(agent)
    );
}

#[tokio::test]
async fn a_missing_path_is_404_and_a_file_400() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    s.sh_ok(&id, "touch /f").await;
    let (status, body) = s
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/watch?path=/nope"),
            None,
        )
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
    let (status, body) = s
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/watch?path=/f"),
            None,
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "not_a_directory");
    let (status, body) = s
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/watch?path=rel"),
            None,
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = s
        .request(
            Method::GET,
            "/v1/sandboxes/sbx_nosuchsandbox0000/files/watch?path=/",
            None,
        )
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_watch_ends_when_its_directory_or_its_sandbox_goes() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    s.sh_ok(&id, "mkdir /w /v").await;
    let mut w = WatchReader::open(&s, &id, "path=/w", "application/x-ndjson").await;
    let mut v = WatchReader::open(&s, &id, "path=/v", "text/event-stream").await;
    assert_eq!(
        w.next(Duration::from_secs(10)).await.expect("ready").0,
        "ready"
    );
    assert_eq!(
        v.next(Duration::from_secs(10)).await.expect("ready").0,
        "ready"
    );
    s.sh_ok(&id, "rmdir /w").await;
    let (kind, end) = w.next(Duration::from_secs(10)).await.expect("end");
    assert_eq!(kind, "end", "{end}");
    assert!(
        end["reason"].as_str().expect("reason").contains("removed"),
        "{end}"
    );
    assert!(
        w.next(Duration::from_secs(5)).await.is_none(),
        "nothing after the end"
    );

    assert_eq!(s.kill(&id).await, 204);
    let (name, error) = v
        .next(Duration::from_secs(10))
        .await
        .expect("an error event");
    assert_eq!(name, "error", "{error}");
    assert!(
        v.next(Duration::from_secs(5)).await.is_none(),
        "the answer ends"
    );
}

#[tokio::test]
async fn polled_watchers_collect_events_between_calls() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    s.sh_ok(&id, "mkdir /w").await;
    let (status, watcher) = s
        .post(
            &format!("/v1/sandboxes/{id}/files/watchers"),
            json!({"path": "/w", "include_entry": true}),
        )
        .await;
    assert_eq!(status, 201, "{watcher}");
    let wid = watcher["id"].as_str().expect("id").to_string();
    assert!(wid.starts_with("wch_"), "{wid}");
    assert_eq!(watcher["watched_dirs"], 1);
    let events_path = format!("/v1/sandboxes/{id}/files/watchers/{wid}/events");
    let (_, empty) = s.request(Method::GET, &events_path, None).await;
    assert_eq!(empty["events"], json!([]), "{empty}");

    // The entry is read when the event is handled: the file stays until the next exec.
    s.sh_ok(&id, "printf abc > /w/x").await;
    let mut collected = Vec::new();
    let poll_until = async |collected: &mut Vec<Value>, count: usize| {
        wait_until(Duration::from_secs(10), async || {
            let (status, got) = s.request(Method::GET, &events_path, None).await;
            assert_eq!(status, 200, "{got}");
            collected.extend(got["events"].as_array().expect("events").iter().cloned());
            (collected.len() >= count).then_some(())
        })
        .await
    };
    assert!(
        poll_until(&mut collected, 2).await.is_some(),
        "{collected:?}"
    );
    s.sh_ok(&id, "rm /w/x").await;
    assert!(
        poll_until(&mut collected, 3).await.is_some(),
        "{collected:?}"
    );
    assert_eq!(
        names(&collected),
        [("create", "x"), ("write", "x"), ("remove", "x")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    assert_eq!(collected[1]["entry"]["size"], 3, "{collected:?}");
    assert!(
        collected[2].get("entry").is_none(),
        "a removed entry has none"
    );
    let (_, again) = s.request(Method::GET, &events_path, None).await;
    assert_eq!(
        again["events"],
        json!([]),
        "a poll takes what it returns: {again}"
    );

    // Another sandbox cannot reach this watcher; removal is for good.
    let other = s.create_id(json!({})).await;
    let (status, _) = s
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{other}/files/watchers/{wid}/events"),
            None,
        )
        .await;
    assert_eq!(status, 404);
    let watcher_path = format!("/v1/sandboxes/{id}/files/watchers/{wid}");
    let (status, _) = s.request(Method::DELETE, &watcher_path, None).await;
    assert_eq!(status, 204);
    let (status, _) = s.request(Method::GET, &events_path, None).await;
    assert_eq!(status, 404);
    let agent = s.init_pid(&id).expect("agent");
    let closed = wait_until(Duration::from_secs(10), async || {
        (inotify_fds(agent) == 0).then_some(())
    })
    .await;
    assert!(
        closed.is_some(),
        "a removed watcher's watch is closed in the agent"
    );
}

#[tokio::test]
async fn the_served_openapi_documents_watches_and_file_urls() {
    let s = TestServer::start().await;
    let (status, doc) = s.request(Method::GET, "/v1/openapi.json", None).await;
    assert_eq!(status, 200);
    for p in [
        "/v1/sandboxes/{id}/files/watch",
        "/v1/sandboxes/{id}/files/watchers",
        "/v1/sandboxes/{id}/files/watchers/{wid}",
        "/v1/sandboxes/{id}/files/watchers/{wid}/events",
        "/v1/sandboxes/{id}/files/url",
    ] {
        assert!(doc["paths"][p].is_object(), "openapi lacks {p}");
    }
    for schema in [
        "FileEvent",
        "WatchReady",
        "WatcherEvents",
        "FileUrlRequest",
        "FileUrl",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "openapi lacks {schema}"
        );
    }
    let read = &doc["paths"]["/v1/sandboxes/{id}/files"]["get"];
    assert_eq!(read["security"][1]["fileUrlSignature"], json!([]), "{read}");
}
