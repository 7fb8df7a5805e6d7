//! A test hook: `HUTCH_TEST_CRASH_AT=<point>` makes the server abort (no destructor, no
//! shutdown work: what `kill -9` leaves) when it reaches the named point of an operation, so
//! the crash tests can stop it exactly where an operation is half done
//! (`crates/hutch/tests/faults_reconcile.rs`). Honoured only in debug builds (the ones the
//! test suites run); a release build never reads the variable.
//!
//! Points: `create.backend_started` (a sandbox's init or QEMU runs, its record does not name
//! it yet), `vm.restore.qemu_running` (QEMU restored, its guest not yet given its identity),
//! `fork.child_started` (one child of a fork runs, its record does not name it yet),
//! `fork.children_created` (every child of a fork runs; no client has their ids),
//! `volume.image_made` (a volume's image is made, its record not inserted).

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
