//! The S3 store against a real S3 server (moto): the behaviour case, multipart, a tampered
//! object, a missing key, the server down, bad keys and URLs.

mod support;

use std::time::Duration;

use hutch_object_store::{sha256_file, ObjectStore, ObjectStoreError, S3ObjectStore, S3Options};
use hutch_testkit::S3Server;
use rusty_s3::{Bucket, S3Action, UrlStyle};
use support::{credentials, file_of, files_in, refuses_bad_keys, round_trip, s3_store};

/// A raw, signed request to `s3` for `key` of `bucket`: what the test does behind the
/// store's back.
fn raw_bucket(s3: &S3Server, bucket: &str) -> (Bucket, rusty_s3::Credentials) {
    let bucket = Bucket::new(
        s3.endpoint().parse().expect("endpoint"),
        UrlStyle::Path,
        bucket.to_string(),
        "us-east-1".to_string(),
    )
    .expect("bucket");
    (
        bucket,
        rusty_s3::Credentials::new("hutch-test-key", "hutch-test-secret"),
    )
}

#[tokio::test]
async fn an_s3_store_round_trips() {
    let Some(s3) = S3Server::start() else { return };
    let scratch = tempfile::tempdir().expect("scratch");
    let store = s3_store(&s3, "roundtrip");
    round_trip(&store, scratch.path()).await;
    refuses_bad_keys(&store, scratch.path()).await;
}

#[tokio::test]
async fn a_prefix_in_the_url_keeps_the_keys_under_it() {
    let Some(s3) = S3Server::start() else { return };
    s3.create_bucket("shared");
    let url = format!(
        "s3://shared/cluster-a?endpoint={}&path_style=true&region=us-east-1",
        s3.endpoint()
    );
    let a = hutch_object_store::open(&url, Some(credentials())).expect("store a");
    let whole = hutch_object_store::open(&s3.url("shared"), Some(credentials())).expect("all");
    let scratch = tempfile::tempdir().expect("scratch");
    let file = file_of(scratch.path(), "f", 10, 4);
    a.put_file("snaps/1", &file).await.expect("put");
    let keys: Vec<String> = a
        .list("")
        .await
        .expect("list")
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(keys, ["snaps/1"]);
    let keys: Vec<String> = whole
        .list("")
        .await
        .expect("list")
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(
        keys,
        ["cluster-a/snaps/1"],
        "the bucket has it under the prefix"
    );
    assert!(a
        .describe()
        .starts_with("s3://shared/cluster-a at http://127.0.0.1:"));
    a.delete("snaps/1").await.expect("delete");
}

#[tokio::test]
async fn a_20_mib_file_goes_up_in_parts_and_comes_back_byte_exact() {
    let Some(s3) = S3Server::start() else { return };
    let store = s3_store(&s3, "multipart");
    let scratch = tempfile::tempdir().expect("scratch");
    let big = file_of(scratch.path(), "big", 20 << 20, 11);
    let (sha, _) = sha256_file(&big).await.expect("hash");

    let started = std::time::Instant::now();
    let info = store.put_file("snaps/big", &big).await.expect("put");
    let put_took = started.elapsed();
    assert_eq!((info.bytes, info.sha256.as_str()), (20 << 20, sha.as_str()));

    // The object's ETag says how many parts made it: 8 + 8 + 4 MiB.
    let (bucket, creds) = raw_bucket(&s3, "multipart");
    let url = bucket
        .head_object(Some(&creds), "snaps/big")
        .sign(Duration::from_secs(60));
    let resp = reqwest::Client::new().head(url).send().await.expect("head");
    let etag = resp.headers()["etag"].to_str().expect("etag").to_string();
    assert!(
        etag.trim_matches('"').ends_with("-3"),
        "a 3-part upload: {etag}"
    );

    let head = store.head("snaps/big").await.expect("head").expect("there");
    assert_eq!(head, info);
    let dest = scratch.path().join("big.back");
    let started = std::time::Instant::now();
    let got = store
        .get_to_file("snaps/big", &dest, Some(&sha))
        .await
        .expect("get");
    eprintln!(
        "measured: 20 MiB put (hash + 3 parts) {put_took:?}, get (stream + verify) {:?}",
        started.elapsed()
    );
    assert_eq!(got, info);
    assert!(
        std::fs::read(&dest).expect("read back") == std::fs::read(&big).expect("read"),
        "the bytes come back exactly"
    );
}

#[tokio::test]
async fn a_tampered_object_is_refused_with_a_checksum_error_and_leaves_no_file() {
    let Some(s3) = S3Server::start() else { return };
    let store = s3_store(&s3, "tamper");
    let scratch = tempfile::tempdir().expect("scratch");
    let original = file_of(scratch.path(), "orig", 70_000, 5);
    let info = store.put_file("snaps/t", &original).await.expect("put");

    // Other bytes under the same key, with the original's sha256 as metadata.
    let (bucket, creds) = raw_bucket(&s3, "tamper");
    let mut put = bucket.put_object(Some(&creds), "snaps/t");
    put.headers_mut()
        .insert("x-amz-meta-sha256", info.sha256.clone());
    let url = put.sign(Duration::from_secs(60));
    let resp = reqwest::Client::new()
        .put(url)
        .header("x-amz-meta-sha256", &info.sha256)
        .body(&b"forged snapshot bytes"[..])
        .send()
        .await
        .expect("tampering put");
    assert!(resp.status().is_success(), "{}", resp.status());
    let head = store.head("snaps/t").await.expect("head").expect("there");
    assert_eq!(head.sha256, info.sha256, "the metadata claims the original");

    let downloads = tempfile::tempdir().expect("downloads");
    let dest = downloads.path().join("t");
    for expected in [None, Some(info.sha256.as_str())] {
        let e = store
            .get_to_file("snaps/t", &dest, expected)
            .await
            .expect_err("tampered bytes");
        let ObjectStoreError::ChecksumMismatch {
            expected, actual, ..
        } = &e
        else {
            panic!("not a checksum error: {e:?}");
        };
        assert_eq!(*expected, info.sha256);
        assert_ne!(*actual, info.sha256);
        assert!(!e.is_unavailable());
        assert!(files_in(downloads.path()).is_empty(), "no file is left");
    }
}

#[tokio::test]
async fn a_missing_key_is_not_found() {
    let Some(s3) = S3Server::start() else { return };
    let store = s3_store(&s3, "missing");
    let downloads = tempfile::tempdir().expect("downloads");
    let e = store
        .get_to_file("snaps/none", &downloads.path().join("x"), None)
        .await
        .expect_err("missing");
    assert!(
        matches!(&e, ObjectStoreError::NotFound { key } if key == "snaps/none"),
        "{e:?}"
    );
    assert!(!e.is_unavailable());
    assert!(files_in(downloads.path()).is_empty());
    assert_eq!(store.head("snaps/none").await.expect("head"), None);
}

#[tokio::test]
async fn with_the_server_down_every_operation_is_unavailable() {
    let Some(mut s3) = S3Server::start() else {
        return;
    };
    let store = s3_store(&s3, "down");
    let scratch = tempfile::tempdir().expect("scratch");
    let small = file_of(scratch.path(), "small", 1000, 8);
    let big = file_of(scratch.path(), "big", 6 << 20, 9);
    store
        .put_file("snaps/there", &small)
        .await
        .expect("put while up");
    s3.stop();

    for path in [&small, &big] {
        let e = store.put_file("snaps/s", path).await.expect_err("down");
        assert!(e.is_unavailable(), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("object store unavailable: PUT snaps/s: could not connect"),
            "{e}"
        );
        assert!(
            !e.to_string().contains("X-Amz-Signature"),
            "no signature in {e}"
        );
    }
    let dest = scratch.path().join("d");
    let e = store
        .get_to_file("snaps/there", &dest, None)
        .await
        .expect_err("down");
    assert!(e.is_unavailable(), "{e:?}");
    assert!(!dest.exists());
    assert!(store
        .head("snaps/there")
        .await
        .expect_err("down")
        .is_unavailable());
    assert!(store.list("").await.expect_err("down").is_unavailable());
    assert!(store
        .delete("snaps/there")
        .await
        .expect_err("down")
        .is_unavailable());

    // Back (empty: moto keeps nothing), the same store works again.
    s3.start_again();
    s3.create_bucket("down");
    store
        .put_file("snaps/s", &small)
        .await
        .expect("put once it is back");
}

#[tokio::test]
async fn a_stalled_server_times_out_as_unavailable() {
    // A listener that accepts and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let url = format!("s3://stalled?endpoint=http://127.0.0.1:{port}");
    let options = S3Options {
        request_timeout: Duration::from_millis(300),
        ..S3Options::default()
    };
    let store = S3ObjectStore::from_url(&url, Some(credentials()), options).expect("store");
    let started = std::time::Instant::now();
    let e = store.head("k").await.expect_err("stalled");
    assert!(e.is_unavailable(), "{e:?}");
    assert!(e.to_string().contains("timed out"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(listener);
}

#[test]
fn bad_urls_and_missing_credentials_are_typed_errors_with_exact_messages() {
    let e = hutch_object_store::open(
        "s3://bucket?endpoint=ftp://127.0.0.1:9",
        Some(credentials()),
    )
    .expect_err("ftp");
    assert!(matches!(e, ObjectStoreError::BadUrl { .. }));
    assert_eq!(
        e.to_string(),
        "bad object store URL \"s3://bucket?endpoint=ftp://127.0.0.1:9\": endpoint \
         \"ftp://127.0.0.1:9\" is not http:// or https://"
    );
    let e = hutch_object_store::open("gs://bucket", None).expect_err("gs");
    assert_eq!(
        e.to_string(),
        "bad object store URL \"gs://bucket\": the scheme is gs:, not s3: or file:"
    );
    let e = S3ObjectStore::from_url(
        "s3://bucket?endpoint=http://127.0.0.1:9",
        Some(credentials()),
        S3Options {
            part_size: 1 << 20,
            ..S3Options::default()
        },
    )
    .expect_err("small parts");
    assert!(
        e.to_string()
            .ends_with("the part size 1048576 is below S3's minimum of 5242880 bytes"),
        "{e}"
    );
}

#[tokio::test]
async fn a_multipart_upload_that_fails_is_aborted() {
    // moto made to want 16 MiB parts: completing an upload of 8 MiB parts fails
    // (EntityTooSmall) after its parts went up.
    let Some(s3) = S3Server::start_with_env(&[("S3_UPLOAD_PART_MIN_SIZE", "16777216")]) else {
        return;
    };
    let store = s3_store(&s3, "abort");
    let scratch = tempfile::tempdir().expect("scratch");
    let big = file_of(scratch.path(), "big", 17 << 20, 12);
    let e = store
        .put_file("snaps/too-small-parts", &big)
        .await
        .expect_err("refused");
    assert!(
        matches!(&e, ObjectStoreError::Rejected { status: 400, reason, .. }
            if reason.starts_with("EntityTooSmall")),
        "{e:?}"
    );
    let (status, uploads) = s3.get("/abort?uploads");
    assert_eq!(status, 200, "{uploads}");
    assert!(uploads.contains("ListMultipartUploadsResult"), "{uploads}");
    assert!(
        !uploads.contains("<UploadId>"),
        "no upload is left: {uploads}"
    );
    assert_eq!(
        store.head("snaps/too-small-parts").await.expect("head"),
        None
    );
}
