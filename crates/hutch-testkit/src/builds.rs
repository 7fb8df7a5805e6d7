//! Template builds of a [`TestServer`] from a Dockerfile, through the API.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value;

use crate::server::TestServer;

/// How long a test waits for a build to end.
const BUILD_WAIT: Duration = Duration::from_secs(120);

/// A build context holding only `Dockerfile`, as a tar stream.
pub fn dockerfile_context(dockerfile: &str) -> Vec<u8> {
    context_of(&[("Dockerfile", dockerfile.as_bytes())])
}

/// A build context of `files` (path in the context, contents), as a tar stream.
pub fn context_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        out.append_data(&mut header, path, *data)
            .expect("a file in the context");
    }
    out.into_inner().expect("the context")
}

impl TestServer {
    /// Note template `name` for deletion when the server is dropped.
    fn remember_built(&self, name: &str) {
        let mut built = self
            .built_templates
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !built.iter().any(|n| n == name) {
            built.push(name.to_string());
        }
    }

    /// Build template `name` from `dockerfile` through the API with `key`, and wait until the
    /// build ends (succeeded, failed or cancelled): its last view. 202 expected.
    pub async fn build_dockerfile_as(&self, key: &str, name: &str, dockerfile: &str) -> Value {
        self.build_context_as(key, name, dockerfile_context(dockerfile), &[])
            .await
    }

    /// Build template `name` from the context tar `context` (with its `Dockerfile`) and
    /// the request headers `headers`, with `key`; wait until the build ends: its last
    /// view. 202 expected.
    pub async fn build_context_as(
        &self,
        key: &str,
        name: &str,
        context: Vec<u8>,
        headers: &[(&str, String)],
    ) -> Value {
        let mut request = self
            .http
            .post(format!("{}/v1/templates?name={name}", self.url))
            .bearer_auth(key)
            .header("content-type", "application/x-tar");
        for (header, value) in headers {
            request = request.header(*header, value);
        }
        let resp = request
            .body(context)
            .send()
            .await
            .expect("POST /v1/templates");
        assert_eq!(resp.status().as_u16(), 202, "a build of {name} starts");
        self.remember_built(name);
        let started: Value = resp.json().await.expect("json");
        let id = started["id"].as_str().expect("build id").to_string();
        let t0 = Instant::now();
        loop {
            let (status, v) = self
                .request_as(
                    key,
                    Method::GET,
                    &format!("/v1/templates/{name}/builds/{id}"),
                    None,
                )
                .await;
            assert_eq!(status, 200, "{v}");
            if matches!(
                v["status"].as_str(),
                Some("succeeded" | "failed" | "cancelled")
            ) {
                return v;
            }
            assert!(t0.elapsed() < BUILD_WAIT, "the build of {name} ends: {v}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The text of build `build`'s log (its `id`) of template `name`, read with `key`.
    pub async fn build_log(&self, key: &str, name: &str, build: &Value) -> String {
        let id = build["id"].as_str().expect("a build view with an id");
        let resp = self
            .http
            .get(format!("{}/v1/templates/{name}/builds/{id}/logs", self.url))
            .bearer_auth(key)
            .send()
            .await
            .expect("GET the build's log");
        assert_eq!(resp.status().as_u16(), 200, "the log of build {id}");
        resp.text().await.expect("the log's text")
    }
}
