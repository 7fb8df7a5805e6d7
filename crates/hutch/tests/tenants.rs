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
