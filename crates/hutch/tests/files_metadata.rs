//! File metadata: `X-Hutch-Meta-<key>` headers on an upload become the file's `user.<key>`
//! extended attributes, reported by stat and list, visible and changeable from inside, kept
//! by a fork; bad pairs are a 400 that writes nothing.

use hutch_testkit::{both_backends, on, TestServer};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::Method;
use serde_json::{json, Value};

both_backends!(
    upload_headers_become_metadata_that_stat_list_the_sandbox_and_forks_see,
    bad_metadata_is_a_400_and_writes_nothing
);

/// One metadata header: the key and the value's bytes.
type Pair<'a> = (&'a str, &'a [u8]);

/// Uploads `data` to `path` with `pairs` as metadata headers; the status and JSON answer.
async fn put_with(s: &TestServer, id: &str, path: &str, pairs: &[Pair<'_>]) -> (u16, Value) {
    let mut headers = HeaderMap::new();
    for (key, value) in pairs {
        headers.insert(
            HeaderName::from_bytes(format!("X-Hutch-Meta-{key}").as_bytes()).expect("name"),
            HeaderValue::from_bytes(value).expect("value"),
        );
    }
    let resp = s
        .http
        .put(format!("{}/v1/sandboxes/{id}/files?path={path}", s.url))
        .bearer_auth(&s.key)
        .headers(headers)
        .body("contents")
        .send()
        .await
        .expect("put");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn stat(s: &TestServer, id: &str, path: &str) -> Value {
    let (st, v) = s
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/stat?path={path}"),
            None,
        )
        .await;
    assert_eq!(st, 200, "{v}");
    v
}

async fn upload_headers_become_metadata_that_stat_list_the_sandbox_and_forks_see(isolation: &str) {
    let s = TestServer::start().await;
    let id = s
        .create_id(on(isolation, json!({"template": "base"})))
        .await;
    for path in ["/work/tagged.txt", "/tmp/tagged.txt"] {
        let (st, v) = put_with(
            &s,
            &id,
            path,
            &[("Owner", b"agent-7"), ("run.id", b"42 / final")],
        )
        .await;
        assert_eq!(st, 204, "{path}: {v}");
        let entry = stat(&s, &id, path).await;
        // Header names arrive lowercased: so are the keys.
        assert_eq!(
            entry["metadata"],
            json!({"owner": "agent-7", "run.id": "42 / final"}),
            "{path}: {entry}"
        );
    }
    // Inside, the pairs are the file's user.* attributes: read and added to from there.
    let out = s
        .sh_ok(
            &id,
            "python3 -c \"import os; p='/work/tagged.txt'; \
             print(os.getxattr(p, 'user.owner').decode()); \
             os.setxattr(p, 'user.from-inside', b'yes'); \
             os.setxattr(p, 'user.binary', bytes([0, 255]))\"",
        )
        .await;
    assert_eq!(out, "agent-7\n");
    let (st, list) = s
        .request(
            Method::GET,
            &format!("/v1/sandboxes/{id}/files/list?path=/work"),
            None,
        )
        .await;
    assert_eq!(st, 200, "{list}");
    let entry = list["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["path"] == "/work/tagged.txt")
        .expect("listed")
        .clone();
    // A binary value set out-of-band is not a metadata value: left out, not mangled.
    assert_eq!(
        entry["metadata"],
        json!({"owner": "agent-7", "run.id": "42 / final", "from-inside": "yes"}),
        "{entry}"
    );
    // Files without pairs carry no metadata field.
    s.put_file(&id, "/work/plain.txt", "0644", b"plain".to_vec())
        .await;
    assert!(stat(&s, &id, "/work/plain.txt")
        .await
        .get("metadata")
        .is_none());

    let mode = if isolation == "vm" { "live" } else { "disk" };
    let children = s.fork(&id, 1, mode).await;
    let child = stat(&s, &children[0], "/work/tagged.txt").await;
    assert_eq!(
        child["metadata"], entry["metadata"],
        "the fork's copy: {child}"
    );
}

async fn bad_metadata_is_a_400_and_writes_nothing(isolation: &str) {
    let s = TestServer::start().await;
    let id = s.create_id(on(isolation, json!({}))).await;
    let long = vec![b'v'; 4097];
    let many: Vec<(String, &[u8])> = (0..33).map(|i| (format!("k{i}"), &b"v"[..])).collect();
    let many: Vec<Pair> = many.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let cases: [(&str, Vec<Pair>, &str); 3] = [
        (
            "non-ascii",
            vec![("name", "é".as_bytes())],
            "printable ASCII",
        ),
        ("long", vec![("name", &long)], "at most 4096 bytes"),
        ("many", many, "at most 32 metadata pairs"),
    ];
    for (what, pairs, says) in cases {
        let path = format!("/work/{what}.txt");
        let (st, v) = put_with(&s, &id, &path, &pairs).await;
        assert_eq!(st, 400, "{what}: {v}");
        assert_eq!(v["error"]["code"], "bad_request", "{what}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{what}: {message}");
        let (st, _) = s
            .request(
                Method::GET,
                &format!("/v1/sandboxes/{id}/files/stat?path={path}"),
                None,
            )
            .await;
        assert_eq!(st, 404, "{what}: nothing is written");
    }
}
