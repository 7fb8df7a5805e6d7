//! Tags: names for revisions (`web:stable` → revision 4), as `docker tag` names images. A
//! build asked to tag its result (`web:v2`) moves the tag to the revision it made once it
//! succeeds; the name alone is always the newest revision. Tags live in
//! `<dir>/.tags/<name>.json` (`{"v2": 3}`), written atomically; a tagged revision is kept
//! like one a sandbox uses.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use crate::error::{IoContext, Result, TemplateError};
use crate::lock::TemplateLock;
use crate::store::{validate_name, TemplateStore};

/// Where tag files live, under the templates directory.
const TAGS_DIR: &str = ".tags";
/// Longest tag.
const MAX_TAG: usize = 128;

/// Whether `tag` is a tag: what Docker allows (`[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`).
pub fn validate_tag(tag: &str) -> std::result::Result<(), TemplateError> {
    let ok = !tag.is_empty()
        && tag.len() <= MAX_TAG
        && !tag.starts_with(['.', '-'])
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(TemplateError::InvalidTag(tag.to_owned()))
    }
}

/// How a reference names a template: the newest revision, a revision, or a tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateRef<'a> {
    /// `name`.
    Newest(&'a str),
    /// `name@rev`.
    Revision(&'a str, u64),
    /// `name:tag`.
    Tag(&'a str, &'a str),
}

impl<'a> TemplateRef<'a> {
    /// `name`, `name@3` or `name:stable`; a bad revision number or tag is `Err` with the
    /// reason.
    pub fn parse(reference: &'a str) -> std::result::Result<Self, String> {
        if let Some((name, rev)) = reference.split_once('@') {
            return rev
                .parse::<u64>()
                .map(|r| Self::Revision(name, r))
                .map_err(|_| format!("{reference:?}: a template revision is a number (name@3)"));
        }
        match reference.split_once(':') {
            None => Ok(Self::Newest(reference)),
            Some((name, tag)) => validate_tag(tag)
                .map(|()| Self::Tag(name, tag))
                .map_err(|e| format!("{reference:?}: {e}")),
        }
    }

    /// The template's name.
    pub fn name(&self) -> &'a str {
        match self {
            Self::Newest(n) | Self::Revision(n, _) | Self::Tag(n, _) => n,
        }
    }
}

impl TemplateStore {
    fn tags_file(&self, name: &str) -> PathBuf {
        self.dir().join(TAGS_DIR).join(format!("{name}.json"))
    }

    /// The tags of `name` (tag → revision).
    pub fn tags(&self, name: &str) -> BTreeMap<String, u64> {
        if validate_name(name).is_err() {
            return BTreeMap::new();
        }
        fs::read(self.tags_file(name))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Point `tag` of `name` at revision `rev` (which must exist).
    pub fn set_tag(&self, name: &str, tag: &str, rev: u64) -> Result<()> {
        validate_name(name)?;
        validate_tag(tag)?;
        let _lock = TemplateLock::acquire(self.dir(), name, || {})?;
        if self.get_at(name, Some(rev)).is_none() {
            return Err(TemplateError::NoRevision {
                name: name.to_owned(),
                rev,
            });
        }
        let mut tags = self.tags(name);
        tags.insert(tag.to_owned(), rev);
        self.write_tags(name, &tags)
    }

    /// Remove `tag` of `name`; whether it was there.
    pub fn remove_tag(&self, name: &str, tag: &str) -> Result<bool> {
        validate_name(name)?;
        let _lock = TemplateLock::acquire(self.dir(), name, || {})?;
        let mut tags = self.tags(name);
        let had = tags.remove(tag).is_some();
        if had {
            self.write_tags(name, &tags)?;
        }
        Ok(had)
    }

    /// The revision `reference` names (`None`: the newest), if it exists.
    pub fn resolve(&self, reference: &TemplateRef<'_>) -> Option<Option<u64>> {
        match reference {
            TemplateRef::Newest(_) => Some(None),
            TemplateRef::Revision(_, rev) => Some(Some(*rev)),
            TemplateRef::Tag(name, tag) => self.tags(name).get(*tag).map(|rev| Some(*rev)),
        }
    }

    fn write_tags(&self, name: &str, tags: &BTreeMap<String, u64>) -> Result<()> {
        let path = self.tags_file(name);
        if tags.is_empty() {
            return match fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(TemplateError::io("removing", &path, e))
                }
                _ => Ok(()),
            };
        }
        let dir = self.dir().join(TAGS_DIR);
        fs::create_dir_all(&dir).at("creating directory", &dir)?;
        let json = serde_json::to_vec_pretty(tags)
            .map_err(|e| TemplateError::io("encoding", &path, std::io::Error::other(e)))?;
        let tmp = path.with_extension("json.tmp");
        fs::write(&tmp, json).at("writing", &tmp)?;
        fs::rename(&tmp, &path).at("replacing", &path)
    }

    /// Delete every tag of `name` (with the template).
    pub(crate) fn remove_tags(&self, name: &str) -> Result<()> {
        let path = self.tags_file(name);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(TemplateError::io("removing", &path, e))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_name_the_newest_a_revision_or_a_tag() {
        assert_eq!(TemplateRef::parse("web"), Ok(TemplateRef::Newest("web")));
        assert_eq!(
            TemplateRef::parse("web@3"),
            Ok(TemplateRef::Revision("web", 3))
        );
        assert_eq!(
            TemplateRef::parse("web:v2.1"),
            Ok(TemplateRef::Tag("web", "v2.1"))
        );
        assert!(TemplateRef::parse("web@x").is_err());
        assert!(TemplateRef::parse("web:").is_err());
        assert!(TemplateRef::parse("web:a/b").is_err());
        assert!(TemplateRef::parse("web:.hidden").is_err());
        assert_eq!(TemplateRef::parse("web:v2").map(|r| r.name()), Ok("web"));
    }
}
