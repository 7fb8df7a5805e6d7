//! Object storage of cluster mode (`docs/object-store.md`): hibernated sandboxes, named
//! snapshots and template bakes move between hosts through an S3-compatible store (MinIO,
//! Ceph RGW, Garage, a cloud bucket), or a directory for a single host or a shared
//! filesystem.
//!
//! - [`ObjectStore`], the one trait, object-safe: `put_file` (multipart above the part
//!   size, sha256 stored with the object), `get_to_file` (streamed to a temporary file
//!   beside the destination, verified, renamed into place), `head`, `delete`, `list`.
//! - [`S3ObjectStore`], for `s3://BUCKET[/PREFIX]?endpoint=...&region=...&path_style=...`,
//!   requests signed by `rusty-s3` and sent with `reqwest`.
//! - [`FsObjectStore`], for `file:///path`: atomic renames.
//! - [`UploadQueue`], for uploads that must not be lost while the store is down: one JSON file
//!   per job, retried with capped exponential backoff, resumed by the next process.
//! - [`open`], the store a URL names.
//!
//! Keys are checked before any request ([`check_key`]): visible ASCII, no `..`, no leading
//! `/`.

mod checksum;
mod error;
mod fs;
mod key;
mod location;
mod partial;
mod queue;
mod s3;

use std::path::Path;
use std::sync::Arc;

pub use checksum::sha256_file;
pub use error::ObjectStoreError;
pub use fs::FsObjectStore;
pub use key::{check_key, check_prefix, MAX_KEY_LEN};
pub use location::{Location, S3Location};
pub use queue::{CompletedUpload, OnUploaded, PendingUpload, QueueError, RetryPolicy, UploadQueue};
pub use s3::{S3Credentials, S3ObjectStore, S3Options, DEFAULT_PART_SIZE, MIN_PART_SIZE};

/// An object as the store has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Its key (relative to the store's prefix).
    pub key: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// The sha256 of its bytes, lowercase hex.
    pub sha256: String,
}

/// An object as a listing names it (a listing carries no metadata, so no sha256).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedObject {
    /// Its key (relative to the store's prefix).
    pub key: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// Object storage: the operations cluster mode needs, the same on S3 and on a directory.
///
/// Every operation checks its key first ([`check_key`]); a refused key is
/// [`ObjectStoreError::BadKey`] and sends no request.
#[async_trait::async_trait]
pub trait ObjectStore: Send + Sync + std::fmt::Debug {
    /// Upload the file at `path` under `key`, replacing what was there. The sha256 of the
    /// file is stored with the object; large files go up in parts, and a failed multipart
    /// upload is aborted.
    async fn put_file(&self, key: &str, path: &Path) -> Result<ObjectInfo, ObjectStoreError>;

    /// Download `key` to `dest`: streamed into a temporary file in `dest`'s directory, its
    /// sha256 checked against `expected_sha256` (or, when `None`, against the object's own
    /// metadata), then renamed onto `dest`. On any error, a mismatch included, no file is
    /// left (and `dest`, if it existed, is untouched).
    async fn get_to_file(
        &self,
        key: &str,
        dest: &Path,
        expected_sha256: Option<&str>,
    ) -> Result<ObjectInfo, ObjectStoreError>;

    /// The object under `key`, or `None` if there is none.
    async fn head(&self, key: &str) -> Result<Option<ObjectInfo>, ObjectStoreError>;

    /// Delete `key`; deleting a key that does not exist succeeds.
    async fn delete(&self, key: &str) -> Result<(), ObjectStoreError>;

    /// Every object whose key starts with `prefix` (`""` for all), sorted by key.
    async fn list(&self, prefix: &str) -> Result<Vec<ListedObject>, ObjectStoreError>;

    /// Where the objects are, for logs and messages (never with credentials).
    fn describe(&self) -> String;
}

/// The store `url` names: `s3://...` or `file:///...` (see [`Location::parse`]).
/// `credentials` are used for S3; without them, the standard environment variables are read.
pub fn open(
    url: &str,
    credentials: Option<S3Credentials>,
) -> Result<Arc<dyn ObjectStore>, ObjectStoreError> {
    match Location::parse(url)? {
        Location::S3(location) => {
            let credentials = match credentials {
                Some(c) => c,
                None => S3Credentials::from_env().ok_or(ObjectStoreError::NoCredentials)?,
            };
            Ok(Arc::new(S3ObjectStore::new(
                location,
                credentials,
                S3Options::default(),
            )?))
        }
        Location::Fs(root) => Ok(Arc::new(FsObjectStore::open(&root)?)),
    }
}
