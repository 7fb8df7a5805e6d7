//! A sandbox's logs, read and followed (`GET /v1/sandboxes/{id}/logs`).
//!
//! The backend names the files ([`crate::backend::Backend::log_files`]); reading them is
//! [`crate::logs`]. Reading a sandbox's logs refreshes its TTL like any call on it, but
//! following them does not: a client tailing a log does not keep a sandbox alive.

use std::sync::Arc;
use std::time::Duration;

use super::Manager;
use crate::error::{CoreError, CoreResult};
use crate::ids::SandboxId;
use crate::logs::{self, Follower, LogFile, LogLine, LogQuery};
use crate::time::now_ms;

/// How often a followed log is looked at.
const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// Every this many polls, a follower checks its sandbox still exists.
const POLLS_PER_EXISTENCE_CHECK: u32 = 5;

/// A followed log: [`LogFollow::next`] gives what was written since.
pub struct LogFollow {
    mgr: Arc<Manager>,
    id: SandboxId,
    follower: Option<Follower>,
    polls: u32,
}

fn io_error(id: &str, e: std::io::Error) -> CoreError {
    CoreError::Internal(format!("read the logs of sandbox {id}: {e}"))
}

impl Manager {
    /// The logs of sandbox `id` that `query` names, checked against what its backend keeps.
    async fn chosen_logs(&self, id: &SandboxId, query: &LogQuery) -> CoreResult<Vec<LogFile>> {
        let r = self.load(id).await?;
        let all = self.backend(r.isolation)?.log_files(&r);
        let chosen = logs::select(&all, query).map_err(|missing| {
            let have: Vec<_> = all.iter().map(|l| l.source.as_str()).collect();
            CoreError::InvalidArgument(format!(
                "sandbox {id} ({}) has no {} log; its logs: {}",
                r.isolation.as_str(),
                missing.as_str(),
                have.join(", ")
            ))
        })?;
        if query.since_ms.is_some() {
            if let Some(untimed) = chosen.iter().find(|l| !l.timestamped) {
                return Err(CoreError::InvalidArgument(format!(
                    "the {} log of sandbox {id} has no times, so `since` cannot pick its lines; use `tail`",
                    untimed.source.as_str()
                )));
            }
        }
        Ok(chosen.into_iter().cloned().collect())
    }

    /// The lines of sandbox `id`'s logs that `query` asks for.
    pub async fn logs(&self, id: &SandboxId, query: LogQuery) -> CoreResult<Vec<LogLine>> {
        self.touch(id).await?;
        let chosen = self.chosen_logs(id, &query).await?;
        let owned = id.to_string();
        tokio::task::spawn_blocking(move || {
            let refs: Vec<&LogFile> = chosen.iter().collect();
            logs::read(&refs, &query).map_err(|e| io_error(&owned, e))
        })
        .await
        .map_err(|e| CoreError::Internal(e.to_string()))?
    }

    /// Follow sandbox `id`'s logs from their current end, with the lines `query` asks for
    /// of what they held until then.
    pub async fn follow_logs(
        self: &Arc<Self>,
        id: &SandboxId,
        query: LogQuery,
    ) -> CoreResult<(LogFollow, Vec<LogLine>)> {
        self.touch(id).await?;
        let chosen = self.chosen_logs(id, &query).await?;
        let owned = id.to_string();
        let (follower, backlog) =
            tokio::task::spawn_blocking(move || Follower::start(chosen, &query))
                .await
                .map_err(|e| CoreError::Internal(e.to_string()))?
                .map_err(|e| io_error(&owned, e))?;
        let follow = LogFollow {
            mgr: self.clone(),
            id: id.clone(),
            follower: Some(follower),
            polls: 0,
        };
        Ok((follow, backlog))
    }
}

impl LogFollow {
    /// The next lines written, waiting until there are some; `None` once the sandbox is
    /// gone (deleted, or expired).
    pub async fn next(&mut self) -> Option<CoreResult<Vec<LogLine>>> {
        loop {
            tokio::time::sleep(FOLLOW_POLL).await;
            self.polls += 1;
            if self.polls.is_multiple_of(POLLS_PER_EXISTENCE_CHECK) {
                match self.mgr.load(&self.id).await {
                    Ok(_) => {}
                    Err(CoreError::NotFound(_)) => return None,
                    Err(e) => return Some(Err(e)),
                }
            }
            let mut follower = self.follower.take()?;
            let polled = tokio::task::spawn_blocking(move || {
                let lines = follower.poll(now_ms());
                (follower, lines)
            })
            .await;
            let (follower, lines) = match polled {
                Ok(done) => done,
                Err(e) => return Some(Err(CoreError::Internal(e.to_string()))),
            };
            self.follower = Some(follower);
            match lines {
                Ok(lines) if lines.is_empty() => continue,
                Ok(lines) => return Some(Ok(lines)),
                Err(e) => return Some(Err(io_error(&self.id, e))),
            }
        }
    }
}
