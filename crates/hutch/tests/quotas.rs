//! Tenant quotas from the attacker's side: a tenant's key tries to take more than its
//! quotas allow, at once and one by one. Over quota is 429 `quota_exceeded` naming the
//! quota, its limit and what was in use; concurrent creates never overshoot; a refused
//! wake or resume loses nothing; fork asks room for all its children before making any.

use futures_util::future::join_all;
use hutch_testkit::TestServer;
use reqwest::Method;
use serde_json::{json, Value};

/// Assert `v` is the 429 of `quota` with `limit` and `used`.
fn assert_quota(status: u16, v: &Value, quota: &str, limit: Value, used: Value) {
    assert_eq!(status, 429, "{v}");
    let e = &v["error"];
    assert_eq!(e["code"], "quota_exceeded", "{v}");
    assert_eq!(e["quota"], quota, "{v}");
    assert_eq!(e["limit"], limit, "{v}");
    assert_eq!(e["used"], used, "{v}");
    assert!(
        e["message"].as_str().is_some_and(|m| m.contains(quota)),
        "{v}"
    );
}

#[tokio::test]
async fn twenty_concurrent_creates_against_a_quota_of_five_make_exactly_five() {
    let s = TestServer::start().await;
    s.tenant("acme", json!({"quotas": {"max_sandboxes": 5}}))
        .await;
    let key = s.tenant_key("acme", "full").await;
    let answers = join_all((0..20).map(|_| {
        s.request_as(
            &key,
            Method::POST,
            "/v1/sandboxes",
            Some(json!({"cpus": 0.1})),
        )
    }))
    .await;
    let made: Vec<String> = answers
        .iter()
        .filter(|(status, _)| *status == 201)
        .filter_map(|(_, v)| v["id"].as_str().map(String::from))
        .collect();
    assert_eq!(made.len(), 5, "{answers:?}");
    for (status, v) in answers.iter().filter(|(status, _)| *status != 201) {
        assert_quota(*status, v, "max_sandboxes", json!(5), json!(5));
    }
    let (_, v) = s.request_as(&key, Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(v["sandboxes"].as_array().map(Vec::len), Some(5), "{v}");
    // Deleting one makes room for exactly one more.
    assert_eq!(s.kill(&made[0]).await, 204);
    let (status, v) = s
        .request_as(&key, Method::POST, "/v1/sandboxes", Some(json!({})))
        .await;
    assert_eq!(status, 201, "{v}");
    let (status, v) = s
        .request_as(&key, Method::POST, "/v1/sandboxes", Some(json!({})))
        .await;
    assert_quota(status, &v, "max_sandboxes", json!(5), json!(5));
    // Another tenant is not counted against it, nor is an admin's sandbox.
    let other = s.tenant_key("other", "full").await;
    let (status, v) = s
        .request_as(&other, Method::POST, "/v1/sandboxes", Some(json!({})))
        .await;
    assert_eq!(status, 201, "{v}");
    s.create(json!({})).await;
}

#[tokio::test]
async fn running_cpus_and_memory_are_counted_and_a_refused_resume_loses_nothing() {
    let s = TestServer::start().await;
    s.tenant(
        "acme",
        json!({"quotas": {"max_cpus": 1, "max_memory_mib": 1024}}),
    )
    .await;
    let key = s.tenant_key("acme", "full").await;
    let create = |body: Value| s.request_as(&key, Method::POST, "/v1/sandboxes", Some(body));
    let (status, first) = create(json!({"cpus": 0.5, "memory_mib": 256})).await;
    assert_eq!(status, 201, "{first}");
    let first = first["id"].as_str().expect("id").to_string();
    let (status, v) = create(json!({"cpus": 0.25, "memory_mib": 800})).await;
    assert_quota(status, &v, "max_memory_mib", json!(1024), json!(256));
    let (status, v) = create(json!({"cpus": 0.5, "memory_mib": 256})).await;
    assert_eq!(status, 201, "{v}");
    let (status, v) = create(json!({"cpus": 0.25, "memory_mib": 256})).await;
    assert_quota(status, &v, "max_cpus", json!(1.0), json!(1.0));
    // A paused sandbox's CPUs are not running: room for one more...
    s.sh_ok(&first, "echo kept > /tmp/kept").await;
    s.act(&first, "pause").await;
    let (status, third) = create(json!({"cpus": 0.5, "memory_mib": 256})).await;
    assert_eq!(status, 201, "{third}");
    // ... and its resume no longer fits: refused, it stays paused with what it had.
    let (status, v) = s
        .post(&format!("/v1/sandboxes/{first}/resume"), Value::Null)
        .await;
    assert_quota(status, &v, "max_cpus", json!(1.0), json!(1.0));
    assert_eq!(s.state(&first).await, "paused");
    assert_eq!(s.kill(third["id"].as_str().expect("id")).await, 204);
    s.act(&first, "resume").await;
    assert_eq!(s.sh_ok(&first, "cat /tmp/kept").await, "kept\n");
}

#[tokio::test]
async fn a_refused_wake_loses_nothing_and_fork_asks_room_for_every_child() {
    let s = TestServer::start().await;
    s.tenant("acme", json!({"quotas": {"max_sandboxes": 2}}))
        .await;
    let key = s.tenant_key("acme", "full").await;
    let create = || s.request_as(&key, Method::POST, "/v1/sandboxes", Some(json!({})));
    let (status, v) = create().await;
    assert_eq!(status, 201, "{v}");
    let sleeper = v["id"].as_str().expect("id").to_string();
    s.sh_ok(&sleeper, "echo kept > /root/kept").await;
    s.act(&sleeper, "hibernate").await;
    // Hibernated, it holds no room: two more fit.
    let mut running = Vec::new();
    for _ in 0..2 {
        let (status, v) = create().await;
        assert_eq!(status, 201, "{v}");
        running.push(v["id"].as_str().expect("id").to_string());
    }
    let (status, v) = s
        .post(&format!("/v1/sandboxes/{sleeper}/wake"), Value::Null)
        .await;
    assert_quota(status, &v, "max_sandboxes", json!(2), json!(2));
    // An exec would wake it too: refused the same way.
    let (status, v) = s
        .request_as(
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{sleeper}/exec"),
            Some(json!({"cmd": ["true"]})),
        )
        .await;
    assert_quota(status, &v, "max_sandboxes", json!(2), json!(2));
    assert_eq!(s.state(&sleeper).await, "hibernated");
    // A fork of two children with no room is refused before anything is made.
    let (status, v) = s
        .request_as(
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{}/fork", running[0]),
            Some(json!({"count": 2})),
        )
        .await;
    assert_quota(status, &v, "max_sandboxes", json!(2), json!(2));
    let (_, listed) = s.request_as(&key, Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(
        listed["sandboxes"].as_array().map(Vec::len),
        Some(3),
        "no child: {listed}"
    );
    // Room again: the wake goes through and everything it kept is there.
    assert_eq!(s.kill(&running.pop().expect("one")).await, 204);
    s.act(&sleeper, "wake").await;
    assert_eq!(s.sh_ok(&sleeper, "cat /root/kept").await, "kept\n");
    // With one slot free a fork of one fits, of two not.
    assert_eq!(s.kill(&sleeper).await, 204);
    let (status, v) = s
        .request_as(
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{}/fork", running[0]),
            Some(json!({"count": 2})),
        )
        .await;
    assert_quota(status, &v, "max_sandboxes", json!(2), json!(1));
    let (status, v) = s
        .request_as(
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{}/fork", running[0]),
            Some(json!({"count": 1})),
        )
        .await;
    assert_eq!(status, 201, "{v}");
}

#[tokio::test]
async fn hourly_creates_ttl_and_size_limits_are_enforced() {
    let s = TestServer::start().await;
    s.tenant(
        "acme",
        json!({"quotas": {
            "max_creates_per_hour": 2, "max_ttl_seconds": 600,
            "max_sandbox_memory_mib": 512, "max_sandbox_cpus": 1, "max_sandbox_disk_mib": 2048
        }}),
    )
    .await;
    let key = s.tenant_key("acme", "full").await;
    let create = |body: Value| s.request_as(&key, Method::POST, "/v1/sandboxes", Some(body));
    for (body, quota, limit, used) in [
        (
            json!({"ttl_seconds": 601}),
            "max_ttl_seconds",
            json!(600),
            json!(601),
        ),
        (
            json!({"persistent": true}),
            "max_ttl_seconds",
            json!(600),
            Value::Null,
        ),
        (
            json!({"memory_mib": 1024}),
            "max_sandbox_memory_mib",
            json!(512),
            json!(1024),
        ),
        (
            json!({"cpus": 2}),
            "max_sandbox_cpus",
            json!(1.0),
            json!(2.0),
        ),
        (
            json!({"disk_mib": 4096}),
            "max_sandbox_disk_mib",
            json!(2048),
            json!(4096),
        ),
    ] {
        let (status, v) = create(body.clone()).await;
        assert_quota(status, &v, quota, limit, used);
    }
    let mut made = Vec::new();
    for _ in 0..2 {
        let (status, v) = create(json!({"ttl_seconds": 600})).await;
        assert_eq!(status, 201, "{v}");
        made.push(v["id"].as_str().expect("id").to_string());
    }
    // A PATCH cannot lift the TTL limit either.
    let (status, v) = s
        .request_as(
            &key,
            Method::PATCH,
            &format!("/v1/sandboxes/{}", made[0]),
            Some(json!({"ttl_seconds": 3600})),
        )
        .await;
    assert_quota(status, &v, "max_ttl_seconds", json!(600), json!(3600));
    // Deleting what it made does not give creates back within the hour.
    for id in &made {
        assert_eq!(s.kill(id).await, 204);
    }
    let (status, v) = create(json!({})).await;
    assert_quota(status, &v, "max_creates_per_hour", json!(2), json!(2));
    // Raising the quota takes effect at once, for the next create.
    let (status, v) = s
        .request(
            Method::PATCH,
            "/v1/tenants/acme",
            Some(json!({"quotas": {"max_creates_per_hour": 3}})),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = create(json!({})).await;
    assert_eq!(status, 201, "{v}");
    // The log of creates survives a restart of the server.
    let mut s = s;
    s.stop_server();
    s.spawn_server().await;
    let (status, v) = s
        .request_as(&key, Method::POST, "/v1/sandboxes", Some(json!({})))
        .await;
    assert_quota(status, &v, "max_creates_per_hour", json!(3), json!(3));
}
