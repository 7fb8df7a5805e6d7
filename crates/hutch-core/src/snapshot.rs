//! Snapshots as the manager knows them: the record kept in the state database and the API
//! object.
//!
//! On `ns` a snapshot is **filesystem-level**: the sandbox's writes (its overlay upper layer,
//! merged onto the snapshot it was itself created from) stored as a read-only layer with
//! 0-based ids under `<state>/snapshots/<id>/upper/` (format: `hutch_jail::export_layer`).
//! Sandboxes created from it stack that directory, idmapped into their own uid range, between
//! their empty upper layer and the template, so creating one copies nothing. A snapshot is
//! therefore kept while a sandbox uses it: deleting it then is refused (409). The hidden
//! snapshot behind a fork is removed with the last of its children.
//!
//! `<state>/snapshots/<id>/snapshot.json` repeats the record for humans and recovery:
//! `{"format": 1, "id", "name", "kind", "isolation", "template", "sandbox_id", "created_at"}`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::Isolation;

/// Format of `snapshot.json`.
pub const SNAPSHOT_FORMAT: u32 = 1;

/// What a snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    /// Files only (`ns`): processes do not survive into sandboxes created from it.
    Filesystem,
    /// Memory, devices and disk (`vm`): running processes survive.
    Memory,
}

impl SnapshotKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Filesystem => "filesystem",
            Self::Memory => "memory",
        }
    }
}

/// Settings of the source sandbox, the defaults of sandboxes created from the snapshot.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SnapshotDefaults {
    /// CPUs.
    pub cpus: f64,
    /// Memory limit in MiB.
    pub memory_mib: u64,
    /// Disk in MiB.
    pub disk_mib: u64,
    /// Tasks limit.
    pub pids_max: u32,
    /// Environment of every exec.
    pub env: BTreeMap<String, String>,
    /// Working directory and user of commands that name neither (from the template).
    #[serde(default, skip_serializing_if = "hutch_proto::ExecDefaults::is_empty")]
    pub exec: hutch_proto::ExecDefaults,
}

/// One snapshot's row in the state database.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SnapshotRecord {
    /// `snap_…`.
    pub id: crate::ids::SnapshotId,
    /// The name given by the client (not unique).
    pub name: String,
    /// The sandbox it was taken of.
    pub sandbox_id: String,
    /// Filesystem or memory.
    pub kind: SnapshotKind,
    /// Backend of the source sandbox (and of every sandbox created from it).
    pub isolation: Isolation,
    /// Template under the snapshot's files.
    pub template: String,
    /// When that template was built, to notice a rebuild.
    #[serde(default)]
    pub template_created_at: Option<String>,
    /// The revision of the template the snapshotted sandbox ran (`None`: older records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_rev: Option<u64>,
    /// Bytes of regular files in it.
    pub size_bytes: u64,
    /// Regular files in it.
    #[serde(default)]
    pub files: u64,
    /// Creation time (ms since epoch).
    pub created_at_ms: i64,
    /// Tenant of the source sandbox (only that tenant and admins see the snapshot).
    pub tenant_id: Option<crate::tenant::Tenant>,
    /// A fork's snapshot: not listed, removed with the last sandbox that uses it.
    #[serde(default)]
    pub hidden: bool,
    /// A template build's step cache entry: hidden too, but kept until the build cache
    /// lets it go ([`crate::Manager::delete_build_snapshot`]), not when its users are gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub build: bool,
    /// Resources of the source sandbox.
    pub defaults: SnapshotDefaults,
}

/// The snapshot object of the API.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SnapshotView {
    /// `snap_…`.
    pub id: crate::ids::SnapshotId,
    /// Its name.
    pub name: String,
    /// The sandbox it was taken of.
    pub sandbox_id: String,
    /// `filesystem` (ns) or `memory` (vm).
    pub kind: SnapshotKind,
    /// `ns` or `vm`.
    pub isolation: Isolation,
    /// Template under its files.
    pub template: String,
    /// Bytes of regular files in it.
    pub size_bytes: u64,
    /// RFC 3339.
    pub created_at: String,
    /// Sandboxes created from it that still exist (it cannot be deleted before they go).
    pub used_by: Vec<String>,
}

impl SnapshotRecord {
    /// The API view, given the sandboxes that use it.
    pub fn view(&self, used_by: Vec<String>) -> SnapshotView {
        SnapshotView {
            id: self.id.clone(),
            name: self.name.clone(),
            sandbox_id: self.sandbox_id.clone(),
            kind: self.kind,
            isolation: self.isolation,
            template: self.template.clone(),
            size_bytes: self.size_bytes,
            created_at: crate::time::rfc3339(self.created_at_ms),
            used_by,
        }
    }

    /// The contents of `snapshot.json`.
    pub fn manifest(&self) -> serde_json::Value {
        serde_json::json!({
            "format": SNAPSHOT_FORMAT,
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "isolation": self.isolation,
            "template": self.template,
            "sandbox_id": self.sandbox_id,
            "created_at": crate::time::rfc3339(self.created_at_ms),
        })
    }
}

/// Whether `name` is acceptable for a snapshot: 1-64 characters of `[A-Za-z0-9._-]`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(valid_name("warm-1.0_x"));
        assert!(!valid_name(""));
        assert!(!valid_name("a b"));
        assert!(!valid_name("../x"));
        assert!(!valid_name(&"x".repeat(65)));
    }
}
