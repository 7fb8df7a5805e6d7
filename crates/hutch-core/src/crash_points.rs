//! A test hook: `HUTCH_TEST_CRASH_AT=<point>` makes the server abort (no destructor, no
//! shutdown work: what `kill -9` leaves) when it reaches the named point of an operation, so
//! the crash tests can stop it exactly where an operation is half done
//! (`crates/hutch/tests/faults_reconcile.rs`). Honoured only in debug builds (the ones the
//! test suites run); a release build never reads the variable.
//!
//! Points, by operation (`crates/hutch/tests/faults_crash.rs` crashes at each):
//! - create: `create.backend_started` (a sandbox's init or QEMU runs, its record does not
//!   name it yet); `vm.restore.qemu_running` (QEMU restored, its guest not yet given its
//!   identity: creates from the warm pool or a snapshot, and wakes);
//! - snapshot: `snapshot.frozen` (the sandbox frozen, or its guest stopped, while its files
//!   or memory are read); `snapshot.written` (the snapshot in place, not yet recorded);
//! - fork: `fork.snapshot_taken` (its hidden snapshot recorded, no intent yet),
//!   `fork.child_started` (one child runs, its record does not name it yet),
//!   `fork.children_created` (every child runs; no client has their ids);
//! - explore: `explore.commands_run` (every child ran its command; none is kept or removed);
//! - hibernate: `hibernate.recorded` (the record says hibernated, nothing is stopped yet),
//!   `vm.hibernate.memory_saved` (the memory file in place, QEMU still there),
//!   `hibernate.stopped` (its processes are gone; its network slot and record not updated);
//! - wake: `wake.started` (its init or QEMU runs again, the record does not name it);
//! - pause and resume: `pause.stopped`, `resume.continued` (done on the host, not recorded);
//! - delete: `delete.record_gone` (the record deleted, nothing on the host removed);
//! - volumes: `volume.image_made` (a volume's image is made, its record not inserted).

/// The environment variable naming the point to crash at.
pub const CRASH_AT_ENV: &str = "HUTCH_TEST_CRASH_AT";

/// Abort the process here when [`CRASH_AT_ENV`] names `point` (debug builds only).
pub fn crash_point(point: &str) {
    #[cfg(debug_assertions)]
    if std::env::var(CRASH_AT_ENV).is_ok_and(|v| v == point) {
        tracing::error!(point, "{CRASH_AT_ENV}: aborting here");
        eprintln!("hutch: {CRASH_AT_ENV}={point}: aborting");
        std::process::abort();
    }
    #[cfg(not(debug_assertions))]
    let _ = point;
}
