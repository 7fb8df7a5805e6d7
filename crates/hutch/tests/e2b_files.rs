//! envd's `/files` through Hutch's E2B-compatible API with a raw HTTP client, where the SDK
//! cannot show it: large uploads (octet-stream, gzip, multipart) are relayed to the agent as
//! they arrive, so the server's peak memory grows far less than the upload; downloads asked
//! with `Accept-Encoding: gzip` come back `Content-Encoding: gzip`.

use std::io::Write;

use futures_util::StreamExt;
use hutch_testkit::{ensure_template, TestServer};
use serde_json::{json, Value};

/// Bytes of each large upload (64 MiB).
const UPLOAD: usize = 64 << 20;
/// Bytes per generated chunk.
const CHUNK: usize = 1 << 20;

async fn server() -> TestServer {
    ensure_template("base");
    TestServer::start_with(&["--e2b-listen", "127.0.0.1:0"]).await
}

/// A sandbox made through E2B's control plane: its id and envd access token.
async fn e2b_sandbox(s: &TestServer) -> (String, String) {
    let url = s.e2b_url.as_deref().expect("--e2b-listen");
    let resp = s
        .http
        .post(format!("{url}/sandboxes"))
        .header("x-api-key", &s.key)
        .json(&json!({"templateID": "base", "timeout": 600}))
        .send()
        .await
        .expect("create");
    assert_eq!(resp.status(), 201);
    let v: Value = resp.json().await.expect("json");
    (
        v["sandboxID"].as_str().expect("sandboxID").to_string(),
        v["envdAccessToken"].as_str().expect("token").to_string(),
    )
}

/// A request to envd's `/files` of sandbox `id`.
fn files(
    s: &TestServer,
    method: reqwest::Method,
    id: &str,
    token: &str,
    path: &str,
) -> reqwest::RequestBuilder {
    let url = s.e2b_url.as_deref().expect("--e2b-listen");
    s.http
        .request(method, format!("{url}/files"))
        .query(&[("path", path)])
        .header("E2b-Sandbox-Id", id)
        .header("E2b-Sandbox-Port", "49983")
        .header("X-Access-Token", token)
}

/// Chunk `i` of the incompressible test content (xorshift, the same every run).
fn random_chunk(i: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (i as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let mut out = Vec::with_capacity(CHUNK);
    while out.len() < CHUNK {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// Chunk `i` of the compressible test content (numbered text lines).
fn text_chunk(i: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(CHUNK + 64);
    let mut n = i * CHUNK;
    while out.len() < CHUNK {
        let _ = writeln!(out, "line {n:012} of the upload");
        n += 1;
    }
    out.truncate(CHUNK);
    out
}

fn body_of(chunks: impl Iterator<Item = Vec<u8>> + Send + 'static) -> reqwest::Body {
    reqwest::Body::wrap_stream(futures_util::stream::iter(
        chunks.map(Ok::<_, std::io::Error>),
    ))
}

/// The server's resident memory (`VmRSS`) and its peak (`VmHWM`) in KiB.
fn memory(s: &TestServer) -> (u64, u64) {
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", s.server_pid())).expect("status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("memory field")
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Reset the server's peak RSS to its current RSS (`clear_refs` 5), returning that RSS.
fn reset_peak(s: &TestServer) -> u64 {
    std::fs::write(format!("/proc/{}/clear_refs", s.server_pid()), "5").expect("clear_refs");
    memory(s).0
}

/// Assert the file at `path` reads back as `expected(0..UPLOAD/CHUNK)`, streamed.
async fn assert_reads_back(
    s: &TestServer,
    id: &str,
    token: &str,
    path: &str,
    expected: fn(usize) -> Vec<u8>,
) {
    let resp = files(s, reqwest::Method::GET, id, token, path)
        .send()
        .await
        .expect("download");
    assert_eq!(resp.status(), 200, "{path}");
    let mut stream = resp.bytes_stream();
    let (mut i, mut want, mut total) = (0, expected(0), 0usize);
    let mut at = 0;
    while let Some(chunk) = stream.next().await {
        let mut chunk = &chunk.expect("download chunk")[..];
        total += chunk.len();
        while !chunk.is_empty() {
            assert!(i < UPLOAD / CHUNK, "{path} is longer than the upload");
            let n = chunk.len().min(CHUNK - at);
            assert!(
                chunk[..n] == want[at..at + n],
                "{path} differs at byte {}",
                i * CHUNK + at
            );
            chunk = &chunk[n..];
            at += n;
            if at == CHUNK {
                i += 1;
                at = 0;
                want = if i < UPLOAD / CHUNK {
                    expected(i)
                } else {
                    Vec::new()
                };
            }
        }
    }
    assert_eq!(total, UPLOAD, "{path} length");
}

/// 64 MiB uploads (octet-stream, gzip-encoded, multipart) round-trip byte-exact while the
/// server's peak memory grows by less than a quarter of one upload: each is relayed to the
/// agent as it arrives (the gzip one inflated chunk by chunk), never buffered whole.
#[tokio::test]
async fn large_uploads_stream_through_without_being_buffered() {
    let s = server().await;
    let (id, token) = e2b_sandbox(&s).await;
    let mut growth = Vec::new();

    // octet-stream
    let base = reset_peak(&s);
    let resp = files(&s, reqwest::Method::POST, &id, &token, "/tmp/big.bin")
        .header("content-type", "application/octet-stream")
        .body(body_of((0..UPLOAD / CHUNK).map(random_chunk)))
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    growth.push(("octet-stream", memory(&s).1.saturating_sub(base)));
    assert_reads_back(&s, &id, &token, "/tmp/big.bin", random_chunk).await;

    // gzip: a few hundred KiB on the wire inflate to 64 MiB in the sandbox.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for i in 0..UPLOAD / CHUNK {
        gz.write_all(&text_chunk(i)).expect("gzip");
    }
    let packed = gz.finish().expect("gzip");
    assert!(packed.len() < UPLOAD / 8, "{}", packed.len());
    let parts: Vec<Vec<u8>> = packed.chunks(64 << 10).map(<[u8]>::to_vec).collect();
    let base = reset_peak(&s);
    let resp = files(&s, reqwest::Method::POST, &id, &token, "/tmp/big.txt")
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body(body_of(parts.into_iter()))
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    growth.push(("gzip", memory(&s).1.saturating_sub(base)));
    assert_reads_back(&s, &id, &token, "/tmp/big.txt", text_chunk).await;

    // multipart: the field's bytes, between the form's boundaries.
    let boundary = "hutch-test-boundary-5a1f";
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/big.form\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    let tail = format!("\r\n--{boundary}--\r\n").into_bytes();
    let body = std::iter::once(head)
        .chain((0..UPLOAD / CHUNK).map(random_chunk))
        .chain(std::iter::once(tail));
    let base = reset_peak(&s);
    let url = s.e2b_url.as_deref().expect("--e2b-listen");
    let resp = s
        .http
        .post(format!("{url}/files"))
        .header("E2b-Sandbox-Id", &id)
        .header("E2b-Sandbox-Port", "49983")
        .header("X-Access-Token", &token)
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body_of(body))
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v[0]["path"], "/tmp/big.form", "{v}");
    growth.push(("multipart", memory(&s).1.saturating_sub(base)));
    assert_reads_back(&s, &id, &token, "/tmp/big.form", random_chunk).await;

    eprintln!(
        "peak RSS growth per {} MiB upload (KiB): {growth:?}",
        UPLOAD >> 20
    );
    for (kind, kib) in growth {
        assert!(
            kib < (UPLOAD as u64 / 4) >> 10,
            "a {} MiB {kind} upload grew the server's peak RSS by {kib} KiB",
            UPLOAD >> 20
        );
    }
    // A corrupt gzip body is refused, not stored as if complete.
    let resp = files(&s, reqwest::Method::POST, &id, &token, "/tmp/bad.txt")
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body("this is not gzip")
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.status(), 400);
    let text = resp.text().await.unwrap_or_default();
    assert!(text.contains("broke off"), "{text}");
    // The sandbox is fine after it.
    let resp = files(&s, reqwest::Method::POST, &id, &token, "/tmp/after.txt")
        .header("content-type", "application/octet-stream")
        .body("still here")
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.status(), 200);
    s.kill(&id).await;
}

/// `Accept-Encoding: gzip` gets `Content-Encoding: gzip`, inflating to the file's bytes;
/// without it the bytes come plain.
#[tokio::test]
async fn downloads_are_gzipped_when_the_client_accepts_it() {
    let s = server().await;
    let (id, token) = e2b_sandbox(&s).await;
    let data: Vec<u8> = (0..4).flat_map(text_chunk).collect();
    let resp = files(&s, reqwest::Method::POST, &id, &token, "/tmp/d.txt")
        .header("content-type", "application/octet-stream")
        .body(data.clone())
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.status(), 200);
    let resp = files(&s, reqwest::Method::GET, &id, &token, "/tmp/d.txt")
        .header("accept-encoding", "gzip")
        .send()
        .await
        .expect("download");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-encoding"], "gzip");
    let packed = resp.bytes().await.expect("body");
    assert!(packed.len() < data.len() / 4, "{} bytes", packed.len());
    let mut plain = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&packed[..]), &mut plain)
        .expect("gunzip");
    assert!(plain == data, "the gzip download inflates to other bytes");
    for refused in ["identity", "gzip;q=0"] {
        let resp = files(&s, reqwest::Method::GET, &id, &token, "/tmp/d.txt")
            .header("accept-encoding", refused)
            .send()
            .await
            .expect("download");
        assert!(
            resp.headers().get("content-encoding").is_none(),
            "{refused}"
        );
        assert!(resp.bytes().await.expect("body") == data, "{refused}");
    }
    s.kill(&id).await;
}

/// The answer to an upload that needs more disk than the sandbox has: 507 (the E2B SDKs'
/// `NotEnoughSpaceException`), and the sandbox carries on once space is freed.
#[tokio::test]
async fn an_upload_that_does_not_fit_the_disk_is_507_and_the_sandbox_carries_on() {
    let s = server().await;
    // E2B's create takes no disk size: the sandbox is made through Hutch's API, and its envd
    // token read through E2B's `GET /sandboxes/{id}` as an SDK's connect would. The files go
    // to /root, on the disk (`/tmp` is a tmpfs, bounded by the memory limit instead).
    let id = s
        .create_id(json!({"template": "base", "isolation": "ns", "disk_mib": 32}))
        .await;
    let url = s.e2b_url.as_deref().expect("--e2b-listen");
    let detail: Value = s
        .http
        .get(format!("{url}/sandboxes/{id}"))
        .header("x-api-key", &s.key)
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let token = detail["envdAccessToken"]
        .as_str()
        .expect("token")
        .to_string();
    let data: Vec<u8> = (0..48).flat_map(random_chunk).collect();
    let resp = files(&s, reqwest::Method::POST, &id, &token, "/root/too-big.bin")
        .header("content-type", "application/octet-stream")
        .body(data)
        .send()
        .await
        .expect("upload answered");
    assert_eq!(resp.status(), 507);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["code"], 507, "{v}");
    let message = v["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("quota") || message.contains("space"),
        "{message}"
    );
    let (out, code) = s.sh(&id, "rm /root/too-big.bin && echo freed").await;
    assert_eq!((out.as_str(), code), ("freed\n", 0));
    let resp = files(&s, reqwest::Method::POST, &id, &token, "/root/fits.txt")
        .header("content-type", "application/octet-stream")
        .body("fits")
        .send()
        .await
        .expect("upload");
    assert_eq!(resp.status(), 200);
    let (out, _) = s.sh(&id, "cat /root/fits.txt").await;
    assert_eq!(out, "fits");
    s.kill(&id).await;
}
