//! The API server against hostile clients: half-open connections (slowloris), oversized
//! bodies, exec output past the memory budget, too many execs at once (docs/limits.md).

mod common;

use std::time::{Duration, Instant};

use common::TestServer;
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
