//! [`BlobStore`]: image blobs stored once by digest, shared by every template.
//!
//! ```text
//! <dir>/sha256/<64 hex>     a verified blob (layer, config), 0600, never changed
//! <dir>/tmp/<16 hex>        a download in progress, renamed into sha256/ once verified
//! ```
//! `<dir>` and its subdirectories are 0700 (root only): layers hold set-uid programs and
//! private files of images. A blob appears under its digest only by a rename after its
//! sha256 matched, so a present blob is a verified one. Digests are parsed strictly
//! ([`Digest::parse`]) before they name a file.

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::error::{ImageError, IoContext, Result};

/// A sha256 content digest (`sha256:` and 64 lowercase hex digits).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Digest {
    /// The 64 hex digits.
    hex: String,
}

impl Digest {
    /// Parses `sha256:<64 lowercase hex>`; anything else (other algorithms, other lengths,
    /// `/` or `..`) is [`ImageError::InvalidDigest`].
    pub fn parse(text: &str) -> Result<Self> {
        let hex = text
            .strip_prefix("sha256:")
            .filter(|h| {
                h.len() == 64
                    && h.bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            })
            .ok_or_else(|| ImageError::InvalidDigest(text.to_owned()))?;
        Ok(Self {
            hex: hex.to_owned(),
        })
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// Twelve hex digits, for progress lines.
    pub fn short(&self) -> &str {
        &self.hex[..12]
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

/// The content-addressed blob directory.
#[derive(Debug, Clone)]
pub struct BlobStore {
    /// The directory.
    dir: PathBuf,
}

impl BlobStore {
    /// Opens (creating, 0700) the blob directory `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        for sub in [dir.clone(), dir.join("sha256"), dir.join("tmp")] {
            match fs::DirBuilder::new().mode(0o700).create(&sub) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(ImageError::io("creating directory", &sub, e)),
            }
            let meta = fs::symlink_metadata(&sub).at("inspecting", &sub)?;
            if !meta.is_dir() {
                return Err(ImageError::io(
                    "opening blob directory",
                    &sub,
                    std::io::Error::other("not a directory"),
                ));
            }
            if meta.permissions().mode() & 0o777 != 0o700 {
                fs::set_permissions(&sub, fs::Permissions::from_mode(0o700))
                    .at("setting mode of", &sub)?;
            }
        }
        Ok(Self { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the blob `digest` is (or would be).
    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.join("sha256").join(digest.hex())
    }

    /// Whether the blob `digest` is stored.
    pub fn contains(&self, digest: &Digest) -> bool {
        fs::symlink_metadata(self.path(digest)).is_ok_and(|m| m.is_file())
    }

    /// Starts writing the blob `digest`, which may be at most `max` bytes.
    pub(crate) fn begin(&self, digest: &Digest, max: u64) -> Result<BlobWriter> {
        let mut suffix = [0u8; 8];
        getrandom::fill(&mut suffix).map_err(|e| {
            ImageError::io(
                "naming a download in",
                self.dir.join("tmp"),
                std::io::Error::other(e.to_string()),
            )
        })?;
        let name: String = suffix.iter().map(|b| format!("{b:02x}")).collect();
        let tmp = self.dir.join("tmp").join(name);
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .at("creating", &tmp)?;
        Ok(BlobWriter {
            file: Some(file),
            tmp,
            target: self.path(digest),
            digest: digest.clone(),
            hasher: Sha256::new(),
            written: 0,
            max,
        })
    }
}

/// A blob being downloaded: hashed and size-checked as it is written; deleted unless
/// [`BlobWriter::commit`] succeeds.
pub(crate) struct BlobWriter {
    /// The temporary file (taken by `commit`).
    file: Option<File>,
    /// Its path.
    tmp: PathBuf,
    /// Where it goes once verified.
    target: PathBuf,
    /// What it must hash to.
    digest: Digest,
    /// Running hash.
    hasher: Sha256,
    /// Bytes so far.
    written: u64,
    /// Most bytes allowed.
    max: u64,
}

impl BlobWriter {
    /// Appends `chunk`, refusing to pass the size bound.
    pub(crate) fn write(&mut self, chunk: &[u8]) -> Result<()> {
        self.written += chunk.len() as u64;
        if self.written > self.max {
            return Err(ImageError::TooLarge {
                what: "blob",
                digest: self.digest.to_string(),
                limit: self.max,
            });
        }
        self.hasher.update(chunk);
        let file = self.file.as_mut().expect("file is present until commit");
        file.write_all(chunk).at("writing", &self.tmp)
    }

    /// Checks the digest, flushes the file and renames it into place.
    pub(crate) fn commit(mut self) -> Result<PathBuf> {
        let actual = format!("sha256:{:x}", std::mem::take(&mut self.hasher).finalize());
        if actual != self.digest.to_string() {
            return Err(ImageError::DigestMismatch {
                what: "blob",
                expected: self.digest.to_string(),
                actual,
            });
        }
        let file = self.file.take().expect("commit runs once");
        file.sync_all().at("flushing", &self.tmp)?;
        fs::set_permissions(&self.tmp, fs::Permissions::from_mode(0o600))
            .at("setting mode of", &self.tmp)?;
        fs::rename(&self.tmp, &self.target).at("storing blob", &self.target)?;
        Ok(self.target.clone())
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if self.file.is_some() || fs::symlink_metadata(&self.tmp).is_ok() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn parses_only_sha256_hex_digests() {
        assert!(Digest::parse(EMPTY).is_ok());
        for bad in [
            "sha256:../../../../etc/passwd",
            "sha512:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "sha256:e3b0",
            "",
        ] {
            let err = Digest::parse(bad).expect_err(bad);
            assert!(
                err.to_string().contains("invalid or unsupported digest"),
                "{err}"
            );
        }
    }

    #[test]
    fn stores_only_verified_blobs() {
        let scratch = tempfile::tempdir().expect("tempdir");
        let store = BlobStore::open(scratch.path().join("blobs")).expect("open");
        let digest = Digest::parse(EMPTY).expect("digest");

        let mut w = store.begin(&digest, 10).expect("begin");
        w.write(b"not empty").expect("write");
        let err = w.commit().expect_err("wrong content");
        assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
        assert!(!store.contains(&digest));

        let mut w = store.begin(&digest, 4).expect("begin");
        let err = w.write(b"too long").expect_err("over the bound");
        assert!(matches!(err, ImageError::TooLarge { .. }), "{err}");
        drop(w);

        let w = store.begin(&digest, 0).expect("begin");
        let path = w.commit().expect("empty blob hashes right");
        assert!(store.contains(&digest));
        assert_eq!(path, store.path(&digest));
        assert_eq!(
            fs::read_dir(store.dir().join("tmp")).expect("ls").count(),
            0,
            "no temp files left"
        );
        let mode = fs::metadata(store.dir())
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
