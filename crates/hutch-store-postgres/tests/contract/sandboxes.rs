//! Contract cases of sandbox records: writes and their errors, atomic changes, lookups,
//! pages, filters and the queries of the reaper, idle hibernation, snapshots and volumes.

use std::collections::BTreeMap;

use hutch_core::model::SandboxState;
use hutch_core::store::{Cursor, PageRequest, SandboxQuery, SandboxRefresh, Store};
use hutch_core::tenant::{Tenant, TenantScope};
use hutch_core::volume::VolumeMount;
use hutch_core::CoreError;

use crate::support::{ids, record, sid};

fn acme() -> TenantScope {
    TenantScope::Only(Tenant::new("acme"))
}

fn everything(scope: TenantScope) -> SandboxQuery {
    SandboxQuery {
        scope,
        state: None,
        metadata: BTreeMap::new(),
    }
}

pub async fn records_are_inserted_updated_and_deleted(s: &dyn Store) {
    let a = record("sbx_a", 20);
    s.insert_sandbox(&a).await.expect("insert");
    let taken = s.insert_sandbox(&record("sbx_b", 20)).await;
    match taken {
        Err(CoreError::Conflict(m)) => assert_eq!(m, "uid slot 20 in use"),
        other => panic!("a taken uid slot is a conflict: {other:?}"),
    }
    assert!(s.get_sandbox(&sid("sbx_b")).await.expect("get").is_none());
    assert_eq!(
        s.get_sandbox(&sid("sbx_a")).await.expect("get"),
        Some(a.clone()),
        "a record reads back as written, its tenant too"
    );
    let mut failed = a.clone();
    failed.state = SandboxState::Failed;
    failed.error = Some("oom".into());
    s.update_sandbox(&failed).await.expect("update");
    assert_eq!(
        s.get_sandbox(&sid("sbx_a")).await.expect("get"),
        Some(failed)
    );
    assert_eq!(
        s.count_by_state().await.expect("count"),
        vec![(SandboxState::Failed, 1)]
    );
    match s.update_sandbox(&record("sbx_zz", 21)).await {
        Err(CoreError::NotFound(m)) => assert_eq!(m, "sandbox sbx_zz does not exist"),
        other => panic!("an update of no record is NotFound: {other:?}"),
    }
    assert!(s.delete_sandbox(&sid("sbx_a")).await.expect("delete"));
    assert!(!s.delete_sandbox(&sid("sbx_a")).await.expect("again"));
    assert!(s.get_sandbox(&sid("sbx_a")).await.expect("get").is_none());
    assert!(s.count_by_state().await.expect("count").is_empty());
    // Its slot is free again.
    s.insert_sandbox(&record("sbx_b", 20))
        .await
        .expect("slot reused");
}

pub async fn modify_changes_one_record_and_can_refuse(s: &dyn Store) {
    s.insert_sandbox(&record("sbx_a", 20))
        .await
        .expect("insert");
    let a = sid("sbx_a");
    let r = s
        .modify_sandbox(
            &a,
            Box::new(|r| {
                r.state = SandboxState::Paused;
                Ok(())
            }),
        )
        .await
        .expect("modify");
    assert_eq!(r.state, SandboxState::Paused);
    assert_eq!(
        s.count_by_state().await.expect("count"),
        vec![(SandboxState::Paused, 1)],
        "the indexed state follows the record"
    );
    let refused = s
        .modify_sandbox(
            &a,
            Box::new(|r| {
                r.state = SandboxState::Failed;
                Err(CoreError::Conflict("no".into()))
            }),
        )
        .await;
    assert!(
        matches!(refused, Err(CoreError::Conflict(_))),
        "{refused:?}"
    );
    let kept = s
        .get_sandbox(&sid("sbx_a"))
        .await
        .expect("get")
        .expect("row");
    assert_eq!(
        kept.state,
        SandboxState::Paused,
        "a refused change changed nothing"
    );
    assert!(matches!(
        s.modify_sandbox(&sid("sbx_zz"), Box::new(|_| Ok(()))).await,
        Err(CoreError::NotFound(_))
    ));
}

pub async fn concurrent_modifies_never_undo_each_other(s: &dyn Store) {
    s.insert_sandbox(&record("sbx_a", 20))
        .await
        .expect("insert");
    let a = sid("sbx_a");
    let bump = |_| {
        s.modify_sandbox(
            &a,
            Box::new(|r| {
                let n: u32 = r
                    .metadata
                    .get("n")
                    .map_or(0, |n| n.parse().expect("a count"));
                r.metadata.insert("n".into(), (n + 1).to_string());
                Ok(())
            }),
        )
    };
    let results = futures_util::future::join_all((0..20).map(bump)).await;
    for r in results {
        r.expect("modify");
    }
    let r = s
        .get_sandbox(&sid("sbx_a"))
        .await
        .expect("get")
        .expect("row");
    assert_eq!(r.metadata.get("n").map(String::as_str), Some("20"));
}

pub async fn a_scoped_lookup_finds_only_the_tenants_sandbox_and_never_a_warm_guest(s: &dyn Store) {
    s.insert_sandbox(&record("sbx_a", 20))
        .await
        .expect("insert");
    let mut pooled = record("sbx_p", 21);
    pooled.state = SandboxState::Pooled;
    pooled.tenant = None;
    s.insert_sandbox(&pooled).await.expect("insert");
    let other = TenantScope::Only(Tenant::new("other"));
    let found = |scope: TenantScope, id: &'static str| async move {
        s.get_sandbox_for(&sid(id), &scope)
            .await
            .expect("lookup")
            .map(|r| r.id.to_string())
    };
    assert_eq!(found(acme(), "sbx_a").await.as_deref(), Some("sbx_a"));
    assert_eq!(
        found(TenantScope::All, "sbx_a").await.as_deref(),
        Some("sbx_a")
    );
    assert_eq!(found(other, "sbx_a").await, None);
    assert_eq!(
        found(TenantScope::All, "sbx_p").await,
        None,
        "never a warm guest"
    );
    assert!(s.get_sandbox(&sid("sbx_p")).await.expect("get").is_some());
    assert_eq!(ids(&s.pooled_sandboxes().await.expect("pool")), ["sbx_p"]);
    assert_eq!(ids(&s.all_sandboxes().await.expect("all")), ["sbx_a"]);
    let listed = s
        .list_sandboxes(&everything(TenantScope::All), &PageRequest::default())
        .await
        .expect("list");
    assert_eq!(
        ids(&listed.items),
        ["sbx_a"],
        "warm guests are never listed"
    );
}

pub async fn pages_return_every_row_once_while_rows_are_inserted_and_deleted(s: &dyn Store) {
    let mut before = Vec::new();
    for i in 0..25u32 {
        let id = format!("sbx_{i:03}");
        s.insert_sandbox(&record(&id, 100 + i))
            .await
            .expect("insert");
        before.push(id);
    }
    let mut other = record("sbx_zother", 99);
    other.tenant = Some(Tenant::new("other"));
    s.insert_sandbox(&other).await.expect("insert");
    let query = everything(acme());
    let mut seen = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let page = PageRequest::new(Some(4), after.take()).expect("page");
        let got = s.list_sandboxes(&query, &page).await.expect("page");
        assert!(got.items.len() <= 4);
        seen.extend(ids(&got.items));
        pages += 1;
        // Between pages: a new row, one row not yet seen deleted, one seen deleted.
        let id = format!("sbx_new{pages:03}");
        s.insert_sandbox(&record(&id, 1000 + pages))
            .await
            .expect("insert");
        if pages == 2 {
            assert!(s.delete_sandbox(&sid("sbx_024")).await.expect("delete"));
            assert!(s.delete_sandbox(&sid("sbx_000")).await.expect("delete"));
        }
        match got.next {
            Some(c) => after = Some(c),
            None => break,
        }
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "no row twice: {seen:?}");
    for id in before.iter().filter(|id| id.as_str() != "sbx_024") {
        assert!(seen.contains(id), "{id} missing from {seen:?}");
    }
    assert!(
        !seen.contains(&"sbx_zother".to_string()),
        "only acme's rows"
    );
    let all = s
        .list_sandboxes(&query, &PageRequest::default())
        .await
        .expect("all");
    assert!(all.next.is_none(), "no limit: one answer, no cursor");
    assert_eq!(all.items.len(), 23 + pages as usize);
    // An exact last page says no more follow.
    let exact = PageRequest::new(Some(all.items.len()), None).expect("page");
    assert!(s
        .list_sandboxes(&query, &exact)
        .await
        .expect("page")
        .next
        .is_none());
    // A cursor is opaque and belongs to its listing.
    let first = s
        .list_sandboxes(&query, &PageRequest::new(Some(1), None).expect("page"))
        .await
        .expect("page");
    let cursor = first.next.expect("more follow");
    let foreign = PageRequest::new(Some(1), Some(cursor)).expect("page");
    let refused = s.list_volumes(&TenantScope::All, &foreign).await;
    assert!(
        matches!(refused, Err(CoreError::InvalidArgument(_))),
        "{refused:?}"
    );
    let garbage = PageRequest::new(Some(2), Some(Cursor::from_client("garbage"))).expect("page");
    let refused = s.list_sandboxes(&query, &garbage).await;
    assert!(
        matches!(refused, Err(CoreError::InvalidArgument(_))),
        "{refused:?}"
    );
}

pub async fn listings_filter_by_state_and_metadata(s: &dyn Store) {
    let mut a = record("sbx_a", 1);
    a.metadata.insert("role".into(), "ci".into());
    a.metadata.insert("team".into(), "ml".into());
    s.insert_sandbox(&a).await.expect("a");
    let mut b = record("sbx_b", 2);
    b.state = SandboxState::Paused;
    b.tenant = Some(Tenant::new("other"));
    b.metadata.insert("role".into(), "cd".into());
    s.insert_sandbox(&b).await.expect("b");
    let listed = |state: Option<SandboxState>, metadata: &[(&str, &str)]| {
        let q = SandboxQuery {
            scope: TenantScope::All,
            state,
            metadata: metadata
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        async move {
            ids(&s
                .list_sandboxes(&q, &PageRequest::default())
                .await
                .expect("list")
                .items)
        }
    };
    assert_eq!(listed(None, &[]).await, ["sbx_a", "sbx_b"]);
    assert_eq!(listed(Some(SandboxState::Paused), &[]).await, ["sbx_b"]);
    assert_eq!(listed(Some(SandboxState::Running), &[]).await, ["sbx_a"]);
    assert_eq!(listed(None, &[("role", "ci")]).await, ["sbx_a"]);
    assert_eq!(
        listed(None, &[("role", "ci"), ("team", "ml")]).await,
        ["sbx_a"]
    );
    assert!(listed(None, &[("role", "ci"), ("team", "web")])
        .await
        .is_empty());
    assert_eq!(listed(None, &[("tenant_id", "other")]).await, ["sbx_b"]);
    assert!(listed(None, &[("role", "qa")]).await.is_empty());
    assert!(listed(Some(SandboxState::Paused), &[("role", "ci")])
        .await
        .is_empty());
}

fn mount(volume: &str) -> VolumeMount {
    VolumeMount {
        volume: volume.into(),
        path: format!("/mnt/{volume}"),
        read_only: false,
    }
}

pub async fn the_reaper_idle_layer_and_volume_queries_select_their_rows(s: &dyn Store) {
    let mut late = record("sbx_late", 1);
    late.expires_at_ms = 50;
    let mut soon = record("sbx_soon", 2);
    soon.expires_at_ms = 10;
    soon.idle_hibernate_seconds = Some(60);
    soon.layer = Some("snap_x".into());
    soon.volumes = vec![mount("vol_a"), mount("vol_b")];
    let mut kept = record("sbx_kept", 3);
    kept.persistent = true;
    kept.expires_at_ms = 1;
    kept.layer = Some("snap_x".into());
    kept.volumes = vec![mount("vol_a")];
    let mut pooled = record("sbx_pool", 4);
    pooled.state = SandboxState::Pooled;
    pooled.expires_at_ms = 1;
    let mut idle_paused = record("sbx_paused", 5);
    idle_paused.state = SandboxState::Paused;
    idle_paused.idle_hibernate_seconds = Some(60);
    idle_paused.expires_at_ms = 1_000;
    idle_paused.volumes = vec![mount("vol_c")];
    for r in [&late, &soon, &kept, &pooled, &idle_paused] {
        s.insert_sandbox(r).await.expect("insert");
    }
    assert_eq!(
        ids(&s.expired_sandboxes(50).await.expect("expired")),
        ["sbx_soon", "sbx_late"],
        "soonest first; never a persistent sandbox or a warm guest"
    );
    assert_eq!(
        ids(&s.expired_sandboxes(9).await.expect("expired")),
        Vec::<String>::new()
    );
    assert_eq!(ids(&s.idle_candidates().await.expect("idle")), ["sbx_soon"]);
    assert_eq!(
        ids(&s.sandboxes_on_layer("snap_x").await.expect("layer")),
        ["sbx_soon", "sbx_kept"]
    );
    assert!(s
        .sandboxes_on_layer("snap_y")
        .await
        .expect("layer")
        .is_empty());
    let running = [SandboxState::Running];
    let live = [SandboxState::Running, SandboxState::Paused];
    assert_eq!(
        ids(&s
            .sandboxes_with_volume("vol_a", &running)
            .await
            .expect("users")),
        ["sbx_soon", "sbx_kept"]
    );
    assert_eq!(
        ids(&s
            .sandboxes_with_volume("vol_c", &live)
            .await
            .expect("users")),
        ["sbx_paused"]
    );
    assert!(s
        .sandboxes_with_volume("vol_c", &running)
        .await
        .expect("users")
        .is_empty());
    let mut in_use = s.volumes_in_use(&live).await.expect("in use");
    in_use.sort();
    assert_eq!(in_use, ["vol_a", "vol_b", "vol_c"]);
    assert!(s
        .volumes_in_use(&[SandboxState::Failed])
        .await
        .expect("none")
        .is_empty());
    let mut counts = s.count_by_state().await.expect("count");
    counts.sort_by_key(|(state, _)| state.as_str());
    assert_eq!(
        counts,
        [(SandboxState::Paused, 1), (SandboxState::Running, 3)],
        "warm guests are not counted (`pooled` is no state of `SandboxState::ALL`)"
    );
}

pub async fn refreshes_move_times_only_later_and_skip_deleted_records(s: &dyn Store) {
    let mut kept = record("sbx_a", 16);
    kept.expires_at_ms = 1_000;
    kept.last_used_ms = 500;
    let mut persistent = record("sbx_b", 17);
    persistent.persistent = true;
    s.insert_sandbox(&kept).await.expect("insert");
    s.insert_sandbox(&persistent).await.expect("insert");
    let refresh = |expires, used| SandboxRefresh {
        expires_at_ms: Some(expires),
        last_used_ms: Some(used),
    };
    s.refresh_sandboxes(&[
        (sid("sbx_a"), refresh(5_000, 100)),
        (sid("sbx_b"), refresh(5_000, 900)),
        (sid("sbx_gone"), refresh(5_000, 900)),
        (sid("sbx_a"), refresh(4_000, 300)),
    ])
    .await
    .expect("refresh");
    let a = s.get_sandbox(&sid("sbx_a")).await.expect("get").expect("a");
    assert_eq!((a.expires_at_ms, a.last_used_ms), (5_000, 500));
    let b = s.get_sandbox(&sid("sbx_b")).await.expect("get").expect("b");
    assert_eq!((b.expires_at_ms, b.last_used_ms), (2, 900));
    assert!(s
        .get_sandbox(&sid("sbx_gone"))
        .await
        .expect("get")
        .is_none());
    assert!(
        s.expired_sandboxes(4_999).await.expect("due").is_empty(),
        "the column moved"
    );
    assert_eq!(
        ids(&s.expired_sandboxes(5_000).await.expect("due")),
        ["sbx_a"]
    );
    s.refresh_sandboxes(&[]).await.expect("an empty batch");
}
