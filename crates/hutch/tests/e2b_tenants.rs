//! Tenants through Hutch's E2B-compatible API: E2B's Python SDK runs with an `e2b_…` key of
//! one tenant (the form its older versions check), and that tenant's key, or a read-only
//! one, aimed at another tenant's sandbox through the E2B control plane gets 404 and 403.

use hutch_testkit::{ensure_template, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// A new key of `tenant` made with `body` (`scope`, `format`); its secret.
async fn key(s: &TestServer, tenant: &str, body: Value) -> String {
    let (status, _) = s
        .request(Method::GET, &format!("/v1/tenants/{tenant}"), None)
        .await;
    if status == 404 {
        s.tenant(tenant, json!({})).await;
    }
    let mut body = body;
    body["tenant"] = tenant.into();
    let (status, v) = s.request(Method::POST, "/v1/keys", Some(body)).await;
    assert_eq!(status, 201, "{v}");
    v["secret"].as_str().expect("secret").to_string()
}

/// A call to the E2B control plane with `X-API-Key: key`.
async fn e2b(
    s: &TestServer,
    key: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let url = s.e2b_url.as_deref().expect("--e2b-listen");
    let mut req = s
        .http
        .request(method, format!("{url}{path}"))
        .header("x-api-key", key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_e2b_api_keeps_tenants_apart_and_takes_e2b_format_keys() {
    ensure_template("base");
    let s = TestServer::start_with(&["--e2b-listen", "127.0.0.1:0"]).await;
    let a = key(&s, "team-a", json!({"scope": "full", "format": "e2b"})).await;
    let b = key(&s, "team-b", json!({"scope": "full"})).await;
    let reader = key(&s, "team-a", json!({"scope": "read-only"})).await;
    // E2B's own SDK, unmodified, with the tenant's e2b_ key.
    let url = s.e2b_url.clone().expect("--e2b-listen");
    hutch_testkit::e2b_scenario(&hutch_testkit::e2b_python(), &url, &a, "basics", &[]);
    // A's sandbox, made through the E2B API, is the tenant's.
    let (status, v) = e2b(
        &s,
        &a,
        Method::POST,
        "/sandboxes",
        Some(json!({"templateID": "base"})),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let id = v["sandboxID"].as_str().expect("sandboxID").to_string();
    let (_, hutch_view) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(
        hutch_view["metadata"]["tenant_id"], "team-a",
        "{hutch_view}"
    );
    // B's key: A's sandbox is unknown; its listing has none of A's.
    for (method, path) in [
        (Method::GET, format!("/sandboxes/{id}")),
        (Method::POST, format!("/sandboxes/{id}/timeout")),
        (Method::POST, format!("/sandboxes/{id}/pause")),
        (Method::DELETE, format!("/sandboxes/{id}")),
    ] {
        let body = (method == Method::POST).then(|| json!({"timeout": 30}));
        let (status, v) = e2b(&s, &b, method.clone(), &path, body).await;
        assert_eq!(status, 404, "{method} {path}: {v}");
    }
    let (status, v) = e2b(&s, &b, Method::GET, "/v2/sandboxes", None).await;
    assert_eq!(status, 200, "{v}");
    assert!(!v.to_string().contains(&id), "B lists A's sandbox: {v}");
    // A read-only key takes no E2B call (E2B's routes read and change alike).
    let (status, v) = e2b(&s, &reader, Method::GET, "/v2/sandboxes", None).await;
    assert_eq!(status, 403, "{v}");
    let (status, _) = e2b(&s, &a, Method::DELETE, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(status, 204);
}
