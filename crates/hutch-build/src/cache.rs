//! The step cache's index: step key → the build snapshot holding that step's result, one
//! small file per key in `<state-dir>/build-cache/` (written atomically), beside the state
//! database that records those snapshots. The snapshots themselves are the manager's
//! (build snapshots: hidden, kept until pruned, `crate::prune`).

use std::path::PathBuf;
use std::time::SystemTime;

use hutch_core::ids::SnapshotId;

/// One entry of the index.
#[derive(Debug, Clone)]
pub(crate) struct CacheEntry {
    pub key: String,
    pub snapshot: SnapshotId,
    /// When it was written or last hit.
    pub used: SystemTime,
}

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

    /// The snapshot recorded for `key`; the entry counts as used now (its file's time,
    /// which [`StepCache::entries`] reports for pruning).
    pub fn get(&self, key: &str) -> Option<SnapshotId> {
        let path = self.path(key)?;
        let text = std::fs::read_to_string(&path).ok()?;
        if let Ok(f) = std::fs::File::options().append(true).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
        text.trim().parse().ok()
    }

    /// Every entry: its key, snapshot and when it was last used (written or hit).
    pub fn entries(&self) -> std::io::Result<Vec<CacheEntry>> {
        let mut out = Vec::new();
        let dir = match std::fs::read_dir(&self.dir) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        for item in dir {
            let item = item?;
            let Some(key) = item.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if self.path(&key).is_none() {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(item.path()) else {
                continue;
            };
            let Ok(snapshot) = text.trim().parse() else {
                continue;
            };
            let used = item
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            out.push(CacheEntry {
                key,
                snapshot,
                used,
            });
        }
        Ok(out)
    }

    /// Forget `key` (gone already is not an error).
    pub fn remove(&self, key: &str) -> std::io::Result<()> {
        let Some(path) = self.path(key) else {
            return Ok(());
        };
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
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
        let listed = cache.entries().expect("entries");
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].key.as_str(), &listed[0].snapshot),
            (key.as_str(), &sid)
        );
        cache.remove(&key).expect("remove");
        cache.remove(&key).expect("removing twice is fine");
        assert!(cache.entries().expect("entries").is_empty());
    }

    #[test]
    fn a_hit_counts_as_a_use() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = StepCache::open(dir.path().join("idx"));
        let key = "b".repeat(64);
        cache.put(&key, &SnapshotId::random()).expect("put");
        let old = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        std::fs::File::options()
            .append(true)
            .open(dir.path().join("idx").join(&key))
            .expect("open")
            .set_modified(old)
            .expect("age it");
        assert_eq!(cache.entries().expect("entries")[0].used, old);
        cache.get(&key).expect("a hit");
        assert!(cache.entries().expect("entries")[0].used > old);
    }
}
