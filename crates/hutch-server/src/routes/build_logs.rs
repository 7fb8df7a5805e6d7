//! `GET /v1/templates/{name}/builds/{id}/logs`: a build's log as text, JSON or SSE, once
//! or followed until the build ends.
//!
//! Text (the default) is one line per log line. `Accept: application/json` answers
//! `{"lines": [...]}` (not with `follow`). `Accept: text/event-stream` sends one `log`
//! event per line (data: the line as JSON, `id:` its `seq`) and, once the build has ended,
//! an `end` event `{"status", "error"?}`. With `?follow=true` the answer stays open until
//! the build ends; a follower too slow for the log skips the lines it missed (the log is
//! bounded in memory) and goes on.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::{stream, Stream, StreamExt};
use hutch_build::{BuildLogLine, BuildStatus, LogFollow};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::{broadcast, watch};

use super::logs::{format_of, Format};
use super::templates::visible_build;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiQuery, Caller};
use crate::AppState;

/// The query string.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildLogsParams {
    /// Keep the answer open until the build ends.
    #[serde(default)]
    follow: bool,
}

/// What a followed log yields.
#[derive(Debug)]
enum Item {
    Line(BuildLogLine),
    /// The build ended with this status.
    End(BuildStatus),
}

/// The lines after the backlog until the build ends, then its status: lines written before
/// the end are all delivered (they are sent before the status changes).
fn live(
    lines: broadcast::Receiver<BuildLogLine>,
    done: watch::Receiver<BuildStatus>,
) -> impl Stream<Item = Item> + Send {
    stream::unfold(Some((lines, done)), |st| async move {
        let (mut lines, mut done) = st?;
        loop {
            let status = *done.borrow();
            if status.is_done() {
                // Everything written before the end is in the channel by now.
                return match lines.try_recv() {
                    Ok(line) => Some((Item::Line(line), Some((lines, done)))),
                    Err(TryRecvError::Lagged(_)) => continue,
                    Err(TryRecvError::Empty | TryRecvError::Closed) => {
                        Some((Item::End(status), None))
                    }
                };
            }
            tokio::select! {
                line = lines.recv() => match line {
                    Ok(line) => return Some((Item::Line(line), Some((lines, done)))),
                    Err(RecvError::Lagged(missed)) => {
                        tracing::debug!(missed, "a build log follower fell behind");
                    }
                    // The build was forgotten: it ended long ago.
                    Err(RecvError::Closed) => {
                        let status = *done.borrow();
                        return Some((Item::End(status), None));
                    }
                },
                changed = done.changed() => {
                    if changed.is_err() && !done.borrow().is_done() {
                        // The build is gone without a status: say what it was.
                        let status = *done.borrow();
                        return Some((Item::End(status), None));
                    }
                }
            }
        }
    })
}

fn line_json(line: &BuildLogLine) -> serde_json::Value {
    serde_json::to_value(line).unwrap_or_default()
}

fn sse_line(line: &BuildLogLine) -> Event {
    Event::default()
        .event("log")
        .id(line.seq.to_string())
        .data(line_json(line).to_string())
}

fn end_event(status: BuildStatus, error: Option<String>) -> Event {
    let mut data = serde_json::json!({ "status": status });
    if let Some(e) = error {
        data["error"] = e.into();
    }
    Event::default().event("end").data(data.to_string())
}

/// `GET /v1/templates/{name}/builds/{id}/logs`.
pub async fn logs(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((name, id)): Path<(String, String)>,
    ApiQuery(params): ApiQuery<BuildLogsParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let view = visible_build(&state, &caller, &name, &id)?;
    let format = format_of(&headers);
    if params.follow && format == Format::Json {
        return Err(ApiError::bad_request(
            "follow=true streams text or SSE (Accept: text/event-stream), not JSON",
        ));
    }
    let LogFollow {
        backlog,
        lines,
        done,
    } = state.builder.follow(&name, &id)?;
    // The end event carries the build's error; read it when the build has ended.
    let builder = state.builder.clone();
    let (template, build_id) = (name.clone(), id.clone());
    let error_of = move || builder.get(&template, &build_id).ok().and_then(|v| v.error);
    if !params.follow {
        let ended = view.status.is_done().then_some(view.status);
        return Ok(match format {
            Format::Json => {
                let lines: Vec<_> = backlog.iter().map(line_json).collect();
                Json(serde_json::json!({ "lines": lines })).into_response()
            }
            Format::Text => text_answer(backlog.iter().map(text_line).collect::<String>().into()),
            Format::EventStream => {
                let mut events: Vec<Result<Event, Infallible>> =
                    backlog.iter().map(|l| Ok(sse_line(l))).collect();
                if let Some(status) = ended {
                    events.push(Ok(end_event(status, view.error.clone())));
                }
                Sse::new(stream::iter(events)).into_response()
            }
        });
    }
    let live = live(lines, done);
    Ok(match format {
        Format::EventStream => {
            let first = stream::iter(backlog.into_iter().map(|l| Ok(sse_line(&l))));
            let rest = live.map(move |item| {
                Ok::<_, Infallible>(match item {
                    Item::Line(line) => sse_line(&line),
                    Item::End(status) => end_event(status, error_of()),
                })
            });
            Sse::new(first.chain(rest))
                .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
                .into_response()
        }
        // (JSON was refused above.)
        Format::Text | Format::Json => {
            let first: String = backlog.iter().map(text_line).collect();
            let rest = live.filter_map(|item| async move {
                match item {
                    Item::Line(line) => {
                        Some(Ok::<_, Infallible>(bytes::Bytes::from(text_line(&line))))
                    }
                    Item::End(_) => None,
                }
            });
            let body = stream::once(async move { Ok(bytes::Bytes::from(first)) }).chain(rest);
            text_answer(Body::from_stream(body))
        }
    })
}

fn text_line(line: &BuildLogLine) -> String {
    format!("{}\n", line.text)
}

fn text_answer(body: Body) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
}
