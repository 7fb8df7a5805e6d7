//! The state disk: the filesystem holding the server's state directory (the database,
//! sandbox directories, snapshots, volume images, `vm` overlays, and the `ns` disk pool's
//! image).
//!
//! A full state disk must be an error, never data loss (issue 23):
//!
//! - The `ns` disk pool is allocated when it is made ([`hutch_jail::btrfs`]): sandboxes'
//!   writes to their own layers need no host block after that, so they go on (up to the
//!   pool's size) however full the host gets. Its default size is
//!   [`default_pool_bytes`]: half of the state disk's free space, at most 64 GiB.
//! - A **reserve** ([`reserve_bytes`]: 5 % of the state disk, between 64 MiB and 2 GiB) is kept
//!   free for what the server itself must write: new work that takes host disk (a create, a
//!   snapshot, a fork, a volume) is refused with [`CoreError::NoSpace`] (507) once less than
//!   the reserve is free ([`check_room`]), before anything of it is made; calls on existing
//!   sandboxes go on.

use std::path::Path;

use crate::error::{CoreError, CoreResult};

/// Least reserve kept free on the state disk.
pub const MIN_RESERVE: u64 = 64 << 20;
/// Most reserve kept free on the state disk.
pub const MAX_RESERVE: u64 = 2 << 30;
/// Largest default `ns` disk pool.
pub const MAX_DEFAULT_POOL: u64 = 64 << 30;

/// Free and total bytes of the filesystem holding `dir` (free: what a write may take).
pub fn space(dir: &Path) -> Option<(u64, u64)> {
    let free = hutch_jail::volume::available(dir).ok()?;
    let (_, total) = hutch_jail::volume::usage(dir).ok()?;
    Some((free, total))
}

/// The bytes kept free on a state disk of `total` bytes: 5 %, between [`MIN_RESERVE`] and
/// [`MAX_RESERVE`].
pub fn reserve_bytes(total: u64) -> u64 {
    (total / 20).clamp(MIN_RESERVE, MAX_RESERVE)
}

/// The size of an `ns` disk pool made when `free` of `total` bytes are free and none was
/// asked for: half the free space, at most [`MAX_DEFAULT_POOL`], in whole MiB.
pub fn default_pool_bytes(free: u64, _total: u64) -> u64 {
    ((free / 2).min(MAX_DEFAULT_POOL) >> 20) << 20
}

/// Why a pool of `size` bytes cannot be made on a disk with `free` of `total` bytes free:
/// it would leave less than the reserve.
pub fn pool_does_not_fit(size: u64, free: u64, total: u64) -> Option<String> {
    let reserve = reserve_bytes(total);
    (size.saturating_add(reserve) > free).then(|| {
        format!(
            "an ns disk pool of {} MiB does not fit: the state disk has {} MiB free and keeps {} MiB of them in reserve (make it smaller with hutch serve --ns-disk-pool-gib, or free disk space)",
            size >> 20,
            free >> 20,
            reserve >> 20
        )
    })
}

/// `NoSpace` if less than the reserve is free on the state disk holding `state_dir`: `what`
/// (say "create a sandbox") would take host disk the server needs for itself.
pub fn check_room(state_dir: &Path, what: &str) -> CoreResult<()> {
    match space(state_dir) {
        Some((free, total)) => refusal(free, total, what).map_or(Ok(()), Err),
        None => Ok(()),
    }
}

/// The refusal of `what` on a state disk with `free` of `total` bytes free, if below the
/// reserve.
fn refusal(free: u64, total: u64, what: &str) -> Option<CoreError> {
    let reserve = reserve_bytes(total);
    (free < reserve).then(|| CoreError::NoSpace {
        what: format!(
            "cannot {what}: {} MiB free, below the {} MiB kept in reserve; free disk space on the server's host (sandboxes keep running and keep what they wrote)",
            free >> 20,
            reserve >> 20
        ),
        source: None,
    })
}

/// Whether the state disk holding `state_dir` is below its reserve (a failure there is
/// then most likely for want of space).
pub fn below_reserve(state_dir: &Path) -> bool {
    space(state_dir).is_some_and(|(free, total)| free < reserve_bytes(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_five_percent_within_bounds() {
        assert_eq!(reserve_bytes(100 << 20), MIN_RESERVE);
        assert_eq!(reserve_bytes(20 << 30), 1 << 30);
        assert_eq!(reserve_bytes(10 << 40), MAX_RESERVE);
    }

    #[test]
    fn the_default_pool_is_half_the_free_space_in_whole_mib_at_most_64_gib() {
        assert_eq!(default_pool_bytes(1000 << 20, 2000 << 20), 500 << 20);
        assert_eq!(default_pool_bytes((3 << 20) + 5, 10 << 20), 1 << 20);
        assert_eq!(default_pool_bytes(1 << 40, 2 << 40), MAX_DEFAULT_POOL);
    }

    #[test]
    fn a_pool_must_leave_the_reserve() {
        let total = 2000u64 << 20;
        assert_eq!(pool_does_not_fit(1000 << 20, 1200 << 20, total), None);
        let why = pool_does_not_fit(1000 << 20, 1050 << 20, total).expect("does not fit");
        assert_eq!(
            why,
            "an ns disk pool of 1000 MiB does not fit: the state disk has 1050 MiB free and keeps 100 MiB of them in reserve (make it smaller with hutch serve --ns-disk-pool-gib, or free disk space)"
        );
    }

    #[test]
    fn below_the_reserve_new_work_is_no_space() {
        let total = 10u64 << 30;
        assert!(refusal(600 << 20, total, "create a sandbox").is_none());
        let e = refusal(3 << 20, total, "create a sandbox").expect("refused");
        assert!(matches!(e, CoreError::NoSpace { .. }));
        assert_eq!(
            e.to_string(),
            "no space on the server's state disk: cannot create a sandbox: 3 MiB free, below the 512 MiB kept in reserve; free disk space on the server's host (sandboxes keep running and keep what they wrote)"
        );
    }
}
