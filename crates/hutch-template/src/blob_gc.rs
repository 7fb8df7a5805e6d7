//! Collecting image blobs (`<dir>/.blobs/sha256/…`) that no template records: what failed
//! or replaced pulls left, and what deleted templates used. A blob a template revision (or
//! a tagged one) records is kept, so pulling that image again downloads nothing. Pulls hold
//! the blob lock shared; the collector takes it exclusively, only when it is free (a pull
//! running means another collection later).

use std::collections::HashSet;
use std::fs;

use crate::error::{IoContext, Result};
use crate::info::TemplateInfo;
use crate::lock::BlobLock;
use crate::store::TemplateStore;

/// What a collection removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlobSweep {
    /// Blobs deleted.
    pub removed: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Whether it was skipped (a pull was running, or a template of an older Hutch does
    /// not say which blobs it used).
    pub skipped: bool,
}

impl TemplateStore {
    /// Every template revision on disk: the current ones and the old ones.
    fn all_revisions(&self) -> Result<Vec<TemplateInfo>> {
        let mut all = self.list()?;
        for name in self.names_with_old_revisions() {
            for rev in self.old_revisions(&name) {
                all.extend(self.get_at(&name, Some(rev)));
            }
        }
        Ok(all)
    }

    /// Delete the blobs no template revision records (see the module docs).
    pub fn collect_blobs(&self) -> std::result::Result<BlobSweep, crate::TemplateError> {
        let blobs = self.blob_dir().join("sha256");
        if !blobs.is_dir() {
            return Ok(BlobSweep::default());
        }
        let Some(_lock) = BlobLock::try_exclusive(self.dir())? else {
            return Ok(BlobSweep {
                skipped: true,
                ..BlobSweep::default()
            });
        };
        let mut kept: HashSet<String> = HashSet::new();
        for info in self.all_revisions()? {
            let Some(image) = &info.image else { continue };
            if image.blobs.is_empty() {
                // Built before templates recorded their blobs: keep everything.
                return Ok(BlobSweep {
                    skipped: true,
                    ..BlobSweep::default()
                });
            }
            for digest in &image.blobs {
                if let Some(hex) = digest.strip_prefix("sha256:") {
                    kept.insert(hex.to_owned());
                }
            }
        }
        let mut sweep = BlobSweep::default();
        for entry in fs::read_dir(&blobs).at("listing directory", &blobs)? {
            let entry = entry.at("listing directory", &blobs)?;
            let Some(hex) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if kept.contains(&hex) {
                continue;
            }
            let path = entry.path();
            let bytes = entry.metadata().map(|m| m.len()).unwrap_or(0);
            fs::remove_file(&path).at("removing", &path)?;
            sweep.removed += 1;
            sweep.bytes += bytes;
        }
        Ok(sweep)
    }
}
