//! `GET /v1/sandboxes/{id}/logs`: a sandbox's logs as text, JSON or SSE, once or followed.
//!
//! `?source=agent,console,start` picks logs (default: every log the sandbox's backend keeps;
//! `start` is the template's start command),
//! `?tail=N` the last lines, `?since=` lines from a time on (RFC 3339, Unix seconds or a
//! duration before now such as `10m`; only for logs whose lines carry times),
//! `?timestamps=true` prefixes each text line with its time, `?follow=true` keeps the answer
//! open and sends lines as they are written until the sandbox is gone. The answer is text
//! (one line per line), JSON (`Accept: application/json`: `{"lines": [...]}`, not with
//! `follow`) or SSE (`Accept: text/event-stream`: one `log` event per line, an `end` event
//! when the sandbox is gone). See `docs/logs.md`.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::{stream, Stream, StreamExt};
use hutch_core::logs::{parse_since, LogLine, LogQuery, LogSource};
use hutch_core::LogFollow;

use crate::auth::AuthorizedSandbox;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiQuery;
use crate::AppState;

/// The query string of `GET /v1/sandboxes/{id}/logs`.
#[derive(Debug, serde::Deserialize)]
pub struct LogsParams {
    /// Comma-separated log names (`agent`, `console`).
    source: Option<String>,
    /// Only the last N lines (of what was written before, when following).
    tail: Option<usize>,
    /// Only lines written at or after this time.
    since: Option<String>,
    /// Keep the answer open and send new lines.
    #[serde(default)]
    follow: bool,
    /// Prefix text lines with their time.
    #[serde(default)]
    timestamps: bool,
}

/// How a log answer is written (sandbox logs here, build logs in `build_logs.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// One line per line.
    Text,
    /// `{"lines": [...]}`.
    Json,
    /// Server-sent events.
    EventStream,
}

/// The format `Accept` asks for: SSE, JSON, else text.
pub(crate) fn format_of(headers: &HeaderMap) -> Format {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if accept.contains("text/event-stream") {
        Format::EventStream
    } else if accept.contains("application/json") {
        Format::Json
    } else {
        Format::Text
    }
}

fn query_of(p: &LogsParams) -> ApiResult<LogQuery> {
    let sources = match &p.source {
        None => None,
        Some(list) => Some(
            list.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| {
                    LogSource::parse(s).ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "unknown log source {s:?}: the sources are agent, console and start"
                        ))
                    })
                })
                .collect::<ApiResult<Vec<_>>>()?,
        ),
    };
    let since_ms = match &p.since {
        None => None,
        Some(text) => Some(parse_since(text, hutch_core::time::now_ms()).ok_or_else(|| {
            ApiError::bad_request(format!(
                "since {text:?} is not a time: give RFC 3339 (2026-12-01T10:00:00Z), Unix seconds or a duration before now (90s, 10m, 2h, 1d)"
            ))
        })?),
    };
    Ok(LogQuery {
        sources,
        tail: p.tail,
        since_ms,
    })
}

/// A line as JSON: `{"source", "time", "text"}` (`time` RFC 3339, or null when unknown).
fn line_json(line: &LogLine) -> serde_json::Value {
    serde_json::json!({
        "source": line.source,
        "time": line.time_ms.map(hutch_core::time::rfc3339),
        "text": line.text,
    })
}

fn line_text(line: &LogLine, timestamps: bool) -> String {
    match (timestamps, line.time_ms) {
        (true, Some(ms)) => format!("{} {}\n", hutch_core::time::rfc3339(ms), line.text),
        (true, None) => format!("- {}\n", line.text),
        (false, _) => format!("{}\n", line.text),
    }
}

fn sse_line(line: &LogLine) -> Result<Event, Infallible> {
    Ok(Event::default()
        .event("log")
        .data(line_json(line).to_string()))
}

/// The followed lines, batch by batch, until the sandbox is gone; then `end`, if any.
fn followed<T: Send + 'static>(
    follow: LogFollow,
    each: impl Fn(&LogLine) -> T + Send + 'static,
    end: Option<T>,
) -> impl Stream<Item = T> + Send {
    stream::unfold(Some(follow), |follow| async move {
        let mut follow = follow?;
        match follow.next().await {
            Some(Ok(lines)) => Some((lines, Some(follow))),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "following a sandbox's logs");
                None
            }
            None => None,
        }
    })
    .flat_map(move |lines| stream::iter(lines.iter().map(&each).collect::<Vec<_>>()))
    .chain(stream::iter(end))
}

/// `GET /v1/sandboxes/{id}/logs`.
pub async fn logs(
    State(state): State<AppState>,
    sandbox: AuthorizedSandbox,
    ApiQuery(params): ApiQuery<LogsParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let id = sandbox.id;
    let query = query_of(&params)?;
    let format = format_of(&headers);
    if !params.follow {
        let lines = state.manager.logs(&id, query).await?;
        return Ok(match format {
            Format::Json => {
                let lines: Vec<_> = lines.iter().map(line_json).collect();
                Json(serde_json::json!({ "lines": lines })).into_response()
            }
            Format::Text => {
                let text: String = lines
                    .iter()
                    .map(|l| line_text(l, params.timestamps))
                    .collect();
                ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
            }
            Format::EventStream => {
                let events = lines
                    .iter()
                    .map(sse_line)
                    .chain(std::iter::once(Ok(end_event("not following"))))
                    .collect::<Vec<_>>();
                Sse::new(stream::iter(events)).into_response()
            }
        });
    }
    if format == Format::Json {
        return Err(ApiError::bad_request(
            "follow=true streams text or SSE (Accept: text/event-stream), not JSON",
        ));
    }
    let (follow, backlog) = state.manager.follow_logs(&id, query).await?;
    Ok(match format {
        Format::EventStream => {
            let first: Vec<_> = backlog.iter().map(sse_line).collect();
            let live = followed(follow, sse_line, Some(Ok(end_event("sandbox gone"))));
            Sse::new(stream::iter(first).chain(live))
                .keep_alive(KeepAlive::default())
                .into_response()
        }
        // (JSON was refused above.)
        Format::Text | Format::Json => {
            let timestamps = params.timestamps;
            let first: String = backlog.iter().map(|l| line_text(l, timestamps)).collect();
            let live = followed(
                follow,
                move |l| Ok::<_, Infallible>(bytes::Bytes::from(line_text(l, timestamps))),
                None,
            );
            let body = stream::once(async move { Ok(bytes::Bytes::from(first)) }).chain(live);
            (
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                Body::from_stream(body),
            )
                .into_response()
        }
    })
}

fn end_event(reason: &str) -> Event {
    Event::default()
        .event("end")
        .data(serde_json::json!({ "reason": reason }).to_string())
}
