//! [`FsObjectStore`]: the [`ObjectStore`] of a directory, for a single host or a filesystem
//! every host mounts (NFS, CephFS).
//!
//! Layout under the root:
//!
//! ```text
//! objects/KEY        the bytes (KEY's `/` are directories)
//! meta/KEY.json      {"version": 1, "sha256": "...", "bytes": N}
//! tmp/               files being written, renamed into objects/ and meta/ when complete
//! ```
//!
//! Writes go to `tmp/` and are renamed into place (atomic on one filesystem): a reader
//! never sees half an object. The bytes are renamed before the metadata, so a reader racing
//! a replacement sees the new bytes with the old sha256 (or the reverse) and fails its
//! checksum rather than taking the wrong bytes. A key and a key under it (`a` and `a/b`)
//! cannot both exist here (a file cannot be a directory), unlike on S3.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use crate::checksum::Hasher;
use crate::key::{check_key, check_prefix};
use crate::partial::PartialFile;
use crate::{ListedObject, ObjectInfo, ObjectStore, ObjectStoreError};

/// The version of the metadata files.
const META_VERSION: u32 = 1;
/// How much is copied at a time.
const COPY_CHUNK: usize = 256 * 1024;

/// A directory as an [`ObjectStore`] (see the module docs).
#[derive(Debug)]
pub struct FsObjectStore {
    root: PathBuf,
}

/// The metadata file of one object.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Meta {
    version: u32,
    sha256: String,
    bytes: u64,
}

impl FsObjectStore {
    /// The store under `root`, which must exist (a missing root is more likely an
    /// unmounted shared filesystem than a directory to make); its `objects/`, `meta/` and
    /// `tmp/` are made if missing.
    pub fn open(root: &Path) -> Result<Self, ObjectStoreError> {
        if !root.is_absolute() {
            return Err(ObjectStoreError::BadUrl {
                url: root.display().to_string(),
                reason: "the directory must be an absolute path".to_string(),
            });
        }
        let meta = std::fs::metadata(root).map_err(|e| ObjectStoreError::io("open", root, e))?;
        if !meta.is_dir() {
            return Err(ObjectStoreError::io(
                "open",
                root,
                std::io::Error::other("not a directory"),
            ));
        }
        for sub in ["objects", "meta", "tmp"] {
            let dir = root.join(sub);
            std::fs::create_dir_all(&dir).map_err(|e| ObjectStoreError::io("create", &dir, e))?;
        }
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    fn object_path(&self, key: &str) -> PathBuf {
        self.root.join("objects").join(key)
    }

    fn meta_path(&self, key: &str) -> PathBuf {
        self.root.join("meta").join(format!("{key}.json"))
    }

    async fn read_meta(&self, key: &str) -> Result<Option<Meta>, ObjectStoreError> {
        let path = self.meta_path(key);
        let text = match tokio::fs::read(&path).await {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ObjectStoreError::io("read", &path, e)),
        };
        let meta: Meta = serde_json::from_slice(&text).map_err(|e| {
            ObjectStoreError::io("parse", &path, std::io::Error::other(e.to_string()))
        })?;
        if meta.version != META_VERSION {
            return Err(ObjectStoreError::io(
                "parse",
                &path,
                std::io::Error::other(format!("metadata version {}", meta.version)),
            ));
        }
        Ok(Some(meta))
    }

    /// A partial file in `tmp/`.
    async fn partial(&self, key: &str) -> Result<PartialFile, ObjectStoreError> {
        let name = key.rsplit('/').next().unwrap_or(key);
        PartialFile::create_in(&self.root.join("tmp"), name).await
    }
}

/// Make the parent directories of `path`.
async fn make_parent(path: &Path) -> Result<(), ObjectStoreError> {
    if let Some(parent) = path.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| ObjectStoreError::io("create", parent, e))?;
    }
    Ok(())
}

/// Copy `from` into `to` while hashing it.
async fn copy_hashing(
    from: &Path,
    to: &mut PartialFile,
    not_found_key: Option<&str>,
) -> Result<(String, u64), ObjectStoreError> {
    let mut src = match tokio::fs::File::open(from).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && not_found_key.is_some() => {
            return Err(ObjectStoreError::NotFound {
                key: not_found_key.unwrap_or_default().to_string(),
            })
        }
        Err(e) => return Err(ObjectStoreError::io("open", from, e)),
    };
    let mut hasher = Hasher::default();
    let mut buf = vec![0u8; COPY_CHUNK];
    loop {
        let n = src
            .read(&mut buf)
            .await
            .map_err(|e| ObjectStoreError::io("read", from, e))?;
        if n == 0 {
            return Ok(hasher.finish());
        }
        hasher.update(&buf[..n]);
        to.write_all(&buf[..n]).await?;
    }
}

#[async_trait::async_trait]
impl ObjectStore for FsObjectStore {
    async fn put_file(&self, key: &str, path: &Path) -> Result<ObjectInfo, ObjectStoreError> {
        check_key(key)?;
        let mut data = self.partial(key).await?;
        let (sha256, bytes) = copy_hashing(path, &mut data, None).await?;
        let mut meta = self.partial(key).await?;
        let json = serde_json::to_vec(&Meta {
            version: META_VERSION,
            sha256: sha256.clone(),
            bytes,
        })
        .expect("the metadata serializes");
        meta.write_all(&json).await?;
        let object_path = self.object_path(key);
        let meta_path = self.meta_path(key);
        make_parent(&object_path).await?;
        make_parent(&meta_path).await?;
        data.persist(&object_path).await?;
        meta.persist(&meta_path).await?;
        tracing::info!(key, bytes, sha256, root = %self.root.display(), "stored");
        Ok(ObjectInfo {
            key: key.to_string(),
            bytes,
            sha256,
        })
    }

    async fn get_to_file(
        &self,
        key: &str,
        dest: &Path,
        expected_sha256: Option<&str>,
    ) -> Result<ObjectInfo, ObjectStoreError> {
        check_key(key)?;
        let stored = self.read_meta(key).await?;
        let mut partial = PartialFile::beside(dest).await?;
        let (actual, bytes) = copy_hashing(&self.object_path(key), &mut partial, Some(key)).await?;
        let expected = match (expected_sha256, stored) {
            (Some(e), _) => e.to_ascii_lowercase(),
            (None, Some(m)) => m.sha256,
            (None, None) => {
                return Err(ObjectStoreError::NoChecksum {
                    key: key.to_string(),
                })
            }
        };
        if actual != expected {
            return Err(ObjectStoreError::ChecksumMismatch {
                key: key.to_string(),
                expected,
                actual,
            });
        }
        partial.persist(dest).await?;
        Ok(ObjectInfo {
            key: key.to_string(),
            bytes,
            sha256: actual,
        })
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectInfo>, ObjectStoreError> {
        check_key(key)?;
        let path = self.object_path(key);
        let bytes = match tokio::fs::metadata(&path).await {
            Ok(m) if m.is_file() => m.len(),
            Ok(_) => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ObjectStoreError::io("stat", &path, e)),
        };
        let meta = self
            .read_meta(key)
            .await?
            .ok_or_else(|| ObjectStoreError::NoChecksum {
                key: key.to_string(),
            })?;
        Ok(Some(ObjectInfo {
            key: key.to_string(),
            bytes,
            sha256: meta.sha256,
        }))
    }

    async fn delete(&self, key: &str) -> Result<(), ObjectStoreError> {
        check_key(key)?;
        for path in [self.meta_path(key), self.object_path(key)] {
            match tokio::fs::remove_file(&path).await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(ObjectStoreError::io("remove", &path, e)),
            }
        }
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ListedObject>, ObjectStoreError> {
        check_prefix(prefix)?;
        let objects = self.root.join("objects");
        let prefix = prefix.to_string();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            walk(&objects, "", &prefix, &mut out)?;
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(out)
        })
        .await
        .expect("the listing task does not panic")
    }

    fn describe(&self) -> String {
        format!("file://{}", self.root.display())
    }
}

/// Every file under `dir` (whose key so far is `at`) with a key starting with `prefix`.
fn walk(
    dir: &Path,
    at: &str,
    prefix: &str,
    out: &mut Vec<ListedObject>,
) -> Result<(), ObjectStoreError> {
    let entries = std::fs::read_dir(dir).map_err(|e| ObjectStoreError::io("list", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| ObjectStoreError::io("list", dir, e))?;
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let key = if at.is_empty() {
            name
        } else {
            format!("{at}/{name}")
        };
        // Skip whole directories that cannot hold a match.
        let dir_key = format!("{key}/");
        if !(key.starts_with(prefix) || prefix.starts_with(&dir_key)) {
            continue;
        }
        let kind = entry
            .file_type()
            .map_err(|e| ObjectStoreError::io("list", entry.path(), e))?;
        if kind.is_dir() {
            walk(&entry.path(), &key, prefix, out)?;
        } else if kind.is_file() && key.starts_with(prefix) && check_key(&key).is_ok() {
            let bytes = entry
                .metadata()
                .map_err(|e| ObjectStoreError::io("stat", entry.path(), e))?
                .len();
            out.push(ListedObject { key, bytes });
        }
    }
    Ok(())
}
