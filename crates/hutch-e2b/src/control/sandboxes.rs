//! Sandboxes: create, list, get, kill, pause/resume/connect, timeouts, fork, snapshots.

use std::collections::BTreeMap;

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hutch_core::fork::{ForkCommand, ForkMode};
use hutch_core::ids::{SandboxId, SnapshotId};
use hutch_core::model::{
    CreateSandbox, Isolation, IsolationRequest, ListFilter, SandboxState, UpdateSandbox, TENANT_KEY,
};
use hutch_core::store::{Cursor, PageRequest};
use hutch_core::CoreError;
use hutch_server::Caller;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::model::{NewSandbox, Sandbox, SandboxInfo, ADAPTER_PREFIX, TEMPLATE_KEY};
use super::network::policy_of;
use crate::error::{E2bError, E2bResult};
use crate::target::PRIVATE_TRAFFIC_KEY;
use crate::E2bState;

/// E2B's default sandbox timeout, seconds (what the SDKs document when they send none).
const DEFAULT_TIMEOUT: u64 = 300;
/// E2B's template names that are Hutch templates by another name.
const TEMPLATE_ALIASES: [(&str, &str); 2] = [
    ("code-interpreter-v1", "code-interpreter"),
    ("code-interpreter-beta", "code-interpreter"),
];

/// A JSON body (an empty one is `T::default()`), refused in E2B's error format.
pub fn body_json<T: DeserializeOwned + Default>(body: &[u8]) -> E2bResult<T> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| E2bError::bad_request(format!("invalid request body: {e}")))
}

/// Authenticate the caller and find sandbox `id` in its scope (404 otherwise, which the
/// SDKs turn into `NotFoundException`/`False`).
pub async fn sandbox_of(
    state: &E2bState,
    headers: &HeaderMap,
    id: &str,
) -> E2bResult<(Caller, SandboxId)> {
    let caller = state.caller(headers).await?;
    let missing = || E2bError::not_found(format!("sandbox {id} not found"));
    let sid: SandboxId = id.parse().map_err(|_| missing())?;
    match state.app.manager.authorize(&sid, &caller.scope()).await {
        // Outside the key's selector is as unknown as another tenant's.
        Ok(r) if caller.selects(&r.metadata) => Ok((caller, sid)),
        Ok(_) | Err(CoreError::NotFound(_)) => Err(missing()),
        Err(e) => Err(e.into()),
    }
}

/// `POST /sandboxes` and `POST /v2/sandboxes` → 201 `Sandbox`.
pub async fn create(
    State(state): State<E2bState>,
    headers: HeaderMap,
    placed: Option<axum::Extension<hutch_server::PlacedSandboxId>>,
    body: axum::body::Bytes,
) -> E2bResult<Response> {
    let caller = state.caller(&headers).await?;
    let req: NewSandbox = body_json(&body)?;
    if let Some(key) = req.other.iter().find(|(_, v)| !v.is_null()).map(|(k, _)| k) {
        return Err(E2bError::bad_request(format!(
            "{key} is not supported by Hutch's E2B API (see docs/e2b.md)"
        )));
    }
    if req.auto_pause == Some(true) {
        return Err(E2bError::bad_request(
            "autoPause is not supported: Hutch kills a sandbox at its timeout; pause it \
             yourself (Sandbox.pause) before then",
        ));
    }
    let asked = req
        .template_id
        .clone()
        .unwrap_or_else(|| "base".to_string());
    let mut metadata = req.metadata.clone().unwrap_or_default();
    if metadata
        .keys()
        .any(|k| k.starts_with(ADAPTER_PREFIX) || k == TENANT_KEY)
    {
        return Err(E2bError::bad_request(format!(
            "metadata keys starting with {ADAPTER_PREFIX:?} and {TENANT_KEY:?} are reserved"
        )));
    }
    let (template, snapshot) = resolve_template(&state, &caller, &asked).await?;
    if template.as_deref() != Some(asked.as_str()) {
        metadata.insert(TEMPLATE_KEY.to_string(), asked.clone());
    }
    if req.network.as_ref().and_then(|n| n.allow_public_traffic) == Some(false) {
        metadata.insert(PRIVATE_TRAFFIC_KEY.to_string(), "true".to_string());
    }
    let network = super::network::for_server(
        &state,
        policy_of(req.allow_internet_access, req.network.as_ref())?,
    );
    let volumes = req
        .volume_mounts
        .unwrap_or_default()
        .into_iter()
        .map(|v| {
            serde_json::from_value::<hutch_core::volume::VolumeMount>(
                serde_json::json!({"volume": v.name, "path": v.path}),
            )
            .map_err(|e| E2bError::bad_request(format!("volumeMounts: {e}")))
        })
        .collect::<E2bResult<Vec<_>>>()?;
    // A key limited by a selector makes only sandboxes it selects.
    for (k, v) in &caller.key.selector {
        metadata.insert(k.clone(), v.clone());
    }
    let cmd = CreateSandbox {
        template,
        isolation: IsolationRequest::default(),
        ttl_seconds: Some(req.timeout.unwrap_or(DEFAULT_TIMEOUT).max(1)),
        persistent: false,
        tenant: caller.owner(),
        metadata,
        env: req.env_vars.unwrap_or_default(),
        cpus: None,
        memory_mib: None,
        disk_mib: None,
        pids_max: None,
        network,
        snapshot,
        idle_hibernate_seconds: None,
        volumes,
        created_by: Some(caller.key.id.clone()),
        max_cost_micros: None,
        // In a cluster, the id placement chose (and reserved under).
        id: placed.map(|axum::Extension(p)| p.0),
    };
    let view = state.app.manager.create(cmd).await?;
    Ok((StatusCode::CREATED, Json(Sandbox::of(&state, &view))).into_response())
}

/// The Hutch template name E2B's `templateID` `asked` stands for (an alias resolved, a
/// `:tag` dropped): what a cluster places a create by.
pub fn template_name(asked: &str) -> &str {
    let name = asked.split_once(':').map_or(asked, |(n, _)| n);
    TEMPLATE_ALIASES
        .iter()
        .find(|(alias, _)| *alias == name)
        .map_or(name, |(_, hutch)| hutch)
}

/// What E2B's `templateID` names: a Hutch template (possibly by an E2B alias, with a
/// `:tag` that Hutch ignores), or a snapshot (E2B's snapshots are templates).
async fn resolve_template(
    state: &E2bState,
    caller: &Caller,
    asked: &str,
) -> E2bResult<(Option<String>, Option<String>)> {
    let name = template_name(asked);
    if state.app.manager.templates().get(name).is_some() {
        return Ok((Some(name.to_string()), None));
    }
    match state
        .app
        .manager
        .resolve_snapshot(asked, &caller.scope())
        .await
    {
        Ok(snap) => Ok((None, Some(snap))),
        Err(CoreError::NotFound(_)) => Err(E2bError::not_found(format!(
            "template {asked:?} not found: neither a Hutch template nor a snapshot"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// `?metadata=&state=&limit=&nextToken=` of the listings.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
}

/// `GET /sandboxes` (running ones, unpaginated, as E2B's deprecated listing).
pub async fn list_v1(
    State(state): State<E2bState>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> E2bResult<Response> {
    let mut query = parse_list_query(q.as_deref())?;
    query.state.get_or_insert_with(|| "running".to_string());
    query.limit = None;
    list(&state, &headers, query).await
}

/// `GET /v2/sandboxes` → `[ListedSandbox]`, the next page's token in `X-Next-Token`.
pub async fn list_v2(
    State(state): State<E2bState>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> E2bResult<Response> {
    let mut query = parse_list_query(q.as_deref())?;
    query.limit.get_or_insert(100);
    list(&state, &headers, query).await
}

fn parse_list_query(q: Option<&str>) -> E2bResult<ListQuery> {
    let mut out = ListQuery::default();
    for (k, v) in form_pairs(q.unwrap_or("")) {
        match k.as_str() {
            "metadata" => out.metadata = Some(v),
            "state" => out.state = Some(v),
            "limit" => {
                out.limit = Some(v.parse().map_err(|_| {
                    E2bError::bad_request(format!("limit must be a number, got {v:?}"))
                })?)
            }
            "nextToken" => out.next_token = Some(v),
            // Accepted and not needed: Hutch lists oldest first.
            "order" | "startedAfter" | "template" => {}
            other => {
                return Err(E2bError::bad_request(format!(
                    "unknown query parameter {other:?}"
                )))
            }
        }
    }
    Ok(out)
}

/// `a=b&c=d`, percent-decoded, `+` as a space (Hutch's own query decoding).
pub use hutch_server::url_pairs as form_pairs;

async fn list(state: &E2bState, headers: &HeaderMap, q: ListQuery) -> E2bResult<Response> {
    let caller = state.caller(headers).await?;
    let mut filter = ListFilter::default();
    if let Some(m) = &q.metadata {
        for (k, v) in form_pairs(m) {
            filter.metadata.insert(k, v);
        }
    }
    let mut wanted: Vec<&str> = q
        .state
        .as_deref()
        .unwrap_or("running,paused")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    wanted.sort_unstable();
    wanted.dedup();
    for s in &wanted {
        if !["running", "paused"].contains(s) {
            return Err(E2bError::bad_request(format!(
                "unknown state {s:?}; expected running or paused"
            )));
        }
    }
    if wanted == ["running"] {
        filter.state = Some(SandboxState::Running);
    }
    let page = PageRequest::new(q.limit, q.next_token.map(Cursor::from_client))?;
    let found = state
        .app
        .manager
        .list(&filter, &caller.scope(), &page)
        .await?;
    let rows: Vec<SandboxInfo> = found
        .items
        .iter()
        .filter(|v| {
            let s = super::model::state_of(v.state);
            wanted.contains(&s)
                && matches!(
                    v.state,
                    SandboxState::Running | SandboxState::Paused | SandboxState::Hibernated
                )
        })
        .map(|v| SandboxInfo::of(state, v, false))
        .collect();
    Ok(paged(rows, found.next))
}

/// `GET /sandboxes/{id}` → `SandboxDetail`.
pub async fn get(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> E2bResult<Json<SandboxInfo>> {
    let (_, id) = sandbox_of(&state, &headers, &id).await?;
    let view = state.app.manager.get(&id).await?;
    if !matches!(
        view.state,
        SandboxState::Running
            | SandboxState::Paused
            | SandboxState::Hibernated
            | SandboxState::Starting
    ) {
        return Err(E2bError::not_found(format!(
            "sandbox {id} not found (it is {})",
            view.state.as_str()
        )));
    }
    Ok(Json(SandboxInfo::of(&state, &view, true)))
}

/// `DELETE /sandboxes/{id}` → 204.
pub async fn kill(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let (_, id) = sandbox_of(&state, &headers, &id).await?;
    state.app.manager.kill(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/pause` → 204 (Hutch hibernates it: memory and processes on `vm`,
/// files on `ns`); 409 when it is already paused.
pub async fn pause(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let (_, id) = sandbox_of(&state, &headers, &id).await?;
    let view = state.app.manager.get(&id).await?;
    if matches!(view.state, SandboxState::Hibernated | SandboxState::Paused) {
        return Err(E2bError::conflict(format!(
            "sandbox {id} is already paused"
        )));
    }
    state.app.manager.hibernate(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `{timeout}` of connect and resume.
#[derive(Debug, Default, Deserialize)]
struct ConnectBody {
    timeout: Option<u64>,
}

/// `POST /sandboxes/{id}/resume` (deprecated) → 201 `Sandbox`; 409 when it is running.
pub async fn resume(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> E2bResult<Response> {
    let (_, id) = sandbox_of(&state, &headers, &id).await?;
    let req: ConnectBody = body_json(&body)?;
    let view = state.app.manager.get(&id).await?;
    if !matches!(view.state, SandboxState::Hibernated | SandboxState::Paused) {
        return Err(E2bError::conflict(format!("sandbox {id} is not paused")));
    }
    let view = wake(&state, &id, view.state).await?;
    let view = extend(&state, &id, view, req.timeout).await?;
    Ok((StatusCode::CREATED, Json(Sandbox::of(&state, &view))).into_response())
}

/// `POST /sandboxes/{id}/connect` and `/v2/…` → 200 (it was running) or 201 (resumed):
/// the timeout is only ever extended.
pub async fn connect(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> E2bResult<Response> {
    let (_, id) = sandbox_of(&state, &headers, &id).await?;
    let req: ConnectBody = body_json(&body)?;
    let view = state.app.manager.get(&id).await?;
    let (status, view) = match view.state {
        SandboxState::Hibernated | SandboxState::Paused => {
            (StatusCode::CREATED, wake(&state, &id, view.state).await?)
        }
        SandboxState::Running | SandboxState::Starting => (StatusCode::OK, view),
        other => {
            return Err(E2bError::not_found(format!(
                "sandbox {id} not found (it is {})",
                other.as_str()
            )))
        }
    };
    let view = extend(&state, &id, view, req.timeout).await?;
    Ok((status, Json(Sandbox::of(&state, &view))).into_response())
}

async fn wake(
    state: &E2bState,
    id: &SandboxId,
    from: SandboxState,
) -> E2bResult<hutch_core::model::SandboxView> {
    Ok(if from == SandboxState::Paused {
        state.app.manager.resume(id).await?
    } else {
        state.app.manager.wake(id).await?.sandbox
    })
}

/// Raise the TTL to `timeout` seconds if that is longer than it is.
async fn extend(
    state: &E2bState,
    id: &SandboxId,
    view: hutch_core::model::SandboxView,
    timeout: Option<u64>,
) -> E2bResult<hutch_core::model::SandboxView> {
    match timeout {
        Some(t) if t > view.ttl_seconds && !view.persistent => set_ttl(state, id, t).await,
        _ => Ok(view),
    }
}

/// A listing's answer: its rows, and the next page's token in `X-Next-Token`.
fn paged<T: serde::Serialize>(rows: Vec<T>, next: Option<Cursor>) -> Response {
    let mut response = Json(rows).into_response();
    if let Some(v) = next.and_then(|n| HeaderValue::from_str(n.as_str()).ok()) {
        response.headers_mut().insert("x-next-token", v);
    }
    response
}

/// Set sandbox `id`'s TTL to `seconds` from now.
async fn set_ttl(
    state: &E2bState,
    id: &SandboxId,
    seconds: u64,
) -> E2bResult<hutch_core::model::SandboxView> {
    let update = UpdateSandbox {
        ttl_seconds: Some(seconds),
        ..Default::default()
    };
    Ok(state.app.manager.update(id, update).await?)
}

/// `{timeout}` / `{duration}`.
#[derive(Debug, Default, Deserialize)]
struct TimeoutBody {
    timeout: Option<u64>,
    duration: Option<u64>,
}

/// `POST /sandboxes/{id}/timeout {timeout}` → 204: it now ends `timeout` seconds from now
/// (shorter or longer than before).
pub async fn set_timeout(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> E2bResult<StatusCode> {
    let (_, id) = sandbox_of(&state, &headers, &id).await?;
    let req: TimeoutBody = body_json(&body)?;
    let timeout = req
        .timeout
        .ok_or_else(|| E2bError::bad_request("timeout (seconds) is required"))?;
    set_ttl(&state, &id, timeout.max(1)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/refreshes {duration}` → 204: alive at least `duration` more seconds.
pub async fn refresh(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> E2bResult<StatusCode> {
    let (_, id) = sandbox_of(&state, &headers, &id).await?;
    let req: TimeoutBody = body_json(&body)?;
    if req.duration.is_some_and(|d| d > 3600) {
        return Err(E2bError::bad_request(
            "duration must be at most 3600 seconds",
        ));
    }
    let view = state.app.manager.get(&id).await?;
    extend(&state, &id, view, req.duration).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `{timeout, count}` of a fork.
#[derive(Debug, Default, Deserialize)]
struct ForkBody {
    timeout: Option<u64>,
    count: Option<u32>,
}

/// `POST /sandboxes/{id}/fork` → 201 `[{sandbox}]`: live children on `vm` (memory and
/// processes), children with the parent's files on `ns`.
pub async fn fork(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> E2bResult<Response> {
    let (_, id) = sandbox_of(&state, &headers, &id).await?;
    let req: ForkBody = body_json(&body)?;
    let parent = state.app.manager.get(&id).await?;
    let mode = if parent.isolation == Isolation::Vm {
        ForkMode::Live
    } else {
        ForkMode::Disk
    };
    let cmd = ForkCommand::new(req.count.unwrap_or(1), mode)?;
    let children = state.app.manager.fork(&id, cmd).await?;
    let mut out = Vec::with_capacity(children.len());
    for child in children {
        let child = match req.timeout {
            Some(t) => set_ttl(&state, &child.id, t.max(1)).await?,
            None => child,
        };
        out.push(serde_json::json!({"sandbox": Sandbox::of(&state, &child)}));
    }
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

/// `{name}` of a snapshot.
#[derive(Debug, Default, Deserialize)]
struct SnapshotBody {
    name: Option<String>,
}

/// `POST /sandboxes/{id}/snapshots` → 201 `{snapshotID, names}`.
pub async fn snapshot(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> E2bResult<Response> {
    let (_, id) = sandbox_of(&state, &headers, &id).await?;
    let req: SnapshotBody = body_json(&body)?;
    let snap = state.app.manager.snapshot(&id, req.name.as_deref()).await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({"snapshotID": snap.id, "names": [snap.name]})),
    )
        .into_response())
}

/// `GET /snapshots?sandboxID=&name=&limit=&nextToken=` → `[SnapshotInfo]`.
pub async fn list_snapshots(
    State(state): State<E2bState>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> E2bResult<Response> {
    let caller = state.caller(&headers).await?;
    let mut filter: BTreeMap<String, String> = BTreeMap::new();
    let (mut limit, mut next) = (None, None);
    for (k, v) in form_pairs(q.as_deref().unwrap_or("")) {
        match k.as_str() {
            "limit" => {
                limit = Some(
                    v.parse::<usize>()
                        .map_err(|_| E2bError::bad_request("limit must be a number"))?,
                )
            }
            "nextToken" => next = Some(Cursor::from_client(v)),
            "sandboxID" | "name" => {
                filter.insert(k, v);
            }
            other => {
                return Err(E2bError::bad_request(format!(
                    "unknown query parameter {other:?}"
                )))
            }
        }
    }
    let page = PageRequest::new(limit.or(Some(100)), next)?;
    let found = state
        .app
        .manager
        .list_snapshots(&caller.scope(), &page)
        .await?;
    let rows: Vec<serde_json::Value> = found
        .items
        .iter()
        .filter(|s| {
            filter
                .get("sandboxID")
                .is_none_or(|want| *want == s.sandbox_id)
        })
        .filter(|s| filter.get("name").is_none_or(|want| *want == s.name))
        .map(|s| serde_json::json!({"snapshotID": s.id, "names": [s.name]}))
        .collect();
    Ok(paged(rows, found.next))
}

/// `DELETE /templates/{id}` → 204: a snapshot (E2B's `Sandbox.delete_snapshot`) or a
/// template (admin keys only: templates are shared by every tenant).
pub async fn delete_template(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let caller = state.caller(&headers).await?;
    if let Ok(snap) = id.parse::<SnapshotId>() {
        state
            .app
            .manager
            .delete_snapshot(&snap, &caller.scope())
            .await?;
        return Ok(StatusCode::NO_CONTENT);
    }
    if !caller.admin {
        return Err(E2bError::status(
            StatusCode::FORBIDDEN,
            "deleting a template needs an admin key",
        ));
    }
    state.app.manager.delete_template(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_pairs_decode_percent_and_plus() {
        assert_eq!(
            form_pairs("metadata=user%3Dabc%26app%3Dprod&state=running,paused&x=a+b"),
            vec![
                ("metadata".into(), "user=abc&app=prod".into()),
                ("state".into(), "running,paused".into()),
                ("x".into(), "a b".into()),
            ]
        );
        assert_eq!(form_pairs("a=%zz%4"), vec![("a".into(), "%zz%4".into())]);
    }
}
