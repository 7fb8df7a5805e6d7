//! Tenants and keys of a [`TestServer`], made through the API with its admin key, and
//! requests sent with another key.

use reqwest::Method;
use serde_json::{json, Value};

use crate::server::TestServer;

impl TestServer {
    /// Make tenant `name` with `settings` (`{"quotas", "defaults", "allowed_templates"}`,
    /// any part left out); 201 expected.
    pub async fn tenant(&self, name: &str, settings: Value) {
        let mut body = match settings {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        body.insert("name".into(), name.into());
        let (status, v) = self
            .request(Method::POST, "/v1/tenants", Some(Value::Object(body)))
            .await;
        assert_eq!(status, 201, "tenant {name}: {v}");
    }

    /// A new key of `tenant` with `scope` (`full`, `exec`, `read-only`), the tenant made
    /// with nothing set when it does not exist yet; returns its secret.
    pub async fn tenant_key(&self, tenant: &str, scope: &str) -> String {
        self.key_with(json!({"tenant": tenant, "scope": scope}))
            .await
    }

    /// A new key made with `body` (`POST /v1/keys`), its tenant made when missing; returns
    /// its secret.
    pub async fn key_with(&self, body: Value) -> String {
        if let Some(tenant) = body["tenant"].as_str() {
            let (status, _) = self
                .request(Method::GET, &format!("/v1/tenants/{tenant}"), None)
                .await;
            if status == 404 {
                self.tenant(tenant, json!({})).await;
            }
        }
        let (status, v) = self.request(Method::POST, "/v1/keys", Some(body)).await;
        assert_eq!(status, 201, "key: {v}");
        v["secret"].as_str().expect("the secret").to_string()
    }

    /// Any request with API key `key`; returns status and JSON (Null when empty or not
    /// JSON).
    pub async fn request_as(
        &self,
        key: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{}", self.url, path))
            .bearer_auth(key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.expect("body");
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }
}
