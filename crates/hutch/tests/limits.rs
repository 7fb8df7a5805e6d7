//! The API server against hostile clients: half-open connections (slowloris), oversized
//! bodies, exec output past the memory budget, too many execs at once (docs/limits.md).

use std::time::{Duration, Instant};

use hutch_testkit::TestServer;
use reqwest::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The start of a request head that is never finished.
const PARTIAL_HEAD: &[u8] = b"GET /v1/sandboxes HTTP/1.1\r\nHost: hutch\r\nX-Slow: ";

/// Raise this process's soft descriptor limit to its hard limit (the test holds thousands).
fn raise_own_open_files() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct we own.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = lim.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
    lim.rlim_cur
}

fn addr_of(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

/// `GET /v1/sandboxes` with the key on `client`; the status.
async fn list_status(s: &TestServer, client: &reqwest::Client) -> Result<u16, String> {
    client
        .get(format!("{}/v1/sandboxes", s.url))
        .bearer_auth(&s.key)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("{e:?}"))
}

/// 5,000 connections that send a partial request head and hold it, against a server allowed
/// 4,096 descriptors (so without a cap they exhaust it): an authenticated client keeps
/// getting answers throughout, `/healthz` on a fresh connection answers, and the server's
/// descriptors stay bounded by its connection cap.
#[tokio::test]
async fn half_open_connections_do_not_starve_an_authenticated_client() {
    const ATTACKERS: usize = 5_000;
    assert!(raise_own_open_files() > ATTACKERS as u64 + 200);
    let s = TestServer::start_with_open_files(&[], 4096).await;
    let addr = addr_of(&s.url);
    // A client with a keep-alive connection made before the attack...
    let known = reqwest::Client::new();
    assert_eq!(list_status(&s, &known).await, Ok(200));

    let mut held = Vec::with_capacity(ATTACKERS);
    let mut answered = 0;
    for i in 0..ATTACKERS {
        // A server out of descriptors stops accepting: connects then stall in its backlog.
        let connect = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(&addr));
        if let Ok(Ok(mut c)) = connect.await {
            // Closed by the server (evicted) between connect and write is fine.
            let _ = c.write_all(PARTIAL_HEAD).await;
            held.push(c);
        }
        if i % 500 == 499 {
            // ...keeps being answered during the attack, and so does a brand-new client.
            assert_eq!(
                list_status(&s, &known).await,
                Ok(200),
                "after {i} attackers"
            );
            let fresh = reqwest::Client::new();
            assert_eq!(list_status(&s, &fresh).await, Ok(200), "fresh, after {i}");
            answered += 2;
        }
    }
    assert_eq!(answered, 2 * ATTACKERS / 500);
    // With every attacker connection held: health and authenticated calls still answer.
    let fresh = reqwest::Client::new();
    let health = fresh
        .get(format!("{}/healthz", s.url))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("healthz answers during the attack");
    assert_eq!(health.status(), 200);
    assert_eq!(list_status(&s, &known).await, Ok(200));
    // The cap (half of 4,096) bounds the server's descriptors, whatever the attackers hold.
    let fds = s.server_open_fds();
    assert!(fds < 2048 + 200, "server holds {fds} descriptors");
    let metrics = s.metrics_text().await;
    // Attackers beyond the cap were closed: evicted for newcomers, or by the header timeout.
    let closed = metric(&metrics, "hutch_http_connections_evicted_total")
        + metric(&metrics, "hutch_http_connections_timed_out_total");
    assert!(
        closed >= (ATTACKERS - 2048) as f64,
        "{closed} closed:\n{}",
        metrics
            .lines()
            .filter(|l| l.starts_with("hutch_http"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    drop(held);
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(-1.0)
}

/// A connection that never finishes its request head is closed after the header timeout; a
/// complete request on an idle keep-alive connection is still answered before the idle one.
#[tokio::test]
async fn a_request_head_not_finished_in_time_is_closed() {
    let s = TestServer::start_with(&["--header-timeout-secs", "1"]).await;
    let addr = addr_of(&s.url);
    let mut slow = TcpStream::connect(&addr).await.expect("connect");
    slow.write_all(PARTIAL_HEAD).await.expect("write");
    let started = Instant::now();
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(Duration::from_secs(20), slow.read(&mut buf))
        .await
        .expect("the server closes a slow head within the timeout's reach");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed without an answer, got {read:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(900));
    // Complete requests are unaffected.
    let (st, _) = s.request(Method::GET, "/v1/sandboxes", None).await;
    assert_eq!(st, 200);
}

/// Send a request head declaring `body_len` bytes, then stream zeros while reading the
/// answer (a server that answers early closes before the upload ends). Returns the whole
/// answer as text.
async fn send_large_body(addr: &str, head: String, body_len: usize) -> String {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut rd, mut wr) = stream.into_split();
    let upload = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await?;
        let chunk = vec![b' '; 1 << 20];
        let mut sent = 0;
        while sent < body_len {
            let n = chunk.len().min(body_len - sent);
            wr.write_all(&chunk[..n]).await?;
            sent += n;
        }
        Ok::<usize, std::io::Error>(sent)
    });
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(60), rd.read_to_end(&mut answer)).await;
    upload.abort();
    String::from_utf8_lossy(&answer).into_owned()
}

/// A 100 MiB JSON body to create is answered 413 in Hutch's error shape, naming the limit,
/// without the server buffering it: its RSS stays flat (both with `Content-Length` and
/// chunked, where the limit is met while reading).
#[tokio::test]
async fn a_huge_json_body_is_refused_with_413_and_flat_memory() {
    const BODY: usize = 100 << 20;
    let s = TestServer::start().await;
    let addr = addr_of(&s.url);
    let before = s.server_rss_kib();
    let declared = send_large_body(
        &addr,
        format!(
            "POST /v1/sandboxes HTTP/1.1\r\nHost: hutch\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {BODY}\r\n\r\n",
            s.key
        ),
        BODY,
    )
    .await;
    assert!(declared.starts_with("HTTP/1.1 413"), "{declared}");
    assert!(
        declared.contains(r#""code":"payload_too_large""#)
            && declared.contains("1 MiB (1048576 bytes)")
            && declared.contains("--max-json-body"),
        "{declared}"
    );
    // Chunked: no length to check up front; the limit stops the read.
    let big = Vec::from(format!(
        "{{\"metadata\": {{\"x\": \"{}\"}}}}",
        "a".repeat(BODY)
    ));
    let chunks = futures_util::stream::iter(
        big.chunks(1 << 20)
            .map(|c| Ok::<_, std::io::Error>(c.to_vec()))
            .collect::<Vec<_>>(),
    );
    let resp = s
        .http
        .post(format!("{}/v1/sandboxes", s.url))
        .bearer_auth(&s.key)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await;
    if let Ok(resp) = resp {
        assert_eq!(resp.status(), 413);
        let v: serde_json::Value = resp.json().await.expect("json error");
        assert_eq!(v["error"]["code"], "payload_too_large", "{v}");
    }
    drop(big);
    let after = s.server_rss_kib();
    assert!(
        after < before + 20 * 1024,
        "server RSS grew from {before} KiB to {after} KiB"
    );
    // Ordinary creates still fit.
    let (st, v) = s
        .request(Method::POST, "/v1/sandboxes", Some(serde_json::json!({})))
        .await;
    assert_eq!(st, 201, "{v}");
}

/// Stdin larger than the JSON limit goes as the raw body of `exec/stream` (command in the
/// query) and comes back byte-identical through `cat`, streamed both ways at once.
#[tokio::test]
async fn a_streamed_stdin_body_round_trips_through_cat() {
    let s = TestServer::start().await;
    let id = s.create_id(serde_json::json!({})).await;
    // 12 MiB of bytes that are not UTF-8, well past the pipes and the HTTP/2 stream windows
    // (4 MiB towards the server, 2 MiB towards the agent): cat's output must be read while
    // stdin is still being written.
    let stdin: Vec<u8> = (0..12u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let resp = s
        .http
        .post(format!(
            "{}/v1/sandboxes/{id}/exec/stream?arg=cat&timeout_seconds=120",
            s.url
        ))
        .bearer_auth(&s.key)
        .header("content-type", "application/octet-stream")
        .body(stdin.clone())
        .send()
        .await
        .expect("exec/stream");
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.expect("sse");
    let (stdout, exit) = sse_stdout(&text);
    assert_eq!(
        exit.as_deref(),
        Some("0"),
        "{}",
        &text[text.len().saturating_sub(500)..]
    );
    assert_eq!(stdout.len(), stdin.len());
    assert!(stdout == stdin, "stdout differs from stdin");
    // Unknown query parameters are refused like unknown JSON fields.
    let resp = s
        .http
        .post(format!(
            "{}/v1/sandboxes/{id}/exec/stream?arg=cat&shell=1",
            s.url
        ))
        .bearer_auth(&s.key)
        .header("content-type", "application/octet-stream")
        .body("x")
        .send()
        .await
        .expect("exec/stream");
    assert_eq!(resp.status(), 400);
}

/// JSON stdin on `exec/stream` is written while the output is read (it used to be sent whole
/// before the first event was read): 12 MiB through `cat`, past the pipes and the HTTP/2
/// stream windows, on a server with a larger JSON limit, comes back whole.
#[tokio::test]
async fn json_stdin_on_exec_stream_does_not_hang() {
    let s = TestServer::start_with(&["--max-json-body", "32MiB"]).await;
    let id = s.create_id(serde_json::json!({})).await;
    let stdin = "0123456789abcdef".repeat(12 << 16); // 12 MiB
    let resp = s
        .http
        .post(format!("{}/v1/sandboxes/{id}/exec/stream", s.url))
        .bearer_auth(&s.key)
        .json(&serde_json::json!({"cmd": ["cat"], "stdin": stdin}))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("exec/stream");
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.expect("the stream finishes");
    let (stdout, exit) = sse_stdout(&text);
    assert_eq!(exit.as_deref(), Some("0"));
    assert!(stdout == stdin.as_bytes(), "{} bytes back", stdout.len());
}

/// The stdout bytes of an SSE exec stream, and the exit code.
fn sse_stdout(text: &str) -> (Vec<u8>, Option<String>) {
    use base64::Engine;
    let mut out = Vec::new();
    let mut exit = None;
    let mut event = "";
    for line in text.lines() {
        if let Some(e) = line.strip_prefix("event: ") {
            event = e;
        } else if let Some(d) = line.strip_prefix("data: ") {
            let v: serde_json::Value = serde_json::from_str(d).unwrap_or_default();
            match event {
                "stdout" => match (v["data"].as_str(), v["data_b64"].as_str()) {
                    (Some(t), _) => out.extend_from_slice(t.as_bytes()),
                    (None, Some(b)) => out.extend(
                        base64::engine::general_purpose::STANDARD
                            .decode(b)
                            .expect("base64"),
                    ),
                    _ => {}
                },
                "exit" => exit = Some(v["exit_code"].to_string()),
                _ => {}
            }
        }
    }
    (out, exit)
}

/// Highest `VmRSS` of the server, sampled every 20 ms until `stop` is set.
fn sample_peak_rss(
    pid: u32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let rss = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            peak = peak.max(rss);
            std::thread::sleep(Duration::from_millis(20));
        }
        peak
    })
}

/// 50 concurrent execs, each writing 16 MiB, against a 64 MiB output budget: every one comes
/// back complete and byte-correct (or is refused with 429, never cut), and the server's peak
/// RSS stays under its baseline + the documented bound (budget + 36 MiB) + an allowance for
/// everything else the server holds meanwhile.
#[tokio::test]
async fn fifty_concurrent_16_mib_execs_stay_within_the_output_budget() {
    const EXECS: usize = 50;
    const SIZE: usize = 16 << 20;
    const BUDGET_MIB: u64 = 64;
    const ALLOWANCE_MIB: u64 = 96;
    let s = TestServer::start_with(&["--exec-output-budget-mib", "64"]).await;
    let sandboxes = [
        s.create_id(serde_json::json!({})).await,
        s.create_id(serde_json::json!({})).await,
    ];
    // A line of 16 bytes repeated: 16 MiB of ASCII whose JSON is barely larger.
    let line = "abcdefghijklmno\n";
    let expected = line.repeat(SIZE / line.len());
    let script = format!("yes abcdefghijklmno | head -c {SIZE}");
    // Warm up (first exec per sandbox, allocator arenas), then take the baseline.
    for id in &sandboxes {
        let v = s
            .exec(
                id,
                serde_json::json!({"cmd": "head -c 1000000 /dev/zero | wc -c"}),
            )
            .await;
        assert_eq!(v["stdout"], "1000000\n");
    }
    let base = s.server_rss_kib();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_peak_rss(s.server_pid(), stop.clone());
    let runs = (0..EXECS).map(|i| {
        let url = format!("{}/v1/sandboxes/{}/exec", s.url, sandboxes[i % 2]);
        let (http, key, script, expected) = (s.http.clone(), s.key.clone(), &script, &expected);
        async move {
            let resp = http
                .post(url)
                .bearer_auth(key)
                .json(&serde_json::json!({"cmd": script, "timeout_seconds": 600}))
                .send()
                .await
                .expect("exec answered");
            let status = resp.status().as_u16();
            let body = resp.bytes().await.expect("whole answer");
            if status == 429 {
                return false;
            }
            assert_eq!(
                status,
                200,
                "exec {i}: {}",
                String::from_utf8_lossy(&body[..200.min(body.len())])
            );
            let v: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
            drop(body);
            assert_eq!(v["exit_code"], 0, "exec {i}");
            assert_eq!(v["stdout_truncated"], false, "exec {i}");
            assert!(v.get("stdout_b64").is_none());
            assert!(
                v["stdout"].as_str() == Some(expected.as_str()),
                "exec {i}: wrong output"
            );
            true
        }
    });
    let done = futures_util::future::join_all(runs).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.join().expect("sampler");
    let completed = done.iter().filter(|ok| **ok).count();
    let metrics = s.metrics_text().await;
    let held_peak = metric(&metrics, "hutch_exec_output_buffered_peak_bytes");
    eprintln!(
        "server RSS: base {} MiB, peak {} MiB over {completed}/{EXECS} completed execs; \
         output held at peak {:.0} MiB",
        base / 1024,
        peak / 1024,
        held_peak / 1048576.0
    );
    assert!(completed > 0, "some execs must run");
    assert!(
        held_peak <= ((BUDGET_MIB + 36) << 20) as f64,
        "the budget's own accounting went past its bound: {held_peak}"
    );
    assert!(
        peak < base + (BUDGET_MIB + 36 + ALLOWANCE_MIB) * 1024,
        "server RSS peaked at {} MiB from {} MiB",
        peak / 1024,
        base / 1024
    );
}

/// A sandbox runs at most `--max-execs-per-sandbox` execs at once: one more is answered 429
/// `too_many_execs` naming the cap, and runs again once a slot is free.
#[tokio::test]
async fn execs_past_the_per_sandbox_cap_get_429() {
    let s = TestServer::start_with(&["--max-execs-per-sandbox", "2"]).await;
    let id = s.create_id(serde_json::json!({})).await;
    let hold = |n: u32| {
        let url = format!("{}/v1/sandboxes/{id}/exec/stream", s.url);
        let (http, key) = (s.http.clone(), s.key.clone());
        async move {
            http.post(url)
                .bearer_auth(key)
                .json(&serde_json::json!({"cmd": format!("echo {n}; sleep 30")}))
                .send()
                .await
                .expect("stream")
        }
    };
    let first = hold(1).await;
    let second = hold(2).await;
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let (st, v) = s
        .request(
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(serde_json::json!({"cmd": "echo three"})),
        )
        .await;
    assert_eq!(st, 429, "{v}");
    assert_eq!(v["error"]["code"], "too_many_execs");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("2 execs") && message.contains("--max-execs-per-sandbox"),
        "{message}"
    );
    // Dropping a stream kills its command and frees its slot.
    drop(first);
    let freed = hutch_testkit::wait_until(Duration::from_secs(10), async || {
        let (st, v) = s
            .request(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                Some(serde_json::json!({"cmd": "echo three"})),
            )
            .await;
        (st == 200).then_some(v)
    })
    .await
    .expect("a slot frees up");
    assert_eq!(freed["stdout"], "three\n");
    drop(second);
}

/// 24 concurrent 16 MiB execs in one sandbox under the default 256 MiB budget: the budget is
/// spent and collectors wait, each leaving its 4 MiB stream window unread on the one HTTP/2
/// connection to the agent (64 MiB for all its streams). Unbounded, the waiting streams
/// filled that window and the exec holding the budget's overdraft received nothing: every
/// exec hung. At most 15 collect at once per sandbox now, and all complete.
#[tokio::test]
async fn many_large_execs_in_one_sandbox_never_stall_its_agent_connection() {
    const EXECS: usize = 24;
    const SIZE: usize = 16 << 20;
    let s = TestServer::start().await;
    let id = s.create_id(serde_json::json!({})).await;
    let script = format!("yes abcdefghijklmno | head -c {SIZE}");
    let runs = (0..EXECS).map(|i| {
        let url = format!("{}/v1/sandboxes/{id}/exec", s.url);
        let (http, key, script) = (s.http.clone(), s.key.clone(), &script);
        async move {
            let resp = http
                .post(url)
                .bearer_auth(key)
                .json(&serde_json::json!({"cmd": script, "timeout_seconds": 600}))
                .timeout(Duration::from_secs(240))
                .send()
                .await
                .unwrap_or_else(|e| panic!("exec {i} stalled or failed: {e}"));
            assert_eq!(resp.status(), 200, "exec {i}");
            let v: serde_json::Value = resp.json().await.expect("whole answer");
            assert_eq!(v["stdout"].as_str().map(str::len), Some(SIZE), "exec {i}");
        }
    });
    futures_util::future::join_all(runs).await;
    let metrics = s.metrics_text().await;
    assert!(
        metric(&metrics, "hutch_exec_output_waits_total") > 0.0,
        "the budget was spent, so collectors waited"
    );
}
