//! File watches: changes below a directory of a sandbox, as they happen, from its agent
//! (`GET /v1/files/watch` of the agent protocol, inotify inside the sandbox).
//!
//! [`Manager::watch_files`] returns once the agent has armed the watch: everything changed
//! after is reported. The returned [`FileWatch`] is a stream of [`WatchMessage`]s (events,
//! warnings, and a last `end` when the directory goes away); dropping it ends the watch in the
//! agent. While it is open the sandbox counts as in use (it is not hibernated for idleness).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::Stream;
pub use hutch_proto::client::WatchOptions;
use hutch_proto::{WatchMessage, WatchReady};

use super::{ActiveGuard, Manager};
use crate::error::{CoreError, CoreResult};
use crate::ids::SandboxId;

/// A running watch of a sandbox directory: [`WatchMessage::Event`]s and
/// [`WatchMessage::Warning`]s, then at most one [`WatchMessage::End`] (never
/// [`WatchMessage::Ready`]: that is [`FileWatch::ready`]). An error (the sandbox died or was
/// deleted) is the last item.
pub struct FileWatch {
    ready: WatchReady,
    messages: Pin<Box<dyn Stream<Item = CoreResult<WatchMessage>> + Send>>,
}

impl std::fmt::Debug for FileWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWatch")
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

impl FileWatch {
    /// What the agent confirmed when it armed the watch (the directory, how many
    /// directories are watched).
    pub fn ready(&self) -> &WatchReady {
        &self.ready
    }
}

impl Stream for FileWatch {
    type Item = CoreResult<WatchMessage>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.messages.as_mut().poll_next(cx)
    }
}

/// Check a path given to a watch: absolute, without NUL bytes.
fn check_watch_path(path: &str) -> CoreResult<()> {
    if !path.starts_with('/') {
        return Err(CoreError::InvalidArgument(format!(
            "path must be absolute, got {path:?}"
        )));
    }
    if path.contains('\0') {
        return Err(CoreError::InvalidArgument(
            "path must not contain NUL bytes".into(),
        ));
    }
    Ok(())
}

impl Manager {
    /// Watch the directory `path` of sandbox `id` (woken first if hibernated). Returns once
    /// the watch is armed. Errors: an unknown sandbox is [`CoreError::NotFound`]; a missing
    /// path is [`CoreError::Agent`] with code `not_found`, a file `not_a_directory`, a
    /// recursive watch of a tree over [`hutch_proto::watch::MAX_WATCHED_DIRS`] directories
    /// `bad_request`; a sandbox not running is [`CoreError::WrongState`].
    pub async fn watch_files(
        self: &Arc<Self>,
        id: &SandboxId,
        path: &str,
        options: WatchOptions,
    ) -> CoreResult<FileWatch> {
        check_watch_path(path)?;
        let client = self.agent(id).await?;
        let guard: ActiveGuard = self.session_guard(id);
        let stream = self
            .agent_call(id, client.watch(path, options).await)
            .await?;
        let ready = stream.ready().clone();
        let mgr = Arc::clone(self);
        let id = id.clone();
        let messages =
            futures_util::stream::unfold(Some((stream, mgr, id, guard)), |state| async move {
                let (mut stream, mgr, id, guard) = state?;
                match stream.next_message().await? {
                    Ok(message) => Some((Ok(message), Some((stream, mgr, id, guard)))),
                    Err(e) => {
                        drop(guard);
                        Some((Err(mgr.agent_error(&id, e).await), None))
                    }
                }
            });
        Ok(FileWatch {
            ready,
            messages: Box::pin(messages),
        })
    }
}
