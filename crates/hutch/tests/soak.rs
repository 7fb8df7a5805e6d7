//! A short soak (issue 23, item 7): a mix of creates, execs, file writes and reads, listings,
//! hibernations and deletes for a bounded time, then the server's descriptors, threads and
//! sandboxes return to what they were before, and its memory stays near it. Longer on demand:
//! `HUTCH_SOAK_SECONDS` (default 30).

use std::time::{Duration, Instant};

use hutch_testkit::{wait_until, TestServer};
use reqwest::Method;
use serde_json::json;

/// Threads of the server process.
fn server_threads(s: &TestServer) -> usize {
    std::fs::read_to_string(format!("/proc/{}/status", s.server_pid()))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// One round of the mix on a fresh sandbox; every call must succeed.
async fn round(s: &TestServer, i: usize) {
    let id = s.create_id(json!({"isolation": "ns"})).await;
    let out = s.sh_ok(&id, &format!("echo round {i}")).await;
    assert_eq!(out, format!("round {i}\n"));
    let data = vec![b'x'; 256 << 10];
    s.put_file(&id, "/root/blob", "0644", data.clone()).await;
    let got = s
        .http
        .get(format!("{}/v1/sandboxes/{id}/files?path=/root/blob", s.url))
        .bearer_auth(&s.key)
        .send()
        .await
        .expect("read")
        .bytes()
        .await
        .expect("body");
    assert!(got == data, "round {i}: the file read back differs");
    let (st, _) = s.request(Method::GET, "/v1/sandboxes?limit=20", None).await;
    assert_eq!(st, 200);
    if i.is_multiple_of(3) {
        s.act(&id, "hibernate").await;
        s.act(&id, "wake").await;
        assert_eq!(
            s.sh_ok(&id, "cat /root/blob | wc -c").await.trim(),
            "262144"
        );
    }
    assert_eq!(s.kill(&id).await, 204);
}

#[tokio::test]
async fn a_short_soak_returns_descriptors_threads_and_sandboxes_to_their_baseline() {
    let seconds: u64 = std::env::var("HUTCH_SOAK_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let s = TestServer::start().await;
    // Warm up: the first round fills pools and caches that then stay.
    round(&s, 1).await;
    let fds = s.server_open_fds();
    let threads = server_threads(&s);
    let rss = s.server_rss_kib();
    let started = Instant::now();
    let mut rounds = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        // Two sandboxes at a time, so calls overlap.
        tokio::join!(round(&s, rounds * 2), round(&s, rounds * 2 + 1));
        rounds += 1;
    }
    assert!(rounds > 0);
    assert!(
        s.sandbox_ids().await.is_empty(),
        "every sandbox was deleted"
    );
    // Idle blocking threads end after 10 s and connections are closed as they go idle.
    let settled = wait_until(Duration::from_secs(30), async || {
        let (now_fds, now_threads) = (s.server_open_fds(), server_threads(&s));
        (now_fds <= fds + 8 && now_threads <= threads + 4).then_some((now_fds, now_threads))
    })
    .await;
    assert!(
        settled.is_some(),
        "after {rounds} double rounds: descriptors {} (before {fds}), threads {} (before {threads})",
        s.server_open_fds(),
        server_threads(&s)
    );
    let grown_mib = s.server_rss_kib().saturating_sub(rss) / 1024;
    eprintln!(
        "soak: {rounds} double rounds in {seconds} s; descriptors {fds} → {}, threads {threads} → {}, RSS +{grown_mib} MiB",
        s.server_open_fds(),
        server_threads(&s)
    );
    assert!(
        grown_mib < 64,
        "the server's memory grew by {grown_mib} MiB over {rounds} double rounds"
    );
}
