//! [`UploadQueue`]: uploads that must reach the object store even if it is down now.
//!
//! Each job is one small JSON file in the queue's directory, written (atomically) before
//! [`UploadQueue::enqueue`] returns:
//!
//! ```text
//! DIR/<created ms, 13 digits>-<8 hex>.json
//! {"version":1,"id":"...","key":"snapshots/...","path":"/abs/file","created_unix_ms":...,
//!  "attempts":2,"last_error":"object store unavailable: PUT ...: could not connect: ..."}
//! ```
//!
//! One worker task uploads the jobs one at a time, oldest first. A failed attempt is
//! counted and its error recorded in the file, and the job waits before its next attempt:
//! [`RetryPolicy::first`] after the first failure, doubling up to [`RetryPolicy::max`]
//! (1 s, 2 s, 4 s, ... 30 s by default), forever: the operator sees the pending jobs and
//! their last errors in [`UploadQueue::pending`] and may [`UploadQueue::forget`] one. On
//! success the completion callback runs, then the job's file is removed: delivery is at
//! least once (a crash between the two uploads the file again, with the same bytes and
//! sha256, and calls the callback again).
//!
//! A new queue on the same directory (the next process) resumes every job at once. One
//! queue per directory at a time. Dropping the queue, or [`UploadQueue::shutdown`], stops
//! the worker, cancelling an attempt under way (an interrupted multipart upload is left for
//! the bucket's lifecycle rule; the job starts over next time). The local file is the
//! caller's: the queue never deletes it.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::FutureExt as _;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::key::check_key;
use crate::{ObjectInfo, ObjectStore, ObjectStoreError};

/// The version of the job files.
const JOB_VERSION: u32 = 1;

/// When a failed job is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The wait after the first failure.
    pub first: Duration,
    /// The longest wait (the doubling stops here).
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            first: Duration::from_secs(1),
            max: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait after the `failures`-th failure in a row (`failures` ≥ 1).
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.first
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

/// A job waiting to be uploaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingUpload {
    /// The job's id (its file is `ID.json`); ids sort by creation.
    pub id: String,
    /// The key it goes to.
    pub key: String,
    /// The local file (absolute).
    pub path: PathBuf,
    /// When it was enqueued, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Failed attempts so far.
    pub attempts: u32,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
}

/// A job file: the version, then the job.
#[derive(Serialize, Deserialize)]
struct JobFile {
    version: u32,
    #[serde(flatten)]
    upload: PendingUpload,
}

/// What the completion callback is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletedUpload {
    /// The job's id.
    pub id: String,
    /// The local file that was uploaded.
    pub path: PathBuf,
    /// The object as stored (key, size, sha256).
    pub info: ObjectInfo,
    /// The failed attempts before this one.
    pub failed_attempts: u32,
}

/// The completion callback: runs after each upload succeeds, before its job is removed.
pub type OnUploaded =
    Arc<dyn Fn(CompletedUpload) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// What went wrong with the queue itself (an upload's own errors are recorded in its job).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The queue's directory or a job file could not be read or written.
    #[error("upload queue: {what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A job's local file must be named by an absolute path (the job outlives this
    /// process's working directory).
    #[error("upload queue: the file to upload must be an absolute path, not {path}")]
    RelativePath {
        /// The path given.
        path: PathBuf,
    },
    /// The key is refused ([`ObjectStoreError::BadKey`]).
    #[error(transparent)]
    Key(#[from] ObjectStoreError),
}

fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> QueueError {
    QueueError::Io {
        what,
        path: path.into(),
        source,
    }
}

struct Job {
    upload: PendingUpload,
    due: Instant,
}

/// The state the queue and its worker share.
struct Shared {
    dir: PathBuf,
    jobs: Mutex<BTreeMap<String, Job>>,
    wake: tokio::sync::Notify,
}

impl Shared {
    fn jobs(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Job>> {
        self.jobs
            .lock()
            .expect("no thread panics holding the job table")
    }

    fn job_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Write `upload`'s file atomically (a temporary file, synced, renamed).
    async fn write(&self, upload: &PendingUpload) -> Result<(), QueueError> {
        let path = self.job_path(&upload.id);
        let tmp = self.dir.join(format!(".{}.json.tmp", upload.id));
        let json = serde_json::to_vec_pretty(&JobFile {
            version: JOB_VERSION,
            upload: upload.clone(),
        })
        .expect("a job serializes");
        let mut file = tokio::fs::File::create(&tmp)
            .await
            .map_err(|e| io("create", &tmp, e))?;
        file.write_all(&json)
            .await
            .map_err(|e| io("write", &tmp, e))?;
        file.sync_all().await.map_err(|e| io("sync", &tmp, e))?;
        drop(file);
        tokio::fs::rename(&tmp, &path)
            .await
            .map_err(|e| io("rename", &path, e))
    }

    async fn remove(&self, id: &str) -> Result<(), QueueError> {
        let path = self.job_path(id);
        match tokio::fs::remove_file(&path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("remove", &path, e)),
        }
    }
}

/// The persistent upload queue (see the module docs).
pub struct UploadQueue {
    shared: Arc<Shared>,
    cancel: CancellationToken,
    worker: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for UploadQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UploadQueue")
            .field("dir", &self.shared.dir)
            .finish_non_exhaustive()
    }
}

impl UploadQueue {
    /// Open the queue in `dir` (made if missing), resume the jobs found there, and start
    /// its worker, which uploads to `store` and calls `on_uploaded` after each success.
    /// Must be called within a Tokio runtime.
    pub async fn open(
        dir: &Path,
        store: Arc<dyn ObjectStore>,
        policy: RetryPolicy,
        on_uploaded: OnUploaded,
    ) -> Result<Self, QueueError> {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| io("create", dir, e))?;
        let jobs = load(dir).await?;
        if !jobs.is_empty() {
            tracing::info!(dir = %dir.display(), jobs = jobs.len(), "resuming pending uploads");
        }
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            jobs: Mutex::new(jobs),
            wake: tokio::sync::Notify::new(),
        });
        let cancel = CancellationToken::new();
        let worker = tokio::spawn(run(
            shared.clone(),
            store,
            policy,
            on_uploaded,
            cancel.clone(),
        ));
        Ok(Self {
            shared,
            cancel,
            worker: Some(worker),
        })
    }

    /// Add a job: upload the file at `path` (absolute, existing) to `key`. Its file is
    /// written before this returns, so the job survives a crash from then on.
    pub async fn enqueue(&self, key: &str, path: &Path) -> Result<PendingUpload, QueueError> {
        check_key(key)?;
        if !path.is_absolute() {
            return Err(QueueError::RelativePath {
                path: path.to_path_buf(),
            });
        }
        tokio::fs::metadata(path)
            .await
            .map_err(|e| io("stat", path, e))?;
        let created_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut random = [0u8; 4];
        getrandom::fill(&mut random).map_err(|e| {
            io(
                "make an id in",
                &self.shared.dir,
                std::io::Error::other(e.to_string()),
            )
        })?;
        let upload = PendingUpload {
            id: format!("{created_unix_ms:013}-{}", crate::checksum::hex(&random)),
            key: key.to_string(),
            path: path.to_path_buf(),
            created_unix_ms,
            attempts: 0,
            last_error: None,
        };
        self.shared.write(&upload).await?;
        self.shared.jobs().insert(
            upload.id.clone(),
            Job {
                upload: upload.clone(),
                due: Instant::now(),
            },
        );
        self.shared.wake.notify_one();
        tracing::info!(id = upload.id, key, path = %path.display(), "upload queued");
        Ok(upload)
    }

    /// The jobs not uploaded yet, oldest first.
    pub fn pending(&self) -> Vec<PendingUpload> {
        self.shared
            .jobs()
            .values()
            .map(|j| j.upload.clone())
            .collect()
    }

    /// Drop job `id` without uploading it (an attempt under way still finishes);
    /// `false` if there is no such job.
    pub async fn forget(&self, id: &str) -> Result<bool, QueueError> {
        let found = self.shared.jobs().remove(id).is_some();
        if found {
            self.shared.remove(id).await?;
            tracing::info!(id, "upload forgotten");
        }
        Ok(found)
    }

    /// Stop the worker (an attempt under way is cancelled) and wait for it.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        if let Some(worker) = self.worker.take() {
            let _ = worker.await;
        }
    }
}

impl Drop for UploadQueue {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(worker) = self.worker.take() {
            worker.abort();
        }
    }
}

/// The jobs in `dir`; a file that cannot be read is logged and left alone, and leftover
/// temporary files are removed.
async fn load(dir: &Path) -> Result<BTreeMap<String, Job>, QueueError> {
    let mut jobs = BTreeMap::new();
    let mut entries = tokio::fs::read_dir(dir)
        .await
        .map_err(|e| io("list", dir, e))?;
    let now = Instant::now();
    while let Some(entry) = entries.next_entry().await.map_err(|e| io("list", dir, e))? {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.ends_with(".json.tmp") {
            let _ = tokio::fs::remove_file(&path).await;
            continue;
        }
        let Some(id) = name.strip_suffix(".json") else {
            continue;
        };
        match read_job(&path, id).await {
            Ok(upload) => {
                jobs.insert(upload.id.clone(), Job { upload, due: now });
            }
            Err(reason) => {
                tracing::warn!(path = %path.display(), reason, "skipping an unreadable upload job")
            }
        }
    }
    Ok(jobs)
}

async fn read_job(path: &Path, id: &str) -> Result<PendingUpload, String> {
    let text = tokio::fs::read(path).await.map_err(|e| e.to_string())?;
    let file: JobFile = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    if file.version != JOB_VERSION {
        return Err(format!("job file version {}", file.version));
    }
    if file.upload.id != id {
        return Err(format!("the file names job {}", file.upload.id));
    }
    Ok(file.upload)
}

/// The worker: the due job, oldest first, one at a time, until cancelled.
async fn run(
    shared: Arc<Shared>,
    store: Arc<dyn ObjectStore>,
    policy: RetryPolicy,
    on_uploaded: OnUploaded,
    cancel: CancellationToken,
) {
    loop {
        let next = shared
            .jobs()
            .values()
            .min_by(|a, b| (a.due, &a.upload.id).cmp(&(b.due, &b.upload.id)))
            .map(|j| (j.upload.clone(), j.due));
        let upload = match next {
            None => {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = shared.wake.notified() => continue,
                }
            }
            Some((_, due)) if due > Instant::now() => {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep_until(due) => continue,
                    _ = shared.wake.notified() => continue,
                }
            }
            Some((upload, _)) => upload,
        };
        let result = tokio::select! {
            _ = cancel.cancelled() => return,
            r = AssertUnwindSafe(store.put_file(&upload.key, &upload.path)).catch_unwind() => r,
        };
        let Ok(result) = result else {
            tracing::error!(id = upload.id, "the store panicked uploading a queued job");
            failed(&shared, &policy, upload, "the store panicked").await;
            continue;
        };
        match result {
            Ok(info) => {
                let done = CompletedUpload {
                    id: upload.id.clone(),
                    path: upload.path.clone(),
                    info,
                    failed_attempts: upload.attempts,
                };
                let called = tokio::select! {
                    _ = cancel.cancelled() => return,
                    r = AssertUnwindSafe(on_uploaded(done)).catch_unwind() => r,
                };
                if called.is_err() {
                    // The job stays: it is uploaded and reported again later.
                    tracing::error!(id = upload.id, "the completion callback panicked");
                    failed(&shared, &policy, upload, "the completion callback panicked").await;
                    continue;
                }
                shared.jobs().remove(&upload.id);
                if let Err(e) = shared.remove(&upload.id).await {
                    tracing::warn!(id = upload.id, error = %e, "an uploaded job's file stays");
                }
                tracing::info!(id = upload.id, key = upload.key, "queued upload done");
            }
            Err(e) => failed(&shared, &policy, upload, &e.to_string()).await,
        }
    }
}

/// Record a failed attempt and when the next one is due.
async fn failed(shared: &Shared, policy: &RetryPolicy, mut upload: PendingUpload, error: &str) {
    upload.attempts += 1;
    upload.last_error = Some(error.to_string());
    let wait = policy.delay(upload.attempts);
    tracing::warn!(
        id = upload.id,
        key = upload.key,
        attempts = upload.attempts,
        retry_in_ms = wait.as_millis() as u64,
        error,
        "queued upload failed"
    );
    {
        let mut jobs = shared.jobs();
        let Some(job) = jobs.get_mut(&upload.id) else {
            return; // forgotten meanwhile
        };
        job.upload = upload.clone();
        job.due = Instant::now() + wait;
    }
    if let Err(e) = shared.write(&upload).await {
        tracing::warn!(id = upload.id, error = %e, "could not record a failed attempt");
    }
    // Forgotten while the file was written: do not leave it to be resumed.
    if !shared.jobs().contains_key(&upload.id) {
        let _ = shared.remove(&upload.id).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = RetryPolicy::default();
        let secs: Vec<u64> = (1..=8).map(|n| p.delay(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(p.delay(u32::MAX), Duration::from_secs(30));
    }
}
