//! `/v1/templates` driven in-process over the fake backend: what is refused before a build
//! runs (the request, the context upload, the Dockerfile), and deleting templates. Builds
//! that run are tested against a real server (`crates/hutch/tests/template_api.rs`).

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use hutch_core::backend::fake::start_manager;
use hutch_server::build_context::ContextLimits;
use serde_json::{json, Value};
use tower::ServiceExt;

struct Api {
    app: axum::Router,
    key: String,
    manager: std::sync::Arc<hutch_core::Manager>,
    _dir: tempfile::TempDir,
}

impl Api {
    async fn start(limits: ContextLimits) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let (manager, _fake) = start_manager(dir.path()).await.expect("manager");
        let key = manager.ensure_admin_key().await.expect("admin key");
        let state = hutch_server::AppState::new(manager.clone()).with_context_limits(limits);
        Self {
            app: hutch_server::app(state),
            key,
            manager,
            _dir: dir,
        }
    }

    async fn send(
        &self,
        key: &str,
        request: axum::http::request::Builder,
        body: Body,
    ) -> (StatusCode, Value) {
        let request = request
            .header("authorization", format!("Bearer {key}"))
            .body(body)
            .expect("request");
        let response = self.app.clone().oneshot(request).await.expect("infallible");
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    async fn call(&self, method: &str, uri: &str) -> (StatusCode, Value) {
        self.send(
            &self.key,
            Request::builder().method(method).uri(uri),
            Body::empty(),
        )
        .await
    }

    /// `POST /v1/templates?{query}` with a tar body.
    async fn build(&self, query: &str, tar: Vec<u8>) -> (StatusCode, Value) {
        self.send(
            &self.key,
            Request::builder()
                .method("POST")
                .uri(format!("/v1/templates?{query}"))
                .header("content-type", "application/x-tar"),
            Body::from(tar),
        )
        .await
    }

    async fn tenant_key(&self) -> String {
        let tenant = hutch_core::tenant::Tenant::new("acme");
        let _ = self
            .manager
            .create_tenant(tenant.clone(), Default::default())
            .await;
        self.manager
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
    }

    /// What is left under `<state>/builds` besides empty directories.
    fn build_leftovers(&self) -> Vec<String> {
        let builds = self.manager.config().state_dir.join("builds");
        let mut left = Vec::new();
        for entry in std::fs::read_dir(builds).into_iter().flatten().flatten() {
            let empty = std::fs::read_dir(entry.path()).map_or(true, |mut d| d.next().is_none());
            if !empty {
                left.push(entry.path().display().to_string());
            }
        }
        left
    }
}

fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, *data).expect("append");
    }
    b.into_inner().expect("finish")
}

fn error_of(v: &Value) -> (&str, &str) {
    (
        v["error"]["code"].as_str().unwrap_or(""),
        v["error"]["message"].as_str().unwrap_or(""),
    )
}

#[tokio::test]
async fn a_bad_dockerfile_or_context_is_400_before_anything_runs() {
    let api = Api::start(ContextLimits::default()).await;
    let (status, v) = api
        .build(
            "name=web",
            tar_of(&[("Dockerfile", b"FROM minimal\nFOO bar\n")]),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(
        error_of(&v),
        (
            "invalid_dockerfile",
            "Dockerfile line 2: unknown instruction \"FOO\""
        )
    );
    let (status, v) = api
        .build("name=web", tar_of(&[("src/a.txt", b"no Dockerfile here")]))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let (code, message) = error_of(&v);
    assert_eq!(code, "bad_request");
    assert!(
        message.starts_with("the build context has no Dockerfile"),
        "{message}"
    );
    // Another path in the context is named with dockerfile=.
    let (status, v) = api
        .build(
            "name=web&dockerfile=docker/Dockerfile.web",
            tar_of(&[("Dockerfile", b"FROM minimal\n")]),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(error_of(&v).1.contains("docker/Dockerfile.web"), "{v}");
    let (status, v) = api
        .build("name=minimal", tar_of(&[("Dockerfile", b"FROM minimal\n")]))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(error_of(&v).1.contains("built-in template"), "{v}");
    let (status, v) = api.build("name=web", b"this is not tar".to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        error_of(&v)
            .1
            .starts_with("the build context is not a valid tar stream"),
        "{v}"
    );
    let (status, v) = api.build("dockerfile=Dockerfile", tar_of(&[])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    // Every refused context was deleted.
    assert_eq!(api.build_leftovers(), Vec::<String>::new());
    let (status, v) = api.call("GET", "/v1/templates/web/builds").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "no build was started: {v}");
}

#[tokio::test]
async fn a_context_over_the_limit_is_413_declared_or_streamed() {
    let api = Api::start(ContextLimits {
        max_bytes: 32 << 10,
        max_entries: 100,
    })
    .await;
    let big = vec![b'x'; 64 << 10];
    let tar = tar_of(&[("Dockerfile", b"FROM minimal\n"), ("big", &big)]);
    // Declared: refused before it is read.
    let (status, v) = api
        .send(
            &api.key,
            Request::builder()
                .method("POST")
                .uri("/v1/templates?name=web")
                .header("content-type", "application/x-tar")
                .header("content-length", tar.len()),
            Body::from(tar.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_eq!(
        error_of(&v),
        (
            "payload_too_large",
            "the build context is larger than the server's limit of 32768 bytes (hutch serve --max-build-context): leave files out with .dockerignore"
        )
    );
    // Streamed without a length: refused once the limit is passed.
    let pieces: Vec<Result<bytes::Bytes, std::io::Error>> = tar
        .chunks(4096)
        .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
        .collect();
    let (status, v) = api.build_streamed(futures_util::stream::iter(pieces)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_eq!(api.build_leftovers(), Vec::<String>::new());
}

impl Api {
    async fn build_streamed(
        &self,
        stream: impl futures_util::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send + 'static,
    ) -> (StatusCode, Value) {
        self.send(
            &self.key,
            Request::builder()
                .method("POST")
                .uri("/v1/templates?name=web")
                .header("content-type", "application/x-tar"),
            Body::from_stream(stream),
        )
        .await
    }
}

#[tokio::test]
async fn other_bodies_are_415_and_bad_image_bodies_are_400() {
    let api = Api::start(ContextLimits::default()).await;
    let (status, v) = api
        .send(
            &api.key,
            Request::builder()
                .method("POST")
                .uri("/v1/templates?name=web")
                .header("content-type", "text/plain"),
            Body::from("FROM minimal"),
        )
        .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{v}");
    // Nothing is pulled for a refused body (no request leaves the machine).
    for (body, says) in [
        (
            json!({"name": "web", "from_image": "oci:/etc:1"}),
            "upload the image instead",
        ),
        (
            json!({"name": "web", "from_image": "registry.test/app:1", "registry_auth": "no-colon"}),
            "registry credentials are USER:PASSWORD",
        ),
        (
            json!({"name": "web", "from_image": "registry.test/app:1", "insecure_registries": ["a/b"]}),
            "an insecure registry is a host or host:port",
        ),
        (
            json!({"name": "web", "from_image": "registry.test/app:1", "start": {"cmd": ""}}),
            "the start command must not be empty",
        ),
        (
            json!({"name": "web", "from_image": "registry.test/app:1", "memory_mib": 1}),
            "memory_mib must be a number from 16",
        ),
        (
            json!({"name": "Web", "from_image": "registry.test/app:1"}),
            "invalid template name",
        ),
        (json!({"name": "web", "from": "debian:12"}), "unknown field"),
    ] {
        let (status, v) = api
            .send(
                &api.key,
                Request::builder()
                    .method("POST")
                    .uri("/v1/templates")
                    .header("content-type", "application/json"),
                Body::from(body.to_string()),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(error_of(&v).1.contains(says), "{body}: {v}");
    }
}

#[tokio::test]
async fn templates_are_read_and_deleted_unless_in_use() {
    let api = Api::start(ContextLimits::default()).await;
    let (status, v) = api.call("GET", "/v1/templates/minimal").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["name"], "minimal");
    let (status, v) = api.call("GET", "/v1/templates/nothing-here").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(
        error_of(&v),
        ("not_found", "template \"nothing-here\" does not exist")
    );
    let (status, v) = api.call("GET", "/v1/templates/minimal/builds").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["builds"], json!([]));
    let (status, v) = api
        .call("GET", "/v1/templates/minimal/builds/bld_nosuchbuild")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let (status, v) = api
        .call("GET", "/v1/templates/minimal/builds/bld_nosuchbuild/logs")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");

    let (status, created) = api
        .send(
            &api.key,
            Request::builder()
                .method("POST")
                .uri("/v1/sandboxes")
                .header("content-type", "application/json"),
            Body::from("{}"),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_str().expect("id").to_string();
    let (status, v) = api.call("DELETE", "/v1/templates/minimal").await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    let (code, message) = error_of(&v);
    assert_eq!(code, "conflict");
    assert!(message.contains(&format!("sandbox {id}")), "{message}");
    let tenant = api.tenant_key().await;
    let (status, v) = api
        .send(
            &tenant,
            Request::builder()
                .method("DELETE")
                .uri("/v1/templates/minimal"),
            Body::empty(),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    let (status, _) = api.call("DELETE", &format!("/v1/sandboxes/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, v) = api.call("DELETE", "/v1/templates/minimal").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    let (status, _) = api.call("GET", "/v1/templates/minimal").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, v) = api.call("DELETE", "/v1/templates/minimal").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
}
