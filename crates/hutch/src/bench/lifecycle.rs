//! Lifecycle series: pause/resume, hibernate/wake, snapshot, fork of 1 and 8, explore of 4.
//! A series whose endpoint the server does not offer is reported as skipped, not failed.

use std::time::Instant;

use serde_json::{json, Value};

use super::baselines::Skipped;
use super::server::BenchServer;
use super::stats::{summarize, Summary};

/// Time `f` `n` times; `Err` carries the first failure's message.
async fn series<F, Fut>(name: &str, n: usize, mut f: F) -> Result<Summary, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        f().await.map_err(|e| format!("{e:#}"))?;
        samples.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(summarize(name, "ms", &samples))
}

/// The ids of the sandboxes in a fork answer.
pub(super) fn ids_of(v: &Value) -> Vec<String> {
    v["sandboxes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s["id"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Run every lifecycle series `n` times on sandboxes of the bench server.
pub async fn run(srv: &BenchServer, n: usize) -> anyhow::Result<(Vec<Summary>, Vec<Skipped>)> {
    let mut done = Vec::new();
    let mut skipped = Vec::new();
    let id_owned = srv.create().await?;
    let id = id_owned.as_str();
    srv.exec_true(id).await?;
    srv.post(
        &format!("/v1/sandboxes/{id}/exec"),
        json!({"cmd": "head -c 1048576 /dev/urandom > /root/state.bin"}),
    )
    .await?;
    let mut record = |r: Result<Summary, String>, name: &str| match r {
        Ok(s) => done.push(s),
        Err(reason) => skipped.push(Skipped {
            name: name.into(),
            reason,
        }),
    };

    let r = series("ns_pause_then_resume", n, || async move {
        srv.post(&format!("/v1/sandboxes/{id}/pause"), json!({}))
            .await?;
        srv.post(&format!("/v1/sandboxes/{id}/resume"), json!({}))
            .await
            .map(|_| ())
    })
    .await;
    record(r, "ns_pause_then_resume");

    let r = series("ns_hibernate_then_wake", n, || async move {
        srv.post(&format!("/v1/sandboxes/{id}/hibernate"), json!({}))
            .await?;
        srv.post(&format!("/v1/sandboxes/{id}/wake"), json!({}))
            .await
            .map(|_| ())
    })
    .await;
    record(r, "ns_hibernate_then_wake");

    let snaps_cell = std::cell::RefCell::new(Vec::new());
    let snaps = &snaps_cell;
    let r = series("ns_snapshot_1mib_changed", n, || async move {
        let v = srv
            .post(
                &format!("/v1/sandboxes/{id}/snapshots"),
                json!({"name": "bench"}),
            )
            .await?;
        if let Some(s) = v["id"].as_str() {
            snaps.borrow_mut().push(s.to_string());
        }
        Ok(())
    })
    .await;
    record(r, "ns_snapshot_1mib_changed");

    for count in [1usize, 8] {
        let name = format!("ns_disk_fork_{count}");
        let children_cell = std::cell::RefCell::new(Vec::new());
        let children = &children_cell;
        let r = series(&name, n.min(10), || async move {
            let v = srv
                .post(
                    &format!("/v1/sandboxes/{id}/fork"),
                    json!({"count": count, "mode": "disk"}),
                )
                .await?;
            children.borrow_mut().extend(ids_of(&v));
            Ok(())
        })
        .await;
        for c in children_cell.take() {
            let _ = srv.kill(&c).await;
        }
        record(r, &name);
    }

    let r = series("ns_explore_4", n.min(10), || async move {
        let v = srv
            .post(
                &format!("/v1/sandboxes/{id}/explore"),
                json!({"commands": ["exit 1", "exit 1", "true", "exit 1"], "timeout_seconds": 30}),
            )
            .await?;
        if let Some(w) = v["winner"]["sandbox_id"].as_str() {
            srv.kill(w).await?;
        }
        Ok(())
    })
    .await;
    record(r, "ns_explore_4");

    for s in snaps_cell.take() {
        let _ = srv.delete(&format!("/v1/snapshots/{s}")).await;
    }
    srv.kill(id).await?;
    Ok((done, skipped))
}
