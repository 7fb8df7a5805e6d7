//! Contract cases of tenants, keys, quota counts and template owners.

use hutch_core::ids::KeyId;
use hutch_core::model::SandboxState;
use hutch_core::store::tenancy::CREATE_WINDOW_MS;
use hutch_core::store::{Page, PageRequest, Store};
use hutch_core::tenant::keys::{KeyBudget, KeyRecord};
use hutch_core::tenant::quota::TenantUsage;
use hutch_core::tenant::settings::Quotas;
use hutch_core::tenant::{Tenant, TenantScope};
use hutch_core::CoreError;

use crate::support::{key, sandbox_of, sid, snapshot, tenant, volume};

pub async fn tenants_are_made_changed_and_deleted_with_their_keys(s: &dyn Store) {
    s.insert_tenant(&tenant("acme")).await.expect("insert");
    match s.insert_tenant(&tenant("acme")).await {
        Err(CoreError::Conflict(m)) => assert_eq!(m, "tenant acme already exists"),
        other => panic!("a second tenant of a name is a conflict: {other:?}"),
    }
    let mut changed = tenant("acme");
    changed.settings.quotas = Quotas {
        max_sandboxes: Some(3),
        ..Quotas::default()
    };
    s.update_tenant(&changed).await.expect("update");
    assert_eq!(
        s.get_tenant(&Tenant::new("acme")).await.expect("q"),
        Some(changed)
    );
    assert!(s
        .get_tenant(&Tenant::new("nobody"))
        .await
        .expect("q")
        .is_none());
    match s.update_tenant(&tenant("nobody")).await {
        Err(CoreError::NotFound(m)) => assert_eq!(m, "tenant nobody does not exist"),
        other => panic!("{other:?}"),
    }
    for name in ["beta", "gamma"] {
        s.insert_tenant(&tenant(name)).await.expect("insert");
    }
    let first = s
        .list_tenants(&PageRequest::new(Some(2), None).expect("page"))
        .await
        .expect("page");
    let names = |p: &Page<hutch_core::tenant::settings::TenantRecord>| {
        p.items
            .iter()
            .map(|t| t.name.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&first), ["acme", "beta"]);
    let rest = s
        .list_tenants(&PageRequest::new(Some(2), first.next.clone()).expect("page"))
        .await
        .expect("page");
    assert_eq!(
        (names(&rest), rest.next.clone()),
        (vec!["gamma".to_string()], None)
    );
    s.insert_key("hash_a", &key("key_a", "acme"))
        .await
        .expect("key");
    s.insert_key("hash_a2", &key("key_a2", "acme"))
        .await
        .expect("key");
    s.insert_key("hash_b", &key("key_b", "beta"))
        .await
        .expect("key");
    s.record_create(&Tenant::new("acme"), 5).await.expect("log");
    assert_eq!(
        s.delete_tenant(&Tenant::new("acme")).await.expect("delete"),
        vec![
            "key_a".parse::<KeyId>().expect("id"),
            "key_a2".parse::<KeyId>().expect("id")
        ]
    );
    assert!(s
        .get_tenant(&Tenant::new("acme"))
        .await
        .expect("q")
        .is_none());
    assert!(s.key_by_secret_hash("hash_a").await.expect("q").is_none());
    assert!(
        s.key_by_secret_hash("hash_b").await.expect("q").is_some(),
        "others stay"
    );
    assert_eq!(
        s.tenant_usage(&Tenant::new("acme"), &[], 0)
            .await
            .expect("usage")
            .creates_last_hour,
        0,
        "its creates went with it"
    );
    match s.delete_tenant(&Tenant::new("acme")).await {
        Err(CoreError::NotFound(m)) => assert_eq!(m, "tenant acme does not exist"),
        other => panic!("{other:?}"),
    }
}

pub async fn a_tenant_that_owns_anything_is_not_deleted(s: &dyn Store) {
    let acme = Tenant::new("acme");
    s.insert_tenant(&tenant("acme")).await.expect("tenant");
    s.insert_key("hash_a", &key("key_a", "acme"))
        .await
        .expect("key");
    s.insert_sandbox(&sandbox_of(
        "sbx_a",
        20,
        "acme",
        SandboxState::Hibernated,
        1.0,
    ))
    .await
    .expect("sandbox");
    s.insert_snapshot(&snapshot("snap_a", "warm", Some("acme"), false))
        .await
        .expect("snapshot");
    s.insert_snapshot(&snapshot("snap_h", "fork", Some("acme"), true))
        .await
        .expect("hidden snapshot");
    s.insert_volume(&volume("vol_a", "data", Some("acme")))
        .await
        .expect("volume");
    s.insert_volume(&volume("vol_b", "logs", Some("acme")))
        .await
        .expect("volume");
    assert_eq!(s.claim_template("web", &acme).await.expect("claim"), acme);
    let refusal = |s: &'static str| format!("tenant acme still owns {s}: delete them first");
    let e = s.delete_tenant(&acme).await.expect_err("owns things");
    assert!(matches!(e, CoreError::Conflict(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        refusal("1 sandbox, 1 snapshot, 2 volumes and 1 template")
    );
    assert!(s.delete_sandbox(&sid("sbx_a")).await.expect("delete"));
    assert!(s
        .delete_snapshot(&"snap_a".parse().expect("id"))
        .await
        .expect("delete"));
    assert!(s
        .delete_volume(&"vol_a".parse().expect("id"))
        .await
        .expect("delete"));
    let e = s.delete_tenant(&acme).await.expect_err("owns things");
    assert_eq!(e.to_string(), refusal("1 volume and 1 template"));
    assert!(s
        .delete_volume(&"vol_b".parse().expect("id"))
        .await
        .expect("delete"));
    s.forget_template("web").await.expect("forget");
    // A warm guest or a hidden fork snapshot is nothing the tenant must delete.
    let mut pooled = sandbox_of("sbx_p", 21, "acme", SandboxState::Pooled, 1.0);
    pooled.state = SandboxState::Pooled;
    s.insert_sandbox(&pooled).await.expect("pooled");
    assert!(
        s.get_tenant(&acme).await.expect("q").is_some(),
        "nothing deleted yet"
    );
    assert_eq!(
        s.delete_tenant(&acme).await.expect("nothing owned now"),
        vec!["key_a".parse::<KeyId>().expect("id")]
    );
}

pub async fn usage_counts_live_sandboxes_leaves_out_the_excluded_and_windows_creates(
    s: &dyn Store,
) {
    for (id, slot, state, cpus) in [
        ("sbx_run", 20, SandboxState::Running, 0.5),
        ("sbx_start", 21, SandboxState::Starting, 0.25),
        ("sbx_pause", 22, SandboxState::Paused, 2.0),
        ("sbx_hib", 23, SandboxState::Hibernated, 4.0),
        ("sbx_fail", 24, SandboxState::Failed, 4.0),
    ] {
        s.insert_sandbox(&sandbox_of(id, slot, "acme", state, cpus))
            .await
            .expect("insert");
    }
    s.insert_sandbox(&sandbox_of(
        "sbx_other",
        25,
        "beta",
        SandboxState::Running,
        8.0,
    ))
    .await
    .expect("insert");
    let acme = Tenant::new("acme");
    assert_eq!(
        s.tenant_usage(&acme, &[], 0).await.expect("usage"),
        TenantUsage {
            sandboxes: 3,
            cpus: 0.75,
            memory_mib: 200,
            creates_last_hour: 0
        },
        "paused counts as a sandbox, not as running CPUs"
    );
    let u = s
        .tenant_usage(&acme, &[sid("sbx_run"), sid("sbx_nothing")], 0)
        .await
        .expect("usage");
    assert_eq!((u.sandboxes, u.cpus, u.memory_mib), (2, 0.25, 100));
    assert_eq!(
        s.tenant_usage(&Tenant::new("nobody"), &[], 0)
            .await
            .expect("usage"),
        TenantUsage::default()
    );
    s.record_create(&acme, 1_000).await.expect("log");
    s.record_create(&acme, 2_000).await.expect("log");
    s.record_create(&Tenant::new("beta"), 2_000)
        .await
        .expect("log");
    let creates = |since| async move {
        s.tenant_usage(&Tenant::new("acme"), &[], since)
            .await
            .expect("usage")
            .creates_last_hour
    };
    assert_eq!(creates(1_500).await, 1);
    assert_eq!(creates(0).await, 2);
    // A create an hour later forgets the ones before its window.
    s.record_create(&acme, 2_000 + CREATE_WINDOW_MS)
        .await
        .expect("log");
    assert_eq!(creates(0).await, 1, "only the last create is kept");
}

pub async fn keys_list_by_tenant_in_pages_and_uses_only_move_later(s: &dyn Store) {
    for (id, t) in [
        ("key_a1", "acme"),
        ("key_b1", "beta"),
        ("key_a2", "acme"),
        ("key_a3", "acme"),
    ] {
        s.insert_key(&format!("h_{id}"), &key(id, t))
            .await
            .expect("key");
    }
    let acme = TenantScope::Only(Tenant::new("acme"));
    let ids = |p: &Page<KeyRecord>| p.items.iter().map(|k| k.id.to_string()).collect::<Vec<_>>();
    let first = s
        .list_keys(&acme, &PageRequest::new(Some(2), None).expect("page"))
        .await
        .expect("page");
    assert_eq!(ids(&first), ["key_a1", "key_a2"]);
    let second = s
        .list_keys(
            &acme,
            &PageRequest::new(Some(2), first.next.clone()).expect("page"),
        )
        .await
        .expect("page");
    assert_eq!(ids(&second), ["key_a3"]);
    assert!(second.next.is_none());
    let all = s
        .list_keys(&TenantScope::All, &PageRequest::default())
        .await
        .expect("all");
    assert_eq!(ids(&all), ["key_a1", "key_b1", "key_a2", "key_a3"]);
    let a1: KeyId = "key_a1".parse().expect("id");
    assert_eq!(
        s.get_key(&a1).await.expect("q"),
        Some(key("key_a1", "acme"))
    );
    assert_eq!(
        s.key_by_secret_hash("h_key_a1").await.expect("q"),
        Some(key("key_a1", "acme"))
    );
    assert!(s
        .key_by_secret_hash("h_nothing")
        .await
        .expect("q")
        .is_none());
    let a2: KeyId = "key_a2".parse().expect("id");
    s.record_key_uses(&[(a1.clone(), 50), (a2.clone(), 70), (a1.clone(), 45)])
        .await
        .expect("uses");
    s.record_key_uses(&[(a1.clone(), 40)]).await.expect("uses");
    s.record_key_uses(&[]).await.expect("no uses");
    let used = |id: KeyId| async move {
        s.get_key(&id)
            .await
            .expect("q")
            .and_then(|k| k.last_used_ms)
    };
    assert_eq!(used(a1.clone()).await, Some(50), "uses only move later");
    assert_eq!(used(a2.clone()).await, Some(70));
    let budget = KeyBudget {
        daily_budget: Some(1_000),
        ..KeyBudget::default()
    };
    assert!(s.set_key_budget(&a1, &budget).await.expect("budget"));
    assert_eq!(
        s.get_key(&a1).await.expect("q").map(|k| k.budget),
        Some(budget)
    );
    let nobody: KeyId = "key_nobody".parse().expect("id");
    assert!(!s.set_key_budget(&nobody, &budget).await.expect("budget"));
    assert!(s.delete_key(&a1).await.expect("delete"));
    assert!(!s.delete_key(&a1).await.expect("again"));
    assert!(s.key_by_secret_hash("h_key_a1").await.expect("q").is_none());
}

pub async fn a_template_name_is_claimed_once(s: &dyn Store) {
    let (acme, beta) = (Tenant::new("acme"), Tenant::new("beta"));
    assert_eq!(s.claim_template("web", &acme).await.expect("claim"), acme);
    assert_eq!(s.claim_template("web", &beta).await.expect("claim"), acme);
    assert_eq!(s.claim_template("web", &acme).await.expect("again"), acme);
    assert_eq!(s.claim_template("db", &beta).await.expect("claim"), beta);
    assert_eq!(
        s.template_owner("web").await.expect("q"),
        Some(acme.clone())
    );
    assert_eq!(s.template_owner("nothing").await.expect("q"), None);
    let owners = s.template_owners().await.expect("q");
    assert_eq!(
        owners.into_iter().collect::<Vec<_>>(),
        [
            ("db".to_string(), beta.clone()),
            ("web".to_string(), acme.clone())
        ]
    );
    s.insert_tenant(&tenant("acme")).await.expect("tenant");
    assert!(matches!(
        s.delete_tenant(&acme).await,
        Err(CoreError::Conflict(_))
    ));
    s.forget_template("web").await.expect("forget");
    s.forget_template("web").await.expect("forget again");
    assert_eq!(s.template_owner("web").await.expect("q"), None);
    s.delete_tenant(&acme).await.expect("nothing owned now");
    assert_eq!(s.claim_template("web", &beta).await.expect("claim"), beta);
}
