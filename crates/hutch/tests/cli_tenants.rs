//! `hutch tenant …`, `hutch key …` and `hutch audit` against a real server: what an
//! operator types, and what the server holds afterwards.

use std::process::{Command, Output};
use std::time::Duration;

use hutch_testkit::{hutch_bin, wait_until, TestServer};
use reqwest::Method;
use serde_json::Value;

/// Run the CLI with `key` (and `HUTCH_TENANT` when given).
fn hutch(s: &TestServer, key: &str, tenant: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(hutch_bin());
    cmd.args(args)
        .env("HUTCH_URL", &s.url)
        .env("HUTCH_API_KEY", key)
        .env_remove("HUTCH_TENANT");
    if let Some(t) = tenant {
        cmd.env("HUTCH_TENANT", t);
    }
    cmd.output().expect("run hutch")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "hutch failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn an_operator_makes_tenants_and_keys_and_reads_the_audit_log_with_the_cli() {
    let s = TestServer::start().await;
    let admin = s.key.clone();
    assert_eq!(
        ok(&hutch(
            &s,
            &admin,
            None,
            &[
                "tenant",
                "create",
                "acme",
                "--max-sandboxes",
                "2",
                "--max-cpus",
                "1.5",
                "--default-ttl-seconds",
                "90",
                "--allow-template",
                "minimal"
            ]
        )),
        "acme\n"
    );
    let (_, t) = s.request(Method::GET, "/v1/tenants/acme", None).await;
    assert_eq!(
        (
            t["quotas"]["max_sandboxes"].clone(),
            t["quotas"]["max_cpus"].clone()
        ),
        (2.into(), 1.5.into()),
        "{t}"
    );
    assert_eq!(t["defaults"]["ttl_seconds"], 90);
    assert_eq!(t["allowed_templates"], serde_json::json!(["minimal"]));
    // `set` changes only what it names; `none` lifts a limit.
    ok(&hutch(
        &s,
        &admin,
        None,
        &[
            "tenant",
            "set",
            "acme",
            "--max-cpus",
            "none",
            "--max-memory-mib",
            "2048",
        ],
    ));
    let (_, t) = s.request(Method::GET, "/v1/tenants/acme", None).await;
    assert_eq!(t["quotas"]["max_sandboxes"], 2, "{t}");
    assert_eq!(t["quotas"]["max_cpus"], Value::Null, "{t}");
    assert_eq!(t["quotas"]["max_memory_mib"], 2048, "{t}");
    let listed = ok(&hutch(&s, &admin, None, &["tenant", "ls"]));
    assert!(
        listed
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("acme ")),
        "{listed}"
    );
    // A key is printed once: the secret on stdout, its id on stderr.
    let out = hutch(
        &s,
        &admin,
        None,
        &[
            "key",
            "create",
            "--tenant",
            "acme",
            "--scope",
            "full",
            "--format",
            "e2b",
            "--expires-in",
            "1d",
        ],
    );
    let secret = ok(&out).trim().to_string();
    assert!(secret.starts_with("e2b_") && secret.len() == 44, "{secret}");
    let note = String::from_utf8_lossy(&out.stderr).to_string();
    let key_id = note.split_whitespace().next().expect("the id").to_string();
    assert!(
        key_id.starts_with("key_") && note.contains("shown only now"),
        "{note}"
    );
    // The tenant's key makes sandboxes of its tenant, and the admin acts for it.
    let id = ok(&hutch(&s, &secret, None, &["create"]))
        .trim()
        .to_string();
    let (_, v) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(
        (v["metadata"]["tenant_id"].clone(), v["ttl_seconds"].clone()),
        ("acme".into(), 90.into()),
        "{v}"
    );
    let mine = ok(&hutch(&s, &admin, Some("acme"), &["ls", "--json"]));
    assert!(mine.contains(&id), "{mine}");
    let keys = ok(&hutch(&s, &secret, None, &["key", "ls"]));
    assert!(keys.contains(&key_id) && !keys.contains(&secret), "{keys}");
    let audit = wait_until(Duration::from_secs(20), async || {
        let out = ok(&hutch(&s, &secret, None, &["audit", "--json"]));
        out.contains("/v1/sandboxes").then_some(out)
    })
    .await
    .expect("the create in the audit log");
    assert!(audit.contains(&key_id), "{audit}");
    // Deleting a tenant that owns a sandbox is refused; a revoked key stops.
    let refused = hutch(&s, &admin, None, &["tenant", "rm", "acme"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("still owns 1 sandbox"),
        "{refused:?}"
    );
    ok(&hutch(&s, &admin, None, &["key", "revoke", &key_id]));
    let gone = hutch(&s, &secret, None, &["ls"]);
    assert!(!gone.status.success());
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("401"),
        "{gone:?}"
    );
    assert_eq!(s.kill(&id).await, 204);
    ok(&hutch(&s, &admin, None, &["tenant", "rm", "acme"]));
    let (status, _) = s.request(Method::GET, "/v1/tenants/acme", None).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn an_operator_sets_budgets_and_reads_usage_with_the_cli() {
    let s = TestServer::start_with(&["--usage-interval-seconds", "0.25"]).await;
    let admin = s.key.clone();
    ok(&hutch(
        &s,
        &admin,
        None,
        &["tenant", "create", "acme", "--daily-budget", "100"],
    ));
    let (_, t) = s.request(Method::GET, "/v1/tenants/acme", None).await;
    assert_eq!(t["quotas"]["daily_budget"], 100, "{t}");
    let secret = ok(&hutch(
        &s,
        &admin,
        None,
        &["key", "create", "--tenant", "acme", "--daily-budget", "50"],
    ))
    .trim()
    .to_string();
    let (_, keys) = s.request_as(&secret, Method::GET, "/v1/keys", None).await;
    let key_id = keys["keys"][0]["id"].as_str().expect("id").to_string();
    assert_eq!(keys["keys"][0]["daily_budget"], 50, "{keys}");
    let set = ok(&hutch(
        &s,
        &admin,
        None,
        &["key", "set", &key_id, "--daily-budget", "70"],
    ));
    assert_eq!(
        set.trim(),
        format!("{key_id}: daily budget 70, monthly budget none")
    );
    let id = ok(&hutch(&s, &secret, None, &["create", "--json"]));
    let id: Value = serde_json::from_str(&id).expect("json");
    let id = id["id"].as_str().expect("id").to_string();
    s.sh_ok(&id, "true").await;
    let usage = wait_until(Duration::from_secs(20), async || {
        let out = ok(&hutch(
            &s,
            &secret,
            None,
            &["usage", "--group-by", "tenant", "--json"],
        ));
        let v: Value = serde_json::from_str(&out).expect("json");
        (v["groups"][0]["tenant"] == "acme").then_some(v)
    })
    .await
    .expect("acme's usage");
    assert!(
        usage["total"]["memory_gib_seconds"].as_f64() > Some(0.0),
        "{usage}"
    );
    let table = ok(&hutch(&s, &admin, None, &["usage", "--group-by", "key"]));
    assert!(
        table.contains("CPU-S") && table.contains(&key_id) && table.contains("TOTAL"),
        "{table}"
    );
}
