//! Volume API input errors (names, sizes, mount paths, unknown fields, missing volumes).
//!
//! The volume lifecycle (data kept from one sandbox to the next and over a server restart,
//! read-only attachments, exclusivity and deletion, a full volume, hibernate and wake, fork
//! children) is written once for both backends in `lifecycle_table/volumes.rs`.

use hutch_testkit::TestServer;
use reqwest::Method;
use serde_json::json;

#[tokio::test]
async fn volume_input_errors_are_4xx() {
    let s = TestServer::start().await;
    let vol = s.volume("v1", 8).await;
    for (body, want) in [
        (json!({"name": "bad name", "size_mib": 8}), 422),
        (json!({"name": "ok", "size_mib": 0}), 422),
        (json!({"name": "ok", "size_mib": "8"}), 400),
        (json!({"name": "ok"}), 400),
        (json!({"name": "v1", "size_mib": 8}), 409),
    ] {
        let (st, v) = s
            .request(Method::POST, "/v1/volumes", Some(body.clone()))
            .await;
        assert_eq!(st, want, "{body} -> {v}");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    for (mount, want) in [
        (json!({"volume": vol, "path": "/proc/x"}), 422),
        (json!({"volume": vol, "path": "relative"}), 422),
        (json!({"volume": vol, "path": "/a/../b"}), 422),
        (json!({"volume": "vol_missing", "path": "/data"}), 404),
        (json!({"volume": vol, "path": "/data", "extra": true}), 400),
    ] {
        let (st, v) = s
            .request(
                Method::POST,
                "/v1/sandboxes",
                Some(json!({"volumes": [mount.clone()]})),
            )
            .await;
        assert_eq!(st, want, "{mount} -> {v}");
    }
    let (st, _) = s
        .request(Method::DELETE, "/v1/volumes/vol_missing", None)
        .await;
    assert_eq!(st, 404);
}
