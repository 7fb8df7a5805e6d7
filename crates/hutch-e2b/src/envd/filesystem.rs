//! `filesystem.Filesystem`: stat, list, make directories, move and remove, through Hutch's
//! agent (paths resolve inside the sandbox's own root). Watching directories is not served
//! yet (`unimplemented`).

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use hutch_core::ids::SandboxId;
use hutch_core::manager::WatchOptions;
use serde_json::{json, Value};

use super::proto::{self, entry_info};
use super::{absolute, EnvdUser};
use crate::connect::{self, Code, ConnectError};
use crate::target::SandboxTarget;
use crate::E2bState;

/// `POST /filesystem.Filesystem/{method}`.
pub async fn rpc(
    State(state): State<E2bState>,
    Extension(t): Extension<SandboxTarget>,
    Path(method): Path<String>,
    EnvdUser(user): EnvdUser,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if connect::is_streaming(&headers) {
        if method != "WatchDir" {
            return connect::stream_error(ConnectError::new(
                Code::Unimplemented,
                format!("filesystem.Filesystem/{method} is not a streaming method"),
            ));
        }
        return match connect::first_message::<proto::WatchRequest>(body).await {
            Ok(req) => watch_dir(state, t.id, user, &headers, req).await,
            Err(e) => connect::stream_error(e),
        };
    }
    let result = async {
        let body = axum::body::to_bytes(body, connect::MAX_MESSAGE)
            .await
            .map_err(|e| ConnectError::new(Code::InvalidArgument, e.to_string()))?;
        unary(&state, &t.id, user.as_deref(), &method, &body).await
    }
    .await;
    match result {
        Ok(v) => connect::unary_ok(&v),
        Err(e) => e.into_response(),
    }
}

fn path_of(p: &str, user: Option<&str>) -> Result<String, ConnectError> {
    absolute(p, user).map_err(ConnectError::from)
}

async fn unary(
    state: &E2bState,
    id: &SandboxId,
    user: Option<&str>,
    method: &str,
    body: &[u8],
) -> Result<Value, ConnectError> {
    let manager = &state.app.manager;
    let agent = manager.agent(id).await?;
    match method {
        "Stat" => {
            let req: proto::PathRequest = connect::decode_unary(body)?;
            let path = path_of(&req.path, user)?;
            let e = manager.agent_call(id, agent.stat(&path).await).await?;
            Ok(json!({ "entry": entry_info(&e) }))
        }
        "ListDir" => {
            let req: proto::ListDirRequest = connect::decode_unary(body)?;
            let path = path_of(&req.path, user)?;
            let depth = req.depth.filter(|d| *d > 0).unwrap_or(1);
            let stat = manager.agent_call(id, agent.stat(&path).await).await?;
            if stat.file_type != hutch_proto::FileType::Dir {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    format!("path {path} is not a directory"),
                ));
            }
            let list = manager
                .agent_call(id, agent.list(&path, Some(depth)).await)
                .await?;
            let entries: Vec<Value> = list.entries.iter().map(entry_info).collect();
            Ok(json!({ "entries": entries }))
        }
        "MakeDir" => {
            let req: proto::PathRequest = connect::decode_unary(body)?;
            let path = path_of(&req.path, user)?;
            match agent.stat(&path).await {
                Ok(_) => {
                    return Err(ConnectError::new(
                        Code::AlreadyExists,
                        format!("directory {path} already exists"),
                    ))
                }
                Err(e) => {
                    let e = crate::error::E2bError::from(manager.agent_error(id, e).await);
                    if e.http_status() != axum::http::StatusCode::NOT_FOUND {
                        return Err(e.into());
                    }
                }
            }
            manager.agent_call(id, agent.mkdir(&path).await).await?;
            let e = manager.agent_call(id, agent.stat(&path).await).await?;
            Ok(json!({ "entry": entry_info(&e) }))
        }
        "Move" => {
            let req: proto::MoveRequest = connect::decode_unary(body)?;
            let (from, to) = (
                path_of(&req.source, user)?,
                path_of(&req.destination, user)?,
            );
            manager
                .agent_call(id, agent.rename(&from, &to).await)
                .await?;
            let e = manager.agent_call(id, agent.stat(&to).await).await?;
            Ok(json!({ "entry": entry_info(&e) }))
        }
        "Remove" => {
            let req: proto::PathRequest = connect::decode_unary(body)?;
            let path = path_of(&req.path, user)?;
            manager
                .agent_call(id, agent.remove(&path, true).await)
                .await?;
            Ok(json!({}))
        }
        "CreateWatcher" => {
            let req: proto::WatchRequest = connect::decode_unary(body)?;
            let path = watch_path(&req, user)?;
            let w = manager
                .create_watcher(id, &path, options(&req))
                .await
                .map_err(watch_error)?;
            Ok(json!({ "watcherId": w.id }))
        }
        "GetWatcherEvents" => {
            let req: proto::WatcherRequest = connect::decode_unary(body)?;
            let got = manager.watcher_events(id, &req.watcher_id)?;
            let events: Vec<Value> = got
                .events
                .iter()
                .flat_map(proto::filesystem_events)
                .collect();
            Ok(json!({ "events": events }))
        }
        "RemoveWatcher" => {
            let req: proto::WatcherRequest = connect::decode_unary(body)?;
            manager.remove_watcher(id, &req.watcher_id)?;
            Ok(json!({}))
        }
        other => Err(ConnectError::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem has no method {other}"),
        )),
    }
}

fn options(req: &proto::WatchRequest) -> WatchOptions {
    WatchOptions {
        recursive: req.recursive,
        include_entry: req.include_entry,
    }
}

fn watch_path(req: &proto::WatchRequest, user: Option<&str>) -> Result<String, ConnectError> {
    if req.allow_network_mounts {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "watching through network mounts is not supported: inotify sees only the \
             sandbox's own files",
        ));
    }
    path_of(&req.path, user)
}

/// A watch refused: a path that is not a directory is `invalid_argument`, as envd says.
fn watch_error(e: hutch_core::CoreError) -> ConnectError {
    ConnectError::from(e)
}

/// `WatchDir`: `start` once the watch is armed, then an event per change, keepalives while
/// nothing happens, until the client goes or the directory does.
async fn watch_dir(
    state: E2bState,
    id: SandboxId,
    user: Option<String>,
    headers: &HeaderMap,
    req: proto::WatchRequest,
) -> Response {
    let path = match watch_path(&req, user.as_deref()) {
        Ok(p) => p,
        Err(e) => return connect::stream_error(e),
    };
    let mut watch = match state
        .app
        .manager
        .watch_files(&id, &path, options(&req))
        .await
    {
        Ok(w) => w,
        Err(e) => return connect::stream_error(watch_error(e)),
    };
    let interval = super::process::keepalive_interval(headers);
    let events =
        crate::task_stream::<Result<Value, ConnectError>, _, _>(16, move |tx| async move {
            if tx.send(Ok(json!({"start": {}}))).await.is_err() {
                return;
            }
            let mut tick = tokio::time::interval(interval);
            tick.tick().await;
            loop {
                let item = tokio::select! {
                    item = futures_util::StreamExt::next(&mut watch) => item,
                    _ = tick.tick() => {
                        if tx.send(Ok(json!({"keepalive": {}}))).await.is_err() { return; }
                        continue;
                    }
                };
                match item {
                    Some(Ok(hutch_proto::WatchMessage::Event(e))) => {
                        for ev in proto::filesystem_events(&e) {
                            if tx.send(Ok(json!({ "filesystem": ev }))).await.is_err() {
                                return;
                            }
                        }
                    }
                    Some(Ok(hutch_proto::WatchMessage::End(_))) | None => return,
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                }
            }
        });
    connect::stream_response(events)
}
