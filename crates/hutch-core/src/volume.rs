//! Durable volumes: records and the API view.

use serde::{Deserialize, Serialize};

/// A volume's row in the state database.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct VolumeRecord {
    /// `vol_…`.
    pub id: crate::ids::VolumeId,
    /// Name, unique per tenant.
    pub name: String,
    /// Size limit (the image's size).
    pub size_mib: u64,
    /// Creation time (ms since epoch).
    pub created_at_ms: i64,
    /// Owning tenant (`None`: created by an admin key without one).
    pub tenant: Option<crate::tenant::Tenant>,
}

/// A volume mounted in a sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// `vol_…` (a name is accepted on create and resolved to the id).
    pub volume: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Mounted read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// Where a volume is mounted now.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeAttachment {
    /// The sandbox.
    pub sandbox: String,
    /// Path inside it.
    pub path: String,
    /// Read-only mount.
    pub read_only: bool,
}

/// The volume object of the API.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct VolumeView {
    /// `vol_…`.
    pub id: crate::ids::VolumeId,
    /// Name.
    pub name: String,
    /// Size limit in MiB.
    pub size_mib: u64,
    /// RFC 3339.
    pub created_at: String,
    /// Bytes in use, when the volume is mounted on the host now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// Sandboxes it is attached to (running, paused or hibernated).
    pub attached: Vec<VolumeAttachment>,
}
