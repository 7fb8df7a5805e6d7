//! The Dockerfile step cache's usage and pruning through the API (`GET /v1/build-cache`,
//! `POST /v1/build-cache/prune`): least recently used entries go first with their build
//! snapshots, a hit counts as a use, snapshots no entry names are removed, and tenant keys
//! are refused.

use std::path::Path;
use std::time::{Duration, SystemTime};

use hutch_testkit::TestServer;
use reqwest::Method;
use serde_json::{json, Value};

/// The index files of the server's step cache.
fn index_files(state_dir: &Path) -> Vec<std::path::PathBuf> {
    match std::fs::read_dir(state_dir.join("build-cache")) {
        Ok(d) => d.flatten().map(|e| e.path()).collect(),
        Err(_) => Vec::new(),
    }
}

/// Snapshot directories on disk.
fn snapshot_dirs(state_dir: &Path) -> usize {
    std::fs::read_dir(state_dir.join("snapshots"))
        .map(|d| d.flatten().count())
        .unwrap_or(0)
}

fn set_used(path: &Path, ago: Duration) {
    std::fs::File::options()
        .append(true)
        .open(path)
        .expect("open an index file")
        .set_modified(SystemTime::now() - ago)
        .expect("set its time");
}

async fn prune(s: &TestServer, body: Value) -> Value {
    let (status, v) = s
        .request(Method::POST, "/v1/build-cache/prune", Some(body))
        .await;
    assert_eq!(status, 200, "{v}");
    v
}

async fn usage(s: &TestServer) -> Value {
    let (status, v) = s.request(Method::GET, "/v1/build-cache", None).await;
    assert_eq!(status, 200, "{v}");
    v
}

#[tokio::test]
async fn the_step_cache_is_pruned_least_recently_used_first() {
    let s = TestServer::start_with_env(&[], &[(hutch_build::ORPHAN_GRACE_ENV, "0")]).await;
    let name = format!("prune-{}", std::process::id());
    let dockerfile =
        "FROM base\nRUN echo one > /one\nRUN echo two > /two\nRUN echo three > /three\n";
    let built = s.build_dockerfile_as(&s.key, &name, dockerfile).await;
    assert_eq!(built["status"], "succeeded", "{built}");
    let u = usage(&s).await;
    assert_eq!(u["entries"], 3, "{u}");
    assert!(u["bytes"].as_u64().unwrap_or(0) > 0, "{u}");
    let snapshots_before = snapshot_dirs(&s.state_dir);
    assert!(snapshots_before >= 3, "{snapshots_before}");

    // Age every entry; a rebuild hits all three, which makes them recent again.
    let files = index_files(&s.state_dir);
    assert_eq!(files.len(), 3);
    for f in &files {
        set_used(f, Duration::from_secs(3 * 86400));
    }
    let again = s.build_dockerfile_as(&s.key, &name, dockerfile).await;
    assert_eq!(again["steps"][2]["status"], "cached", "{again}");
    let kept = prune(&s, json!({"unused_for_seconds": 86400})).await;
    assert_eq!(kept["removed_entries"], 0, "hits count as uses: {kept}");

    // Two entries unused for three days go, with their snapshots; the third stays.
    let mut files = index_files(&s.state_dir);
    files.sort();
    for f in &files[..2] {
        set_used(f, Duration::from_secs(3 * 86400));
    }
    let pruned = prune(&s, json!({"unused_for_seconds": 86400})).await;
    assert_eq!(pruned["removed_entries"], 2, "{pruned}");
    assert!(pruned["freed_bytes"].as_u64().unwrap_or(0) > 0, "{pruned}");
    assert_eq!(pruned["usage"]["entries"], 1, "{pruned}");
    assert_eq!(index_files(&s.state_dir), vec![files[2].clone()]);
    assert_eq!(snapshot_dirs(&s.state_dir), snapshots_before - 2);

    // A rebuild with --no-cache rewrites the entries and leaves the old snapshot unnamed:
    // a prune removes it (its grace is 0 here).
    let resp = s
        .http
        .post(format!("{}/v1/templates?name={name}&no_cache=true", s.url))
        .bearer_auth(&s.key)
        .header("content-type", "application/x-tar")
        .body(hutch_testkit::dockerfile_context(dockerfile))
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status().as_u16(), 202);
    let id = resp.json::<Value>().await.expect("json")["id"]
        .as_str()
        .expect("id")
        .to_string();
    hutch_testkit::wait_until(Duration::from_secs(120), async || {
        let (_, v) = s
            .request(
                Method::GET,
                &format!("/v1/templates/{name}/builds/{id}"),
                None,
            )
            .await;
        (v["status"] == "succeeded").then_some(())
    })
    .await
    .expect("the --no-cache build succeeds");
    let swept = prune(&s, json!({"unused_for_seconds": 86400})).await;
    assert_eq!(swept["removed_orphans"], 1, "{swept}");
    assert_eq!(swept["usage"]["entries"], 3, "{swept}");

    // keep_mib 0: everything goes, least recently used first; the template stays usable.
    let all = prune(&s, json!({"keep_mib": 0})).await;
    assert_eq!(all["removed_entries"], 3, "{all}");
    assert_eq!(
        all["usage"],
        json!({"entries": 0, "bytes": 0, "oldest_used_at": null})
    );
    assert!(index_files(&s.state_dir).is_empty());
    let sb = s.create_id(json!({"template": name})).await;
    assert_eq!(
        s.sh_ok(&sb, "cat /one /two /three").await,
        "one\ntwo\nthree\n"
    );

    // Bad bodies, and tenant keys.
    let (status, v) = s
        .request(
            Method::POST,
            "/v1/build-cache/prune",
            Some(json!({"all": true, "keep_mib": 1})),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    let (status, v) = s
        .request(
            Method::POST,
            "/v1/build-cache/prune",
            Some(json!({"everything": 1})),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    let key = s.tenant_key("acme", "full").await;
    for (method, path) in [
        (Method::GET, "/v1/build-cache"),
        (Method::POST, "/v1/build-cache/prune"),
    ] {
        let (status, v) = s.request_as(&key, method, path, None).await;
        assert_eq!(status, 403, "{path}: {v}");
    }
}
