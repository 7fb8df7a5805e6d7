//! HTTP plumbing of the agent: the response body type, response builders, query and JSON
//! request parsing. Error responses are built in exactly one place, [`error`].

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::sync::mpsc;

use crate::error::{status_of, Failure};

/// Largest JSON request body the agent reads.
pub const MAX_JSON_REQUEST: usize = 1 << 20;
/// Content type of `/v1/exec` bodies.
pub const FRAMES_CONTENT_TYPE: &str = "application/x-hutch-frames";

/// Every response body of the agent.
#[derive(Debug)]
pub enum AgentBody {
    /// Nothing.
    Empty,
    /// One buffer (JSON).
    Full(Option<Bytes>),
    /// Chunks produced by a task (exec frames, file contents). An error resets the stream.
    Channel(mpsc::Receiver<Result<Bytes, io::Error>>),
}

impl Body for AgentBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        match &mut *self {
            AgentBody::Empty => Poll::Ready(None),
            AgentBody::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            AgentBody::Channel(rx) => rx
                .poll_recv(cx)
                .map(|next| next.map(|chunk| chunk.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            AgentBody::Empty => true,
            AgentBody::Full(data) => data.is_none(),
            AgentBody::Channel(_) => false,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            AgentBody::Empty => SizeHint::with_exact(0),
            AgentBody::Full(data) => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            AgentBody::Channel(_) => SizeHint::default(),
        }
    }
}

fn build(
    status: StatusCode,
    content_type: Option<&'static str>,
    body: AgentBody,
) -> Response<AgentBody> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    if let Some(ct) = content_type {
        response
            .headers_mut()
            .insert(CONTENT_TYPE, http::HeaderValue::from_static(ct));
    }
    response
}

/// `204 No Content`.
pub fn no_content() -> Response<AgentBody> {
    build(StatusCode::NO_CONTENT, None, AgentBody::Empty)
}

/// `200` with a JSON body.
pub fn json<T: serde::Serialize>(value: &T) -> Response<AgentBody> {
    let body = serde_json::to_vec(value).expect("protocol types always serialize");
    build(
        StatusCode::OK,
        Some("application/json"),
        AgentBody::Full(Some(body.into())),
    )
}

/// `200` with a body known whole.
pub fn bytes(content_type: &'static str, data: Bytes) -> Response<AgentBody> {
    build(
        StatusCode::OK,
        Some(content_type),
        AgentBody::Full(Some(data)),
    )
}

/// `200` with a streamed body.
pub fn stream(
    content_type: &'static str,
    rx: mpsc::Receiver<Result<Bytes, io::Error>>,
) -> Response<AgentBody> {
    build(StatusCode::OK, Some(content_type), AgentBody::Channel(rx))
}

/// The error response for a failure: its status and an `AgentError` JSON body.
pub fn error(failure: &Failure) -> Response<AgentBody> {
    let wire = failure.to_wire();
    let status = status_of(wire.code);
    if status.is_server_error() {
        crate::log::log!("internal error: {failure}");
    }
    let body = serde_json::to_vec(&wire).expect("protocol types always serialize");
    build(
        status,
        Some("application/json"),
        AgentBody::Full(Some(body.into())),
    )
}

/// Read and parse a JSON request body (at most [`MAX_JSON_REQUEST`] bytes).
pub async fn read_json<T: serde::de::DeserializeOwned>(body: Incoming) -> Result<T, Failure> {
    let bytes = Limited::new(body, MAX_JSON_REQUEST)
        .collect()
        .await
        .map_err(|e| Failure::BadRequest(format!("reading the request body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| Failure::BadRequest(format!("bad JSON body: {e}")))
}

/// Decoded query parameters.
#[derive(Debug, Default)]
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    /// Parse the query of a request URI.
    pub fn parse(query: Option<&str>) -> Result<Self, Failure> {
        let pairs = hutch_proto::query::parse(query.unwrap_or(""))
            .map_err(|e| Failure::BadRequest(e.to_string()))?;
        Ok(Self { pairs })
    }

    /// The last value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The `path` parameter, required and absolute.
    pub fn path(&self) -> Result<String, Failure> {
        let path = self
            .get("path")
            .ok_or_else(|| Failure::BadRequest("missing query parameter path".into()))?;
        absolute_path(path)
    }

    /// A boolean parameter (`true`/`false`/`1`/`0`), `default` when absent.
    pub fn flag(&self, key: &str, default: bool) -> Result<bool, Failure> {
        match self.get(key) {
            None => Ok(default),
            Some("true" | "1" | "") => Ok(true),
            Some("false" | "0") => Ok(false),
            Some(other) => Err(Failure::BadRequest(format!(
                "{key} must be true or false, got {other:?}"
            ))),
        }
    }
}

/// Check that a path from the host is absolute and free of NUL bytes.
pub fn absolute_path(path: &str) -> Result<String, Failure> {
    if !path.starts_with('/') {
        return Err(Failure::BadRequest(format!(
            "path must be absolute, got {path:?}"
        )));
    }
    if path.contains('\0') {
        return Err(Failure::BadRequest(
            "path must not contain NUL bytes".into(),
        ));
    }
    Ok(path.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_paths_and_flags() {
        let q = Query::parse(Some("path=/a%20b&recursive=true&depth=3")).expect("parses");
        assert_eq!(q.path().expect("absolute"), "/a b");
        assert!(q.flag("recursive", false).expect("flag"));
        assert!(!q.flag("missing", false).expect("flag"));
        assert!(q.flag("depth", false).is_err());
        let rel = Query::parse(Some("path=relative/x")).expect("parses");
        assert_eq!(
            rel.path().expect_err("relative").to_string(),
            "path must be absolute, got \"relative/x\""
        );
        let none = Query::parse(None).expect("parses");
        assert!(none.path().is_err());
    }
}
