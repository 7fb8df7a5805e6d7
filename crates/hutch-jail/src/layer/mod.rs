//! Read-only layers: a sandbox's writes turned into a directory that other sandboxes can stack
//! between their own upper directory and the template (filesystem snapshots and disk forks on
//! `ns`).
//!
//! # On-disk format of a layer
//!
//! A layer is a plain directory tree in overlayfs *lower layer* form, owned by **0-based ids**
//! exactly like a template (a file owned by uid 1000 inside the sandbox is owned by host uid
//! 1000 in the layer), so [`crate::spawn`] can bind it idmapped into any sandbox's uid range:
//! - regular files, directories, symlinks and FIFOs with their modes (setuid/setgid/sticky
//!   included), owners, access and modification times, `user.*`/`security.*` extended
//!   attributes (capability `rootid`s and POSIX ACL ids shifted like owners) and hard links
//!   within the layer;
//! - **whiteouts** (character devices 0/0, owned by 0:0) where the sandbox deleted something
//!   of the layers below;
//! - `trusted.overlay.opaque = "y"` on directories that hide everything below them.
//!
//! Other overlay bookkeeping (`trusted.overlay.origin`, `impure`, `uuid`) is dropped; sockets
//! and device files other than whiteouts are left out (a sandbox cannot create devices).
//! A layer holds host-root-owned setuid files when the sandbox made some: keep layers in a
//! directory only root can traverse (the manager uses mode 0700).
//!
//! # Building one
//!
//! [`export_layer`] reads a sandbox's upper directory (host ids `uid_base + n`), optionally on
//! top of the layer the sandbox was itself created from, and writes a new, self-contained
//! layer: the base layer is copied first and the upper directory merged onto it with
//! overlayfs's rules (a whiteout or a non-directory replaces what is below; an opaque
//! directory replaces a directory; a plain directory merges into one). A sandbox therefore
//! never needs more than one layer, however many snapshot-of-a-snapshot generations it has.
//!
//! The walk opens every directory relative to its parent's descriptor, never follows a
//! symlink, never leaves the source's filesystem, keeps two directory descriptors open at a
//! time (it climbs back through `..` and checks it arrived where it came from), and opens
//! regular files only after checking their type, so a hostile tree can neither redirect it
//! nor make it block on a FIFO. The caller freezes the sandbox while its upper directory is
//! read.

mod archive;
mod walk;
mod xattr;

pub use archive::{pack_layer, unpack_layer};

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::{teardown, JailError};

/// The overflow id (`nobody`): owner given to ids outside the sandbox's range.
pub(crate) const NOBODY: u32 = 65_534;

/// How host ids of the source map to the layer's 0-based ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdShift {
    /// First host id of the source's range.
    pub from: u32,
    /// Size of the range.
    pub count: u32,
}

impl IdShift {
    /// `id - from` inside the range, [`NOBODY`] outside it.
    pub fn map(&self, id: u32) -> u32 {
        match id.checked_sub(self.from) {
            Some(n) if n < self.count => n,
            _ => NOBODY,
        }
    }
}

/// What [`export_layer`] builds.
#[derive(Debug, Clone)]
pub struct LayerExport {
    /// The sandbox's upper directory (owned by host ids `uid_base + n`).
    pub upper: PathBuf,
    /// The layer the sandbox was created from, if any: the new layer is this one with `upper`
    /// merged onto it.
    pub base: Option<PathBuf>,
    /// The new layer's directory: must not exist; its parent must.
    pub dst: PathBuf,
    /// First host id of the sandbox's range.
    pub uid_base: u32,
    /// Size of the sandbox's range.
    pub uid_count: u32,
}

/// Counts of a layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayerStats {
    /// Regular files (hard links counted once).
    pub files: u64,
    /// Directories, the top one included.
    pub dirs: u64,
    /// Symlinks.
    pub symlinks: u64,
    /// Whiteouts (deletions of files of the layers below).
    pub whiteouts: u64,
    /// Bytes of regular files (hard links counted once).
    pub bytes: u64,
    /// Entries left out (sockets, device files).
    pub skipped: u64,
}

/// Build a new layer from a sandbox's upper directory (see the module docs). On error the
/// partial layer is removed.
pub fn export_layer(e: &LayerExport) -> Result<LayerStats, JailError> {
    if e.dst.symlink_metadata().is_ok() {
        return Err(JailError::InvalidSpec(format!(
            "layer {} already exists",
            e.dst.display()
        )));
    }
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&e.dst)
        .map_err(|err| JailError::Sys {
            op: format!("mkdir {}", e.dst.display()),
            source: err,
        })?;
    let built = (|| {
        let mut skipped = 0;
        if let Some(base) = &e.base {
            let identity = IdShift {
                from: 0,
                count: e.uid_count,
            };
            skipped += walk::merge(base, &e.dst, identity)?;
        }
        let shift = IdShift {
            from: e.uid_base,
            count: e.uid_count,
        };
        skipped += walk::merge(&e.upper, &e.dst, shift)?;
        let mut stats = layer_usage(&e.dst)?;
        stats.skipped = skipped;
        Ok(stats)
    })();
    if built.is_err() {
        if let Err(cleanup) = remove_layer(&e.dst) {
            tracing::error!(dir = %e.dst.display(), error = %cleanup, "removing a partial layer");
        }
    }
    built
}

/// What [`flatten_layer`] builds.
#[derive(Debug, Clone)]
pub struct LayerFlatten {
    /// The tree below (a template's root, 0-based ids).
    pub base: PathBuf,
    /// A layer to apply onto it (0-based ids, overlayfs lower-layer form).
    pub layer: PathBuf,
    /// The new tree's directory: must not exist; its parent must.
    pub dst: PathBuf,
}

/// Build a plain tree, `base` with `layer` applied as overlayfs would show it: a template's
/// root made of a template and a snapshot of a sandbox over it (Dockerfile builds). Whiteouts
/// delete and vanish, opaque directories hide what was below; owners (0-based, kept as
/// they are up to 65,534; others become `nobody`), modes, times, attributes and hard links
/// are copied as [`export_layer`] copies them, with the same walk that never follows a
/// symlink. On error the partial tree is removed.
pub fn flatten_layer(f: &LayerFlatten) -> Result<LayerStats, JailError> {
    if f.dst.symlink_metadata().is_ok() {
        return Err(JailError::InvalidSpec(format!(
            "{} already exists",
            f.dst.display()
        )));
    }
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&f.dst)
        .map_err(|err| JailError::Sys {
            op: format!("mkdir {}", f.dst.display()),
            source: err,
        })?;
    let identity = IdShift {
        from: 0,
        count: NOBODY + 1,
    };
    let built = (|| {
        let mut skipped = walk::merge_as(&f.base, &f.dst, identity, true)?;
        skipped += walk::merge_as(&f.layer, &f.dst, identity, true)?;
        let mut stats = layer_usage(&f.dst)?;
        stats.skipped = skipped;
        Ok(stats)
    })();
    if built.is_err() {
        if let Err(cleanup) = remove_layer(&f.dst) {
            tracing::error!(dir = %f.dst.display(), error = %cleanup, "removing a partial tree");
        }
    }
    built
}

/// Delete a layer (or any directory tree Hutch owns), refusing if anything is mounted beneath
/// it and never crossing into another filesystem. A missing directory is success.
pub fn remove_layer(dir: &Path) -> Result<(), JailError> {
    teardown::remove_tree_safely(dir)
}

/// Count what a directory tree holds (regular files by inode, so hard links count once),
/// without leaving its filesystem.
pub fn layer_usage(dir: &Path) -> Result<LayerStats, JailError> {
    walk::usage(dir)
}

#[cfg(test)]
mod tests;
