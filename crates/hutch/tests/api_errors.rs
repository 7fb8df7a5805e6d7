//! Bad input gets a clear 4xx JSON error and loses nothing.

use hutch_testkit::TestServer;
use reqwest::Method;
use serde_json::json;

fn error_code(v: &serde_json::Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("<none>")
}

#[tokio::test]
async fn health_is_public_and_v1_needs_a_key() {
    let s = TestServer::start().await;
    let r = s
        .http
        .get(format!("{}/healthz", s.url))
        .send()
        .await
        .expect("healthz");
    assert_eq!(r.status(), 200);

    let r = s
        .http
        .get(format!("{}/v1/sandboxes", s.url))
        .send()
        .await
        .expect("no key");
    assert_eq!(r.status(), 401);
    let v: serde_json::Value = r.json().await.expect("json");
    assert_eq!(error_code(&v), "unauthorized");

    let r = s
        .http
        .get(format!("{}/v1/sandboxes", s.url))
        .bearer_auth("hk_wrong")
        .send()
        .await
        .expect("wrong key");
    assert_eq!(r.status(), 401);

    let meta = std::fs::metadata(s.state_dir.join("admin.key")).expect("key file");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "admin key must be private"
    );
}

#[tokio::test]
async fn malformed_and_mistyped_bodies_are_400_with_a_message() {
    let s = TestServer::start().await;
    let r = s
        .http
        .post(format!("{}/v1/sandboxes", s.url))
        .bearer_auth(&s.key)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.expect("json");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("malformed JSON"),
        "{v}"
    );

    let (status, v) = s
        .request(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"template": "minimal", "bogus": 1})),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("bogus"),
        "{v}"
    );

    let (status, v) = s
        .request(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"memory_mib": "lots"})),
        )
        .await;
    assert_eq!(status, 400, "{v}");

    let (status, v) = s
        .request(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"memory_mib": 1_000_000_000})),
        )
        .await;
    assert_eq!(status, 422, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("memory_mib"),
        "{v}"
    );

    // Nothing was created by any of these.
    let (_, list) = s.request(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(list["sandboxes"].as_array().map(Vec::len), Some(0));
}

#[tokio::test]
async fn unknown_template_and_unknown_sandbox_are_404() {
    let s = TestServer::start().await;
    let (status, v) = s
        .request(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"template": "no-such-template"})),
        )
        .await;
    assert_eq!(status, 404, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap_or("")
        .contains("no-such-template"));

    for (m, p) in [
        (Method::GET, "/v1/sandboxes/sbx_doesnotexist"),
        (Method::DELETE, "/v1/sandboxes/sbx_doesnotexist"),
        (Method::GET, "/v1/sandboxes/../../etc/passwd"),
    ] {
        let (status, v) = s.request(m.clone(), p, None).await;
        assert_eq!(status, 404, "{m} {p}: {v}");
    }
    let (status, v) = s
        .request(
            Method::POST,
            "/v1/sandboxes/sbx_doesnotexist/exec",
            Some(json!({"cmd": ["true"]})),
        )
        .await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(error_code(&v), "not_found");
}

#[tokio::test]
async fn exec_on_a_destroyed_sandbox_is_404_and_delete_is_idempotent_404() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    assert_eq!(s.kill(&id).await, 204);
    assert_eq!(s.kill(&id).await, 404);
    let (status, _) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": ["true"]})),
        )
        .await;
    assert_eq!(status, 404);
    // The image holding every ns sandbox's writable layer stays mounted while the server
    // runs; the sandbox's own mounts and its subvolume in it must be gone.
    let layers = s.state_dir.join("layers");
    let left: Vec<String> = s
        .mounts_under_state()
        .into_iter()
        .filter(|m| std::path::Path::new(m) != layers)
        .collect();
    assert!(left.is_empty(), "teardown left mounts: {left:?}");
    assert!(!layers.join(&id).exists(), "teardown left its layer");
    assert!(
        !s.state_dir.join("sandboxes").join(&id).exists(),
        "teardown left files"
    );
}

#[tokio::test]
async fn exec_validation_errors_are_clear() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    for (body, needle) in [
        (json!({"cmd": []}), "cmd"),
        (json!({"cmd": ""}), "cmd"),
        (json!({"cmd": ["ls"], "cwd": "relative"}), "cwd"),
        (
            json!({"cmd": ["ls"], "timeout_seconds": -1}),
            "timeout_seconds",
        ),
        (json!({"cmd": ["ls"], "env": {"A=B": "x"}}), "environment"),
    ] {
        let (status, v) = s
            .request(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                Some(body.clone()),
            )
            .await;
        assert_eq!(status, 422, "{body}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains(needle),
            "{body}: {v}"
        );
    }
    let (status, _) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": 5})),
        )
        .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn openapi_templates_and_metrics_are_served() {
    let s = TestServer::start().await;
    let (status, doc) = s.request(Method::GET, "/v1/openapi.json", None).await;
    assert_eq!(status, 200);
    assert!(
        doc["openapi"].as_str().unwrap_or("").starts_with("3."),
        "{doc}"
    );
    for p in [
        "/v1/sandboxes",
        "/v1/sandboxes/{id}",
        "/v1/sandboxes/{id}/exec",
        "/v1/sandboxes/{id}/exec/stream",
        "/v1/sandboxes/{id}/pty",
        "/v1/sandboxes/{id}/files",
        "/v1/sandboxes/{id}/files/list",
        "/v1/templates",
    ] {
        assert!(doc["paths"][p].is_object(), "openapi lacks {p}");
    }
    let (status, t) = s.request(Method::GET, "/v1/templates", None).await;
    assert_eq!(status, 200);
    let names: Vec<&str> = t["templates"]
        .as_array()
        .expect("templates")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"minimal"), "{t}");

    let id = s.create_id(json!({})).await;
    s.exec(&id, json!({"cmd": ["true"]})).await;
    let text = s
        .http
        .get(format!("{}/metrics", s.url))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        text.contains("hutch_sandboxes{state=\"running\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("hutch_sandbox_create_seconds_count 1"),
        "{text}"
    );
    assert!(text.contains("hutch_execs_total 1"), "{text}");
}
