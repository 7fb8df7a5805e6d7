//! Collecting cache entries nobody has used for a while.
//!
//! Every input change (a new agent build, a rebuilt template, a kernel update) makes new
//! cache entries and leaves the old ones behind: a boot directory, template images, and
//! bakes with a guest-RAM-sized memory file each; and a server whose state directory is
//! deleted without deleting its memory snapshots leaves their shared memory behind. Each use of an entry refreshes its
//! modification time ([`touch`]); [`collect`] deletes entries unused for longer than a
//! limit, skipping any whose lock is held (being built) and any the caller names as still
//! referenced (the bakes and images behind its sandboxes' disks, from the chains the host
//! recorded for them, never from an image's header: a hibernated sandbox or a snapshot may
//! not have touched them lately).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::lock::FileLock;

/// Entries unused for this long are deleted by [`collect`] at server start.
pub const MAX_UNUSED: Duration = Duration::from_secs(7 * 24 * 3600);

/// Note that the cache entry at `path` (a file or a directory) is in use now.
pub fn touch(path: &Path) {
    let touched = std::fs::File::open(path).and_then(|f| f.set_modified(SystemTime::now()));
    if let Err(e) = touched {
        tracing::debug!(path = %path.display(), error = %e, "marking a cache entry used");
    }
}

/// What [`collect`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Collected {
    /// Paths deleted.
    pub removed: Vec<PathBuf>,
}

/// Delete entries of the cache `dir` (`boot/`, `bakes/`, `images/`, `shared/`) not modified for
/// `max_unused`, except those in `keep` and those being built.
pub fn collect(dir: &Path, max_unused: Duration, keep: &HashSet<PathBuf>) -> Collected {
    let mut collected = Collected::default();
    let now = SystemTime::now();
    for sub in ["boot", "bakes", "images", "shared"] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".lock") || name.ends_with(".tmp") || keep.contains(&path) {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let age = meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .unwrap_or_default();
            if age < max_unused {
                continue;
            }
            // Images share one lock per template name; boot and bake entries have their own.
            let lock = match sub {
                "images" => name
                    .rsplit_once('-')
                    .map(|(template, _)| dir.join(sub).join(format!("{template}.lock"))),
                _ => Some(path.with_extension("lock")),
            };
            let _held = match lock.map(|l| FileLock::try_exclusive(&l)) {
                Some(Ok(Some(held))) => Some(held),
                Some(Ok(None)) => continue, // being built
                Some(Err(_)) | None => None,
            };
            let removed = if meta.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            match removed {
                Ok(()) => collected.removed.push(path),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "removing an unused cache entry")
                }
            }
        }
    }
    collected
}

#[cfg(test)]
mod tests {
    use super::*;

    fn age(path: &Path, by: Duration) {
        std::fs::File::open(path)
            .and_then(|f| f.set_modified(SystemTime::now() - by))
            .expect("set mtime");
    }

    #[test]
    fn removes_only_old_unkept_unlocked_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        for sub in [
            "boot/old",
            "boot/new",
            "bakes/old",
            "bakes/kept",
            "bakes/busy",
        ] {
            std::fs::create_dir_all(d.join(sub)).expect("mkdir");
        }
        std::fs::create_dir_all(d.join("images")).expect("mkdir");
        std::fs::write(d.join("images/base-1111.ext4"), b"x").expect("write");
        std::fs::write(d.join("bakes/old.lock"), b"").expect("write");
        let week = MAX_UNUSED + Duration::from_secs(60);
        for old in [
            "boot/old",
            "bakes/old",
            "bakes/kept",
            "bakes/busy",
            "images/base-1111.ext4",
        ] {
            age(&d.join(old), week);
        }
        let busy = FileLock::exclusive(&d.join("bakes/busy.lock")).expect("lock");
        let keep: HashSet<PathBuf> = [d.join("bakes/kept")].into();
        let got = collect(d, MAX_UNUSED, &keep);
        let mut removed: Vec<_> = got
            .removed
            .iter()
            .map(|p| p.strip_prefix(d).expect("inside").display().to_string())
            .collect();
        removed.sort();
        assert_eq!(removed, ["bakes/old", "boot/old", "images/base-1111.ext4"]);
        assert!(d.join("boot/new").exists() && d.join("bakes/kept").exists());
        assert!(d.join("bakes/busy").exists(), "an entry being built stays");
        assert!(
            d.join("bakes/old.lock").exists(),
            "lock files are never deleted"
        );
        drop(busy);
        touch(&d.join("bakes/busy"));
        assert!(
            collect(d, MAX_UNUSED, &keep).removed.is_empty(),
            "touched: in use"
        );
    }
}
