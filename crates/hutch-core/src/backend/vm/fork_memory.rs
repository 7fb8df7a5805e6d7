//! Where a fork's snapshot keeps its shared memory: a tmpfs of the server's own, mounted at
//! `<state>/fork-memory` with transparent huge pages (`huge=always`).
//!
//! The loading QEMU touches every page of the guest's RAM: QEMU 7.2 reads each page the
//! stream says is zero before deciding not to write it, and on tmpfs that read already
//! allocates the page. With 4 KiB pages that is 65,536 faults for a 256 MiB guest (about
//! 13 µs each here); with 2 MiB pages, 128. Children map the file copy-on-write as before: a
//! child's write copies 4 KiB, the pages it does not write stay one copy.
//!
//! The mount is made on the first fork and kept while any fork's memory is in it (running
//! children outlive a server restart); the server unmounts it at shutdown once it is empty.
//! Where it cannot be mounted, `/dev/shm/hutch-fork-memory` (4 KiB pages) is used instead.
//!
//! It also holds a copy of each bake's memory file that a fork's parent was restored from
//! ([`VmBackend::bake_mirror`]), read when a fork copies its parent's RAM (`capture.rs`).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::VmBackend;

/// The fallback: the host's `/dev/shm`.
pub(super) const FALLBACK_DIR: &str = "/dev/shm/hutch-fork-memory";

/// Name prefix of bake memory mirrors in the fork memory tmpfs ([`VmBackend::bake_mirror`]).
const MIRROR_PREFIX: &str = "bake-";

/// Serializes the making of bake mirrors ([`VmBackend::bake_mirror`]).
static MIRRORING: Mutex<()> = Mutex::new(());

/// Serializes the mount (two forks at once must not stack two mounts).
static MOUNTING: Mutex<()> = Mutex::new(());

impl VmBackend {
    /// The server's own huge-page tmpfs for fork memory.
    fn fork_memory_mount(&self) -> PathBuf {
        self.cfg.state_dir.join("fork-memory")
    }

    /// The directories fork memory may live in (for checks before deleting).
    pub(super) fn fork_memory_dirs(&self) -> [PathBuf; 2] {
        [self.fork_memory_mount(), PathBuf::from(FALLBACK_DIR)]
    }

    /// The directory for a new fork's shared memory: the huge-page tmpfs, mounted now if it
    /// is not yet, else the fallback.
    pub(super) fn fork_memory_dir(&self) -> PathBuf {
        let dir = self.fork_memory_mount();
        let _guard = MOUNTING.lock().unwrap_or_else(|p| p.into_inner());
        match hutch_jail::volume::is_mounted(&dir) {
            Ok(true) => return dir,
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "reading the mount table"),
        }
        match mount_huge_tmpfs(&dir) {
            Ok(()) => dir,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot mount a huge-page tmpfs for fork memory; using {FALLBACK_DIR}");
                PathBuf::from(FALLBACK_DIR)
            }
        }
    }

    /// Whether `dir` is in the huge-page tmpfs (its memory file is then mapped 2 MiB-aligned).
    pub(super) fn on_fork_memory(&self, dir: &Path) -> bool {
        dir.starts_with(self.fork_memory_mount())
    }

    /// A copy of the bake memory file `original` (as it is now) on the huge-page tmpfs, made
    /// now if there is none (`hutch_vm::capture::mirror_memory_file`): a fork reads the pages its parent
    /// has not written from there rather than from the bake's 4 KiB page cache, which is an
    /// order of magnitude slower to read here. `None` where there is no huge-page tmpfs.
    pub(super) fn bake_mirror(&self, original: &Path) -> Option<PathBuf> {
        let dir = self.fork_memory_dir();
        if !self.on_fork_memory(&dir) {
            return None;
        }
        // `<bakes>/<key>/memory` → `<fork-memory>/bake-<key>-<inode>-<mtime>`: a bake made
        // again under the same key (its cache entry deleted meanwhile) is another file with
        // other content, so it gets a mirror of its own.
        let key = original.parent()?.file_name()?.to_str()?;
        let meta = std::fs::metadata(original).ok()?;
        use std::os::unix::fs::MetadataExt;
        let mirror = dir.join(format!(
            "{MIRROR_PREFIX}{key}-{}-{}.{}",
            meta.ino(),
            meta.mtime(),
            meta.mtime_nsec()
        ));
        // One copy at a time: two forks of the same bake would write the same file.
        let _guard = MIRRORING.lock().unwrap_or_else(|p| p.into_inner());
        if mirror.is_file() {
            return Some(mirror);
        }
        let t0 = std::time::Instant::now();
        let tmp = dir.join(format!("{MIRROR_PREFIX}{key}.{}.tmp", std::process::id()));
        match hutch_vm::capture::mirror_memory_file(original, &tmp).and_then(|bytes| {
            std::fs::rename(&tmp, &mirror)
                .map(|()| bytes)
                .map_err(|source| hutch_vm::VmError::Io {
                    what: format!("rename {}", tmp.display()),
                    source,
                })
        }) {
            Ok(bytes) => {
                tracing::debug!(mirror = %mirror.display(), mib = bytes >> 20, ms = t0.elapsed().as_millis() as u64, "bake memory mirrored for forks");
                Some(mirror)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                tracing::warn!(error = %e, "mirroring the bake memory for forks");
                None
            }
        }
    }

    /// Unmount the fork memory tmpfs if no fork's memory is in it (server shutdown); the
    /// bake mirrors in it are only caches.
    pub fn release_fork_memory(&self) {
        let dir = self.fork_memory_mount();
        let _guard = MOUNTING.lock().unwrap_or_else(|p| p.into_inner());
        if !matches!(hutch_jail::volume::is_mounted(&dir), Ok(true)) {
            return;
        }
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name();
            if name.to_string_lossy().starts_with(MIRROR_PREFIX) && entry.path().is_file() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let empty = std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_none());
        if !empty {
            return;
        }
        if let Err(e) = unmount(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "unmounting the fork memory tmpfs");
        } else {
            let _ = std::fs::remove_dir(&dir);
        }
    }
}

fn c_path(path: &Path) -> std::io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
}

fn mount_huge_tmpfs(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let target = c_path(dir)?;
    // SAFETY: valid NUL-terminated strings that outlive the call.
    let ret = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NODEV | libc::MS_NOSUID | libc::MS_NOEXEC,
            c"mode=0755,huge=always".as_ptr().cast(),
        )
    };
    if ret != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn unmount(dir: &Path) -> std::io::Result<()> {
    let target = c_path(dir)?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(target.as_ptr(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
