//! [`S3ObjectStore`]: the [`ObjectStore`] of an S3-compatible server.
//!
//! Requests are presigned by `rusty-s3` (SigV4 in the query string, valid for
//! [`SIGNED_FOR`]) and sent by `reqwest`. Every request has a timeout ([`S3Options`]):
//! connecting, each small request as a whole, each uploaded part as a whole, and a download
//! between any two reads (a large GET has no total limit, a stalled one does).
//!
//! Uploads: the file is hashed first (the sha256 goes into `x-amz-meta-sha256` of the
//! object, so it must be known when the upload starts), then sent in one PUT up to the part
//! size, or as a multipart upload of part-size parts read one at a time (memory: one
//! part). The parts are hashed again as they go: a file that changed in between is
//! [`ObjectStoreError::ChangedDuringUpload`]. A multipart upload that fails is aborted.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use rusty_s3::actions::{CompleteMultipartUploadResponse, CreateMultipartUpload, ListObjectsV2};
use rusty_s3::{Bucket, S3Action, UrlStyle};
use tokio::io::AsyncReadExt;

mod answer;
mod config;

pub use config::{S3Credentials, S3Options};

use crate::checksum::{sha256_file, Hasher};
use crate::key::{check_key, check_prefix};
use crate::partial::PartialFile;
use crate::{ListedObject, ObjectInfo, ObjectStore, ObjectStoreError, S3Location};
use answer::{answer_error, transport, unreadable};

/// The smallest part S3 accepts (every part but the last).
pub const MIN_PART_SIZE: u64 = 5 * 1024 * 1024;
/// The part size by default (the AWS CLI's).
pub const DEFAULT_PART_SIZE: u64 = 8 * 1024 * 1024;
/// The most parts one upload may have.
const MAX_PARTS: u64 = 10_000;
/// How long a presigned request stays valid: it is sent at once, so this only has to cover
/// a clock skew between this host and the server.
const SIGNED_FOR: Duration = Duration::from_secs(15 * 60);
/// The user metadata that carries an object's sha256.
const SHA256_HEADER: &str = "x-amz-meta-sha256";

/// An S3 bucket (and prefix) as an [`ObjectStore`] (see the module docs).
pub struct S3ObjectStore {
    location: S3Location,
    bucket: Bucket,
    credentials: rusty_s3::Credentials,
    http: reqwest::Client,
    options: S3Options,
}

impl std::fmt::Debug for S3ObjectStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3ObjectStore")
            .field("location", &self.location)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl S3ObjectStore {
    /// A store of `location`, signing with `credentials`.
    pub fn new(
        location: S3Location,
        credentials: S3Credentials,
        options: S3Options,
    ) -> Result<Self, ObjectStoreError> {
        let bad = |reason: String| ObjectStoreError::BadUrl {
            url: location.to_string(),
            reason,
        };
        if options.part_size < MIN_PART_SIZE {
            return Err(bad(format!(
                "the part size {} is below S3's minimum of {MIN_PART_SIZE} bytes",
                options.part_size
            )));
        }
        let style = if location.path_style {
            UrlStyle::Path
        } else {
            UrlStyle::VirtualHost
        };
        let bucket = Bucket::new(
            location.endpoint.clone(),
            style,
            location.bucket.clone(),
            location.region.clone(),
        )
        .map_err(|e| bad(e.to_string()))?;
        let http = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            .read_timeout(options.read_timeout)
            // A presigned URL is for one host and path: a redirect could not be followed.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| bad(format!("the HTTP client: {e}")))?;
        Ok(Self {
            location,
            bucket,
            credentials: credentials.signing(),
            http,
            options,
        })
    }

    /// A store from an `s3://` URL (see [`crate::Location`]); `credentials`, or the
    /// standard environment variables without them.
    pub fn from_url(
        url: &str,
        credentials: Option<S3Credentials>,
        options: S3Options,
    ) -> Result<Self, ObjectStoreError> {
        let crate::Location::S3(location) = crate::Location::parse(url)? else {
            return Err(ObjectStoreError::BadUrl {
                url: url.to_string(),
                reason: "not an s3:// URL".to_string(),
            });
        };
        let credentials = match credentials {
            Some(c) => c,
            None => S3Credentials::from_env().ok_or(ObjectStoreError::NoCredentials)?,
        };
        Self::new(location, credentials, options)
    }

    /// Where this store's objects are.
    pub fn location(&self) -> &S3Location {
        &self.location
    }

    /// Send `req` (for `op` on `key`), mapping transport errors and non-2xx answers.
    async fn send(
        &self,
        op: &'static str,
        key: &str,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ObjectStoreError> {
        let resp = req.send().await.map_err(|e| transport(op, key, e))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = resp.text().await.unwrap_or_default();
        Err(answer_error(op, key, status.as_u16(), &body))
    }

    async fn put_small(
        &self,
        key: &str,
        full: &str,
        path: &Path,
        sha256: &str,
    ) -> Result<(), ObjectStoreError> {
        let data = tokio::fs::read(path)
            .await
            .map_err(|e| ObjectStoreError::io("read", path, e))?;
        let mut hasher = Hasher::default();
        hasher.update(&data);
        if hasher.finish().0 != sha256 {
            return Err(changed(key, path));
        }
        let mut action = self.bucket.put_object(Some(&self.credentials), full);
        action
            .headers_mut()
            .insert(SHA256_HEADER, sha256.to_string());
        let url = action.sign(SIGNED_FOR);
        let req = self
            .http
            .put(url)
            .header(SHA256_HEADER, sha256)
            .header(reqwest::header::CONTENT_LENGTH, data.len())
            .body(data)
            .timeout(self.options.part_timeout);
        self.send("PUT", key, req).await?;
        Ok(())
    }

    async fn put_multipart(
        &self,
        key: &str,
        full: &str,
        path: &Path,
        sha256: &str,
        bytes: u64,
    ) -> Result<(), ObjectStoreError> {
        let mut action = self
            .bucket
            .create_multipart_upload(Some(&self.credentials), full);
        action
            .headers_mut()
            .insert(SHA256_HEADER, sha256.to_string());
        let url = action.sign(SIGNED_FOR);
        let req = self
            .http
            .post(url)
            .header(SHA256_HEADER, sha256)
            .timeout(self.options.request_timeout);
        let body = self.send("PUT", key, req).await?;
        let body = body.text().await.map_err(|e| transport("PUT", key, e))?;
        let created = CreateMultipartUpload::parse_response(&body)
            .map_err(|e| unreadable("PUT", key, "CreateMultipartUpload", &e, &body))?;
        let upload_id = created.upload_id().to_string();
        match self
            .upload_parts(key, full, &upload_id, path, sha256, bytes)
            .await
        {
            Ok(()) => Ok(()),
            Err(e) => {
                self.abort(key, full, &upload_id).await;
                Err(e)
            }
        }
    }

    async fn upload_parts(
        &self,
        key: &str,
        full: &str,
        upload_id: &str,
        path: &Path,
        sha256: &str,
        bytes: u64,
    ) -> Result<(), ObjectStoreError> {
        let part_size = part_size_for(bytes, self.options.part_size);
        let mut file = tokio::fs::File::open(path)
            .await
            .map_err(|e| ObjectStoreError::io("open", path, e))?;
        let mut hasher = Hasher::default();
        let mut etags = Vec::new();
        loop {
            let part = read_part(&mut file, path, part_size).await?;
            if part.is_empty() {
                break;
            }
            if etags.len() as u64 >= MAX_PARTS {
                return Err(changed(key, path));
            }
            hasher.update(&part);
            let number = u16::try_from(etags.len() + 1).expect("at most 10,000 parts");
            let action = self
                .bucket
                .upload_part(Some(&self.credentials), full, number, upload_id);
            let url = action.sign(SIGNED_FOR);
            let len = part.len();
            let req = self
                .http
                .put(url)
                .header(reqwest::header::CONTENT_LENGTH, len)
                .body(Bytes::from(part))
                .timeout(self.options.part_timeout);
            let resp = self.send("PUT", key, req).await?;
            let etag = resp
                .headers()
                .get(reqwest::header::ETAG)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| ObjectStoreError::Rejected {
                    op: "PUT",
                    key: key.to_string(),
                    status: resp.status().as_u16(),
                    reason: format!("part {number} was answered without an ETag"),
                })?
                .to_string();
            tracing::debug!(key, part = number, bytes = len, "uploaded a part");
            etags.push(etag);
        }
        let (actual, hashed) = hasher.finish();
        if actual != sha256 || hashed != bytes {
            return Err(changed(key, path));
        }
        let action = self.bucket.complete_multipart_upload(
            Some(&self.credentials),
            full,
            upload_id,
            etags.iter().map(String::as_str),
        );
        let url = action.sign(SIGNED_FOR);
        // Completing can take S3 a while for a large object: the long timeout.
        let req = self
            .http
            .post(url)
            .body(action.body())
            .timeout(self.options.part_timeout);
        let resp = self.send("PUT", key, req).await?;
        let body = resp.text().await.map_err(|e| transport("PUT", key, e))?;
        // S3 may answer 200 and still fail: the body then holds an <Error>.
        if body.contains("<Error>") {
            return Err(answer_error("PUT", key, 200, &body));
        }
        CompleteMultipartUploadResponse::parse(&body)
            .map_err(|e| unreadable("PUT", key, "CompleteMultipartUpload", &e, &body))?;
        Ok(())
    }

    /// Abort a multipart upload, best effort (its parts are stored, and on AWS paid for,
    /// until it is completed or aborted; a bucket lifecycle rule is the backstop).
    async fn abort(&self, key: &str, full: &str, upload_id: &str) {
        let action = self
            .bucket
            .abort_multipart_upload(Some(&self.credentials), full, upload_id);
        let url = action.sign(SIGNED_FOR);
        let req = self.http.delete(url).timeout(self.options.request_timeout);
        match self.send("DELETE", key, req).await {
            Ok(_) => tracing::info!(key, upload_id, "aborted a failed multipart upload"),
            Err(e) => {
                tracing::warn!(key, upload_id, error = %e, "could not abort a multipart upload")
            }
        }
    }
}

#[async_trait::async_trait]
impl ObjectStore for S3ObjectStore {
    async fn put_file(&self, key: &str, path: &Path) -> Result<ObjectInfo, ObjectStoreError> {
        check_key(key)?;
        let full = self.location.full_key(key);
        let (sha256, bytes) = sha256_file(path).await?;
        if bytes <= self.options.part_size {
            self.put_small(key, &full, path, &sha256).await?;
        } else {
            self.put_multipart(key, &full, path, &sha256, bytes).await?;
        }
        tracing::info!(key, bytes, sha256, store = %self.location, "uploaded");
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
        let full = self.location.full_key(key);
        let url = self
            .bucket
            .get_object(Some(&self.credentials), &full)
            .sign(SIGNED_FOR);
        let mut resp = self.send("GET", key, self.http.get(url)).await?;
        let stored = header(&resp, SHA256_HEADER).map(|s| s.to_ascii_lowercase());
        let expected = match (expected_sha256, stored) {
            (Some(e), _) => e.to_ascii_lowercase(),
            (None, Some(s)) => s,
            (None, None) => {
                return Err(ObjectStoreError::NoChecksum {
                    key: key.to_string(),
                })
            }
        };
        let mut partial = PartialFile::beside(dest).await?;
        let mut hasher = Hasher::default();
        while let Some(chunk) = resp.chunk().await.map_err(|e| transport("GET", key, e))? {
            hasher.update(&chunk);
            partial.write_all(&chunk).await?;
        }
        let (actual, bytes) = hasher.finish();
        if actual != expected {
            // `partial` is dropped, and removed, on the way out.
            return Err(ObjectStoreError::ChecksumMismatch {
                key: key.to_string(),
                expected,
                actual,
            });
        }
        partial.persist(dest).await?;
        tracing::info!(key, bytes, dest = %dest.display(), "downloaded and verified");
        Ok(ObjectInfo {
            key: key.to_string(),
            bytes,
            sha256: actual,
        })
    }

    async fn head(&self, key: &str) -> Result<Option<ObjectInfo>, ObjectStoreError> {
        check_key(key)?;
        let full = self.location.full_key(key);
        let url = self
            .bucket
            .head_object(Some(&self.credentials), &full)
            .sign(SIGNED_FOR);
        let req = self.http.head(url).timeout(self.options.request_timeout);
        let resp = match self.send("HEAD", key, req).await {
            Ok(resp) => resp,
            Err(ObjectStoreError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let bytes = header(&resp, "content-length")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| ObjectStoreError::Rejected {
                op: "HEAD",
                key: key.to_string(),
                status: resp.status().as_u16(),
                reason: "no Content-Length in the answer".to_string(),
            })?;
        let sha256 = header(&resp, SHA256_HEADER)
            .map(|s| s.to_ascii_lowercase())
            .ok_or_else(|| ObjectStoreError::NoChecksum {
                key: key.to_string(),
            })?;
        Ok(Some(ObjectInfo {
            key: key.to_string(),
            bytes,
            sha256,
        }))
    }

    async fn delete(&self, key: &str) -> Result<(), ObjectStoreError> {
        check_key(key)?;
        let full = self.location.full_key(key);
        let url = self
            .bucket
            .delete_object(Some(&self.credentials), &full)
            .sign(SIGNED_FOR);
        let req = self.http.delete(url).timeout(self.options.request_timeout);
        match self.send("DELETE", key, req).await {
            Ok(_) | Err(ObjectStoreError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ListedObject>, ObjectStoreError> {
        check_prefix(prefix)?;
        let full_prefix = match &self.location.prefix {
            Some(p) => format!("{p}/{prefix}"),
            None => prefix.to_string(),
        };
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut action = self.bucket.list_objects_v2(Some(&self.credentials));
            if !full_prefix.is_empty() {
                action.with_prefix(full_prefix.as_str());
            }
            if let Some(t) = &token {
                action.with_continuation_token(t.as_str());
            }
            let url = action.sign(SIGNED_FOR);
            let req = self.http.get(url).timeout(self.options.request_timeout);
            let resp = self.send("LIST", prefix, req).await?;
            let body = resp
                .text()
                .await
                .map_err(|e| transport("LIST", prefix, e))?;
            let page = ListObjectsV2::parse_response(&body)
                .map_err(|e| unreadable("LIST", prefix, "ListObjectsV2", &e, &body))?;
            for object in page.contents {
                // Keys Hutch could not have written (a console's "folder" marker `dir/`,
                // say) are left out: no operation here would take them.
                let key = self.location.relative_key(&object.key);
                if let Some(key) = key.filter(|k| check_key(k).is_ok()) {
                    out.push(ListedObject {
                        key: key.to_string(),
                        bytes: object.size.unwrap_or(0),
                    });
                }
            }
            match page.next_continuation_token {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    fn describe(&self) -> String {
        self.location.to_string()
    }
}

/// The part size for a file of `bytes`: `wanted`, or larger (whole MiB) if `wanted` would
/// need more than 10,000 parts.
fn part_size_for(bytes: u64, wanted: u64) -> usize {
    const MIB: u64 = 1024 * 1024;
    let least = bytes.div_ceil(MAX_PARTS).div_ceil(MIB) * MIB;
    wanted.max(least) as usize
}

/// Up to `size` bytes from `file` (fewer only at its end; empty at its end).
async fn read_part(
    file: &mut tokio::fs::File,
    path: &Path,
    size: usize,
) -> Result<Vec<u8>, ObjectStoreError> {
    let mut buf = vec![0u8; size];
    let mut filled = 0;
    while filled < size {
        let n = file
            .read(&mut buf[filled..])
            .await
            .map_err(|e| ObjectStoreError::io("read", path, e))?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    buf.truncate(filled);
    Ok(buf)
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

fn changed(key: &str, path: &Path) -> ObjectStoreError {
    ObjectStoreError::ChangedDuringUpload {
        key: key.to_string(),
        path: path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_grow_only_past_ten_thousand() {
        assert_eq!(part_size_for(20 << 20, DEFAULT_PART_SIZE), 8 << 20);
        // 100 GiB in 8 MiB parts would be 12,800 of them: 11 MiB parts instead.
        assert_eq!(part_size_for(100 << 30, DEFAULT_PART_SIZE), 11 << 20);
    }
}
