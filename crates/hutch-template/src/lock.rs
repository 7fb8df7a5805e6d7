//! Per-template exclusive locks shared between processes.
//!
//! The lock is an `flock` on `<templates_dir>/.lock-<name>`. Lock files are never deleted
//! (deleting one while another process waits on it would let two holders coexist). `flock`
//! locks belong to an open file description, so two threads of one process exclude each
//! other too, and the kernel releases the lock when a holder dies.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result};
use crate::sys;

/// A held lock on one template name; released when dropped.
#[derive(Debug)]
pub(crate) struct TemplateLock {
    /// Keeps the locked open file description alive.
    _file: File,
}

impl TemplateLock {
    /// Path of the lock file for `name` in `dir`.
    pub(crate) fn path(dir: &Path, name: &str) -> PathBuf {
        dir.join(format!(".lock-{name}"))
    }

    /// Takes the lock for `name`, calling `on_wait` once before blocking if another holder
    /// has it.
    pub(crate) fn acquire(dir: &Path, name: &str, on_wait: impl FnOnce()) -> Result<Self> {
        let path = Self::path(dir, name);
        let file = open_lock_file(&path)?;
        match sys::flock_exclusive(file.as_fd(), false) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                on_wait();
                sys::flock_exclusive(file.as_fd(), true).at("locking", &path)?;
            }
            Err(e) => return Err(crate::TemplateError::io("locking", &path, e)),
        }
        Ok(Self { _file: file })
    }
}

/// A lock file, made if missing (never truncated: another holder may have it open).
fn open_lock_file(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .at("opening lock file", path)
}

/// The blob store's lock (`<templates_dir>/.lock-blobs`): pulls hold it shared while they
/// write and read blobs, the collector exclusively (and only when it is free).
#[derive(Debug)]
pub(crate) struct BlobLock {
    _file: File,
}

impl BlobLock {
    fn open(dir: &Path) -> Result<(File, PathBuf)> {
        let path = dir.join(".lock-blobs");
        Ok((open_lock_file(&path)?, path))
    }

    /// Held while a pull or an unpack uses the blobs.
    pub(crate) fn shared(dir: &Path) -> Result<Self> {
        let (file, path) = Self::open(dir)?;
        sys::flock_shared(file.as_fd()).at("locking", &path)?;
        Ok(Self { _file: file })
    }

    /// Held while blobs are collected; `None` when a pull holds the lock.
    pub(crate) fn try_exclusive(dir: &Path) -> Result<Option<Self>> {
        let (file, path) = Self::open(dir)?;
        match sys::flock_exclusive(file.as_fd(), false) {
            Ok(()) => Ok(Some(Self { _file: file })),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(crate::TemplateError::io("locking", &path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_waits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = TemplateLock::acquire(dir.path(), "t", || panic!("free lock")).expect("lock");
        let path = dir.path().to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let _second = TemplateLock::acquire(&path, "t", || {
                tx.send(()).expect("main thread listens");
            })
            .expect("lock");
        });
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .expect("the second holder reports that it waits");
        drop(first);
        waiter
            .join()
            .expect("the second holder gets the lock once the first is dropped");
    }
}
