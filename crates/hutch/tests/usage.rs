//! Usage metering on real cgroups and real sandboxes: CPU-seconds and working-set GiB-seconds
//! as a billing system reads them (`GET /v1/usage`, `usage.jsonl`, Prometheus), kept over a
//! server restart, grouped by sandbox, tenant, key and day, and never shown to another
//! tenant. Spending caps are in `usage_caps.rs`.

use std::time::{Duration, Instant};

use hutch_testkit::{both_backends, on, static_c_binary, wait_until, TestServer};
use reqwest::Method;
use serde_json::{json, Value};

/// Sampling every 250 ms: a test's few seconds of work are many intervals.
const FAST: [&str; 2] = ["--usage-interval-seconds", "0.25"];

/// `GET /v1/usage?{query}` with `key` (the admin key when `None`); 200 expected.
async fn usage(s: &TestServer, key: Option<&str>, query: &str) -> Value {
    let path = format!("/v1/usage?{query}");
    let (status, v) = match key {
        Some(k) => s.request_as(k, Method::GET, &path, None).await,
        None => s.request(Method::GET, &path, None).await,
    };
    assert_eq!(status, 200, "{path}: {v}");
    v
}

fn now_ms() -> i64 {
    hutch_core::time::now_ms()
}

/// The sandbox's totals once an interval ending after now is stored (so everything it did
/// before this call is counted).
async fn settled_totals(s: &TestServer, id: &str) -> Value {
    let since = now_ms();
    wait_until(Duration::from_secs(10), async || {
        let v = usage(s, None, &format!("sandbox_id={id}&from={since}")).await;
        (v["total"]["intervals"].as_u64() > Some(0)).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("no usage interval of {id} was stored after {since}"));
    usage(s, None, &format!("sandbox_id={id}")).await["total"].clone()
}

fn f(v: &Value, field: &str) -> f64 {
    v[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} in {v}"))
}

async fn with_probe(s: &TestServer, id: &str) {
    s.put_file(id, "/usr/local/bin/probe", "0755", static_c_binary("probe"))
        .await;
}

#[tokio::test]
async fn three_cpu_seconds_meter_as_three_and_200_mib_for_5_s_as_one_gib_second() {
    let s = TestServer::start_with(&FAST).await;
    let id = s.create_id(json!({"cpus": 1, "memory_mib": 512})).await;
    with_probe(&s, &id).await;

    // CPU: the probe burns exactly 3 s of its own CPU time, however busy the host is.
    let before = settled_totals(&s, &id).await;
    let out = s.sh_ok(&id, "probe burn 3").await;
    assert_eq!(out.trim(), "burnt");
    let after = settled_totals(&s, &id).await;
    let cpu = f(&after, "cpu_seconds") - f(&before, "cpu_seconds");
    eprintln!("3 CPU-seconds burnt: {cpu:.3} metered");
    assert!(
        (2.7..=3.3).contains(&cpu),
        "3 CPU-seconds burnt, {cpu} metered ({before} → {after})"
    );

    // Memory: what the sandbox holds while idle, then 200 MiB more for 5 s.
    let (status, now) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}/usage"), None)
        .await;
    assert_eq!(status, 200, "{now}");
    let idle_gib = f(&now["usage"], "memory_working_set_bytes") / (1u64 << 30) as f64;
    assert!(idle_gib > 0.0, "an idle sandbox holds some memory: {now}");
    let before = settled_totals(&s, &id).await;
    let t0 = Instant::now();
    let out = s.sh_ok(&id, "probe hold 200 5").await;
    assert_eq!(out.trim(), "held");
    let after = settled_totals(&s, &id).await;
    let wall = t0.elapsed().as_secs_f64();
    let held = f(&after, "memory_gib_seconds") - f(&before, "memory_gib_seconds") - idle_gib * wall;
    let expected = 200.0 / 1024.0 * 5.0;
    eprintln!(
        "200 MiB for 5 s: {held:.3} GiB-s metered, {expected:.3} expected (idle {idle_gib:.4} GiB)"
    );
    assert!(
        (held - expected).abs() <= expected * 0.15,
        "200 MiB held 5 s is {expected:.3} GiB-s, {held:.3} metered (idle {idle_gib:.4} GiB over {wall:.1} s)"
    );
    assert!(
        after["cost_micros"].is_null(),
        "no rate card, no cost: {after}"
    );
}

#[tokio::test]
async fn usage_is_grouped_kept_over_a_restart_logged_and_hidden_from_other_tenants() {
    let card = tempfile::NamedTempFile::new().expect("rate card");
    std::fs::write(
        card.path(),
        r#"{"cpu_second_micros": 1000, "memory_gib_second_micros": 10}"#,
    )
    .expect("write rate card");
    let card_path = card.path().to_str().expect("utf-8 path").to_string();
    let mut s = TestServer::start_with(&[FAST[0], FAST[1], "--rate-card", &card_path]).await;
    let a = s.tenant_key("team-a", "full").await;
    let b = s.tenant_key("team-b", "full").await;
    let create = async |key: &str| {
        let (status, v) = s
            .request_as(key, Method::POST, "/v1/sandboxes", Some(json!({"cpus": 1})))
            .await;
        assert_eq!(status, 201, "{v}");
        v["id"].as_str().expect("id").to_string()
    };
    let sa = create(&a).await;
    let sb = create(&b).await;
    for id in [&sa, &sb] {
        with_probe(&s, id).await;
        s.sh_ok(id, "probe burn 1").await;
    }
    let totals_a = settled_totals(&s, &sa).await;
    settled_totals(&s, &sb).await;
    assert!(f(&totals_a, "cpu_seconds") >= 0.9, "{totals_a}");

    // Grouped by tenant, an admin sees both; tenant A's key only its own.
    let all = usage(&s, None, "group_by=tenant").await;
    let tenants: Vec<&str> = all["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter_map(|g| g["tenant"].as_str())
        .collect();
    assert!(
        tenants.contains(&"team-a") && tenants.contains(&"team-b"),
        "{all}"
    );
    let mine = usage(&s, Some(&a), "group_by=tenant").await;
    let groups = mine["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 1, "{mine}");
    assert_eq!(groups[0]["tenant"], "team-a", "{mine}");
    let (status, v) = s
        .request_as(&a, Method::GET, "/v1/usage?tenant=team-b", None)
        .await;
    assert_eq!(status, 403, "{v}");
    let theirs = usage(&s, Some(&a), &format!("sandbox_id={sb}")).await;
    assert_eq!(
        theirs["total"]["intervals"], 0,
        "A sees nothing of B's sandbox: {theirs}"
    );
    assert_eq!(theirs["total"]["cpu_seconds"], 0.0, "{theirs}");
    let by_sandbox = usage(&s, Some(&a), "group_by=sandbox").await;
    let ids: Vec<&str> = by_sandbox["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .filter_map(|g| g["sandbox_id"].as_str())
        .collect();
    assert_eq!(ids, [sa.as_str()], "{by_sandbox}");

    // By key: each tenant's sandboxes under the key that made them.
    let (_, keys) = s.request_as(&a, Method::GET, "/v1/keys", None).await;
    let key_a = keys["keys"][0]["id"].as_str().expect("key id").to_string();
    let by_key = usage(&s, None, "group_by=key").await;
    let row = by_key["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .find(|g| g["key_id"] == key_a.as_str())
        .unwrap_or_else(|| panic!("no group of key {key_a}: {by_key}"))
        .clone();
    assert!(f(&row, "cpu_seconds") >= 0.9, "{row}");
    // By day: today (UTC), the whole of it.
    let today = &hutch_core::time::rfc3339(now_ms())[..10];
    let by_day = usage(&s, Some(&a), "group_by=day").await;
    assert_eq!(by_day["groups"][0]["day"], today, "{by_day}");
    // Cost through the rate card: 1000 per CPU-second and 10 per GiB-second.
    let t = &by_day["total"];
    let cost = (f(t, "cpu_seconds") * 1000.0 + f(t, "memory_gib_seconds") * 10.0).round();
    assert_eq!(t["cost_micros"].as_f64(), Some(cost), "{by_day}");
    assert_eq!(by_day["rate_card"]["cpu_second_micros"], 1000.0, "{by_day}");
    // A window that ends before anything ran holds nothing; a bad group is 422.
    let empty = usage(&s, None, "to=2020-01-01T00:00:00Z").await;
    assert_eq!(empty["total"]["intervals"], 0, "{empty}");
    let (status, v) = s
        .request(Method::GET, "/v1/usage?group_by=week", None)
        .await;
    assert_eq!(status, 422, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("group_by must be one of sandbox, tenant, key or day")),
        "{v}"
    );

    // Prometheus: per tenant for admin scrapes, server-wide sums on the open /metrics.
    let text = s.metrics_text().await;
    assert!(
        text.contains("hutch_usage_cpu_seconds_total{tenant=\"team-a\"}"),
        "{text}"
    );
    let open = reqwest::get(format!("{}/metrics", s.url))
        .await
        .expect("/metrics")
        .text()
        .await
        .expect("text");
    assert!(open.contains("\nhutch_usage_cpu_seconds_total "), "{open}");
    assert!(
        !open.contains("team-a"),
        "no tenant names on /metrics: {open}"
    );

    // The usage log: one JSON line per interval, the sandboxes' among them.
    let log = std::fs::read_to_string(s.state_dir.join("usage.jsonl")).expect("usage log");
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let of_a: Vec<&Value> = lines.iter().filter(|l| l["id"] == sa.as_str()).collect();
    assert!(!of_a.is_empty(), "{log}");
    assert_eq!(of_a[0]["tenant"], "team-a");
    assert_eq!(of_a[0]["kind"], "sandbox");
    assert_eq!(of_a[0]["key_id"], key_a.as_str());
    let logged: f64 = of_a.iter().map(|l| f(l, "cpu_seconds")).sum();
    assert!(logged >= 0.9, "the log holds A's CPU-seconds: {logged}");

    // A restart keeps what was metered and picks up the meters where they were: the
    // sandbox's CPU total does not jump by its whole life again.
    let before = usage(&s, None, &format!("sandbox_id={sa}")).await["total"].clone();
    s.stop_server();
    s.spawn_server().await;
    let after = settled_totals(&s, &sa).await;
    let grew = f(&after, "cpu_seconds") - f(&before, "cpu_seconds");
    assert!(
        f(&after, "cpu_seconds") >= f(&before, "cpu_seconds") && grew < 0.5,
        "usage over a restart: {before} → {after}"
    );
    // A deleted sandbox's usage stays.
    assert_eq!(s.kill(&sa).await, 204);
    let kept = usage(&s, Some(&a), &format!("sandbox_id={sa}")).await;
    assert!(f(&kept["total"], "cpu_seconds") >= 0.9, "{kept}");
}

both_backends!(a_busy_sandbox_meters_cpu_and_memory);

async fn a_busy_sandbox_meters_cpu_and_memory(isolation: &str) {
    let s = TestServer::start_with(&FAST).await;
    let id = s.create_id(on(isolation, json!({}))).await;
    s.sh_ok(&id, "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done")
        .await;
    let totals = settled_totals(&s, &id).await;
    assert!(f(&totals, "cpu_seconds") > 0.0, "{isolation}: {totals}");
    assert!(
        f(&totals, "memory_gib_seconds") > 0.0,
        "{isolation}: {totals}"
    );
}

#[tokio::test]
async fn snapshots_volumes_and_hibernated_sandboxes_are_billed_disk_hours() {
    let s =
        TestServer::start_with(&[FAST[0], FAST[1], "--disk-usage-interval-seconds", "0.5"]).await;
    let key = s.tenant_key("acme", "full").await;
    let (status, vol) = s
        .request_as(
            &key,
            Method::POST,
            "/v1/volumes",
            Some(json!({"name": "data", "size_mib": 16})),
        )
        .await;
    assert_eq!(status, 201, "{vol}");
    let (status, v) = s
        .request_as(&key, Method::POST, "/v1/sandboxes", Some(json!({})))
        .await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().expect("id").to_string();
    s.sh_ok(&id, "head -c 4000000 /dev/urandom > /workspace/blob")
        .await;
    let (status, snap) = s
        .request_as(
            &key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/snapshots"),
            Some(json!({"name": "keep"})),
        )
        .await;
    assert_eq!(status, 201, "{snap}");
    s.act(&id, "hibernate").await;
    let kinds = wait_until(Duration::from_secs(20), async || {
        let v = usage(&s, Some(&key), "group_by=sandbox").await;
        let billed: Vec<(String, String)> = v["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .filter(|g| g["disk_gib_hours"].as_f64() > Some(0.0))
            .map(|g| {
                (
                    g["kind"].as_str().unwrap_or_default().to_string(),
                    g["sandbox_id"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        (billed.len() == 3).then_some(billed)
    })
    .await
    .expect("disk billed for the volume, the snapshot and the hibernated sandbox");
    for (kind, want) in [
        ("volume", vol["id"].as_str()),
        ("snapshot", snap["id"].as_str()),
        ("sandbox", Some(id.as_str())),
    ] {
        assert!(
            kinds
                .iter()
                .any(|(k, i)| k == kind && Some(i.as_str()) == want),
            "{kind} {want:?} not billed: {kinds:?}"
        );
    }
}
