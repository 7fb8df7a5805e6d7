//! The template build API against a real server (`POST /v1/templates`, builds, their logs,
//! cancel, `DELETE /v1/templates/{name}`) and `hutch template build -f` end to end.
//!
//! Dockerfiles start `FROM minimal` (busybox), so no build needs a network. Templates are
//! built into the shared templates directory under names of their own test and deleted
//! at the end (also when a test fails: [`TemplateGuard`]). What the builds do step by step
//! (cache hits, stages, failing `RUN`s) is `hutch-build`'s tests.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hutch_testkit::{hutch_bin, templates_dir, wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// Deletes its template from the shared directory when dropped, if a test left it there.
/// Declare it before the server: the server (and its sandboxes) go first.
struct TemplateGuard(String);

impl TemplateGuard {
    /// A template name of `test`'s own.
    fn new(test: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        Self(format!("api-{test}-{}-{nanos:x}", std::process::id()))
    }
}

impl Drop for TemplateGuard {
    fn drop(&mut self) {
        if let Ok(store) = hutch_template::TemplateStore::open(templates_dir()) {
            let _ = store.remove(&self.0);
        }
        // The store's lock file of the name stays after a removal.
        let _ = std::fs::remove_file(templates_dir().join(format!(".lock-{}", self.0)));
    }
}

/// A tar stream of `files` (path, contents).
fn tar_of(files: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data.as_bytes())
            .expect("append");
    }
    b.into_inner().expect("finish")
}

/// `POST /v1/templates?{query}` with `tar`: status, `Location`, body.
async fn post_context(s: &TestServer, query: &str, tar: Vec<u8>) -> (u16, Option<String>, Value) {
    let resp = s
        .http
        .post(format!("{}/v1/templates?{query}", s.url))
        .bearer_auth(&s.key)
        .header("content-type", "application/x-tar")
        .body(tar)
        .send()
        .await
        .expect("post the context");
    let status = resp.status().as_u16();
    let location = resp
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let v = resp.json().await.unwrap_or(Value::Null);
    (status, location, v)
}

/// Start a build of `name` from `files`; its id.
async fn start_build(s: &TestServer, name: &str, files: &[(&str, &str)]) -> String {
    let (status, _, v) = post_context(s, &format!("name={name}"), tar_of(files)).await;
    assert_eq!(status, 202, "{v}");
    v["id"].as_str().expect("build id").to_string()
}

/// Wait until build `id` of `name` has ended; its view.
async fn wait_build(s: &TestServer, name: &str, id: &str) -> Value {
    wait_until(Duration::from_secs(120), async || {
        let (_, v) = s
            .request(
                Method::GET,
                &format!("/v1/templates/{name}/builds/{id}"),
                None,
            )
            .await;
        matches!(
            v["status"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        )
        .then_some(v)
    })
    .await
    .expect("the build ended")
}

/// One SSE event: its `event:`, `id:` and data as JSON.
#[derive(Debug)]
struct Sse {
    event: String,
    id: Option<String>,
    data: Value,
}

fn parse_sse(text: &str) -> Vec<Sse> {
    text.split("\n\n")
        .filter_map(|block| {
            let mut event = None;
            let mut id = None;
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = Some(v.trim().to_string());
                } else if let Some(v) = line.strip_prefix("id:") {
                    id = Some(v.trim().to_string());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.trim_start().to_string());
                }
            }
            Some(Sse {
                event: event?,
                id,
                data: serde_json::from_str(&data.join("\n")).unwrap_or(Value::Null),
            })
        })
        .collect()
}

/// `GET …/logs?{query}` asking for `accept`; the whole answer, which must end by itself
/// within `within`.
async fn read_logs(
    s: &TestServer,
    name: &str,
    id: &str,
    query: &str,
    accept: &str,
    within: Duration,
) -> (u16, String) {
    let resp = s
        .http
        .get(format!(
            "{}/v1/templates/{name}/builds/{id}/logs?{query}",
            s.url
        ))
        .bearer_auth(&s.key)
        .header("accept", accept)
        .send()
        .await
        .expect("logs");
    let status = resp.status().as_u16();
    let mut body = resp.bytes_stream();
    let mut text = Vec::new();
    let read = tokio::time::timeout(within, async {
        while let Some(chunk) = body.next().await {
            text.extend_from_slice(&chunk.expect("log bytes"));
        }
    })
    .await;
    assert!(read.is_ok(), "the log answer did not end within {within:?}");
    (status, String::from_utf8_lossy(&text).into_owned())
}

#[tokio::test]
async fn a_build_is_accepted_followed_and_read_back() {
    let guard = TemplateGuard::new("read");
    let name = guard.0.clone();
    let s = TestServer::start().await;
    let dockerfile = "FROM minimal\nRUN echo step-output && echo step-error >&2\nCOPY a.txt /a\n";
    // Over the server's JSON body limit (1 MiB): a context is streamed, not limited by it.
    let big = "b".repeat(3 << 20);
    let (status, location, v) = post_context(
        &s,
        &format!("name={name}"),
        tar_of(&[
            ("Dockerfile", dockerfile),
            ("a.txt", "alpha\n"),
            ("big.bin", &big),
        ]),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    assert!(id.starts_with("bld_"), "{v}");
    assert_eq!(
        location.as_deref(),
        Some(format!("/v1/templates/{name}/builds/{id}").as_str())
    );
    assert_eq!(v["template"], name.as_str());
    assert!(
        matches!(v["status"].as_str(), Some("queued" | "running")),
        "{v}"
    );
    let instructions: Vec<&str> = v["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| s["instruction"].as_str())
        .collect();
    assert_eq!(
        instructions,
        [
            "RUN echo step-output && echo step-error >&2",
            "COPY a.txt /a"
        ]
    );

    // Followed as SSE from the start: every line, then `end`, and the answer closes.
    let (status, text) = read_logs(
        &s,
        &name,
        &id,
        "follow=true",
        "text/event-stream",
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(status, 200);
    let events = parse_sse(&text);
    let last = events.last().expect("events");
    assert_eq!(last.event, "end", "{text}");
    assert_eq!(last.data, json!({"status": "succeeded"}), "{text}");
    let logs: Vec<&Sse> = events.iter().filter(|e| e.event == "log").collect();
    for e in &logs {
        assert_eq!(
            e.id.as_deref(),
            Some(e.data["seq"].to_string().as_str()),
            "{e:?}"
        );
    }
    let seqs: Vec<u64> = logs.iter().filter_map(|e| e.data["seq"].as_u64()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let find = |stream: &str, text: &str| {
        logs.iter()
            .find(|e| e.data["stream"] == stream && e.data["text"] == text)
            .unwrap_or_else(|| panic!("no {stream} line {text:?} in {events:?}"))
    };
    assert_eq!(find("stdout", "step-output").data["step"], 1);
    assert_eq!(find("stderr", "step-error").data["step"], 1);

    let view = wait_build(&s, &name, &id).await;
    assert_eq!(view["status"], "succeeded", "{view}");
    assert!(
        view["finished_at"].is_string() && view["duration_ms"].is_u64(),
        "{view}"
    );
    let statuses: Vec<&str> = view["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| s["status"].as_str())
        .collect();
    assert_eq!(statuses, ["done", "done"], "{view}");

    // Text: one line per log line; JSON: the lines.
    let (_, text) = read_logs(&s, &name, &id, "", "text/plain", Duration::from_secs(10)).await;
    assert!(text.lines().any(|l| l == "step-output"), "{text}");
    let (_, body) = read_logs(
        &s,
        &name,
        &id,
        "",
        "application/json",
        Duration::from_secs(10),
    )
    .await;
    let v: Value = serde_json::from_str(&body).expect("json");
    let lines = v["lines"].as_array().expect("lines");
    assert_eq!(lines.len(), logs.len(), "{v}");
    assert!(lines.iter().any(|l| l["text"] == "step-error"), "{v}");
    // Following a build that has ended answers at once, with its `end`.
    let (_, text) = read_logs(
        &s,
        &name,
        &id,
        "follow=true",
        "text/event-stream",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        parse_sse(&text).last().map(|e| e.event.as_str()),
        Some("end"),
        "{text}"
    );

    let (status, t) = s
        .request(Method::GET, &format!("/v1/templates/{name}"), None)
        .await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(
        (t["name"].clone(), t["ready"].clone()),
        (json!(name), json!(true))
    );
    let (_, list) = s
        .request(Method::GET, &format!("/v1/templates/{name}/builds"), None)
        .await;
    assert_eq!(list["builds"][0]["id"], id.as_str(), "{list}");
    let (status, v) = s
        .request(Method::DELETE, &format!("/v1/templates/{name}"), None)
        .await;
    assert_eq!(status, 204, "{v}");
}

#[tokio::test]
async fn a_cancelled_build_ends_at_once_and_the_old_template_stays() {
    let guard = TemplateGuard::new("cancel");
    let name = guard.0.clone();
    let s = TestServer::start().await;
    let first = start_build(
        &s,
        &name,
        &[("Dockerfile", "FROM minimal\nRUN echo one > /version\n")],
    )
    .await;
    assert_eq!(wait_build(&s, &name, &first).await["status"], "succeeded");

    let id = start_build(&s, &name, &[("Dockerfile", "FROM minimal\nRUN sleep 30\n")]).await;
    // A follower from before the cancel sees the end.
    let follower = {
        let (url, key, path) = (
            s.url.clone(),
            s.key.clone(),
            format!("/v1/templates/{name}/builds/{id}/logs?follow=true"),
        );
        tokio::spawn(async move {
            let resp = reqwest::Client::new()
                .get(format!("{url}{path}"))
                .bearer_auth(key)
                .header("accept", "text/event-stream")
                .send()
                .await
                .expect("follow");
            resp.text().await.expect("the followed log")
        })
    };
    wait_until(Duration::from_secs(60), async || {
        let (_, v) = s
            .request(
                Method::GET,
                &format!("/v1/templates/{name}/builds/{id}"),
                None,
            )
            .await;
        (v["steps"][0]["status"] == "running").then_some(())
    })
    .await
    .expect("the RUN step started");
    let asked = Instant::now();
    let (status, v) = s
        .request(
            Method::DELETE,
            &format!("/v1/templates/{name}/builds/{id}"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["id"], id.as_str());
    let view = wait_build(&s, &name, &id).await;
    assert_eq!(view["status"], "cancelled", "{view}");
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "the cancel took {:?}",
        asked.elapsed()
    );
    let followed = tokio::time::timeout(Duration::from_secs(10), follower)
        .await
        .expect("the follower's answer ended with the build")
        .expect("follower task");
    let end = parse_sse(&followed).pop().expect("events");
    assert_eq!(end.event, "end", "{followed}");
    assert_eq!(end.data["status"], "cancelled", "{followed}");
    assert!(end.data["error"].is_string(), "{followed}");
    // Its build sandbox is gone, and the template is the first build's.
    assert_eq!(s.sandbox_ids().await, Vec::<String>::new());
    let sbx = s.create_id(json!({"template": name})).await;
    assert_eq!(s.sh_ok(&sbx, "cat /version").await, "one\n");
    s.kill(&sbx).await;
    let (status, _) = s
        .request(Method::DELETE, &format!("/v1/templates/{name}"), None)
        .await;
    assert_eq!(status, 204);
}

#[tokio::test]
async fn a_bad_dockerfile_or_context_is_400_and_starts_nothing() {
    let guard = TemplateGuard::new("bad");
    let name = guard.0.clone();
    let s = TestServer::start().await;
    let (status, _, v) = post_context(
        &s,
        &format!("name={name}"),
        tar_of(&[(
            "Dockerfile",
            "FROM minimal\nRUN true\n\n# a comment\nENV A=1\nWORKDIR /w\nFOO bar\n",
        )]),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "invalid_dockerfile", "{v}");
    assert_eq!(
        v["error"]["message"], "Dockerfile line 7: unknown instruction \"FOO\"",
        "{v}"
    );
    let (status, _, v) = post_context(
        &s,
        &format!("name={name}"),
        tar_of(&[("a.txt", "no Dockerfile")]),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "bad_request", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("has no Dockerfile")),
        "{v}"
    );
    let (status, v) = s
        .request(Method::GET, &format!("/v1/templates/{name}/builds"), None)
        .await;
    assert_eq!(status, 404, "no build was started: {v}");
    let leftovers: Vec<_> = std::fs::read_dir(s.state_dir.join("builds"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| std::fs::read_dir(e.path()).is_ok_and(|mut d| d.next().is_some()))
        .collect();
    assert!(leftovers.is_empty(), "contexts left: {leftovers:?}");
}

#[tokio::test]
async fn a_context_over_the_servers_cap_is_413() {
    let s = TestServer::start_with(&["--max-build-context", "64KiB"]).await;
    let big = "x".repeat(256 << 10);
    let tar = tar_of(&[("Dockerfile", "FROM minimal\n"), ("big.bin", &big)]);
    let (status, _, v) = post_context(&s, "name=api-too-large", tar.clone()).await;
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["error"]["code"], "payload_too_large", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("65536 bytes") && m.contains("--max-build-context")),
        "{v}"
    );
    // Streamed without a length: refused once past the cap, and the client reads why.
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
        tar.chunks(8192).map(|c| Ok(c.to_vec())).collect();
    let resp = s
        .http
        .post(format!("{}/v1/templates?name=api-too-large", s.url))
        .bearer_auth(&s.key)
        .header("content-type", "application/x-tar")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            pieces,
        )))
        .send()
        .await
        .expect("post streamed");
    assert_eq!(resp.status().as_u16(), 413);
}

#[tokio::test]
async fn deleting_a_template_in_use_is_409_naming_the_sandbox() {
    let guard = TemplateGuard::new("inuse");
    let name = guard.0.clone();
    let s = TestServer::start().await;
    let id = start_build(
        &s,
        &name,
        &[("Dockerfile", "FROM minimal\nRUN touch /built\n")],
    )
    .await;
    assert_eq!(wait_build(&s, &name, &id).await["status"], "succeeded");
    let sbx = s.create_id(json!({"template": name})).await;
    let (status, v) = s
        .request(Method::DELETE, &format!("/v1/templates/{name}"), None)
        .await;
    assert_eq!(status, 409, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("sandbox {sbx}"))),
        "{v}"
    );
    let (status, v) = s
        .request(Method::DELETE, "/v1/templates/api-no-such-template", None)
        .await;
    assert_eq!(status, 404, "{v}");
    s.kill(&sbx).await;
    let (status, v) = s
        .request(Method::DELETE, &format!("/v1/templates/{name}"), None)
        .await;
    assert_eq!(status, 204, "{v}");
    let (status, _) = s
        .request(Method::GET, &format!("/v1/templates/{name}"), None)
        .await;
    assert_eq!(status, 404);
}

fn hutch(s: &TestServer, args: &[&str]) -> Output {
    Command::new(hutch_bin())
        .args(args)
        .env("HUTCH_URL", &s.url)
        .env("HUTCH_API_KEY", &s.key)
        .output()
        .expect("run hutch")
}

#[tokio::test]
async fn the_cli_builds_a_dockerfile_through_the_api_and_a_sandbox_runs_on_it() {
    let guard = TemplateGuard::new("cli");
    let name = guard.0.clone();
    // The ignored file alone is over the cap: the build works only if it is not sent.
    let s = TestServer::start_with(&["--max-build-context", "256KiB"]).await;
    let context = tempfile::tempdir().expect("context");
    let elsewhere = tempfile::tempdir().expect("dockerfile dir");
    std::fs::write(context.path().join("a.txt"), "alpha\n").expect("a.txt");
    std::fs::write(context.path().join("huge.bin"), vec![b'h'; 1 << 20]).expect("huge");
    std::fs::write(context.path().join(".dockerignore"), "huge.bin\n").expect("ignore");
    let dockerfile = elsewhere.path().join("Dockerfile.api");
    std::fs::write(
        &dockerfile,
        "FROM minimal\nRUN echo hi > /x\nCOPY a.txt /a\n",
    )
    .expect("Dockerfile");
    let o = hutch(
        &s,
        &[
            "template",
            "build",
            &name,
            "-f",
            dockerfile.to_str().expect("utf-8"),
            context.path().to_str().expect("utf-8"),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{o:?}");
    assert!(err.contains("#1 [1/2] RUN echo hi > /x"), "{err}");
    assert!(err.contains("#2 [2/2] COPY a.txt /a"), "{err}");
    assert!(err.contains(&format!("template {name} is ready")), "{err}");

    let o = hutch(&s, &["create", "--template", &name]);
    assert!(o.status.success(), "{o:?}");
    let sbx = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let o = hutch(&s, &["exec", &sbx, "--", "cat", "/x", "/a"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hi\nalpha\n", "{o:?}");
    s.kill(&sbx).await;

    // A failing step: a non-zero exit and the error, the template kept as it was.
    std::fs::write(&dockerfile, "FROM minimal\nRUN echo broken; exit 3\n").expect("Dockerfile");
    let o = hutch(
        &s,
        &[
            "template",
            "build",
            &name,
            "-f",
            dockerfile.to_str().expect("utf-8"),
            context.path().to_str().expect("utf-8"),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{o:?}");
    assert!(err.contains("#1 broken"), "{err}");
    assert!(err.contains("failed"), "{err}");
    let o = hutch(&s, &["template", "rm", &name]);
    assert!(o.status.success(), "{o:?}");
    let o = hutch(&s, &["template", "inspect", &name]);
    assert!(!o.status.success(), "{o:?}");
}

#[tokio::test]
async fn openapi_documents_the_template_routes() {
    let s = TestServer::start().await;
    let (status, doc) = s.request(Method::GET, "/v1/openapi.json", None).await;
    assert_eq!(status, 200);
    for (path, methods) in [
        ("/v1/templates", &["get", "post"][..]),
        ("/v1/templates/{name}", &["get", "delete"][..]),
        ("/v1/templates/{name}/builds", &["get"][..]),
        ("/v1/templates/{name}/builds/{id}", &["get", "delete"][..]),
        ("/v1/templates/{name}/builds/{id}/logs", &["get"][..]),
    ] {
        for method in methods {
            assert!(
                doc["paths"][path][method].is_object(),
                "openapi lacks {method} {path}"
            );
        }
    }
    assert!(doc["paths"]["/v1/templates"]["post"]["responses"]["202"].is_object());
    for schema in [
        "Build",
        "BuildStep",
        "BuildList",
        "BuildLogLine",
        "BuildLogLines",
        "BuildEnd",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "openapi lacks {schema}"
        );
    }
}

#[tokio::test]
async fn a_tag_names_a_revision_that_outlives_rebuilds() {
    let guard = TemplateGuard::new("tags");
    let name = guard.0.clone();
    let s = TestServer::start().await;
    let build = |query: String, content: &'static str| {
        let s = &s;
        let name = name.clone();
        async move {
            let dockerfile = format!("FROM minimal\nRUN echo {content} > /v\n");
            let (status, _, v) =
                post_context(s, &query, tar_of(&[("Dockerfile", &dockerfile)])).await;
            assert_eq!(status, 202, "{v}");
            assert_eq!(
                v["template"],
                name.as_str(),
                "the tag is not part of the name"
            );
            let done = wait_build(s, &name, v["id"].as_str().expect("id")).await;
            assert_eq!(done["status"], "succeeded", "{done}");
        }
    };
    build(format!("name={name}:v1"), "one").await;
    build(format!("name={name}"), "two").await;
    let (status, t) = s
        .request(Method::GET, &format!("/v1/templates/{name}"), None)
        .await;
    assert_eq!(status, 200, "{t}");
    let v1 = t["tags"]["v1"].as_u64().expect("the tag is listed");
    assert_eq!(t["rev"].as_u64(), Some(v1 + 1), "{t}");
    let read = |template: String| {
        let s = &s;
        async move {
            let id = s
                .create_id(json!({"template": template, "isolation": "ns"}))
                .await;
            let (out, code) = s.sh(&id, "cat /v").await;
            assert_eq!(s.kill(&id).await, 204);
            assert_eq!(code, 0, "{out}");
            out
        }
    };
    assert_eq!(read(format!("{name}:v1")).await, "one\n");
    assert_eq!(read(name.clone()).await, "two\n");
    // Nothing uses the tagged revision now, and another build collects unused revisions:
    // the tag keeps it.
    build(format!("name={name}"), "three").await;
    assert_eq!(read(format!("{name}:v1")).await, "one\n");
    assert_eq!(read(format!("{name}@{v1}")).await, "one\n");
    let (status, v) = s
        .request(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"template": format!("{name}:nope")})),
        )
        .await;
    assert_eq!(status, 404, "{v}");
    assert!(v.to_string().contains("has no tag \\\"nope\\\""), "{v}");
    let (status, _, v) = post_context(
        &s,
        &format!("name={name}:.bad"),
        tar_of(&[("Dockerfile", "FROM minimal\n")]),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    // A tag moves to another revision, and goes.
    let (_, t) = s
        .request(Method::GET, &format!("/v1/templates/{name}"), None)
        .await;
    let newest = t["rev"].as_u64().expect("rev");
    let tag_path = format!("/v1/templates/{name}/tags/v1");
    let (status, v) = s
        .request(Method::PUT, &tag_path, Some(json!({"rev": newest})))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["tags"]["v1"].as_u64(), Some(newest), "{v}");
    assert_eq!(read(format!("{name}:v1")).await, "three\n");
    let (status, v) = s
        .request(Method::PUT, &tag_path, Some(json!({"rev": newest + 5})))
        .await;
    assert_eq!(status, 404, "a revision that is not there: {v}");
    let (status, _) = s.request(Method::DELETE, &tag_path, None).await;
    assert_eq!(status, 204);
    let (status, v) = s.request(Method::DELETE, &tag_path, None).await;
    assert_eq!(status, 404, "{v}");
    let (status, v) = s
        .request(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"template": format!("{name}:v1")})),
        )
        .await;
    assert_eq!(status, 404, "{v}");
    drop(s);
    drop(guard);
}

#[tokio::test]
async fn builds_past_a_tenants_bound_are_429_naming_it() {
    let guard = TemplateGuard::new("bound");
    let other = TemplateGuard::new("bound-admin");
    let s = TestServer::start_with(&["--max-builds-per-tenant", "1"]).await;
    let key = s.tenant_key("builders", "full").await;
    let post = |key: String, name: String| {
        let s = &s;
        async move {
            let tar = tar_of(&[("Dockerfile", "FROM minimal\nRUN sleep 30\n")]);
            let resp = s
                .http
                .post(format!("{}/v1/templates?name={name}", s.url))
                .bearer_auth(&key)
                .header("content-type", "application/x-tar")
                .body(tar)
                .send()
                .await
                .expect("post");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, first) = post(key.clone(), guard.0.clone()).await;
    assert_eq!(status, 202, "{first}");
    let (status, v) = post(key.clone(), format!("{}-2", guard.0)).await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "too_many_builds", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("the limit per tenant"),
        "{v}"
    );
    // Another caller is not held up by this tenant's bound.
    let (status, admin) = post(s.key.clone(), other.0.clone()).await;
    assert_eq!(status, 202, "{admin}");
    for (k, b) in [(&key, &first), (&s.key, &admin)] {
        let (status, v) = s
            .request_as(
                k,
                Method::DELETE,
                &format!(
                    "/v1/templates/{}/builds/{}",
                    b["template"].as_str().expect("template"),
                    b["id"].as_str().expect("id")
                ),
                None,
            )
            .await;
        assert_eq!(status, 200, "{v}");
    }
    // Once the first has ended, the tenant builds again.
    wait_build(&s, &guard.0, first["id"].as_str().expect("id")).await;
    let (status, v) = post(key, format!("{}-3", guard.0)).await;
    assert_eq!(status, 202, "{v}");
    let (status, _) = s
        .request(
            Method::DELETE,
            &format!(
                "/v1/templates/{}-3/builds/{}",
                guard.0,
                v["id"].as_str().expect("id")
            ),
            None,
        )
        .await;
    assert_eq!(status, 200);
    drop(s);
    drop(other);
    drop(guard);
}

#[tokio::test]
async fn a_tenants_build_sandboxes_count_against_its_quotas() {
    let guard = TemplateGuard::new("quota");
    let name = guard.0.clone();
    let s = TestServer::start().await;
    // Less than a build sandbox asks for (2 CPUs, 2 GiB): it is fitted to the quotas.
    s.tenant(
        "quota-builders",
        json!({"quotas": {"max_sandboxes": 1, "max_cpus": 1, "max_memory_mib": 1024}}),
    )
    .await;
    let key = s.tenant_key("quota-builders", "full").await;
    let post = || async {
        let resp = s
            .http
            .post(format!("{}/v1/templates?name={name}", s.url))
            .bearer_auth(&key)
            .header("content-type", "application/x-tar")
            .body(tar_of(&[(
                "Dockerfile",
                "FROM minimal\nRUN echo built > /built\n",
            )]))
            .send()
            .await
            .expect("post");
        assert_eq!(resp.status().as_u16(), 202);
        let v: Value = resp.json().await.expect("json");
        v["id"].as_str().expect("build id").to_owned()
    };
    // The tenant's one sandbox is in use: the build's RUN needs a second, which its quota
    // refuses, and the build says so.
    let (status, sandbox) = s
        .request_as(
            &key,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"cpus": 0.25, "memory_mib": 128})),
        )
        .await;
    assert_eq!(status, 201, "{sandbox}");
    let id = post().await;
    let failed = wait_build(&s, &name, &id).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        ["max_sandboxes", "max_cpus", "max_memory_mib"]
            .iter()
            .any(|q| error.contains(q)),
        "the quota is named: {failed}"
    );
    // With the sandbox gone the same build runs.
    let sid = sandbox["id"].as_str().expect("id");
    let (status, _) = s
        .request_as(&key, Method::DELETE, &format!("/v1/sandboxes/{sid}"), None)
        .await;
    assert_eq!(status, 204);
    let id = post().await;
    let done = wait_build(&s, &name, &id).await;
    assert_eq!(done["status"], "succeeded", "{done}");
}
