//! Contract cases of the audit log and of metered usage.

use hutch_core::audit::{AuditEntry, AuditQuery};
use hutch_core::store::usage::MeterReading;
use hutch_core::store::{Page, PageRequest, Store};
use hutch_core::tenant::{Tenant, TenantScope};
use hutch_core::usage::{GroupBy, ResourceKind, UsageInterval, UsageQuery, UsageTotals};

use crate::support::sid;

fn entry(at_ms: i64, tenant: Option<&str>, key: Option<&str>, sandbox: Option<&str>) -> AuditEntry {
    AuditEntry {
        id: 0,
        at_ms,
        key_id: key.map(|k| k.parse().expect("key id")),
        tenant: tenant.map(Tenant::new),
        method: "POST".into(),
        route: "/v1/sandboxes/{id}/exec".into(),
        path: format!("/v1/sandboxes/{}/exec", sandbox.unwrap_or("none")),
        sandbox: sandbox.map(sid),
        argv: sandbox.map(|_| vec!["sh".to_string(), "-c".to_string(), "echo 'hi'".to_string()]),
        status: 200,
    }
}

fn query(scope: TenantScope) -> AuditQuery {
    AuditQuery {
        scope,
        key_id: None,
        sandbox: None,
        since_ms: None,
        until_ms: None,
    }
}

pub async fn audit_entries_page_in_order_by_every_filter(s: &dyn Store) {
    s.append_audit(&[
        entry(10, Some("acme"), Some("key_a"), Some("sbx_a")),
        entry(20, Some("beta"), Some("key_b"), None),
        entry(30, Some("acme"), Some("key_a2"), Some("sbx_b")),
    ])
    .await
    .expect("append");
    s.append_audit(&[entry(40, None, None, Some("sbx_a"))])
        .await
        .expect("append");
    s.append_audit(&[]).await.expect("nothing to append");
    let times = |p: &Page<AuditEntry>| p.items.iter().map(|e| e.at_ms).collect::<Vec<_>>();
    let all = s
        .list_audit(&query(TenantScope::All), &PageRequest::default())
        .await
        .expect("all");
    assert_eq!(times(&all), [10, 20, 30, 40], "in the order appended");
    let mut ids: Vec<i64> = all.items.iter().map(|e| e.id).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "the store numbers them: {ids:?}"
    );
    ids.dedup();
    assert_eq!(ids.len(), 4);
    let mut first = entry(10, Some("acme"), Some("key_a"), Some("sbx_a"));
    first.id = all.items[0].id;
    assert_eq!(all.items[0], first, "an entry reads back as written");
    let first_page = s
        .list_audit(
            &query(TenantScope::All),
            &PageRequest::new(Some(3), None).expect("page"),
        )
        .await
        .expect("page");
    assert_eq!(times(&first_page), [10, 20, 30]);
    let rest = s
        .list_audit(
            &query(TenantScope::All),
            &PageRequest::new(Some(3), first_page.next).expect("page"),
        )
        .await
        .expect("page");
    assert_eq!((times(&rest), rest.next), (vec![40], None));
    let acme = TenantScope::Only(Tenant::new("acme"));
    let listed = |q: AuditQuery| async move {
        times(
            &s.list_audit(&q, &PageRequest::default())
                .await
                .expect("list"),
        )
    };
    assert_eq!(listed(query(acme.clone())).await, [10, 30]);
    let by_key = AuditQuery {
        key_id: Some("key_a".parse().expect("id")),
        ..query(TenantScope::All)
    };
    assert_eq!(listed(by_key).await, [10]);
    let by_sandbox = AuditQuery {
        sandbox: Some(sid("sbx_a")),
        ..query(TenantScope::All)
    };
    assert_eq!(listed(by_sandbox).await, [10, 40]);
    let window = AuditQuery {
        since_ms: Some(20),
        until_ms: Some(40),
        ..query(TenantScope::All)
    };
    assert_eq!(listed(window).await, [20, 30], "[since, until)");
}

fn interval(
    id: &str,
    tenant: Option<&str>,
    key: Option<&str>,
    end_ms: i64,
    cpu: f64,
) -> UsageInterval {
    UsageInterval {
        kind: ResourceKind::Sandbox,
        resource: id.into(),
        tenant: tenant.map(Tenant::new),
        key_id: key.map(|k| k.parse().expect("key id")),
        start_ms: end_ms - 1000,
        end_ms,
        usage: UsageTotals {
            cpu_seconds: cpu,
            memory_gib_seconds: 0.5,
            disk_gib_hours: 0.25,
            egress_bytes: 10,
        },
    }
}

pub async fn usage_rows_sum_by_group_and_window_and_meters_come_back(s: &dyn Store) {
    let day = 86_400_000;
    let k = "key_00000000000000000001";
    let mut snap = interval("snap_a", Some("acme"), None, 2 * day + 7, 0.0);
    snap.kind = ResourceKind::Snapshot;
    let reading = |cpu_ns| MeterReading {
        cpu_ns,
        egress_bytes: 3,
        at_ms: 7,
    };
    s.append_usage(
        &[
            interval("sbx_a", Some("acme"), Some(k), day + 5, 1.0),
            interval("sbx_a", Some("acme"), Some(k), 2 * day + 5, 2.0),
            interval("sbx_b", Some("other"), None, 2 * day + 6, 4.0),
            interval("sbx_c", None, None, 3 * day, 8.0),
            snap,
        ],
        &[
            (sid("sbx_a"), Some(reading(9))),
            (sid("sbx_b"), Some(reading(1))),
            (sid("sbx_b"), Some(reading(2))),
            (sid("sbx_c"), Some(reading(5))),
        ],
    )
    .await
    .expect("append");
    let q = |scope, group_by, from_ms, to_ms| UsageQuery {
        group_by,
        from_ms,
        to_ms,
        ..UsageQuery::since(scope, 0)
    };
    let sum = |q: UsageQuery| async move { s.usage_groups(&q).await.expect("sum") };
    let all = sum(q(TenantScope::All, GroupBy::Nothing, None, None)).await;
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].key.clone(), all[0].kind), (None, None));
    assert_eq!(all[0].usage.cpu_seconds, 15.0);
    assert_eq!(all[0].usage.memory_gib_seconds, 2.5);
    assert_eq!(all[0].usage.disk_gib_hours, 1.25);
    assert_eq!(all[0].usage.egress_bytes, 50);
    assert_eq!(all[0].intervals, 5);
    let acme = TenantScope::Only(Tenant::new("acme"));
    let days: Vec<(Option<String>, f64)> = sum(q(acme.clone(), GroupBy::Day, None, None))
        .await
        .into_iter()
        .map(|g| (g.key, g.usage.cpu_seconds))
        .collect();
    assert_eq!(
        days,
        [
            (Some("1970-01-02".to_string()), 1.0),
            (Some("1970-01-03".to_string()), 2.0)
        ]
    );
    // The window is (from, to] on each interval's end.
    let window = sum(q(
        TenantScope::All,
        GroupBy::Tenant,
        Some(day + 5),
        Some(2 * day + 6),
    ))
    .await;
    let tenants: Vec<(Option<String>, f64, u64)> = window
        .into_iter()
        .map(|g| (g.key, g.usage.cpu_seconds, g.intervals))
        .collect();
    assert_eq!(
        tenants,
        [
            (Some("acme".to_string()), 2.0, 1),
            (Some("other".to_string()), 4.0, 1)
        ]
    );
    let by_tenant = sum(q(TenantScope::All, GroupBy::Tenant, None, None)).await;
    let keys: Vec<Option<String>> = by_tenant.into_iter().map(|g| g.key).collect();
    assert_eq!(
        keys,
        [None, Some("acme".into()), Some("other".into())],
        "no tenant first, then in order"
    );
    let by_key = sum(q(TenantScope::All, GroupBy::Key, None, None)).await;
    let keys: Vec<(Option<String>, u64)> =
        by_key.into_iter().map(|g| (g.key, g.intervals)).collect();
    assert_eq!(keys, [(None, 3), (Some(k.to_string()), 2)]);
    let by_sandbox = sum(q(acme.clone(), GroupBy::Sandbox, None, None)).await;
    let resources: Vec<(Option<String>, Option<ResourceKind>)> =
        by_sandbox.into_iter().map(|g| (g.key, g.kind)).collect();
    assert_eq!(
        resources,
        [
            (Some("sbx_a".to_string()), Some(ResourceKind::Sandbox)),
            (Some("snap_a".to_string()), Some(ResourceKind::Snapshot))
        ]
    );
    let one_key = UsageQuery {
        key_id: Some(k.parse().expect("id")),
        ..q(TenantScope::All, GroupBy::Nothing, None, None)
    };
    assert_eq!(sum(one_key).await[0].usage.cpu_seconds, 3.0);
    let one_resource = UsageQuery {
        resource: Some("sbx_b".into()),
        ..q(TenantScope::All, GroupBy::Nothing, None, None)
    };
    assert_eq!(sum(one_resource).await[0].intervals, 1);
    let none = sum(q(
        TenantScope::Only(Tenant::new("nobody")),
        GroupBy::Nothing,
        None,
        None,
    ))
    .await;
    assert!(none.is_empty(), "an empty selection is no group");
    assert!(sum(q(
        TenantScope::Only(Tenant::new("nobody")),
        GroupBy::Day,
        None,
        None
    ))
    .await
    .is_empty());
    let meters = s.meter_readings().await.expect("meters");
    assert_eq!(meters.len(), 3);
    assert_eq!(meters[&sid("sbx_a")], reading(9));
    assert_eq!(meters[&sid("sbx_b")], reading(2), "the batch's last word");
    s.append_usage(
        &[],
        &[
            (sid("sbx_a"), None),
            (sid("sbx_c"), Some(reading(6))),
            (sid("sbx_c"), None),
            (sid("sbx_b"), None),
            (sid("sbx_b"), Some(reading(4))),
        ],
    )
    .await
    .expect("forget");
    let meters = s.meter_readings().await.expect("meters");
    assert_eq!(meters.len(), 1, "{meters:?}");
    assert_eq!(meters[&sid("sbx_b")], reading(4));
    s.append_usage(&[], &[]).await.expect("an empty batch");
}
