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

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::VmBackend;

/// The fallback: the host's `/dev/shm`.
pub(super) const FALLBACK_DIR: &str = "/dev/shm/hutch-fork-memory";

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

    /// Unmount the fork memory tmpfs if no fork's memory is in it (server shutdown).
    pub fn release_fork_memory(&self) {
        let dir = self.fork_memory_mount();
        let _guard = MOUNTING.lock().unwrap_or_else(|p| p.into_inner());
        if !matches!(hutch_jail::volume::is_mounted(&dir), Ok(true)) {
            return;
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
