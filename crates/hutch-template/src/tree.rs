//! Whole-directory operations: deleting a tree without ever crossing a mount point, and
//! measuring its disk usage.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::error::{IoContext, Result, TemplateError};
use crate::mounts;

/// Deletes `path` and everything below it. Mounts below it are unmounted first; the walk
/// never follows symlinks and refuses to descend into a directory on another device, so
/// nothing outside the tree can be deleted. A missing `path` is not an error.
pub(crate) fn remove_tree(path: &Path) -> Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(TemplateError::io("inspecting", path, e)),
    };
    if !meta.is_dir() {
        return ignore_not_found(fs::remove_file(path)).at("deleting", path);
    }
    let real = fs::canonicalize(path).at("resolving", path)?;
    mounts::unmount_all_under(&real)?;
    remove_contents(&real, &real, meta.dev())?;
    ignore_not_found(fs::remove_dir(&real)).at("deleting directory", &real)
}

/// Deletes everything inside `dir`, which lies in the tree rooted at `root` on device `dev`.
fn remove_contents(root: &Path, dir: &Path, dev: u64) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(TemplateError::io("listing directory", dir, e)),
    };
    for entry in entries {
        let entry = entry.at("listing directory", dir)?;
        let path = entry.path();
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(TemplateError::io("inspecting", &path, e)),
        };
        if meta.is_dir() {
            if meta.dev() != dev {
                return Err(TemplateError::StillMounted {
                    dir: root.to_path_buf(),
                    mount: path,
                });
            }
            remove_contents(root, &path, dev)?;
            ignore_not_found(fs::remove_dir(&path)).at("deleting directory", &path)?;
        } else {
            ignore_not_found(fs::remove_file(&path)).at("deleting", &path)?;
        }
    }
    Ok(())
}

/// Treats "already gone" as success.
fn ignore_not_found(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Disk usage of the tree at `dir` in bytes (allocated blocks, hard links counted once,
/// other file systems mounted inside skipped).
pub(crate) fn disk_usage(dir: &Path) -> Result<u64> {
    let meta = fs::symlink_metadata(dir).at("inspecting", dir)?;
    let mut seen = HashSet::new();
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        total += usage_of_contents(dir, meta.dev(), &mut seen)?;
    }
    Ok(total)
}

/// Disk usage of everything inside `dir`.
fn usage_of_contents(dir: &Path, dev: u64, seen: &mut HashSet<(u64, u64)>) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir).at("listing directory", dir)? {
        let entry = entry.at("listing directory", dir)?;
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).at("inspecting", &path)?;
        if meta.dev() != dev {
            continue;
        }
        if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        total += meta.blocks() * 512;
        if meta.is_dir() {
            total += usage_of_contents(&path, dev, seen)?;
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn removes_a_tree_without_following_symlinks() {
        let outside = tempfile::tempdir().expect("tempdir");
        let keep = outside.path().join("keep");
        fs::write(&keep, b"host file").expect("write");

        let scratch = tempfile::tempdir().expect("tempdir");
        let tree = scratch.path().join("tree");
        fs::create_dir_all(tree.join("a/b")).expect("mkdir");
        fs::write(tree.join("a/b/file"), b"x").expect("write");
        std::os::unix::fs::symlink(outside.path(), tree.join("a/link")).expect("symlink");
        fs::hard_link(tree.join("a/b/file"), tree.join("hard")).expect("link");

        assert!(disk_usage(&tree).expect("usage") > 0);
        remove_tree(&tree).expect("removed");
        assert!(!tree.exists());
        assert!(
            keep.exists(),
            "the symlink target outside the tree must survive"
        );
        remove_tree(&tree).expect("removing a missing tree is fine");
    }

    /// Mounts a tmpfs inside the tree (needs root; skipped otherwise) and checks that the
    /// walk alone refuses to cross it, and that [`remove_tree`] unmounts it first.
    #[test]
    fn never_deletes_through_a_mount() {
        let scratch = tempfile::tempdir().expect("tempdir");
        let tree = scratch.path().join("tree");
        let mnt = tree.join("rootfs/proc");
        fs::create_dir_all(&mnt).expect("mkdir");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "hutch-test", &mnt.display().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipping: cannot mount tmpfs (not root?)");
            return;
        }
        fs::write(mnt.join("inside-mount"), b"x").expect("write");
        let real = fs::canonicalize(&tree).expect("canonical");
        let dev = fs::metadata(&real).expect("stat").dev();

        let err = remove_contents(&real, &real, dev).expect_err("must refuse");
        assert!(matches!(err, TemplateError::StillMounted { .. }), "{err}");
        assert!(
            mnt.join("inside-mount").exists(),
            "nothing deleted through the mount"
        );

        remove_tree(&tree).expect("unmounts then removes");
        assert!(!tree.exists());
        assert!(mounts::mounts_under(&real).expect("mountinfo").is_empty());
    }
}
