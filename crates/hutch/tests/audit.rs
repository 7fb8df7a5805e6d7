//! The audit log: every mutating call and every exec of a key is recorded (who, key id,
//! tenant, route, sandbox, argv, status, time) without output or file contents, written in
//! batches off the request path, and read back with filters and pages, each tenant its own.

use std::time::Duration;

use hutch_testkit::{wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// Every entry `key` reads at `/v1/audit?{query}`, once the batch holding `until` is written.
async fn entries_once(
    s: &TestServer,
    key: &str,
    query: &str,
    until: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    wait_until(Duration::from_secs(20), async || {
        let (status, v) = s
            .request_as(key, Method::GET, &format!("/v1/audit?{query}"), None)
            .await;
        assert_eq!(status, 200, "{v}");
        let entries = v["entries"].as_array().cloned().unwrap_or_default();
        until(&entries).then_some(entries)
    })
    .await
    .expect("the audit batch was written")
}

#[tokio::test]
async fn calls_and_execs_are_audited_without_output_and_each_tenant_reads_its_own() {
    let s = TestServer::start().await;
    s.tenant("acme", json!({})).await;
    let (status, key) = s
        .request(
            Method::POST,
            "/v1/keys",
            Some(json!({"tenant": "acme", "name": "ci"})),
        )
        .await;
    assert_eq!(status, 201, "{key}");
    let secret = key["secret"].as_str().expect("secret").to_string();
    let key_id = key["id"].as_str().expect("id").to_string();
    let (status, v) = s
        .request_as(&secret, Method::POST, "/v1/sandboxes", Some(json!({})))
        .await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    let (status, v) = s
        .request_as(
            &secret,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": ["sh", "-c", "echo output-not-audited"]})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let put = s
        .http
        .put(format!("{}/v1/sandboxes/{id}/files?path=/tmp/f", s.url))
        .bearer_auth(&secret)
        .body("contents-not-audited")
        .send()
        .await
        .expect("put");
    assert_eq!(put.status().as_u16(), 204);
    // Refused calls are audited with their status; reads are not.
    let (status, _) = s
        .request_as(
            &secret,
            Method::POST,
            &format!("/v1/sandboxes/{id}/resume"),
            None,
        )
        .await;
    assert_eq!(status, 409);
    let (status, _) = s
        .request_as(&secret, Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 200);
    // Another tenant's call.
    let other = s.tenant_key("other", "full").await;
    let (status, _) = s
        .request_as(
            &other,
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "v", "size_mib": 8})),
        )
        .await;
    assert_eq!(status, 201);

    let entries = entries_once(&s, &secret, "", |e| e.len() >= 4).await;
    let summary: Vec<(String, String, u64)> = entries
        .iter()
        .map(|e| {
            (
                e["method"].as_str().unwrap_or_default().to_string(),
                e["route"].as_str().unwrap_or_default().to_string(),
                e["status"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("POST".into(), "/v1/sandboxes".into(), 201),
            ("POST".into(), "/v1/sandboxes/{id}/exec".into(), 200),
            ("PUT".into(), "/v1/sandboxes/{id}/files".into(), 204),
            ("POST".into(), "/v1/sandboxes/{id}/resume".into(), 409),
        ],
        "{entries:?}"
    );
    for e in &entries {
        assert_eq!(e["key_id"], key_id.as_str(), "{e}");
        assert_eq!(e["tenant"], "acme", "{e}");
        assert!(e["at"].as_str().is_some_and(|t| t.ends_with('Z')), "{e}");
    }
    assert_eq!(entries[1]["sandbox_id"], id.as_str());
    assert_eq!(entries[1]["path"], format!("/v1/sandboxes/{id}/exec"));
    assert_eq!(
        entries[1]["argv"],
        json!(["sh", "-c", "echo output-not-audited"])
    );
    let text = Value::Array(entries.clone()).to_string();
    assert!(
        !text.contains("output-not-audited\\n") && !text.contains("contents-not-audited"),
        "{text}"
    );
    // The admin sees both tenants; filters narrow it; pages walk it.
    let all = entries_once(&s, &s.key, "", |e| e.iter().any(|x| x["tenant"] == "other")).await;
    assert!(all.len() >= 5, "{all:?}");
    let only_other = entries_once(&s, &s.key, "tenant=other", |e| !e.is_empty()).await;
    assert!(
        only_other.iter().all(|e| e["tenant"] == "other"),
        "{only_other:?}"
    );
    let by_sandbox = entries_once(&s, &secret, &format!("sandbox_id={id}"), |e| e.len() >= 3).await;
    assert_eq!(
        by_sandbox.len(),
        3,
        "create is not on the sandbox's path: {by_sandbox:?}"
    );
    let (_, page) = s
        .request_as(&secret, Method::GET, "/v1/audit?limit=2", None)
        .await;
    assert_eq!(page["entries"].as_array().map(Vec::len), Some(2));
    let cursor = page["next_cursor"]
        .as_str()
        .expect("more pages")
        .to_string();
    let (_, rest) = s
        .request_as(
            &secret,
            Method::GET,
            &format!("/v1/audit?limit=10&cursor={cursor}"),
            None,
        )
        .await;
    assert_eq!(
        rest["entries"].as_array().map(Vec::len),
        Some(entries.len() - 2)
    );
    // A tenant never reads another's, and read-only keys read none.
    let (status, v) = s
        .request_as(&secret, Method::GET, "/v1/audit?tenant=other", None)
        .await;
    assert_eq!(status, 403, "{v}");
    let reader = s.tenant_key("acme", "read-only").await;
    let (status, v) = s.request_as(&reader, Method::GET, "/v1/audit", None).await;
    assert_eq!(status, 403, "{v}");
    let (status, v) = s
        .request_as(&secret, Method::GET, "/v1/audit?since=yesterday", None)
        .await;
    assert_eq!(status, 400, "{v}");
    // The log outlives a restart of the server.
    let mut s = s;
    s.stop_server();
    s.spawn_server().await;
    let (_, v) = s.request_as(&secret, Method::GET, "/v1/audit", None).await;
    assert!(
        v["entries"].as_array().map(Vec::len).unwrap_or(0) >= 4,
        "{v}"
    );
}
