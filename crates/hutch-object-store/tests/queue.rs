//! The upload queue against a real S3 server (moto) taken down and brought back: jobs wait
//! with their errors recorded, complete when the store is back, and survive a restart.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hutch_object_store::{
    CompletedUpload, ObjectStore, OnUploaded, QueueError, RetryPolicy, UploadQueue,
};
use hutch_testkit::{wait_until, S3Server};
use support::{file_of, s3_store};
use tokio::sync::mpsc;

/// Fast retries for tests: 50 ms doubling to 400 ms.
const FAST: RetryPolicy = RetryPolicy {
    first: Duration::from_millis(50),
    max: Duration::from_millis(400),
};

/// A callback that sends each completion into a channel.
fn channel() -> (OnUploaded, mpsc::UnboundedReceiver<CompletedUpload>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let on: OnUploaded = Arc::new(move |done| {
        let tx = tx.clone();
        Box::pin(async move {
            let _ = tx.send(done);
        })
    });
    (on, rx)
}

fn job_files(dir: &Path) -> Vec<String> {
    support::files_in(dir)
        .into_iter()
        .filter(|n| n.ends_with(".json"))
        .collect()
}

#[tokio::test]
async fn a_job_waits_while_the_store_is_down_and_completes_when_it_is_back() {
    let Some(mut s3) = S3Server::start() else {
        return;
    };
    let store: Arc<dyn ObjectStore> = Arc::new(s3_store(&s3, "queue"));
    s3.stop();
    let scratch = tempfile::tempdir().expect("scratch");
    let jobs = tempfile::tempdir().expect("jobs");
    let file = file_of(scratch.path(), "snap", 9 << 20, 21);
    let (on, mut done) = channel();
    let queue = UploadQueue::open(jobs.path(), store.clone(), FAST, on)
        .await
        .expect("queue");

    let job = queue.enqueue("snaps/q/disk", &file).await.expect("enqueue");
    assert_eq!(job_files(jobs.path()), [format!("{}.json", job.id)]);
    let waiting = wait_until(Duration::from_secs(20), async || {
        queue.pending().into_iter().find(|p| p.attempts >= 2)
    })
    .await
    .expect("the job is tried and fails while the store is down");
    assert_eq!(waiting.id, job.id);
    let error = waiting.last_error.expect("its error is recorded");
    assert!(
        error.starts_with("object store unavailable: PUT snaps/q/disk: could not connect"),
        "{error}"
    );
    // The job file has it too.
    let text =
        std::fs::read_to_string(jobs.path().join(format!("{}.json", job.id))).expect("job file");
    assert!(text.contains("could not connect"), "{text}");
    assert!(
        done.try_recv().is_err(),
        "no completion while the store is down"
    );

    s3.start_again();
    s3.create_bucket("queue");
    let completed = tokio::time::timeout(Duration::from_secs(30), done.recv())
        .await
        .expect("the job completes once the store is back")
        .expect("a completion");
    assert_eq!(completed.id, job.id);
    assert_eq!(completed.path, file);
    assert_eq!(completed.info.key, "snaps/q/disk");
    assert_eq!(completed.info.bytes, 9 << 20);
    assert!(completed.failed_attempts >= 2);
    assert_eq!(
        completed.info.sha256,
        hutch_object_store::sha256_file(&file)
            .await
            .expect("hash")
            .0
    );
    wait_until(Duration::from_secs(5), async || {
        queue.pending().is_empty().then_some(())
    })
    .await
    .expect("the job is gone");
    assert!(job_files(jobs.path()).is_empty(), "its file is removed");
    let head = store
        .head("snaps/q/disk")
        .await
        .expect("head")
        .expect("uploaded");
    assert_eq!(head, completed.info);
    assert!(file.exists(), "the local file is the caller's");
    queue.shutdown().await;
}

#[tokio::test]
async fn a_queue_reopened_on_the_same_directory_resumes_its_jobs() {
    let Some(mut s3) = S3Server::start() else {
        return;
    };
    let store: Arc<dyn ObjectStore> = Arc::new(s3_store(&s3, "resume"));
    s3.stop();
    let scratch = tempfile::tempdir().expect("scratch");
    let jobs = tempfile::tempdir().expect("jobs");
    let first = file_of(scratch.path(), "one", 1000, 31);
    let second = file_of(scratch.path(), "two", 2000, 32);

    let (on, mut done) = channel();
    let queue = UploadQueue::open(jobs.path(), store.clone(), FAST, on)
        .await
        .expect("queue");
    let a = queue
        .enqueue("snaps/one", &first)
        .await
        .expect("enqueue one");
    let b = queue
        .enqueue("snaps/two", &second)
        .await
        .expect("enqueue two");
    wait_until(Duration::from_secs(20), async || {
        queue
            .pending()
            .iter()
            .all(|p| p.attempts >= 1)
            .then_some(())
    })
    .await
    .expect("both tried");
    // The process goes away (the queue is dropped, its worker with it).
    drop(queue);
    assert!(done.try_recv().is_err());
    assert_eq!(job_files(jobs.path()).len(), 2, "the jobs stay on disk");

    s3.start_again();
    s3.create_bucket("resume");
    let (on, mut done) = channel();
    let queue = UploadQueue::open(jobs.path(), store.clone(), FAST, on)
        .await
        .expect("reopened");
    let resumed = queue.pending();
    assert_eq!(
        resumed.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
        [a.id.as_str(), b.id.as_str()],
        "both, oldest first"
    );
    assert!(resumed
        .iter()
        .all(|p| p.attempts >= 1 && p.last_error.is_some()));
    let mut ids = Vec::new();
    for _ in 0..2 {
        let c = tokio::time::timeout(Duration::from_secs(30), done.recv())
            .await
            .expect("a resumed job completes")
            .expect("a completion");
        ids.push(c.id);
    }
    ids.sort();
    assert_eq!(ids, [a.id.clone(), b.id.clone()]);
    wait_until(Duration::from_secs(5), async || {
        job_files(jobs.path()).is_empty().then_some(())
    })
    .await
    .expect("the job files are removed");
    for key in ["snaps/one", "snaps/two"] {
        assert!(store.head(key).await.expect("head").is_some(), "{key}");
    }
    queue.shutdown().await;
}

#[tokio::test]
async fn enqueue_refuses_bad_keys_and_relative_paths_and_forget_drops_a_job() {
    let root = tempfile::tempdir().expect("root");
    // A directory store whose directory is then removed: every attempt fails.
    let store: Arc<dyn ObjectStore> =
        Arc::new(hutch_object_store::FsObjectStore::open(root.path()).expect("store"));
    let jobs = tempfile::tempdir().expect("jobs");
    let scratch = tempfile::tempdir().expect("scratch");
    let file = file_of(scratch.path(), "f", 10, 41);
    let (on, mut done) = channel();
    let queue = UploadQueue::open(jobs.path(), store, FAST, on)
        .await
        .expect("queue");

    let e = queue.enqueue("a/../b", &file).await.expect_err("bad key");
    assert!(matches!(e, QueueError::Key(_)));
    assert_eq!(
        e.to_string(),
        "bad object key \"a/../b\": it has a . or .. segment"
    );
    let e = queue
        .enqueue("ok", Path::new("relative/file"))
        .await
        .expect_err("relative");
    assert_eq!(
        e.to_string(),
        "upload queue: the file to upload must be an absolute path, not relative/file"
    );
    let missing = scratch.path().join("missing");
    let e = queue
        .enqueue("ok", &missing)
        .await
        .expect_err("missing file");
    assert_eq!(
        e.to_string(),
        format!(
            "upload queue: stat {}: No such file or directory (os error 2)",
            missing.display()
        )
    );
    assert!(
        job_files(jobs.path()).is_empty(),
        "refused jobs leave no file"
    );

    std::fs::remove_dir_all(root.path().join("tmp")).expect("break the store");
    let job = queue.enqueue("snaps/f", &file).await.expect("enqueue");
    wait_until(Duration::from_secs(10), async || {
        queue.pending().into_iter().find(|p| p.last_error.is_some())
    })
    .await
    .expect("it fails");
    assert!(queue.forget(&job.id).await.expect("forget"));
    assert!(!queue.forget(&job.id).await.expect("forget again"));
    assert!(queue.pending().is_empty());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        job_files(jobs.path()).is_empty(),
        "a forgotten job's file is gone"
    );
    assert!(done.try_recv().is_err());
    queue.shutdown().await;
}

#[tokio::test]
async fn a_callback_that_panics_keeps_the_job_for_another_try() {
    let root = tempfile::tempdir().expect("root");
    let store: Arc<dyn ObjectStore> =
        Arc::new(hutch_object_store::FsObjectStore::open(root.path()).expect("store"));
    let jobs = tempfile::tempdir().expect("jobs");
    let scratch = tempfile::tempdir().expect("scratch");
    let file = file_of(scratch.path(), "f", 100, 51);
    let (tx, mut done) = mpsc::unbounded_channel();
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = calls.clone();
    let on: OnUploaded = Arc::new(move |c: CompletedUpload| {
        let tx = tx.clone();
        let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move {
            assert!(n > 0, "the first call panics");
            let _ = tx.send(c);
        })
    });
    let queue = UploadQueue::open(jobs.path(), store, FAST, on)
        .await
        .expect("queue");
    let job = queue.enqueue("snaps/p", &file).await.expect("enqueue");
    let c = tokio::time::timeout(Duration::from_secs(10), done.recv())
        .await
        .expect("the second call completes it")
        .expect("a completion");
    assert_eq!(c.id, job.id);
    assert_eq!(
        c.failed_attempts, 1,
        "the panic counted as a failed attempt"
    );
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    wait_until(Duration::from_secs(5), async || {
        job_files(jobs.path()).is_empty().then_some(())
    })
    .await
    .expect("its file is removed");
    queue.shutdown().await;
}
