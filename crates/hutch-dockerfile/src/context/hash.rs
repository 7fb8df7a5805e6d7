//! [`Context::hash_entries`]: the inputs hash of a `COPY`/`ADD` step's cache key.
//!
//! **Encoding (version 1).** sha256 over named, length-prefixed fields (as in
//! [`crate::step_key`]): `format` = `hutch-dockerfile context entries v1`, then for each
//! entry, sorted by (`path`, `dest_relative`, `is_source_root`): `path`, `dest`, `root`,
//! `kind` (`file`, `dir`, `symlink`), `mode` (4 bytes), `size` (8 bytes), `target` (symlinks
//! only) and `content` (files only: the sha256 of the content, read in 64 KiB chunks, never
//! whole into memory). Owners are not part of it: the context's owners are not copied
//! (`--chown` is part of the instruction, so of the step key).

use std::io::Read;

use sha2::{Digest, Sha256};

use super::{Context, ContextEntry, ContextError, EntryKind};
use crate::cache::{field, hex};

impl Context {
    /// A hex sha256 over `entries` in sorted order: each one's paths, type, mode, size,
    /// content (streamed) and symlink target. What a `COPY` step's cache key takes as its
    /// inputs: it changes when anything the step copies changes, and only then.
    pub fn hash_entries(&self, entries: &[ContextEntry]) -> Result<String, ContextError> {
        let mut sorted: Vec<&ContextEntry> = entries.iter().collect();
        sorted.sort_by(|a, b| {
            (&a.path, &a.dest_relative, a.is_source_root).cmp(&(
                &b.path,
                &b.dest_relative,
                b.is_source_root,
            ))
        });
        let mut hasher = Sha256::new();
        field(
            &mut hasher,
            "format",
            b"hutch-dockerfile context entries v1",
        );
        for entry in sorted {
            field(&mut hasher, "path", entry.path.as_bytes());
            field(&mut hasher, "dest", entry.dest_relative.as_bytes());
            field(&mut hasher, "root", &[u8::from(entry.is_source_root)]);
            field(&mut hasher, "kind", entry.kind.tag().as_bytes());
            field(&mut hasher, "mode", &entry.mode.to_be_bytes());
            field(&mut hasher, "size", &entry.size.to_be_bytes());
            if let Some(target) = &entry.symlink_target {
                field(&mut hasher, "target", target.as_bytes());
            }
            if entry.kind == EntryKind::File {
                let digest = self.content_digest(&entry.path)?;
                field(&mut hasher, "content", &digest);
            }
        }
        Ok(hex(&hasher.finalize()))
    }

    fn content_digest(&self, path: &str) -> Result<Vec<u8>, ContextError> {
        let mut file = self.open_file(path)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = file.read(&mut buf).map_err(|e| ContextError::Io {
                action: "reading",
                path: path.to_owned(),
                error: e,
            })?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        Ok(hasher.finalize().to_vec())
    }
}
