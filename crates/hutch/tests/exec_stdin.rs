//! Exec stdin streamed as the request body (`Content-Type: application/octet-stream`, the
//! command in the query string) on both exec routes, collected `exec` and `exec/stream`:
//! written to the process while its output is read, so large inputs come back whole and a
//! process that writes before it reads never deadlocks on its own input.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use futures_util::StreamExt;
use hutch_testkit::{both_backends, on, TestServer};
use serde_json::json;
use sha2::{Digest, Sha256};

both_backends!(
    a_process_that_writes_before_it_reads_finishes_on_both_routes,
    a_client_that_goes_away_mid_upload_kills_its_exec,
);

/// Longest any single exec of these tests may take; a deadlock fails the test here instead
/// of hanging it.
const DEADLINE: Duration = Duration::from_secs(180);

/// `len` pseudo-random bytes (`printable`: ASCII `!`..`~` only, so a collected exec's JSON
/// answer is plain text; otherwise any byte, most chunks not UTF-8).
fn payload(len: usize, printable: bool) -> Bytes {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let b = (state >> 32) as u8;
            if printable {
                b'!' + b % 94
            } else {
                b
            }
        })
        .collect::<Vec<u8>>()
        .into()
}

/// `data` as a streamed (chunked) request body, 1 MiB at a time.
fn streamed(data: &Bytes) -> reqwest::Body {
    let chunks: Vec<Result<Bytes, std::io::Error>> = (0..data.len())
        .step_by(1 << 20)
        .map(|at| Ok(data.slice(at..data.len().min(at + (1 << 20)))))
        .collect();
    reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
}

/// Length and SHA-256 of some bytes.
fn digest(data: &[u8]) -> (usize, String) {
    (data.len(), format!("{:x}", Sha256::digest(data)))
}

/// `POST {route}?{query}` with `stdin` as the raw body.
async fn post_stdin(
    s: &TestServer,
    id: &str,
    route: &str,
    query: &str,
    stdin: reqwest::Body,
) -> reqwest::Response {
    let resp = s
        .http
        .post(format!("{}/v1/sandboxes/{id}/{route}?{query}", s.url))
        .bearer_auth(&s.key)
        .header("content-type", "application/octet-stream")
        .body(stdin)
        .timeout(DEADLINE)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{route}: {e}"));
    assert_eq!(resp.status(), 200, "{route}");
    resp
}

/// The collected exec's answer: stdout's length and hash, stderr, exit code.
async fn collected(resp: reqwest::Response) -> ((usize, String), String, i64) {
    let v: serde_json::Value = resp.json().await.expect("the exec's JSON answer");
    assert_eq!(v["stdout_truncated"], false, "{}", v["stderr"]);
    let stdout = match v["stdout_b64"].as_str() {
        Some(b) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .expect("stdout_b64"),
        None => v["stdout"].as_str().expect("stdout").as_bytes().to_vec(),
    };
    (
        digest(&stdout),
        v["stderr"].as_str().unwrap_or_default().to_string(),
        v["exit_code"].as_i64().unwrap_or(-1),
    )
}

/// An `exec/stream` answer read as it arrives: stdout's length and hash, and the exit code
/// (`None` when the stream ended without an `exit` event).
async fn streamed_answer(resp: reqwest::Response) -> ((usize, String), Option<i64>) {
    let mut hash = Sha256::new();
    let mut len = 0;
    let mut exit = None;
    let mut pending = Vec::new();
    let mut event = String::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        pending.extend_from_slice(&chunk.expect("the event stream"));
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = std::str::from_utf8(&line).expect("SSE is text").trim_end();
            if let Some(name) = line.strip_prefix("event: ") {
                event = name.to_string();
            } else if let Some(data) = line.strip_prefix("data: ") {
                let v: serde_json::Value = serde_json::from_str(data).expect("event data");
                match event.as_str() {
                    "stdout" => {
                        let bytes = match (v["data"].as_str(), v["data_b64"].as_str()) {
                            (Some(text), _) => text.as_bytes().to_vec(),
                            (None, Some(b)) => base64::engine::general_purpose::STANDARD
                                .decode(b)
                                .expect("data_b64"),
                            _ => panic!("a stdout event without data: {v}"),
                        };
                        len += bytes.len();
                        hash.update(&bytes);
                    }
                    "exit" => exit = v["exit_code"].as_i64(),
                    "error" => panic!("the exec failed: {v}"),
                    _ => {}
                }
            }
        }
    }
    ((len, format!("{:x}", hash.finalize())), exit)
}

/// 64 MiB of stdin, streamed as the body of `exec/stream`, comes back byte-identical
/// through `cat` (any bytes: most chunks go back as base64).
#[tokio::test]
async fn sixty_four_mib_of_streamed_stdin_round_trip_through_cat_on_exec_stream() {
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let stdin = payload(64 << 20, false);
    let resp = post_stdin(&s, &id, "exec/stream", "arg=cat", streamed(&stdin)).await;
    let (stdout, exit) = streamed_answer(resp).await;
    assert_eq!(exit, Some(0));
    assert_eq!(stdout, digest(&stdin), "stdout differs from stdin");
}

/// 64 MiB of stdin, streamed as the body of the collected `exec`, comes back byte-identical
/// through `cat` (on a server whose output cap holds it: 16 MiB by default).
#[tokio::test]
async fn sixty_four_mib_of_streamed_stdin_round_trip_through_cat_on_exec() {
    let s = TestServer::start_with(&["--exec-output-cap", "64MiB"]).await;
    let id = s.create_id(json!({})).await;
    let stdin = payload(64 << 20, true);
    let resp = post_stdin(&s, &id, "exec", "arg=cat", streamed(&stdin)).await;
    let (stdout, stderr, exit) = collected(resp).await;
    assert_eq!(exit, 0, "{stderr}");
    assert_eq!(stdout, digest(&stdin), "stdout differs from stdin");
    // On the default cap, the same exec keeps 16 MiB and says it cut the rest.
    let s = TestServer::start().await;
    let id = s.create_id(json!({})).await;
    let resp = post_stdin(&s, &id, "exec", "arg=cat", streamed(&stdin)).await;
    let v: serde_json::Value = resp.json().await.expect("json");
    assert_eq!(v["stdout_truncated"], true);
    assert_eq!(v["stdout"].as_str().map(str::len), Some(16 << 20));
    assert_eq!(v["exit_code"], 0);
}

/// A process that writes 8 MiB before it reads any of its 16 MiB of stdin (more than the
/// pipes and HTTP/2 windows hold either way) finishes on both routes: stdin is written
/// while the output is read. Writing all of stdin first deadlocked.
async fn a_process_that_writes_before_it_reads_finishes_on_both_routes(isolation: &str) {
    let s = TestServer::start().await;
    let id = s.create_id(on(isolation, json!({}))).await;
    let stdin = payload(16 << 20, false);
    let query =
        "cmd=head%20-c%208388608%20%2Fdev%2Fzero%3B%20cat%20%3E%2Fdev%2Fnull%3B%20echo%20done";
    let zeros_and_done = digest(&[&vec![0u8; 8 << 20][..], b"done\n"].concat());

    let resp = post_stdin(&s, &id, "exec/stream", query, streamed(&stdin)).await;
    let (stdout, exit) = streamed_answer(resp).await;
    assert_eq!(exit, Some(0));
    assert_eq!(stdout, zeros_and_done);

    let resp = post_stdin(&s, &id, "exec", query, streamed(&stdin)).await;
    let (stdout, stderr, exit) = collected(resp).await;
    assert_eq!(exit, 0, "{stderr}");
    assert_eq!(stdout, zeros_and_done);
}

/// A raw HTTP/1.1 connection that has sent the head of `POST {route}?{query}` with a chunked
/// octet-stream body, and [`chunk`]s to follow: the client's side, byte for byte.
async fn raw_upload(s: &TestServer, id: &str, route: &str, query: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;

    let addr = s.url.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let head = format!(
        "POST /v1/sandboxes/{id}/{route}?{query} HTTP/1.1\r\nHost: {addr}\r\n\
         Authorization: Bearer {}\r\nContent-Type: application/octet-stream\r\n\
         Transfer-Encoding: chunked\r\n\r\n",
        s.key
    );
    conn.write_all(head.as_bytes()).await.expect("head");
    conn
}

/// One 64 KiB chunk of a chunked body.
fn chunk() -> Vec<u8> {
    [b"10000\r\n".as_slice(), &[b'x'; 64 << 10], b"\r\n"].concat()
}

/// How many sandbox processes' command lines start with `prefix`.
async fn processes(s: &TestServer, id: &str, prefix: &str) -> String {
    let (out, _) = s
        .sh(id, &format!("ps -o args | grep -c '^{prefix}' || true"))
        .await;
    out.trim().to_string()
}

/// The attacker's side of a streamed body: an upload to a process that does not read is
/// taken no faster than it reads (back-pressure: the client's writes stop; nothing is
/// buffered whole), on a raw connection.
#[tokio::test]
async fn an_upload_to_a_process_that_does_not_read_is_held_back() {
    use tokio::io::AsyncWriteExt;

    let s = TestServer::start().await;
    for route in ["exec", "exec/stream"] {
        let id = s.create_id(json!({})).await;
        let mut conn = raw_upload(&s, &id, route, "arg=sleep&arg=1234").await;
        let running = hutch_testkit::wait_until(Duration::from_secs(10), async || {
            (processes(&s, &id, "sleep 1234").await == "1").then_some(())
        })
        .await;
        assert!(running.is_some(), "{route}: the exec did not start");
        // 64 KiB chunks until the server stops taking them for 2 s.
        let chunk = chunk();
        let mut taken = 0usize;
        while tokio::time::timeout(Duration::from_secs(2), conn.write_all(&chunk))
            .await
            .is_ok_and(|written| written.is_ok())
        {
            taken += chunk.len();
            assert!(taken < 48 << 20, "{route}: the server took {taken} bytes");
        }
        // What was taken sits in the pipe, the queues and HTTP/2 windows and the sockets'
        // buffers between: a few MiB.
        eprintln!("{route}: stdin taken for a process that never reads: {taken} bytes");
        // Behind those bytes the server cannot see the connection close: the exec ends by
        // its timeout or with its sandbox (docs/api.md), as here.
        drop(conn);
        assert_eq!(s.kill(&id).await, 204);
    }
}

/// A client that goes away in the middle of its upload (its body cut off, no final chunk)
/// cancels its exec on both routes: the process group is killed, and stdin never gets the
/// EOF that would let `sh` go on as if the partial input were whole. A collected exec writes
/// nothing to its client before the end, so the broken upload is how the server learns it.
async fn a_client_that_goes_away_mid_upload_kills_its_exec(isolation: &str) {
    use tokio::io::AsyncWriteExt;

    let s = TestServer::start().await;
    let id = s.create_id(on(isolation, json!({}))).await;
    let query = "cmd=cat%20%3E%2Fdev%2Fnull%3B%20exec%20sleep%201234";
    for route in ["exec", "exec/stream"] {
        let mut conn = raw_upload(&s, &id, route, query).await;
        for _ in 0..16 {
            conn.write_all(&chunk()).await.expect("a chunk");
        }
        let running = hutch_testkit::wait_until(Duration::from_secs(10), async || {
            (processes(&s, &id, "/bin/sh -c cat").await == "1").then_some(())
        })
        .await;
        assert!(running.is_some(), "{route}: the exec did not start");
        drop(conn);
        let gone = hutch_testkit::wait_until(Duration::from_secs(10), async || {
            let left = (
                processes(&s, &id, "/bin/sh -c cat").await,
                processes(&s, &id, "sleep 1234").await,
            );
            (left == ("0".into(), "0".into())).then_some(())
        })
        .await;
        assert!(gone.is_some(), "{route}: the exec outlived its client");
    }
}
