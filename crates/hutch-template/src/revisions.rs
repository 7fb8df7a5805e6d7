//! Revisions: every build of a name is a new revision (`rev` 1, 2, …). The newest is the
//! template, at `<dir>/<name>/`; a build that replaces it moves the old one to
//! `<dir>/.revisions/<name>/<rev>/`, where sandboxes and snapshots made from it keep finding
//! it (their records name the revision) until the manager collects it
//! ([`TemplateStore::remove_revision`]) once nothing uses it. `name@rev` names a revision.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result, TemplateError};
use crate::info::TemplateInfo;
use crate::lock::TemplateLock;
use crate::store::{validate_name, TemplateStore};
use crate::tree;

/// Where old revisions live, under the templates directory.
const REVISIONS_DIR: &str = ".revisions";

/// `name@rev` split into its name and revision (`None`: no `@`, the current one). A bad
/// revision number is `Err` with the text.
pub fn parse_ref(reference: &str) -> std::result::Result<(&str, Option<u64>), String> {
    match reference.split_once('@') {
        None => Ok((reference, None)),
        Some((name, rev)) => rev
            .parse::<u64>()
            .map(|r| (name, Some(r)))
            .map_err(|_| format!("{reference:?}: a template revision is a number (name@3)")),
    }
}

impl TemplateStore {
    fn revisions_of(&self, name: &str) -> PathBuf {
        self.dir().join(REVISIONS_DIR).join(name)
    }

    /// The directory of revision `rev` of `name` (the current one's, or an old one's).
    fn revision_dir(&self, name: &str, rev: Option<u64>) -> PathBuf {
        let current = self.dir().join(name);
        match rev {
            None => current,
            Some(rev) if self.read_info_at(name, &current).rev == rev => current,
            Some(rev) => self.revisions_of(name).join(rev.to_string()),
        }
    }

    /// Where the root filesystem of revision `rev` of `name` is (`None`: the current one).
    pub fn rootfs_at(&self, name: &str, rev: Option<u64>) -> PathBuf {
        self.revision_dir(name, rev).join("rootfs")
    }

    /// Revision `rev` of `name` (`None`: the current one), if it exists.
    pub fn get_at(&self, name: &str, rev: Option<u64>) -> Option<TemplateInfo> {
        validate_name(name).ok()?;
        let dir = self.revision_dir(name, rev);
        if !dir.is_dir() {
            return None;
        }
        let info = self.read_info_at(name, &dir);
        match rev {
            Some(rev) if info.rev != rev => None,
            _ => Some(info),
        }
    }

    /// The old revisions of `name` kept on disk, oldest first.
    pub fn old_revisions(&self, name: &str) -> Vec<u64> {
        let mut revs: Vec<u64> = fs::read_dir(self.revisions_of(name))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        revs.sort_unstable();
        revs
    }

    /// Names that have old revisions on disk.
    pub fn names_with_old_revisions(&self) -> Vec<String> {
        fs::read_dir(self.dir().join(REVISIONS_DIR))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                    .filter(|n| validate_name(n).is_ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The number the next build of `name` gets.
    pub(crate) fn next_rev(&self, name: &str) -> u64 {
        let current = self.get(name).map_or(0, |i| i.rev);
        let old = self.old_revisions(name).last().copied().unwrap_or(0);
        current.max(old) + 1
    }

    /// Keep the replaced template directory `dir` (revision `rev` of `name`) as an old
    /// revision. Called with the name's lock held.
    pub(crate) fn keep_revision(&self, name: &str, rev: u64, dir: &Path) -> Result<()> {
        let parent = self.revisions_of(name);
        fs::create_dir_all(&parent).at("creating directory", &parent)?;
        let target = parent.join(rev.to_string());
        if fs::symlink_metadata(&target).is_ok() {
            tree::remove_tree(&target)?;
        }
        fs::rename(dir, &target).at("keeping the old revision as", &target)
    }

    /// Delete old revision `rev` of `name` (never the current one); `Ok(false)` when there
    /// is none. The caller makes sure nothing uses it.
    pub fn remove_revision(
        &self,
        name: &str,
        rev: u64,
    ) -> std::result::Result<bool, TemplateError> {
        validate_name(name)?;
        let _lock = TemplateLock::acquire(self.dir(), name, || {})?;
        let dir = self.revisions_of(name).join(rev.to_string());
        if fs::symlink_metadata(&dir).is_err() {
            return Ok(false);
        }
        tree::remove_tree(&dir)?;
        Ok(true)
    }

    /// Delete every old revision of `name` (with the template).
    pub(crate) fn remove_revisions(&self, name: &str) -> Result<()> {
        let dir = self.revisions_of(name);
        if fs::symlink_metadata(&dir).is_ok() {
            tree::remove_tree(&dir)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_into_name_and_revision() {
        assert_eq!(parse_ref("web"), Ok(("web", None)));
        assert_eq!(parse_ref("web@3"), Ok(("web", Some(3))));
        assert!(parse_ref("web@x").is_err());
    }
}
