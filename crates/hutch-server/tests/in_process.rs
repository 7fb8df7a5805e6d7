//! The API driven in-process: `hutch_server::app(state)` over a manager on the fake backend
//! (`hutch_core::backend::fake`), requests sent with tower's `oneshot` — no socket, no root.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use hutch_core::backend::fake::{start_manager, Operation};
use serde_json::{json, Value};
use tower::ServiceExt;

/// The API of a fresh manager, and its admin key.
struct Api {
    app: axum::Router,
    key: String,
    fake: hutch_core::backend::fake::FakeBackend,
    manager: std::sync::Arc<hutch_core::Manager>,
    _dir: tempfile::TempDir,
}

impl Api {
    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let (manager, fake) = start_manager(dir.path()).await.expect("manager");
        let key = manager.ensure_admin_key().await.expect("admin key");
        let app = hutch_server::app(hutch_server::AppState::new(manager.clone()));
        Self {
            app,
            key,
            fake,
            manager,
            _dir: dir,
        }
    }

    async fn call(&self, method: &str, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
        self.call_as(&self.key, method, uri, body).await
    }

    /// [`Api::call`] with API key `key`.
    async fn call_as(
        &self,
        key: &str,
        method: &str,
        uri: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(match body {
                Some(v) => Body::from(v.to_string()),
                None => Body::empty(),
            })
            .expect("request");
        let response = self.app.clone().oneshot(request).await.expect("infallible");
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        (status, value)
    }
}

#[tokio::test]
async fn create_get_exec_delete_round_trip() {
    let api = Api::start().await;
    let (status, created) = api.call("POST", "/v1/sandboxes", Some(json!({}))).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["state"], "running");
    assert_eq!(created["template"], "minimal");
    let id = created["id"].as_str().expect("id").to_string();

    let (status, got) = api.call("GET", &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["id"], id.as_str());

    let (status, out) = api
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": ["echo", "hello", "world"]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["exit_code"], 0, "{out}");
    assert_eq!(out["stdout"], "hello world\n", "{out}");

    let (status, out) = api
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": "cat", "stdin": "fed through the agent"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["stdout"], "fed through the agent", "{out}");

    let (status, _) = api
        .call("DELETE", &format!("/v1/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, gone) = api.call("GET", &format!("/v1/sandboxes/{id}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{gone}");
    assert_eq!(
        api.fake.operations_on(&id),
        [Operation::Create, Operation::Destroy]
    );
}

#[tokio::test]
async fn a_refused_transition_is_409_with_the_state_machine_message() {
    let api = Api::start().await;
    let (_, created) = api.call("POST", "/v1/sandboxes", Some(json!({}))).await;
    let id = created["id"].as_str().expect("id").to_string();
    let (status, v) = api
        .call("POST", &format!("/v1/sandboxes/{id}/resume"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"]["code"], "conflict", "{v}");
    assert_eq!(
        v["error"]["message"],
        format!("cannot resume sandbox {id}: it is running"),
        "{v}"
    );
    let (status, v) = api
        .call("POST", &format!("/v1/sandboxes/{id}/pause"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "paused");
    let (status, v) = api
        .call(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"cmd": ["true"]})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(
        v["error"]["message"],
        format!("sandbox {id} is paused: only resume, kill, get and list are allowed on a paused sandbox (POST /v1/sandboxes/{id}/resume)"),
        "{v}"
    );
}

#[tokio::test]
async fn a_malformed_sandbox_id_is_answered_as_an_unknown_one() {
    let api = Api::start().await;
    let tenant_key = {
        let tenant = hutch_core::tenant::Tenant::new("acme");
        let _ = api
            .manager
            .create_tenant(tenant.clone(), Default::default())
            .await;
        api.manager
            .create_key(hutch_core::tenant::keys::NewKey {
                tenant,
                scope: hutch_core::tenant::keys::KeyScope::Full,
                name: None,
                selector: Default::default(),
                expires_at_ms: None,
                format: Default::default(),
                budget: Default::default(),
            })
            .await
            .expect("tenant key")
            .secret
    };
    let (status, created) = api.call("POST", "/v1/sandboxes", Some(json!({}))).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let long = format!("sbx_{}", "a".repeat(65));
    // Unknown (well-formed), then malformed: no `sbx_` rest, another kind's prefix, a byte
    // outside the alphabet, too long, upper case.
    let ids = [
        "sbx_doesnotexist",
        "sbx_",
        "snap_abcdefghijklmnop",
        "sbx_abc-def",
        long.as_str(),
        "SBX_abcdefghijklmnop",
    ];
    let routes = [
        ("GET", ""),
        ("DELETE", ""),
        ("POST", "/pause"),
        ("POST", "/wake"),
        ("GET", "/usage"),
        ("GET", "/logs"),
        ("GET", "/files/list?path=/"),
    ];
    for key in [api.key.as_str(), tenant_key.as_str()] {
        for id in ids {
            for (method, rest) in routes {
                let uri = format!("/v1/sandboxes/{id}{rest}");
                let (status, v) = api.call_as(key, method, &uri, None).await;
                assert_eq!(status, StatusCode::NOT_FOUND, "{method} {uri}: {v}");
                assert_eq!(v["error"]["code"], "not_found", "{method} {uri}: {v}");
                assert_eq!(
                    v["error"]["message"],
                    format!("sandbox {id} does not exist"),
                    "{method} {uri}: {v}"
                );
            }
            let uri = format!("/v1/sandboxes/{id}/exec");
            let (status, v) = api
                .call_as(key, "POST", &uri, Some(json!({"cmd": ["true"]})))
                .await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{uri}: {v}");
            assert_eq!(
                v["error"]["message"],
                format!("sandbox {id} does not exist")
            );
        }
    }
    // Nothing was done to the real sandbox.
    let id = created["id"].as_str().expect("id");
    assert_eq!(api.fake.operations_on(id), [Operation::Create]);
}

#[tokio::test]
async fn a_malformed_snapshot_id_is_answered_as_an_unknown_one() {
    let api = Api::start().await;
    for id in [
        "snap_doesnotexist",
        "snap_",
        "sbx_abcdefghijklmnop",
        "snap_a-b",
    ] {
        for method in ["GET", "DELETE"] {
            let uri = format!("/v1/snapshots/{id}");
            let (status, v) = api.call(method, &uri, None).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{method} {uri}: {v}");
            assert_eq!(
                v["error"]["message"],
                format!("snapshot {id} does not exist"),
                "{method} {uri}: {v}"
            );
        }
    }
}
