//! The step cache's index: step key → the build snapshot holding that step's result, one
//! small file per key in `<templates>/.build-cache/` (written atomically). The snapshots
//! themselves are the manager's (build snapshots: hidden, kept until deleted).

use std::path::PathBuf;

use hutch_core::ids::SnapshotId;

/// The index.
#[derive(Debug)]
pub(crate) struct StepCache {
    dir: PathBuf,
}

impl StepCache {
    /// The index in `dir` (made on first write).
    pub fn open(dir: PathBuf) -> Self {
        Self { dir }
    }

    fn path(&self, key: &str) -> Option<PathBuf> {
        // Keys are hex sha256; anything else never names a file.
        (key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit())).then(|| self.dir.join(key))
    }

    /// The snapshot recorded for `key`.
    pub fn get(&self, key: &str) -> Option<SnapshotId> {
        let text = std::fs::read_to_string(self.path(key)?).ok()?;
        text.trim().parse().ok()
    }

    /// Record `snapshot` for `key`.
    pub fn put(&self, key: &str, snapshot: &SnapshotId) -> std::io::Result<()> {
        let Some(path) = self.path(key) else {
            return Err(std::io::Error::other(format!("bad step key {key:?}")));
        };
        std::fs::create_dir_all(&self.dir)?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, snapshot.as_str())?;
        std::fs::rename(&tmp, &path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_snapshots_and_bad_keys_to_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = StepCache::open(dir.path().join("idx"));
        let key = "a".repeat(64);
        assert!(cache.get(&key).is_none());
        let sid = SnapshotId::random();
        cache.put(&key, &sid).expect("put");
        assert_eq!(cache.get(&key), Some(sid.clone()));
        assert!(cache.put("../x", &sid).is_err());
        assert!(cache.get("../x").is_none());
    }
}
