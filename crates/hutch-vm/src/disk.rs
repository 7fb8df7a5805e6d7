//! Disks: the ext4 image of a template and the qcow2 overlays stacked on it.
//!
//! A template's root directory becomes an ext4 image with `mkfs.ext4 -d` (no loop mount, no
//! privileges beyond reading the tree). The image is never written: the bake of a snapshot
//! boots on a qcow2 overlay of it, and every sandbox restored from that snapshot gets its
//! own qcow2 overlay of the bake's overlay (`qemu-img create -b`), deleted with the sandbox.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Why a disk could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// A tool is not installed.
    #[error("{tool} not found; install Debian's {package} package")]
    MissingTool {
        /// The program.
        tool: &'static str,
        /// The package that has it.
        package: &'static str,
    },
    /// A tool failed.
    #[error("{tool} failed ({status}): {stderr}")]
    Failed {
        /// The program.
        tool: &'static str,
        /// Its exit status.
        status: String,
        /// What it said.
        stderr: String,
    },
    /// Filesystem work around the images.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
}

fn run(tool: &'static str, package: &'static str, cmd: &mut Command) -> Result<(), DiskError> {
    let out = cmd.output().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => DiskError::MissingTool { tool, package },
        _ => DiskError::Io {
            what: format!("run {tool}"),
            source: e,
        },
    })?;
    if !out.status.success() {
        return Err(DiskError::Failed {
            tool,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Make an ext4 image of `size_mib` MiB at `out` holding the tree under `root` (ownership
/// and modes kept). Written to a temporary name and renamed, so `out` is always complete.
/// No journal: the image is read-only and every writer is a disposable overlay.
pub fn make_ext4(root: &Path, out: &Path, size_mib: u64) -> Result<(), DiskError> {
    let tmp = out.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let made = run(
        "mkfs.ext4",
        "e2fsprogs",
        Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-t",
                "ext4",
                "-O",
                "^has_journal",
                "-L",
                "hutch-root",
            ])
            .args(["-E", "root_owner=0:0,lazy_itable_init=0", "-m", "0", "-d"])
            .arg(root)
            .arg(&tmp)
            .arg(format!("{size_mib}M")),
    );
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, out).map_err(|source| DiskError::Io {
        what: format!("rename {} to {}", tmp.display(), out.display()),
        source,
    })
}

/// Create a qcow2 overlay at `out` backed by `backing` (of format `backing_format`,
/// `raw` or `qcow2`). Only changed clusters are stored in it.
pub fn make_overlay(backing: &Path, backing_format: &str, out: &Path) -> Result<(), DiskError> {
    run(
        "qemu-img",
        "qemu-utils",
        Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", backing_format, "-b"])
            .arg(backing)
            .arg(out),
    )
}

/// The backing file named in the header of the qcow2 image at `path`, if any.
pub fn qcow2_backing(path: &Path) -> Option<PathBuf> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let mut header = [0u8; 20];
    f.read_exact(&mut header).ok()?;
    if &header[..4] != b"QFI\xfb" {
        return None;
    }
    let offset = u64::from_be_bytes(header[8..16].try_into().ok()?);
    let size = u32::from_be_bytes(header[16..20].try_into().ok()?) as usize;
    if offset == 0 || size == 0 || size > 4096 {
        return None;
    }
    f.seek(SeekFrom::Start(offset)).ok()?;
    let mut name = vec![0u8; size];
    f.read_exact(&mut name).ok()?;
    Some(PathBuf::from(String::from_utf8(name).ok()?))
}

/// The virtual size (what the guest sees) in the header of the qcow2 image at `path`.
pub fn qcow2_virtual_size(path: &Path) -> Option<u64> {
    use std::io::Read;
    let mut header = [0u8; 32];
    std::fs::File::open(path)
        .ok()?
        .read_exact(&mut header)
        .ok()?;
    if &header[..4] != b"QFI\xfb" {
        return None;
    }
    Some(u64::from_be_bytes(header[24..32].try_into().ok()?))
}

/// Bytes used by the files under `root` (apparent sizes, hard links counted once), to
/// size an image. Does not follow symlinks or cross into other filesystems' mounts.
pub fn tree_bytes(root: &Path) -> Result<u64, DiskError> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![root.to_path_buf()];
    let dev = std::fs::symlink_metadata(root)
        .map_err(|source| DiskError::Io {
            what: format!("stat {}", root.display()),
            source,
        })?
        .dev();
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| DiskError::Io {
            what: format!("read {}", dir.display()),
            source,
        })?;
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != dev {
                continue;
            }
            if meta.is_dir() {
                total += 4096;
                stack.push(entry.path());
            } else if meta.nlink() <= 1 || seen.insert(meta.ino()) {
                total += meta.len().div_ceil(4096) * 4096;
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_and_overlay_of_a_tree() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("etc")).expect("mkdir");
        std::fs::write(root.join("etc/hostname"), b"hutch\n").expect("write");
        assert!(tree_bytes(&root).expect("size") >= 4096);
        let image = dir.path().join("root.ext4");
        match make_ext4(&root, &image, 16) {
            Err(DiskError::MissingTool { .. }) => return, // not a machine for this test
            other => other.expect("mkfs.ext4"),
        }
        assert_eq!(
            std::fs::metadata(&image).expect("image").len(),
            16 << 20,
            "sized as asked"
        );
        let overlay = dir.path().join("disk.qcow2");
        match make_overlay(&image, "raw", &overlay) {
            Err(DiskError::MissingTool { .. }) => return,
            other => other.expect("qemu-img"),
        }
        let head = std::fs::read(&overlay).expect("overlay");
        assert_eq!(&head[..4], b"QFI\xfb", "a qcow2 file");
        assert_eq!(qcow2_backing(&overlay), Some(image.clone()));
        assert_eq!(qcow2_backing(&image), None, "raw: no qcow2 header");
        assert_eq!(qcow2_virtual_size(&overlay), Some(16 << 20));
        assert_eq!(qcow2_virtual_size(&image), None);
    }

    #[test]
    fn a_missing_tree_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = make_ext4(&dir.path().join("nope"), &dir.path().join("x.ext4"), 16);
        assert!(err.is_err());
        assert!(!dir.path().join("x.tmp").exists());
    }
}
