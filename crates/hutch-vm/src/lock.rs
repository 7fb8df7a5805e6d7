//! An exclusive `flock` on a lock file, held while a cached artifact is built so parallel
//! servers and creates build it once. Lock files are never deleted (deleting one while
//! another process waits on it would let two holders coexist).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Holds the lock until dropped (closing the file releases it).
#[derive(Debug)]
pub struct FileLock {
    _file: File,
}

impl FileLock {
    /// Take the exclusive lock on `path` if nobody holds it; `None` if someone does.
    pub fn try_exclusive(path: &Path) -> std::io::Result<Option<Self>> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        // SAFETY: flock takes an open fd and flags; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(Some(Self { _file: file }));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        Err(e)
    }

    /// Wait for and take the exclusive lock on `path` (created if missing). Blocking.
    pub fn exclusive(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        loop {
            // SAFETY: flock takes an open fd and a flag; no memory is passed.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(Self { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}
