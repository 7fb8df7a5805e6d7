//! The directory store: the behaviour case, a tampered object, a missing key, bad keys.

mod support;

use hutch_object_store::{FsObjectStore, ObjectStore, ObjectStoreError};
use support::{file_of, files_in, refuses_bad_keys, round_trip};

#[tokio::test]
async fn a_directory_store_round_trips() {
    let root = tempfile::tempdir().expect("root");
    let scratch = tempfile::tempdir().expect("scratch");
    let url = format!("file://{}", root.path().display());
    let store = hutch_object_store::open(&url, None).expect("open a file:// URL");
    assert_eq!(store.describe(), url);
    round_trip(store.as_ref(), scratch.path()).await;
    refuses_bad_keys(store.as_ref(), scratch.path()).await;
    assert!(
        files_in(&root.path().join("tmp")).is_empty(),
        "no temporary file is left"
    );
}

#[tokio::test]
async fn a_tampered_object_is_refused_and_leaves_no_file() {
    let root = tempfile::tempdir().expect("root");
    let scratch = tempfile::tempdir().expect("scratch");
    let store = FsObjectStore::open(root.path()).expect("store");
    let original = file_of(scratch.path(), "orig", 50_000, 7);
    let info = store.put_file("snap/disk", &original).await.expect("put");
    // Different bytes under the key, the metadata left as it was.
    std::fs::write(root.path().join("objects/snap/disk"), b"not the snapshot").expect("tamper");

    let downloads = tempfile::tempdir().expect("downloads");
    let dest = downloads.path().join("disk");
    for expected in [None, Some(info.sha256.as_str())] {
        let e = store
            .get_to_file("snap/disk", &dest, expected)
            .await
            .expect_err("tampered");
        match &e {
            ObjectStoreError::ChecksumMismatch {
                key,
                expected,
                actual,
            } => {
                assert_eq!(key, "snap/disk");
                assert_eq!(*expected, info.sha256);
                assert_ne!(*actual, info.sha256);
            }
            other => panic!("not a checksum error: {other:?}"),
        }
        assert!(
            e.to_string()
                .starts_with("object snap/disk failed its checksum: expected sha256 "),
            "{e}"
        );
        assert!(files_in(downloads.path()).is_empty(), "no file is left");
    }
}

#[tokio::test]
async fn a_missing_key_is_not_found_and_a_missing_root_is_refused() {
    let root = tempfile::tempdir().expect("root");
    let store = FsObjectStore::open(root.path()).expect("store");
    let downloads = tempfile::tempdir().expect("downloads");
    let e = store
        .get_to_file("no/such/key", &downloads.path().join("x"), None)
        .await
        .expect_err("missing");
    assert!(matches!(e, ObjectStoreError::NotFound { ref key } if key == "no/such/key"));
    assert!(files_in(downloads.path()).is_empty());

    let gone = root.path().join("unmounted");
    let e = FsObjectStore::open(&gone).expect_err("a missing root");
    assert_eq!(
        e.to_string(),
        format!(
            "open {}: No such file or directory (os error 2)",
            gone.display()
        )
    );
}
