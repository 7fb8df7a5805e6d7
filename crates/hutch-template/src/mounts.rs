//! Finding and undoing mounts inside a directory before it is deleted.
//!
//! `debootstrap` mounts `/proc` and `/sys` (and sometimes binds `/dev`) inside its target
//! and only unmounts them if it exits normally. Deleting through such a mount would delete
//! host files, so every recursive delete first calls [`unmount_all_under`].

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result, TemplateError};
use hutch_jail::mountinfo::unescape;

use crate::sys;

/// How many passes over `/proc/self/mountinfo` are made before giving up; each pass
/// unmounts one layer of stacked mounts.
const MAX_PASSES: usize = 16;

/// Mount points at or below `dir` in this process's mount namespace, deepest first.
/// `dir` must be absolute and free of symlinks (see [`fs::canonicalize`]).
pub(crate) fn mounts_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let path = Path::new("/proc/self/mountinfo");
    let text = fs::read_to_string(path).at("reading", path)?;
    Ok(mounts_under_in(&text, dir))
}

/// [`mounts_under`] over the given `mountinfo` text.
fn mounts_under_in(mountinfo: &str, dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape(field)))
        .filter(|mount_point| mount_point.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

/// Unmounts everything mounted at or below `dir`, deepest first, lazily if a mount is
/// busy, until `mountinfo` shows nothing there. Errors with [`TemplateError::StillMounted`]
/// if a mount survives.
pub(crate) fn unmount_all_under(dir: &Path) -> Result<()> {
    for _ in 0..MAX_PASSES {
        let mounts = mounts_under(dir)?;
        if mounts.is_empty() {
            return Ok(());
        }
        for mount in mounts {
            tracing::warn!(mount = %mount.display(), "unmounting leftover mount in a template build");
            if sys::unmount(&mount, false).is_err() {
                // Busy or already gone; a lazy unmount detaches it from the tree at once.
                if let Err(e) = sys::unmount(&mount, true) {
                    tracing::debug!(mount = %mount.display(), error = %e, "lazy unmount failed");
                }
            }
        }
    }
    match mounts_under(dir)?.into_iter().next() {
        None => Ok(()),
        Some(mount) => Err(TemplateError::StillMounted {
            dir: dir.to_path_buf(),
            mount,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:5 / /srv/t/.build-base-00/rootfs/proc rw - proc proc rw
41 22 0:6 / /srv/t/.build-base-00/rootfs/proc/sys/fs/binfmt_misc rw - binfmt_misc b rw
42 22 0:7 / /srv/t/.build-base-00/rootfs/sys rw - sysfs sysfs rw
43 22 0:8 / /srv/t/.build-base-001/rootfs/sys rw - sysfs sysfs rw
44 22 0:9 / /srv/t/with\\040space rw - tmpfs tmpfs rw
";

    #[test]
    fn finds_mounts_under_a_directory_deepest_first() {
        let found = mounts_under_in(SAMPLE, Path::new("/srv/t/.build-base-00"));
        assert_eq!(
            found,
            vec![
                PathBuf::from("/srv/t/.build-base-00/rootfs/proc/sys/fs/binfmt_misc"),
                PathBuf::from("/srv/t/.build-base-00/rootfs/proc"),
                PathBuf::from("/srv/t/.build-base-00/rootfs/sys"),
            ]
        );
    }

    #[test]
    fn unescapes_octal_sequences() {
        assert_eq!(unescape("/srv/t/with\\040space"), "/srv/t/with space");
        assert_eq!(unescape("/a\\134b"), "/a\\b");
        assert_eq!(unescape("/trailing\\04"), "/trailing\\04");
        let found = mounts_under_in(SAMPLE, Path::new("/srv/t/with space"));
        assert_eq!(found, vec![PathBuf::from("/srv/t/with space")]);
    }
}
