//! Metrics and logs of sandboxes, in E2B's shapes.

use std::time::{Duration, Instant};

use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::Json;
use hutch_core::ids::SandboxId;
use hutch_core::logs::LogQuery;
use serde_json::{json, Value};

use super::sandboxes::{form_pairs, sandbox_of};
use crate::error::{E2bError, E2bResult};
use crate::E2bState;

/// How long a CPU sample spans when there is no earlier one to compare with.
const CPU_SAMPLE: Duration = Duration::from_millis(100);

/// What a sandbox uses now: CPU over a short sample, memory from its cgroup, disk from
/// `df` inside it. The control plane's `SandboxMetric` and envd's `/metrics` both show it.
pub struct Sample {
    /// When (ms since the epoch).
    pub time_ms: i64,
    /// Whole CPUs.
    pub cpu_count: u64,
    /// Percent of those CPUs used over the sample.
    pub cpu_used_pct: f64,
    /// Memory used, bytes.
    pub mem_used: u64,
    /// The memory limit, bytes.
    pub mem_total: u64,
    /// Root filesystem used, bytes.
    pub disk_used: u64,
    /// Root filesystem size, bytes.
    pub disk_total: u64,
}

/// Sample sandbox `id` now.
pub async fn sample(state: &E2bState, id: &SandboxId) -> E2bResult<Sample> {
    let manager = &state.app.manager;
    let view = manager.get(id).await?;
    let first = manager.usage(id).await?;
    let t0 = Instant::now();
    tokio::time::sleep(CPU_SAMPLE).await;
    let second = manager.usage(id).await?;
    let elapsed = t0.elapsed().as_nanos().max(1) as f64;
    let cpus = view.cpus.ceil().max(1.0);
    let cpu_pct = match (&first, &second) {
        (Some(a), Some(b)) => {
            (b.cpu_usage_ns.saturating_sub(a.cpu_usage_ns) as f64 / elapsed / cpus * 100.0)
                .clamp(0.0, 100.0)
        }
        _ => 0.0,
    };
    let (mem_used, mem_total) = second.as_ref().map_or((0, view.memory_mib << 20), |u| {
        (u.memory_bytes, u.memory_limit_bytes)
    });
    let (disk_used, disk_total) = disk_usage(state, id)
        .await
        .unwrap_or((0, view.disk_mib << 20));
    Ok(Sample {
        time_ms: hutch_core::time::now_ms(),
        cpu_count: cpus as u64,
        cpu_used_pct: cpu_pct,
        mem_used,
        mem_total,
        disk_used,
        disk_total,
    })
}

/// One `SandboxMetric` of sandbox `id` now.
async fn metric(state: &E2bState, id: &SandboxId) -> E2bResult<Value> {
    let s = sample(state, id).await?;
    Ok(json!({
        "timestamp": hutch_core::time::rfc3339(s.time_ms),
        "timestampUnix": s.time_ms / 1000,
        "cpuCount": s.cpu_count,
        "cpuUsedPct": s.cpu_used_pct,
        "memUsed": s.mem_used,
        "memTotal": s.mem_total,
        "memCache": 0,
        "diskUsed": s.disk_used,
        "diskTotal": s.disk_total,
    }))
}

/// Bytes used and total of the sandbox's root filesystem, from `df` inside it.
async fn disk_usage(state: &E2bState, id: &SandboxId) -> Option<(u64, u64)> {
    let cmd = crate::envd::command(
        hutch_core::exec::Command::Argv(vec!["df".into(), "-kP".into(), "/".into()]),
        Some(Duration::from_secs(5)),
    );
    let out = state.app.manager.exec(id, cmd).await.ok()?;
    let text = String::from_utf8_lossy(&out.stdout.to_vec()).into_owned();
    let row: Vec<&str> = text.lines().nth(1)?.split_whitespace().collect();
    let total: u64 = row.get(1)?.parse().ok()?;
    let used: u64 = row.get(2)?.parse().ok()?;
    Some((used * 1024, total * 1024))
}

/// `GET /sandboxes/{id}/metrics` → `[SandboxMetric]` (one sample: Hutch keeps no history).
pub async fn metrics(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> E2bResult<Json<Vec<Value>>> {
    let (_, id) = sandbox_of(&state, &headers, &id).await?;
    Ok(Json(vec![metric(&state, &id).await?]))
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b` → `{"sandboxes": {id: SandboxMetric}}`.
pub async fn metrics_many(
    State(state): State<E2bState>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> E2bResult<Json<Value>> {
    let ids: Vec<String> = form_pairs(q.as_deref().unwrap_or(""))
        .into_iter()
        .filter(|(k, _)| k == "sandbox_ids")
        .flat_map(|(_, v)| v.split(',').map(str::to_string).collect::<Vec<_>>())
        .filter(|s| !s.is_empty())
        .collect();
    if ids.len() > 100 {
        return Err(E2bError::bad_request("at most 100 sandbox_ids"));
    }
    let mut out = serde_json::Map::new();
    for id in ids {
        let (_, sid) = sandbox_of(&state, &headers, &id).await?;
        out.insert(id, metric(&state, &sid).await?);
    }
    Ok(Json(json!({ "sandboxes": out })))
}

/// The sandbox's log lines (agent, console, start command), oldest first.
async fn lines(
    state: &E2bState,
    headers: &HeaderMap,
    id: &str,
    q: Option<&str>,
) -> E2bResult<Vec<(i64, String)>> {
    let (_, id) = sandbox_of(state, headers, id).await?;
    let mut query = LogQuery::default();
    let mut limit = 1000usize;
    let mut backward = false;
    let mut search = None;
    for (k, v) in form_pairs(q.unwrap_or("")) {
        match k.as_str() {
            "start" | "cursor" => query.since_ms = v.parse().ok(),
            "limit" => limit = v.parse::<usize>().unwrap_or(1000).clamp(1, 1000),
            "direction" => backward = v == "backward",
            "search" => search = Some(v),
            _ => {}
        }
    }
    let mut out: Vec<(i64, String)> = state
        .app
        .manager
        .logs(&id, query)
        .await?
        .into_iter()
        .filter(|l| search.as_deref().is_none_or(|s| l.text.contains(s)))
        .map(|l| (l.time_ms.unwrap_or(0), l.text))
        .collect();
    if backward {
        out.reverse();
    }
    out.truncate(limit);
    Ok(out)
}

/// `GET /sandboxes/{id}/logs` → `{logs: [{timestamp, line}], logEntries: [...]}`.
pub async fn logs_v1(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> E2bResult<Json<Value>> {
    let lines = lines(&state, &headers, &id, q.as_deref()).await?;
    let logs: Vec<Value> = lines
        .iter()
        .map(|(t, l)| json!({"timestamp": hutch_core::time::rfc3339(*t), "line": l}))
        .collect();
    let entries: Vec<Value> = lines.iter().map(|(t, l)| entry(*t, l)).collect();
    Ok(Json(json!({"logs": logs, "logEntries": entries})))
}

/// `GET /v2/sandboxes/{id}/logs` → `{logs: [SandboxLogEntry]}`.
pub async fn logs_v2(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> E2bResult<Json<Value>> {
    let lines = lines(&state, &headers, &id, q.as_deref()).await?;
    let entries: Vec<Value> = lines.iter().map(|(t, l)| entry(*t, l)).collect();
    Ok(Json(json!({"logs": entries})))
}

fn entry(t: i64, line: &str) -> Value {
    json!({"timestamp": hutch_core::time::rfc3339(t), "level": "info", "message": line, "fields": {}})
}
