//! The CLI's HTTP client for a running `hutch serve`.

use std::path::Path;

use anyhow::{anyhow, Context};
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// Address and credentials of a server.
#[derive(Clone)]
pub struct Api {
    base: String,
    key: String,
    /// The tenant an admin key acts for (`HUTCH_TENANT`, sent as `X-Hutch-Tenant`).
    tenant: Option<String>,
    http: reqwest::Client,
}

/// A non-2xx answer, shown to the user as `code: message`.
#[derive(Debug)]
pub struct ApiFailure {
    /// HTTP status.
    pub status: StatusCode,
    /// Error code from the body.
    pub code: String,
    /// Message from the body.
    pub message: String,
}

impl std::error::Error for ApiFailure {}

impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.code,
            self.status.as_u16(),
            self.message
        )
    }
}

impl Api {
    /// From `HUTCH_URL` / `HUTCH_API_KEY` (and `HUTCH_TENANT`, the tenant an admin key acts
    /// for), else the default address and `<state-dir>/admin.key`.
    pub fn from_env(state_dir: &Path) -> anyhow::Result<Self> {
        let base = Self::base_from_env();
        let key = match std::env::var("HUTCH_API_KEY") {
            Ok(k) if !k.is_empty() => k,
            _ => {
                let path = state_dir.join("admin.key");
                std::fs::read_to_string(&path)
                    .with_context(|| {
                        format!(
                            "no HUTCH_API_KEY and cannot read {} (is `hutch serve` running with this state dir?)",
                            path.display()
                        )
                    })?
                    .trim()
                    .to_string()
            }
        };
        let http = reqwest::Client::builder()
            .build()
            .context("building the HTTP client")?;
        let tenant = std::env::var("HUTCH_TENANT").ok().filter(|t| !t.is_empty());
        Ok(Self {
            base,
            key,
            tenant,
            http,
        })
    }

    /// The server's address from `HUTCH_URL`, else the default one.
    pub fn base_from_env() -> String {
        std::env::var("HUTCH_URL")
            .unwrap_or_else(|_| "http://127.0.0.1:7700".into())
            .trim_end_matches('/')
            .to_string()
    }

    /// A client of the server at `base` calling with `key`.
    pub fn new(base: &str, key: &str) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .build()
            .context("building the HTTP client")?;
        Ok(Self {
            base: base.trim_end_matches('/').to_string(),
            key: key.to_string(),
            tenant: None,
            http,
        })
    }

    /// The API key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The tenant an admin key acts for, if one is set.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// A request with the key (and the tenant it acts for).
    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let req = self
            .http
            .request(method, self.url(path))
            .bearer_auth(&self.key);
        match &self.tenant {
            Some(t) => req.header("x-hutch-tenant", t),
            None => req,
        }
    }

    async fn check(&self, resp: reqwest::Response) -> anyhow::Result<reqwest::Response> {
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        Err(ApiFailure {
            status,
            code: body["error"]["code"]
                .as_str()
                .unwrap_or("error")
                .to_string(),
            message: body["error"]["message"]
                .as_str()
                .unwrap_or("the server gave no message")
                .to_string(),
        }
        .into())
    }

    /// A JSON call; `Value::Null` for 204.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self.request(method, path);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| self.unreachable(&e))?;
        let resp = self.check(resp).await?;
        if resp.status() == StatusCode::NO_CONTENT {
            return Ok(Value::Null);
        }
        resp.json().await.context("reading the server's answer")
    }

    /// A call returning the raw response (streams, file bytes).
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Option<reqwest::Body>,
        json: Option<&Value>,
    ) -> anyhow::Result<reqwest::Response> {
        let mut req = self.request(method, path);
        if let Some(b) = body {
            req = req.body(b);
        }
        if let Some(j) = json {
            req = req.json(j);
        }
        let resp = req.send().await.map_err(|e| self.unreachable(&e))?;
        self.check(resp).await
    }

    /// A call with a body of `content_type` (a stream: a build context's tar), returning the
    /// raw response.
    pub async fn send_body(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: reqwest::Body,
        headers: &[(&str, String)],
    ) -> anyhow::Result<reqwest::Response> {
        let mut request = self
            .request(method, path)
            .header(reqwest::header::CONTENT_TYPE, content_type);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let resp = request
            .body(body)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        self.check(resp).await
    }

    /// A `GET` whose answer is read as it comes (logs, events), asking for `accept`.
    pub async fn get_streamed(
        &self,
        path: &str,
        accept: &str,
    ) -> anyhow::Result<reqwest::Response> {
        let resp = self
            .request(Method::GET, path)
            .header(reqwest::header::ACCEPT, accept)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        self.check(resp).await
    }

    /// A `POST` of `json` whose answer is read as it comes, asking for `accept`.
    pub async fn post_streamed(
        &self,
        path: &str,
        json: &Value,
        accept: &str,
    ) -> anyhow::Result<reqwest::Response> {
        let resp = self
            .request(Method::POST, path)
            .header(reqwest::header::ACCEPT, accept)
            .json(json)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        self.check(resp).await
    }

    /// A request that got no answer, with every cause (a refused connection, a certificate
    /// the system's roots and `SSL_CERT_FILE` do not vouch for).
    fn unreachable(&self, e: &reqwest::Error) -> anyhow::Error {
        let mut text = format!("cannot reach the Hutch server at {}: {e}", self.base);
        let mut cause = std::error::Error::source(e);
        while let Some(c) = cause {
            text.push_str(&format!(": {c}"));
            cause = c.source();
        }
        anyhow!(text)
    }

    /// `ws://` URL for a path.
    pub fn ws_url(&self, path: &str) -> String {
        let base = self
            .base
            .replacen("https://", "wss://", 1)
            .replacen("http://", "ws://", 1);
        format!("{base}{path}")
    }
}

/// `path`, with `?name=value&…` of the pairs that have a value (values percent-encoded).
pub fn with_query<'a>(
    path: &str,
    pairs: impl IntoIterator<Item = (&'a str, Option<String>)>,
) -> String {
    let query: Vec<String> = pairs
        .into_iter()
        .filter_map(|(name, value)| value.map(|v| format!("{name}={}", encode(&v))))
        .collect();
    if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", query.join("&"))
    }
}

/// Percent-encode a query value.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
