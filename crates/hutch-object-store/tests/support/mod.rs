//! What the object-store tests share: explicit test credentials (the real environment's are
//! never read), files of known bytes, and the behaviour case every store must pass.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use hutch_object_store::{sha256_file, ObjectStore, ObjectStoreError, S3Credentials};
use hutch_testkit::S3Server;

/// The credentials every test signs with (moto accepts any).
pub fn credentials() -> S3Credentials {
    S3Credentials::new("hutch-test-key", "hutch-test-secret")
}

/// A file of `len` bytes at `dir/name`, deterministic for `seed` (xorshift), and its path.
pub fn file_of(dir: &Path, name: &str, len: usize, seed: u64) -> PathBuf {
    let mut x = seed | 1;
    let mut data = Vec::with_capacity(len);
    while data.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(len);
    let path = dir.join(name);
    std::fs::write(&path, data).expect("write a test file");
    path
}

/// The S3 store of `bucket` on `s3` (made), with the test credentials.
pub fn s3_store(s3: &S3Server, bucket: &str) -> hutch_object_store::S3ObjectStore {
    s3.create_bucket(bucket);
    hutch_object_store::S3ObjectStore::from_url(
        &s3.url(bucket),
        Some(credentials()),
        Default::default(),
    )
    .expect("the store")
}

/// Files left in `dir` (to prove a failed download leaves none).
pub fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The behaviour case of every store: put, head, list, get (verified), replace, delete.
pub async fn round_trip(store: &dyn ObjectStore, scratch: &Path) {
    let a = file_of(scratch, "a.bin", 100_000, 1);
    let b = file_of(scratch, "b.bin", 3, 2);
    let (a_sha, _) = sha256_file(&a).await.expect("hash a");

    assert_eq!(store.head("snaps/x/disk.img").await.expect("head"), None);
    assert!(store.list("").await.expect("list").is_empty());

    let info = store.put_file("snaps/x/disk.img", &a).await.expect("put a");
    assert_eq!(info.key, "snaps/x/disk.img");
    assert_eq!(info.bytes, 100_000);
    assert_eq!(info.sha256, a_sha);
    store.put_file("snaps/y/mem", &b).await.expect("put b");
    store.put_file("templates/t1", &b).await.expect("put t1");

    let head = store
        .head("snaps/x/disk.img")
        .await
        .expect("head")
        .expect("the object is there");
    assert_eq!(head, info, "head returns the sha256 stored with the object");

    let listed: Vec<(String, u64)> = store
        .list("snaps/")
        .await
        .expect("list")
        .into_iter()
        .map(|o| (o.key, o.bytes))
        .collect();
    assert_eq!(
        listed,
        [
            ("snaps/x/disk.img".to_string(), 100_000),
            ("snaps/y/mem".to_string(), 3)
        ]
    );
    assert_eq!(store.list("").await.expect("list all").len(), 3);
    assert_eq!(store.list("snaps/x").await.expect("list x").len(), 1);

    let dest = scratch.join("got.img");
    let got = store
        .get_to_file("snaps/x/disk.img", &dest, None)
        .await
        .expect("get");
    assert_eq!(got, info);
    assert_eq!(
        std::fs::read(&dest).expect("read got"),
        std::fs::read(&a).expect("read a")
    );
    // The caller's expected sha256 (upper case is the same digest).
    store
        .get_to_file("snaps/x/disk.img", &dest, Some(&a_sha.to_uppercase()))
        .await
        .expect("get with the expected sha256");

    // A wrong expected sha256: refused, and the file already there is untouched.
    let wrong = "0".repeat(64);
    let e = store
        .get_to_file("snaps/x/disk.img", &dest, Some(&wrong))
        .await
        .expect_err("a wrong sha256 is refused");
    assert!(
        matches!(&e, ObjectStoreError::ChecksumMismatch { expected, actual, .. }
            if *expected == wrong && *actual == a_sha),
        "{e:?}"
    );
    assert_eq!(
        std::fs::read(&dest).expect("read got"),
        std::fs::read(&a).expect("read a")
    );

    // Replacing an object replaces its sha256.
    let replaced = store
        .put_file("snaps/x/disk.img", &b)
        .await
        .expect("replace");
    let head = store
        .head("snaps/x/disk.img")
        .await
        .expect("head")
        .expect("there");
    assert_eq!(head.sha256, replaced.sha256);
    assert_eq!(head.bytes, 3);

    store.delete("snaps/x/disk.img").await.expect("delete");
    store
        .delete("snaps/x/disk.img")
        .await
        .expect("deleting twice is fine");
    assert_eq!(store.head("snaps/x/disk.img").await.expect("head"), None);
    let e = store
        .get_to_file("snaps/x/disk.img", &scratch.join("gone"), None)
        .await
        .expect_err("a deleted key");
    assert!(e.is_not_found(), "{e:?}");
    assert_eq!(e.to_string(), "object not found: snaps/x/disk.img");
    for key in ["snaps/y/mem", "templates/t1"] {
        store.delete(key).await.expect("delete");
    }
    assert!(store.list("").await.expect("list").is_empty());
    // No temporary file was left beside the downloads.
    let left: Vec<String> = files_in(scratch)
        .into_iter()
        .filter(|n| n.ends_with(".partial"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Every bad key is refused by every operation, with its exact message, before any
/// request.
pub async fn refuses_bad_keys(store: &dyn ObjectStore, scratch: &Path) {
    let file = file_of(scratch, "k.bin", 10, 3);
    for (key, message) in [
        (
            "../etc/passwd",
            "bad object key \"../etc/passwd\": it has a . or .. segment",
        ),
        ("/abs", "bad object key \"/abs\": it starts with /"),
        ("", "bad object key \"\": it is empty"),
        (
            "a b",
            "bad object key \"a b\": it has ' ', which is not visible ASCII (! to ~)",
        ),
    ] {
        let e = store.put_file(key, &file).await.expect_err(key);
        assert_eq!(e.to_string(), message);
        assert!(matches!(e, ObjectStoreError::BadKey { .. }));
        for e in [
            store.head(key).await.expect_err(key),
            store.delete(key).await.expect_err(key),
            store
                .get_to_file(key, &scratch.join("x"), None)
                .await
                .expect_err(key),
        ] {
            assert_eq!(e.to_string(), message);
        }
    }
    let e = store.list("a//").await.expect_err("a bad prefix");
    assert_eq!(
        e.to_string(),
        "bad object key \"a//\": it has an empty segment (//)"
    );
}
