//! Spending caps from the spender's side: a key or a tenant that reached its daily budget
//! (in CPU-seconds without a rate card, in cost micros with one) and a sandbox past its
//! `max_cost_micros` have their running sandboxes hibernated (or paused) with everything
//! kept; creates, wakes and resumes are 429 naming the cap until it is raised; a key cannot
//! raise its own cap.

use std::time::Duration;

use hutch_testkit::{static_c_binary, wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// Assert `v` is the 429 of spending cap `quota` with `limit`.
fn assert_cap(status: u16, v: &Value, quota: &str, limit: u64) {
    assert_eq!(status, 429, "{v}");
    let e = &v["error"];
    assert_eq!(e["code"], "quota_exceeded", "{v}");
    assert_eq!(e["quota"], quota, "{v}");
    assert_eq!(e["limit"], limit, "{v}");
    assert!(e["used"].as_u64().is_some_and(|u| u >= limit), "{v}");
}

async fn create_as(s: &TestServer, key: &str, body: Value) -> String {
    let (status, v) = s
        .request_as(key, Method::POST, "/v1/sandboxes", Some(body))
        .await;
    assert_eq!(status, 201, "{v}");
    v["id"].as_str().expect("id").to_string()
}

async fn wait_state(s: &TestServer, id: &str, want: &str) {
    wait_until(Duration::from_secs(30), async || {
        (s.state(id).await == want).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("{id} never became {want}"));
}

/// Burn `secs` CPU-seconds in `id` in the background (the cap may stop it midway).
async fn burn(s: &TestServer, id: &str, secs: u32) {
    s.put_file(id, "/usr/local/bin/probe", "0755", static_c_binary("probe"))
        .await;
    s.start_background(id, json!(["probe", "burn", secs.to_string()]))
        .await;
}

async fn key_id_of(s: &TestServer, key: &str) -> String {
    let (status, v) = s.request_as(key, Method::GET, "/v1/keys", None).await;
    assert_eq!(status, 200, "{v}");
    // A fresh key of a fresh tenant sees itself first.
    v["keys"][0]["id"].as_str().expect("key id").to_string()
}

#[tokio::test]
async fn a_keys_daily_budget_reached_hibernates_its_sandboxes_and_they_wake_when_it_is_raised() {
    let s = TestServer::start_with(&["--usage-interval-seconds", "0.25"]).await;
    // Without a rate card a budget counts CPU-seconds.
    let capped = s
        .key_with(json!({"tenant": "acme", "scope": "full", "daily_budget": 2}))
        .await;
    let capped_id = key_id_of(&s, &capped).await;
    let free = s.tenant_key("acme", "full").await;
    // No key raises its own cap; a full key of the tenant may set another's, no higher
    // than its own (it has none).
    let (status, v) = s
        .request_as(
            &capped,
            Method::PATCH,
            &format!("/v1/keys/{capped_id}"),
            Some(json!({"daily_budget": 1000})),
        )
        .await;
    assert_eq!(status, 403, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("cannot change its own budget")),
        "{v}"
    );
    let (_, view) = s
        .request(Method::GET, &format!("/v1/keys/{capped_id}"), None)
        .await;
    assert_eq!(view["daily_budget"], 2, "{view}");
    // max_cost_micros needs a rate card.
    let (status, v) = s
        .request_as(
            &capped,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"max_cost_micros": 5})),
        )
        .await;
    assert_eq!(status, 422, "{v}");

    let busy = create_as(&s, &capped, json!({"cpus": 1})).await;
    let idle = create_as(&s, &capped, json!({})).await;
    let other = create_as(&s, &free, json!({})).await;
    for id in [&busy, &idle] {
        s.sh_ok(id, "echo kept > /workspace/note").await;
    }
    burn(&s, &busy, 4).await;
    // Both of the key's sandboxes stop once it has spent 2 CPU-seconds; the tenant's
    // other key is not capped.
    wait_state(&s, &busy, "hibernated").await;
    wait_state(&s, &idle, "hibernated").await;
    assert_eq!(s.state(&other).await, "running");
    // Stopped within about one sampling interval of reaching 2 CPU-seconds, its last
    // interval counted once.
    let (_, spent) = s
        .request(Method::GET, &format!("/v1/usage?key_id={capped_id}"), None)
        .await;
    let cpu = spent["total"]["cpu_seconds"].as_f64().expect("cpu_seconds");
    assert!(
        (2.0..3.0).contains(&cpu),
        "the key spent {cpu} CPU-seconds: {spent}"
    );

    let (status, v) = s
        .request_as(&capped, Method::POST, "/v1/sandboxes", Some(json!({})))
        .await;
    assert_cap(status, &v, "daily_budget", 2);
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("daily_budget of key {capped_id} reached"))),
        "{v}"
    );
    let (status, v) = s
        .request_as(
            &capped,
            Method::POST,
            &format!("/v1/sandboxes/{busy}/wake"),
            None,
        )
        .await;
    assert_cap(status, &v, "daily_budget", 2);
    // An exec's transparent wake is refused the same way and leaves it hibernated.
    let (status, v) = s
        .request_as(
            &capped,
            Method::POST,
            &format!("/v1/sandboxes/{idle}/exec"),
            Some(json!({"cmd": "true"})),
        )
        .await;
    assert_cap(status, &v, "daily_budget", 2);
    assert_eq!(s.state(&idle).await, "hibernated");
    // The other key still creates.
    create_as(&s, &free, json!({})).await;

    // An admin raises the cap: they wake with their files.
    let (status, v) = s
        .request(
            Method::PATCH,
            &format!("/v1/keys/{capped_id}"),
            Some(json!({"daily_budget": 100000})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["daily_budget"], 100000, "{v}");
    for id in [&busy, &idle] {
        let (status, v) = s
            .request_as(
                &capped,
                Method::POST,
                &format!("/v1/sandboxes/{id}/wake"),
                None,
            )
            .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(s.sh_ok(id, "cat /workspace/note").await.trim(), "kept");
    }
    create_as(&s, &capped, json!({})).await;
}

#[tokio::test]
async fn a_tenants_budget_and_a_sandboxs_max_cost_pause_through_the_rate_card() {
    let card = tempfile::NamedTempFile::new().expect("rate card");
    std::fs::write(card.path(), r#"{"cpu_second_micros": 1000}"#).expect("write rate card");
    let card_path = card.path().to_str().expect("utf-8 path").to_string();
    let s = TestServer::start_with(&[
        "--usage-interval-seconds",
        "0.25",
        "--rate-card",
        &card_path,
        "--budget-action",
        "pause",
    ])
    .await;
    // 1.5 CPU-seconds a day, at 1000 micros each.
    s.tenant("acme", json!({"quotas": {"daily_budget": 1500}}))
        .await;
    let key = s.tenant_key("acme", "full").await;
    let id = create_as(&s, &key, json!({"cpus": 1})).await;
    s.sh_ok(&id, "echo kept > /workspace/note").await;
    burn(&s, &id, 3).await;
    wait_state(&s, &id, "paused").await;
    let (status, v) = s
        .request_as(&key, Method::POST, "/v1/sandboxes", Some(json!({})))
        .await;
    assert_cap(status, &v, "daily_budget", 1500);
    assert_eq!(v["error"]["tenant"], "acme", "{v}");
    let (status, v) = s
        .request_as(
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/resume"),
            None,
        )
        .await;
    assert_cap(status, &v, "daily_budget", 1500);
    let (_, u) = s.request_as(&key, Method::GET, "/v1/usage", None).await;
    assert!(
        u["total"]["cost_micros"]
            .as_u64()
            .is_some_and(|c| c >= 1500),
        "{u}"
    );
    // Raising the tenant's budget lets it run again, its files and processes kept.
    let (status, v) = s
        .request(
            Method::PATCH,
            "/v1/tenants/acme",
            Some(json!({"quotas": {"daily_budget": 1000000}})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = s
        .request_as(
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/resume"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(s.sh_ok(&id, "cat /workspace/note").await.trim(), "kept");

    // A sandbox's own cap: 500 micros is half a CPU-second.
    let capped = create_as(&s, &key, json!({"cpus": 1, "max_cost_micros": 500})).await;
    let (_, view) = s
        .request(Method::GET, &format!("/v1/sandboxes/{capped}"), None)
        .await;
    assert_eq!(view["max_cost_micros"], 500, "{view}");
    burn(&s, &capped, 3).await;
    wait_state(&s, &capped, "paused").await;
    let (status, v) = s
        .request_as(
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{capped}/resume"),
            None,
        )
        .await;
    assert_cap(status, &v, "max_cost_micros", 500);
    // The tenant's other sandbox is not its business.
    assert_eq!(s.state(&id).await, "running");
}
