//! Tenants and listings through the typed path: a tenant's key finds only its tenant's
//! sandboxes (another tenant's is 404, word for word like an unknown one), and paginated
//! listings return every record exactly once while sandboxes are being created.
//!
//! Tenants and their keys are made through the API (`hutch_testkit`'s `tenant_key`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hutch_testkit::{wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// A new full key of `tenant` on the server `s`.
async fn tenant_key(s: &TestServer, tenant: &str) -> String {
    s.tenant_key(tenant, "full").await
}

/// A request with `key`: status and JSON.
async fn call(
    s: &TestServer,
    key: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = s
        .http
        .request(method, format!("{}{path}", s.url))
        .bearer_auth(key);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let v = resp.json().await.unwrap_or(Value::Null);
    (status, v)
}

fn ids_of(v: &Value, collection: &str) -> Vec<String> {
    v[collection]
        .as_array()
        .unwrap_or_else(|| panic!("no {collection} in {v}"))
        .iter()
        .filter_map(|s| s["id"].as_str().map(String::from))
        .collect()
}

#[tokio::test]
async fn another_tenants_sandbox_is_404_with_the_message_of_an_unknown_one() {
    let s = TestServer::start().await;
    let acme = tenant_key(&s, "acme").await;
    let other = tenant_key(&s, "other").await;
    // A tenant cannot create into another tenant by naming it in its metadata.
    let (status, v) = call(
        &s,
        &acme,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"metadata": {"tenant_id": "other", "role": "ci"}})),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    assert_eq!(v["metadata"]["tenant_id"], "acme", "{v}");
    assert_eq!(v["metadata"]["role"], "ci", "{v}");

    let unknown = "sbx_doesnotexist00";
    let (status, v) = call(
        &s,
        &other,
        Method::GET,
        &format!("/v1/sandboxes/{unknown}"),
        None,
    )
    .await;
    assert_eq!(status, 404, "{v}");
    let unknown_message = v["error"]["message"]
        .as_str()
        .expect("message")
        .replace(unknown, "<id>");
    for (method, path, body) in [
        (Method::GET, format!("/v1/sandboxes/{id}"), None),
        (Method::DELETE, format!("/v1/sandboxes/{id}"), None),
        (Method::GET, format!("/v1/sandboxes/{id}/usage"), None),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": ["true"]})),
        ),
        (
            Method::PATCH,
            format!("/v1/sandboxes/{id}"),
            Some(json!({"metadata": {"tenant_id": "other"}})),
        ),
        (Method::POST, format!("/v1/sandboxes/{id}/pause"), None),
    ] {
        let (status, v) = call(&s, &other, method.clone(), &path, body).await;
        assert_eq!(status, 404, "{method} {path}: {v}");
        assert_eq!(
            v["error"]["message"]
                .as_str()
                .map(|m| m.replace(&id, "<id>")),
            Some(unknown_message.clone()),
            "{method} {path}: the same answer as for an unknown sandbox"
        );
    }
    let (_, v) = call(&s, &other, Method::GET, "/v1/sandboxes", None).await;
    assert!(ids_of(&v, "sandboxes").is_empty(), "{v}");
    let (_, v) = call(
        &s,
        &other,
        Method::GET,
        "/v1/sandboxes?metadata.tenant_id=acme",
        None,
    )
    .await;
    assert!(ids_of(&v, "sandboxes").is_empty(), "{v}");

    // Its own tenant sees it, and cannot move it by rewriting its metadata.
    let (status, v) = call(
        &s,
        &acme,
        Method::PATCH,
        &format!("/v1/sandboxes/{id}"),
        Some(json!({"metadata": {"tenant_id": "other"}})),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["metadata"]["tenant_id"], "acme", "{v}");
    let (status, v) = call(
        &s,
        &other,
        Method::GET,
        &format!("/v1/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 404, "still not the other tenant's: {v}");
    let (_, v) = call(&s, &acme, Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(ids_of(&v, "sandboxes"), [id.as_str()]);
    // The admin sees every tenant's.
    let (status, v) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["metadata"]["tenant_id"], "acme");
}

/// Walk `/v1/{collection}` with `limit`, waiting before each next page until `before_next`
/// says so; every id seen, in order, and the number of pages.
async fn walk(
    s: &TestServer,
    collection: &str,
    limit: usize,
    mut before_next: impl AsyncFnMut(),
) -> (Vec<String>, usize) {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/{collection}?limit={limit}&cursor={c}"),
            None => format!("/v1/{collection}?limit={limit}"),
        };
        let (status, v) = s.request(Method::GET, &path, None).await;
        assert_eq!(status, 200, "{path}: {v}");
        let page = ids_of(&v, collection);
        assert!(page.len() <= limit, "{path}: {v}");
        seen.extend(page);
        pages += 1;
        match v["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
        before_next().await;
    }
    (seen, pages)
}

fn assert_once_each(seen: &[String], expected: &[String]) {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for id in seen {
        *counts.entry(id.as_str()).or_default() += 1;
    }
    assert!(
        counts.values().all(|n| *n == 1),
        "a record came twice: {seen:?}"
    );
    for id in expected {
        assert!(
            counts.contains_key(id.as_str()),
            "{id} missing from {seen:?}"
        );
    }
}

#[tokio::test]
async fn pages_return_every_sandbox_exactly_once_while_creates_happen() {
    let s = Arc::new(TestServer::start().await);
    let mut before = Vec::new();
    for _ in 0..9 {
        before.push(s.create_id(json!({})).await);
    }
    // A creator keeps adding sandboxes while the listing is walked; each next page waits
    // until at least one more create has landed since the previous page.
    let created = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicUsize::new(0));
    let creator = {
        let (s, created, stop) = (Arc::clone(&s), Arc::clone(&created), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut ids = Vec::new();
            while stop.load(Ordering::SeqCst) == 0 && ids.len() < 20 {
                ids.push(s.create_id(json!({})).await);
                created.fetch_add(1, Ordering::SeqCst);
            }
            ids
        })
    };
    let (seen, pages) = walk(&s, "sandboxes", 4, async || {
        let now = created.load(Ordering::SeqCst);
        wait_until(Duration::from_secs(60), async || {
            (created.load(Ordering::SeqCst) > now).then_some(())
        })
        .await
        .expect("a create lands between pages");
    })
    .await;
    stop.store(1, Ordering::SeqCst);
    let during = creator.await.expect("creator");
    assert!(pages >= 3, "9 sandboxes at 4 a page: {pages} pages");
    assert!(!during.is_empty(), "creates happened during the walk");
    assert_once_each(&seen, &before);
    for id in &seen {
        assert!(
            before.contains(id) || during.contains(id),
            "{id} is no sandbox of this test"
        );
    }
    // Without a limit: everything at once and no cursor, as before pagination.
    let (_, v) = s.request(Method::GET, "/v1/sandboxes", None).await;
    assert!(v.get("next_cursor").is_none(), "{v}");
    assert_eq!(ids_of(&v, "sandboxes").len(), before.len() + during.len());
    // Bad pages are refused with a message.
    for bad in [
        "limit=0",
        "limit=1001",
        "limit=x",
        "limit=2&cursor=nonsense",
    ] {
        let (status, v) = s
            .request(Method::GET, &format!("/v1/sandboxes?{bad}"), None)
            .await;
        assert_eq!(status, 400, "{bad}: {v}");
        assert!(v["error"]["message"].as_str().is_some(), "{bad}: {v}");
    }
    drop(s);
}

#[tokio::test]
async fn snapshots_and_volumes_are_paginated_too() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let mut snaps = Vec::new();
    for n in 0..3 {
        let (status, v) = s
            .request(
                Method::POST,
                &format!("/v1/sandboxes/{id}/snapshots"),
                Some(json!({"name": format!("s{n}")})),
            )
            .await;
        assert_eq!(status, 201, "{v}");
        snaps.push(v["id"].as_str().expect("id").to_string());
    }
    let (seen, pages) = walk(&s, "snapshots", 2, async || {}).await;
    assert_eq!(pages, 2);
    assert_once_each(&seen, &snaps);
    let mut vols = Vec::new();
    for n in 0..3 {
        vols.push(s.volume(&format!("v{n}"), 8).await);
    }
    let (seen, pages) = walk(&s, "volumes", 1, async || {}).await;
    assert_eq!(pages, 3);
    assert_eq!(seen, vols, "oldest first");
    for v in vols {
        let (status, body) = s
            .request(Method::DELETE, &format!("/v1/volumes/{v}"), None)
            .await;
        assert_eq!(status, 204, "{body}");
    }
}

#[tokio::test]
async fn tenants_are_an_admins_and_one_owning_objects_is_not_deleted() {
    let s = TestServer::start().await;
    let acme = tenant_key(&s, "acme").await;
    // A tenant's key cannot make or read tenants, nor act for another tenant.
    for (method, path, body) in [
        (Method::GET, "/v1/tenants", None),
        (Method::POST, "/v1/tenants", Some(json!({"name": "mine"}))),
        (Method::GET, "/v1/tenants/acme", None),
        (
            Method::PATCH,
            "/v1/tenants/acme",
            Some(json!({"quotas": {}})),
        ),
        (Method::DELETE, "/v1/tenants/acme", None),
    ] {
        let (status, v) = call(&s, &acme, method.clone(), path, body).await;
        assert_eq!(status, 403, "{method} {path}: {v}");
    }
    let (status, v) = s
        .request(
            Method::POST,
            "/v1/tenants",
            Some(json!({
                "name": "beta",
                "quotas": {"max_sandboxes": 3, "max_cpus": 1.5},
                "defaults": {"ttl_seconds": 120},
                "allowed_templates": ["minimal"]
            })),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["quotas"]["max_sandboxes"], 3);
    assert_eq!(
        v["quotas"]["max_memory_mib"],
        Value::Null,
        "unset is no limit"
    );
    assert_eq!(v["allowed_templates"], json!(["minimal"]));
    for (body, status_wanted, words) in [
        (json!({"name": "beta"}), 409, "already exists"),
        (json!({"name": "admin"}), 422, "admin keys carry"),
        (json!({"name": "Bad Name"}), 422, "invalid tenant name"),
        (
            json!({"name": "gamma", "quotas": {"max_cpus": 0}}),
            422,
            "quotas.max_cpus must be a positive number",
        ),
        (
            json!({"name": "gamma", "quota": {}}),
            400,
            "unknown field `quota`",
        ),
        (
            json!({"name": "gamma", "defaults": {"network": {"egress": "allow"}}}),
            422,
            "defaults.network",
        ),
    ] {
        let (status, v) = s
            .request(Method::POST, "/v1/tenants", Some(body.clone()))
            .await;
        assert_eq!(status, status_wanted, "{body}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(words), "{body}: {message}");
    }
    let (status, v) = s
        .request(
            Method::PATCH,
            "/v1/tenants/beta",
            Some(json!({"quotas": {"max_sandboxes": 1}, "allowed_templates": null})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["quotas"],
        json!({"max_sandboxes": 1, "max_creates_per_hour": null, "max_cpus": null, "max_memory_mib": null, "max_ttl_seconds": null, "max_sandbox_cpus": null, "max_sandbox_memory_mib": null, "max_sandbox_disk_mib": null, "daily_budget": null, "monthly_budget": null})
    );
    assert_eq!(v["defaults"]["ttl_seconds"], 120, "a part left out stays");
    assert_eq!(v["allowed_templates"], Value::Null);
    let (_, v) = s.request(Method::GET, "/v1/tenants", None).await;
    let names: Vec<&str> = v["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["acme", "beta"]);
    // Inspect shows what its sandboxes use.
    let (status, sbx) = call(
        &s,
        &acme,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"cpus": 0.5})),
    )
    .await;
    assert_eq!(status, 201, "{sbx}");
    let id = sbx["id"].as_str().expect("id").to_string();
    let (_, v) = s.request(Method::GET, "/v1/tenants/acme", None).await;
    assert_eq!(v["usage"]["sandboxes"], 1, "{v}");
    assert_eq!(v["usage"]["cpus"], 0.5, "{v}");
    assert_eq!(v["usage"]["creates_last_hour"], 1, "{v}");
    // Deleting it while it owns a sandbox is refused; afterwards its keys go with it.
    let (status, v) = s.request(Method::DELETE, "/v1/tenants/acme", None).await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(
        v["error"]["message"],
        "tenant acme still owns 1 sandbox: delete them first"
    );
    assert_eq!(s.kill(&id).await, 204);
    let (status, v) = s.request(Method::DELETE, "/v1/tenants/acme", None).await;
    assert_eq!(status, 204, "{v}");
    let (status, _) = call(&s, &acme, Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(status, 401, "its key stopped at once");
    let (status, v) = s.request(Method::GET, "/v1/tenants/acme", None).await;
    assert_eq!(status, 404, "{v}");
    // An admin cannot create for a tenant nobody made.
    let (status, v) = s
        .request(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"metadata": {"tenant_id": "nobody"}})),
        )
        .await;
    assert_eq!(status, 404, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .starts_with("tenant nobody does not exist"));
}

#[tokio::test]
async fn a_tenants_defaults_fill_what_a_create_leaves_out() {
    let s = TestServer::start().await;
    s.tenant(
        "acme",
        json!({"defaults": {
            "ttl_seconds": 123, "cpus": 0.5, "memory_mib": 200, "disk_mib": 300,
            "isolation": "ns", "network": {"egress": "none"}
        }}),
    )
    .await;
    let key = s.tenant_key("acme", "full").await;
    let (status, v) = call(&s, &key, Method::POST, "/v1/sandboxes", Some(json!({}))).await;
    assert_eq!(status, 201, "{v}");
    for (field, want) in [
        ("ttl_seconds", json!(123)),
        ("cpus", json!(0.5)),
        ("memory_mib", json!(200)),
        ("disk_mib", json!(300)),
        ("isolation", json!("ns")),
    ] {
        assert_eq!(v[field], want, "{field}: {v}");
    }
    assert_eq!(v["network"]["egress"], "none", "{v}");
    // What a create says wins.
    let (status, v) = call(
        &s,
        &key,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"ttl_seconds": 60, "cpus": 1, "memory_mib": 256})),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(
        (
            v["ttl_seconds"].clone(),
            v["cpus"].clone(),
            v["memory_mib"].clone()
        ),
        (json!(60), json!(1.0), json!(256))
    );
    assert_eq!(
        v["disk_mib"], 300,
        "what it left out still comes from the tenant"
    );
    // Sandboxes of other tenants, and an admin's own, keep the server's defaults.
    let other = s.create(json!({})).await;
    assert_ne!(other["ttl_seconds"], 123, "{other}");
}

#[tokio::test]
async fn a_tenant_creates_only_from_its_allowed_templates() {
    let s = TestServer::start().await;
    s.tenant("acme", json!({"allowed_templates": ["minimal"]}))
        .await;
    let key = s.tenant_key("acme", "full").await;
    let (status, v) = call(
        &s,
        &key,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"template": "minimal"})),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    for template in ["base", "code-interpreter"] {
        let (status, v) = call(
            &s,
            &key,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"template": template})),
        )
        .await;
        assert_eq!(status, 403, "{template}: {v}");
        assert_eq!(v["error"]["code"], "forbidden");
        assert_eq!(
            v["error"]["message"],
            format!("tenant acme may create sandboxes only from the templates minimal: not {template:?}")
        );
    }
    // The admin's creates are not the tenant's.
    let (status, _) = s
        .request(
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"template": "base"})),
        )
        .await;
    assert_ne!(status, 403);
}

#[tokio::test]
async fn an_admin_acts_for_one_tenant_with_x_hutch_tenant() {
    let s = TestServer::start().await;
    let a = tenant_key(&s, "team-a").await;
    s.tenant("team-b", json!({"defaults": {"ttl_seconds": 77}}))
        .await;
    let (status, v) = call(&s, &a, Method::POST, "/v1/sandboxes", Some(json!({}))).await;
    assert_eq!(status, 201, "{v}");
    let a_id = v["id"].as_str().expect("id").to_string();
    let as_b = |method: Method, path: &str, body: Option<Value>| {
        let mut req = s
            .http
            .request(method, format!("{}{path}", s.url))
            .bearer_auth(&s.key)
            .header("x-hutch-tenant", "team-b");
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move {
            let resp = req.send().await.expect("request");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (status, v) = as_b(Method::POST, "/v1/sandboxes", Some(json!({}))).await;
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["metadata"]["tenant_id"], "team-b", "made for the tenant");
    assert_eq!(v["ttl_seconds"], 77, "with the tenant's defaults");
    let b_id = v["id"].as_str().expect("id").to_string();
    let (_, v) = as_b(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(
        ids_of(&v, "sandboxes"),
        [b_id.as_str()],
        "only the tenant's"
    );
    let (status, v) = as_b(Method::GET, &format!("/v1/sandboxes/{a_id}"), None).await;
    assert_eq!(
        status, 404,
        "another tenant's, as for the tenant itself: {v}"
    );
    // Without the header the admin sees both.
    let (_, v) = s.request(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(ids_of(&v, "sandboxes").len(), 2);
    // A tenant nobody made is a bad header; a tenant's key cannot name another tenant.
    let (status, v) = s
        .http
        .get(format!("{}/v1/sandboxes", s.url))
        .bearer_auth(&s.key)
        .header("x-hutch-tenant", "nobody")
        .send()
        .await
        .map(|r| (r.status().as_u16(), r))
        .expect("request");
    assert_eq!(status, 400, "{:?}", v.text().await);
    let resp = s
        .http
        .get(format!("{}/v1/sandboxes", s.url))
        .bearer_auth(&a)
        .header("x-hutch-tenant", "team-b")
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status().as_u16(), 403);
}
