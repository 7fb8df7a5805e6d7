//! Contract cases of snapshot and volume records.

use hutch_core::store::{PageRequest, Store};
use hutch_core::tenant::{Tenant, TenantScope};

use crate::support::{snapshot, volume};

fn only(t: &str) -> TenantScope {
    TenantScope::Only(Tenant::new(t))
}

pub async fn snapshots_are_named_listed_hidden_and_deleted(s: &dyn Store) {
    let warm1 = snapshot("snap_1", "warm", Some("acme"), false);
    for r in [
        &warm1,
        &snapshot("snap_2", "warm", Some("other"), false),
        &snapshot("snap_3", "warm", Some("acme"), true),
        &snapshot("snap_4", "cold", None, false),
        &snapshot("snap_5", "warm", Some("acme"), false),
    ] {
        s.insert_snapshot(r).await.expect("insert");
    }
    assert_eq!(
        s.get_snapshot(&"snap_1".parse().expect("id"))
            .await
            .expect("get"),
        Some(warm1)
    );
    let hidden = s
        .get_snapshot(&"snap_3".parse().expect("id"))
        .await
        .expect("get")
        .expect("a hidden one is found by id");
    assert!(hidden.hidden);
    assert!(s
        .get_snapshot(&"snap_9".parse().expect("id"))
        .await
        .expect("get")
        .is_none());
    let names = |v: Vec<hutch_core::snapshot::SnapshotRecord>| {
        v.into_iter().map(|r| r.id.to_string()).collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            s.snapshots_named("warm", &only("acme"))
                .await
                .expect("named")
        ),
        ["snap_1", "snap_5"]
    );
    assert_eq!(
        names(
            s.snapshots_named("warm", &TenantScope::All)
                .await
                .expect("named")
        ),
        ["snap_1", "snap_2", "snap_5"]
    );
    assert!(s
        .snapshots_named("hot", &TenantScope::All)
        .await
        .expect("named")
        .is_empty());
    let first = s
        .list_snapshots(
            &TenantScope::All,
            &PageRequest::new(Some(2), None).expect("page"),
        )
        .await
        .expect("page");
    assert_eq!(names(first.items), ["snap_1", "snap_2"]);
    let second = s
        .list_snapshots(
            &TenantScope::All,
            &PageRequest::new(Some(2), first.next).expect("page"),
        )
        .await
        .expect("page");
    assert_eq!(
        names(second.items),
        ["snap_4", "snap_5"],
        "hidden ones are not listed"
    );
    assert!(second.next.is_none());
    let acme = s
        .list_snapshots(&only("acme"), &PageRequest::default())
        .await
        .expect("page");
    assert_eq!(names(acme.items), ["snap_1", "snap_5"]);
    assert_eq!(
        names(s.all_snapshots().await.expect("all")),
        ["snap_1", "snap_2", "snap_3", "snap_4", "snap_5"],
        "every record, hidden ones too"
    );
    assert!(s
        .delete_snapshot(&"snap_1".parse().expect("id"))
        .await
        .expect("delete"));
    assert!(!s
        .delete_snapshot(&"snap_1".parse().expect("id"))
        .await
        .expect("again"));
    assert_eq!(s.all_snapshots().await.expect("all").len(), 4);
}

pub async fn volumes_are_found_by_id_or_name_within_their_scope(s: &dyn Store) {
    let data = volume("vol_1", "data", Some("acme"));
    for r in [
        &data,
        &volume("vol_2", "data", Some("other")),
        &volume("vol_3", "logs", None),
        &volume("vol_4", "cache", Some("acme")),
    ] {
        s.insert_volume(r).await.expect("insert");
    }
    assert_eq!(
        s.find_volume("data", &only("acme")).await.expect("find"),
        Some(data.clone())
    );
    assert_eq!(
        s.find_volume("vol_1", &only("acme")).await.expect("find"),
        Some(data)
    );
    assert!(s
        .find_volume("vol_1", &only("other"))
        .await
        .expect("find")
        .is_none());
    let by_name = s.find_volume("data", &only("other")).await.expect("find");
    assert_eq!(by_name.map(|v| v.id.to_string()).as_deref(), Some("vol_2"));
    let first = s
        .find_volume("data", &TenantScope::All)
        .await
        .expect("find");
    assert_eq!(
        first.map(|v| v.id.to_string()).as_deref(),
        Some("vol_1"),
        "oldest first"
    );
    assert!(s
        .find_volume("nope", &TenantScope::All)
        .await
        .expect("find")
        .is_none());
    let acme = Tenant::new("acme");
    assert!(s
        .volume_name_taken("data", Some(&acme))
        .await
        .expect("taken"));
    assert!(!s
        .volume_name_taken("logs", Some(&acme))
        .await
        .expect("taken"));
    assert!(s.volume_name_taken("logs", None).await.expect("taken"));
    assert!(!s.volume_name_taken("data", None).await.expect("taken"));
    let vols = |v: Vec<hutch_core::volume::VolumeRecord>| {
        v.into_iter().map(|r| r.id.to_string()).collect::<Vec<_>>()
    };
    let page = s
        .list_volumes(
            &TenantScope::All,
            &PageRequest::new(Some(3), None).expect("page"),
        )
        .await
        .expect("page");
    assert_eq!(vols(page.items), ["vol_1", "vol_2", "vol_3"]);
    let rest = s
        .list_volumes(
            &TenantScope::All,
            &PageRequest::new(Some(3), page.next).expect("page"),
        )
        .await
        .expect("page");
    assert_eq!(
        (vols(rest.items), rest.next),
        (vec!["vol_4".to_string()], None)
    );
    let mine = s
        .list_volumes(&only("acme"), &PageRequest::default())
        .await
        .expect("page");
    assert_eq!(vols(mine.items), ["vol_1", "vol_4"]);
    assert_eq!(vols(s.all_volumes().await.expect("all")).len(), 4);
    assert!(s
        .delete_volume(&"vol_1".parse().expect("id"))
        .await
        .expect("delete"));
    assert!(!s
        .delete_volume(&"vol_1".parse().expect("id"))
        .await
        .expect("again"));
    assert!(s
        .find_volume("vol_1", &TenantScope::All)
        .await
        .expect("find")
        .is_none());
}
