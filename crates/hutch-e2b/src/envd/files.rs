//! envd's `/files`: download (`GET`) and upload (`POST`, multipart or octet-stream, gzip)
//! files of a sandbox. A request carries the sandbox's `X-Access-Token`, or a signature made
//! from it (E2B's signed URLs: `signature = "v1_" + base64(sha256("path:op:user:token[:exp]"))`,
//! `signature_expiration` in Unix seconds).

use axum::body::Body;
use axum::extract::{Multipart, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine;
use bytes::Bytes;
use futures_util::TryStreamExt;
use hutch_proto::file_metadata::{self, FileMetadata};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::proto::METADATA_NAMESPACE;
use super::{absolute, gzip, has_token, same_secret, EnvdUser};
use crate::error::{E2bError, E2bResult};
use crate::target::SandboxTarget;
use crate::E2bState;

/// Chunks of a multipart field queued towards the agent.
const RELAY_QUEUE: usize = 4;

/// `?path=&username=&signature=&signature_expiration=`.
#[derive(Debug, Deserialize)]
pub struct FileQuery {
    path: Option<String>,
    username: Option<String>,
    /// A signed URL's signature.
    pub signature: Option<String>,
    signature_expiration: Option<i64>,
}

impl FileQuery {
    /// Parse a query string (`None`: malformed).
    pub fn parse(query: &str) -> Option<Self> {
        serde_urlencoded_like(query)
    }

    /// Whether the query's signature is the one sandbox `t`'s token makes for `op` of its
    /// path and user (expiry not checked).
    pub fn signature_matches(&self, state: &E2bState, t: &SandboxTarget, op: &str) -> bool {
        let Some(sig) = &self.signature else {
            return false;
        };
        let token = state.access_token(&t.id);
        let user = self.username.as_deref().unwrap_or("");
        let path = self.path.as_deref().unwrap_or("");
        let raw = match self.signature_expiration {
            Some(exp) => format!("{path}:{op}:{user}:{token}:{exp}"),
            None => format!("{path}:{op}:{user}:{token}"),
        };
        let digest = Sha256::digest(raw.as_bytes());
        let expected = format!(
            "v1_{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
        );
        same_secret(sig, &expected)
    }
}

fn serde_urlencoded_like(query: &str) -> Option<FileQuery> {
    let mut q = FileQuery {
        path: None,
        username: None,
        signature: None,
        signature_expiration: None,
    };
    for (k, v) in crate::control::form_pairs(query) {
        match k.as_str() {
            "path" => q.path = Some(v),
            "username" => q.username = Some(v),
            "signature" => q.signature = Some(v),
            "signature_expiration" => q.signature_expiration = Some(v.parse().ok()?),
            _ => {}
        }
    }
    Some(q)
}

/// Who may do `op` on the query's path: the access token, or a valid signature.
fn check_access(
    state: &E2bState,
    t: &SandboxTarget,
    headers: &HeaderMap,
    q: &FileQuery,
    op: &str,
) -> E2bResult<()> {
    if has_token(state, t, headers) {
        return Ok(());
    }
    if q.signature.is_none() {
        return Err(E2bError::unauthorized(
            "missing X-Access-Token (or a signed URL's signature)",
        ));
    }
    if let Some(exp) = q.signature_expiration {
        if exp < hutch_core::time::now_ms() / 1000 {
            return Err(E2bError::unauthorized("the signed URL has expired"));
        }
    }
    if q.signature_matches(state, t, op) {
        Ok(())
    } else {
        Err(E2bError::unauthorized(format!(
            "the signature does not allow {op} of this path"
        )))
    }
}

/// The user of the request: the query's `username`, else the `Authorization` header's.
fn user_of(q: &FileQuery, header_user: Option<String>) -> Option<String> {
    q.username.clone().filter(|u| !u.is_empty()).or(header_user)
}

/// `GET /files?path=` → the file's bytes, gzipped as a stream ([`gzip::deflate`]) when
/// `Accept-Encoding` offers gzip.
pub async fn read(
    State(state): State<E2bState>,
    Extension(t): Extension<SandboxTarget>,
    EnvdUser(header_user): EnvdUser,
    headers: HeaderMap,
    Query(q): Query<FileQuery>,
) -> E2bResult<Response> {
    check_access(&state, &t, &headers, &q, "read")?;
    let user = user_of(&q, header_user);
    let path = absolute(
        q.path
            .as_deref()
            .ok_or_else(|| E2bError::bad_request("path is required"))?,
        user.as_deref(),
    )?;
    let manager = &state.app.manager;
    let agent = manager.agent(&t.id).await?;
    let stat = manager.agent_call(&t.id, agent.stat(&path).await).await?;
    if stat.file_type == hutch_proto::FileType::Dir {
        return Err(E2bError::bad_request(format!("path {path} is a directory")));
    }
    let stream = manager
        .agent_call(&t.id, agent.read_file_as(&path, user.as_deref()).await)
        .await?;
    let mut response = if accepts_gzip(&headers) {
        let mut r = Body::from_stream(gzip::deflate(stream)).into_response();
        r.headers_mut().insert(
            header::CONTENT_ENCODING,
            header::HeaderValue::from_static("gzip"),
        );
        r
    } else {
        Body::from_stream(stream.map_err(|e| std::io::Error::other(e.to_string()))).into_response()
    };
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(
        header::VARY,
        header::HeaderValue::from_static("accept-encoding"),
    );
    if let Ok(v) = header::HeaderValue::from_str(&format!(
        "attachment; filename=\"{}\"",
        stat.name.replace('"', "")
    )) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(response)
}

/// Whether `Accept-Encoding` offers gzip (`gzip` or `x-gzip`, not with `q=0`).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|offer| {
            let mut parts = offer.split(';').map(str::trim);
            let coding = parts.next().unwrap_or("");
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            (coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip"))
                && !refused
        })
}

/// `POST /files?path=` → `[EntryInfo {path, name, type}]`. Multipart fields and
/// octet-stream bodies are relayed to the agent's write as they arrive (gzip inflated on the
/// way, [`gzip::inflate`]): nothing is buffered whole.
pub async fn write(
    State(state): State<E2bState>,
    Extension(t): Extension<SandboxTarget>,
    EnvdUser(header_user): EnvdUser,
    headers: HeaderMap,
    Query(q): Query<FileQuery>,
    request: axum::extract::Request,
) -> E2bResult<Json<Vec<serde_json::Value>>> {
    check_access(&state, &t, &headers, &q, "write")?;
    // E2B's pairs are kept under `e2b.` (the `user.e2b.*` attributes envd uses).
    let metadata = file_metadata::from_headers(&headers, "x-metadata-", METADATA_NAMESPACE)
        .map_err(|e| E2bError::bad_request(e.to_string()))?;
    let user = user_of(&q, header_user);
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let gzip = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    let mut written = Vec::new();
    if content_type.starts_with("multipart/form-data") {
        let mut form = {
            use axum::extract::FromRequest;
            Multipart::from_request(request, &())
                .await
                .map_err(|e| E2bError::bad_request(format!("multipart body: {e}")))?
        };
        while let Some(mut field) = form
            .next_field()
            .await
            .map_err(|e| E2bError::bad_request(format!("multipart body: {e}")))?
        {
            let target = match (&q.path, field.file_name()) {
                (Some(p), _) if !p.is_empty() => p.clone(),
                (_, Some(name)) => name.to_string(),
                _ => {
                    return Err(E2bError::bad_request(
                        "each file part needs a file name (its path)",
                    ))
                }
            };
            let path = absolute(&target, user.as_deref())?;
            // A field borrows the form, so it is pumped into a channel the agent's write
            // reads from, both driven here; a full channel slows the client down.
            let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(RELAY_QUEUE);
            let pump = async move {
                loop {
                    let chunk = match field.chunk().await {
                        Ok(Some(chunk)) => Ok(chunk),
                        Ok(None) => return,
                        Err(e) => Err(std::io::Error::other(format!("multipart body: {e}"))),
                    };
                    let failed = chunk.is_err();
                    if tx.send(chunk).await.is_err() || failed {
                        return; // the write ended (its error is answered), or the body broke
                    }
                }
            };
            let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
            let store = store(&state, &t, &path, user.as_deref(), &metadata, stream);
            let ((), stored) = tokio::join!(pump, store);
            stored?;
            written.push(written_entry(&path, &metadata));
        }
    } else {
        let path = absolute(
            q.path
                .as_deref()
                .ok_or_else(|| E2bError::bad_request("path is required"))?,
            user.as_deref(),
        )?;
        let body = request.into_body().into_data_stream();
        let user = user.as_deref();
        if gzip {
            store(&state, &t, &path, user, &metadata, gzip::inflate(body)).await?;
        } else {
            let body = body.map_err(|e| std::io::Error::other(e.to_string()));
            store(&state, &t, &path, user, &metadata, body).await?;
        }
        written.push(written_entry(&path, &metadata));
    }
    if written.is_empty() {
        return Err(E2bError::bad_request("no file in the upload"));
    }
    Ok(Json(written))
}

/// One `WriteInfo`: with the pairs the upload set, as E2B's SDKs read them back.
fn written_entry(path: &str, metadata: &FileMetadata) -> serde_json::Value {
    let name = path.rsplit('/').next().unwrap_or(path);
    let mut entry = serde_json::json!({"path": path, "name": name, "type": "file"});
    let pairs = file_metadata::within(metadata, METADATA_NAMESPACE);
    if !pairs.is_empty() {
        entry["metadata"] = serde_json::json!(pairs);
    }
    entry
}

/// Write the stream `data` at `path` (parents made) as `user` when one is named. When the
/// stream itself fails (a corrupt gzip body, a broken multipart form, a client gone), the
/// agent's write is aborted and the answer is a 400 naming the stream's error.
async fn store<S>(
    state: &E2bState,
    t: &SandboxTarget,
    path: &str,
    user: Option<&str>,
    metadata: &FileMetadata,
    data: S,
) -> E2bResult<()>
where
    S: futures_util::Stream<Item = std::io::Result<Bytes>> + Send + 'static,
{
    let fault = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let seen = fault.clone();
    let data = data.inspect_err(move |e| {
        if let Ok(mut f) = seen.lock() {
            f.get_or_insert_with(|| e.to_string());
        }
    });
    let manager = &state.app.manager;
    let agent = manager.agent(&t.id).await?;
    // The agent writes as the user (its permissions apply; the file and the parents it
    // makes are the user's).
    let written = manager
        .agent_call(
            &t.id,
            agent.write_file_as(path, None, user, metadata, data).await,
        )
        .await;
    match (written, fault.lock().ok().and_then(|f| f.clone())) {
        (Ok(()), _) => Ok(()),
        (Err(_), Some(fault)) => Err(E2bError::bad_request(format!(
            "the upload of {path} broke off: {fault}"
        ))),
        (Err(e), None) => Err(e.into()),
    }
}
