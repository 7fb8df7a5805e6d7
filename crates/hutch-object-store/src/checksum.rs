//! sha256 of files and of bytes as they stream, in lowercase hex: the checksum every object
//! carries (`x-amz-meta-sha256` on S3, the metadata file of a directory store).

use std::path::Path;

use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::ObjectStoreError;

/// How much of a file is read at a time while hashing it.
const READ_CHUNK: usize = 256 * 1024;

/// A sha256 being computed over bytes as they pass.
#[derive(Default)]
pub(crate) struct Hasher {
    inner: Sha256,
    bytes: u64,
}

impl Hasher {
    pub(crate) fn update(&mut self, data: &[u8]) {
        self.inner.update(data);
        self.bytes += data.len() as u64;
    }

    /// The digest in lowercase hex, and the number of bytes hashed.
    pub(crate) fn finish(self) -> (String, u64) {
        (hex(&self.inner.finalize()), self.bytes)
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        write!(s, "{b:02x}").expect("writing to a String cannot fail");
    }
    s
}

/// The sha256 (hex) and size of the file at `path`, read in chunks.
pub async fn sha256_file(path: &Path) -> Result<(String, u64), ObjectStoreError> {
    let mut file = tokio::fs::File::open(path)
        .await
        .map_err(|e| ObjectStoreError::io("open", path, e))?;
    let mut hasher = Hasher::default();
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = file
            .read(&mut buf)
            .await
            .map_err(|e| ObjectStoreError::io("read", path, e))?;
        if n == 0 {
            return Ok(hasher.finish());
        }
        hasher.update(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_like_sha256sum() {
        let mut h = Hasher::default();
        h.update(b"ab");
        h.update(b"c");
        let (digest, n) = h.finish();
        assert_eq!(
            digest,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(n, 3);
    }
}
