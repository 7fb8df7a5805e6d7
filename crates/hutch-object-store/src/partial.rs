//! A file being written that becomes visible only when complete: created (exclusively)
//! under a temporary name in a directory on the same filesystem as its destination, synced,
//! then renamed onto the destination in one step. Dropped before that, it is removed, so an
//! error (a checksum mismatch, a lost connection, a cancelled task) leaves nothing behind.

use std::path::{Path, PathBuf};

use tokio::io::AsyncWriteExt;

use crate::ObjectStoreError;

/// See the module docs.
pub(crate) struct PartialFile {
    path: PathBuf,
    file: Option<tokio::fs::File>,
}

impl PartialFile {
    /// A new file `.NAME.RANDOM.partial` in `dir` (`name`: what it will become, for people
    /// reading the directory).
    pub(crate) async fn create_in(dir: &Path, name: &str) -> Result<Self, ObjectStoreError> {
        let mut random = [0u8; 8];
        getrandom::fill(&mut random).map_err(|e| {
            ObjectStoreError::io(
                "make a temporary name in",
                dir,
                std::io::Error::other(e.to_string()),
            )
        })?;
        let path = dir.join(format!(".{name}.{}.partial", crate::checksum::hex(&random)));
        let file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .await
            .map_err(|e| ObjectStoreError::io("create", &path, e))?;
        Ok(Self {
            path,
            file: Some(file),
        })
    }

    /// A new file beside `dest`, to be renamed onto it.
    pub(crate) async fn beside(dest: &Path) -> Result<Self, ObjectStoreError> {
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "download".to_string());
        Self::create_in(dir, &name).await
    }

    pub(crate) async fn write_all(&mut self, data: &[u8]) -> Result<(), ObjectStoreError> {
        let file = self.file.as_mut().expect("the file is open until persist");
        file.write_all(data)
            .await
            .map_err(|e| ObjectStoreError::io("write", &self.path, e))
    }

    /// Sync the bytes to disk and rename the file onto `dest` (replacing it).
    pub(crate) async fn persist(mut self, dest: &Path) -> Result<(), ObjectStoreError> {
        let mut file = self.file.take().expect("the file is open until persist");
        file.flush()
            .await
            .map_err(|e| ObjectStoreError::io("write", &self.path, e))?;
        file.sync_all()
            .await
            .map_err(|e| ObjectStoreError::io("sync", &self.path, e))?;
        drop(file);
        tokio::fs::rename(&self.path, dest)
            .await
            .map_err(|e| ObjectStoreError::io("rename into place", dest, e))?;
        // Renamed: nothing left to remove.
        self.path = PathBuf::new();
        Ok(())
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
