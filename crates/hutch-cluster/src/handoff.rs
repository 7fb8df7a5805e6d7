//! [`ObjectStates`]: hibernated sandboxes' saved states in the cluster's object store
//! (`hutch serve --object-store`), the cluster's [`SavedStates`].
//!
//! - A save is a job of a persistent [`UploadQueue`] in `<state>/uploads/`: retried with
//!   backoff while the store is down, resumed by the next process. When it is uploaded,
//!   the manager records it ([`Manager::state_saved`]); if the sandbox has moved on (woken,
//!   deleted, hibernated again), the object is deleted at once. The local archive goes
//!   either way.
//! - A fetch downloads into a temporary file beside the destination and checks the bytes
//!   against the sha256 the saving node recorded in the database, not against the object's
//!   own metadata: whoever can write the bucket can write that too.
//! - Keys: `hibernations/<sandbox id>/<random>.tar` under the store's prefix.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use hutch_core::handoff::{SavedState, SavedStates};
use hutch_core::ids::SandboxId;
use hutch_core::{CoreError, CoreResult, Manager};
use hutch_object_store::{CompletedUpload, ObjectStore, OnUploaded, RetryPolicy, UploadQueue};

use crate::error::ClusterError;

/// The sandbox a save's key is of (`hibernations/<id>/…`).
fn sandbox_of(key: &str) -> Option<SandboxId> {
    key.strip_prefix("hibernations/")?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// Saved states in an object store (see the module docs).
pub struct ObjectStates {
    store: Arc<dyn ObjectStore>,
    queue: UploadQueue,
}

impl ObjectStates {
    /// Saved states in `store`, uploaded through a queue in `queue_dir`, reported to
    /// `manager`. Saves a previous process queued are resumed.
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        queue_dir: &Path,
        manager: &Arc<Manager>,
        retry: RetryPolicy,
    ) -> Result<Arc<Self>, ClusterError> {
        let weak: Weak<Manager> = Arc::downgrade(manager);
        let for_done = store.clone();
        let on_uploaded: OnUploaded = Arc::new(move |done: CompletedUpload| {
            let (weak, store) = (weak.clone(), for_done.clone());
            Box::pin(async move { uploaded(weak, store, done).await })
        });
        let queue = UploadQueue::open(queue_dir, store.clone(), retry, on_uploaded)
            .await
            .map_err(|e| ClusterError::ObjectStore(e.to_string()))?;
        Ok(Arc::new(Self { store, queue }))
    }

    /// Where the objects are, for logs.
    pub fn describe(&self) -> String {
        self.store.describe()
    }
}

async fn uploaded(weak: Weak<Manager>, store: Arc<dyn ObjectStore>, done: CompletedUpload) {
    let _ = tokio::fs::remove_file(&done.path).await;
    let Some(id) = sandbox_of(&done.info.key) else {
        return;
    };
    let saved = SavedState {
        key: done.info.key.clone(),
        bytes: done.info.bytes,
        sha256: done.info.sha256.clone(),
    };
    let recorded = match weak.upgrade() {
        Some(manager) => manager.state_saved(&id, saved).await,
        None => false,
    };
    if !recorded {
        // Nothing will ever fetch it.
        if let Err(e) = store.delete(&done.info.key).await {
            tracing::warn!(key = done.info.key, error = %e, "deleting a save no sandbox needs");
        }
    }
}

#[async_trait::async_trait]
impl SavedStates for ObjectStates {
    async fn save(&self, _id: &SandboxId, key: &str, archive: PathBuf) -> CoreResult<()> {
        match self.queue.enqueue(key, &archive).await {
            Ok(_) => Ok(()),
            Err(e) => {
                let _ = tokio::fs::remove_file(&archive).await;
                Err(CoreError::SavedStateUnavailable(format!(
                    "queueing the save of {key}: {e}"
                )))
            }
        }
    }

    async fn fetch(&self, saved: &SavedState, dest: &Path) -> CoreResult<()> {
        self.store
            .get_to_file(&saved.key, dest, Some(&saved.sha256))
            .await
            .map(drop)
            .map_err(|e| {
                CoreError::SavedStateUnavailable(format!(
                    "fetching the saved state {} from {}: {e}; the sandbox stays hibernated",
                    saved.key,
                    self.store.describe()
                ))
            })
    }

    async fn discard(&self, id: &SandboxId, saved: Option<&SavedState>) {
        let prefix = format!("hibernations/{id}/");
        for job in self.queue.pending() {
            if job.key.starts_with(&prefix) {
                if let Err(e) = self.queue.forget(&job.id).await {
                    tracing::warn!(key = job.key, error = %e, "dropping a save no sandbox needs");
                }
                let _ = tokio::fs::remove_file(&job.path).await;
            }
        }
        if let Some(saved) = saved {
            if let Err(e) = self.store.delete(&saved.key).await {
                tracing::warn!(key = saved.key, error = %e, "deleting a stale save (the bucket keeps it)");
            }
        }
    }

    fn pending(&self) -> usize {
        self.queue.pending().len()
    }

    fn is_pending(&self, key: &str) -> bool {
        self.queue.pending().iter().any(|j| j.key == key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_names_its_sandbox() {
        let id = SandboxId::random();
        assert_eq!(
            sandbox_of(&format!("hibernations/{id}/abc.tar")),
            Some(id.clone())
        );
        assert_eq!(sandbox_of(&format!("snapshots/{id}/abc.tar")), None);
        assert_eq!(sandbox_of("hibernations/not-an-id/abc.tar"), None);
    }
}
