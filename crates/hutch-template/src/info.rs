//! What a template is described as: [`TemplateInfo`] (the API's template object) and the
//! on-disk `template.json` it is read from.
//!
//! # `template.json`, format 1
//!
//! Written once, last, by a successful build, inside the build directory before it is
//! renamed into place; never edited afterwards. A template directory without this file, with
//! `"ready": false`, an unknown `format` or unparsable JSON is listed as not ready.
//!
//! ```json
//! {"format": 1, "recipe": "minimal", "name": "minimal", "ready": true,
//!  "isolations": ["ns", "vm"], "size_bytes": 2105344, "created_at": "2025-05-20T12:00:00Z",
//!  "description": "…",
//!  "defaults": {"cpus": 1.0, "memory_mib": 256, "disk_mib": 512, "pids_max": 256,
//!               "env": {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}}}
//! ```
//! Unknown fields are ignored so that later versions can add fields without a new format.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The `format` written into `template.json` by this version.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// A template as the API shows it (`GET /v1/templates`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateInfo {
    /// The template's name, equal to its directory name.
    pub name: String,
    /// Which build of the name this is (1, 2, …; 0 for templates built before revisions).
    /// Each build is a new revision; `name@rev` names an older one while something uses it.
    #[serde(default)]
    pub rev: u64,
    /// Whether the template finished building and may be used.
    pub ready: bool,
    /// Isolation backends that can run this template (`"ns"`, `"vm"`).
    pub isolations: Vec<String>,
    /// Disk usage of the root filesystem in bytes (hard links counted once).
    pub size_bytes: u64,
    /// When the build finished, RFC 3339 in UTC (`2025-05-20T12:00:00Z`); absent when the
    /// template is not ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// One line saying what is inside.
    #[serde(default)]
    pub description: String,
    /// Resources a sandbox gets from this template unless the create request says otherwise.
    #[serde(default)]
    pub defaults: ResourceDefaults,
    /// For a template built from an OCI image: the image and its configuration. Its start
    /// command, working directory and user are recorded, not applied (see `start`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<hutch_image::ImageConfig>,
    /// The start command every sandbox of this template runs, supervised by its agent, and
    /// the ready check a create waits for (`docs/templates.md`, "Start command").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<hutch_proto::ServiceSpec>,
    /// For a template built from a Dockerfile: the cache key of its last step (a rebuild
    /// whose last key is the same changes nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_key: Option<String>,
}

impl TemplateInfo {
    /// The description of a directory that exists but is not a finished template.
    pub(crate) fn unready(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            rev: 0,
            ready: false,
            isolations: Vec::new(),
            size_bytes: 0,
            created_at: None,
            description: String::new(),
            defaults: ResourceDefaults::default(),
            image: None,
            start: None,
            build_key: None,
        }
    }
}

/// Default resources of sandboxes created from a template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceDefaults {
    /// CPU bandwidth in cores (fractions allowed).
    pub cpus: f64,
    /// Memory limit in MiB.
    pub memory_mib: u64,
    /// Writable disk space in MiB.
    pub disk_mib: u64,
    /// Maximum number of processes and threads.
    pub pids_max: u32,
    /// Environment variables set for every process.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Isolation of sandboxes whose create request does not choose one (or says `auto`):
    /// `ns` or `vm`; absent means `auto`. Set with [`crate::TemplateStore::set_isolation`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    /// Working directory and user of commands whose request names neither (a Dockerfile's
    /// last `WORKDIR` and `USER`, an image's `WorkingDir` and `User`).
    #[serde(default, skip_serializing_if = "hutch_proto::ExecDefaults::is_empty")]
    pub exec: hutch_proto::ExecDefaults,
}

impl Default for ResourceDefaults {
    fn default() -> Self {
        Self {
            cpus: 1.0,
            memory_mib: 256,
            disk_mib: 512,
            pids_max: 256,
            env: BTreeMap::new(),
            isolation: None,
            exec: hutch_proto::ExecDefaults::default(),
        }
    }
}

/// The on-disk form of `template.json` (see the module docs).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TemplateFile {
    /// Format version; [`FORMAT_VERSION`] when written by this crate.
    pub format: u32,
    /// The built-in recipe that produced the template.
    pub recipe: String,
    /// The recipe's revision when it was built; an older one means the template is stale
    /// (not ready) and the next build replaces it.
    #[serde(default)]
    pub revision: u32,
    /// Everything the API shows.
    #[serde(flatten)]
    pub info: TemplateInfo,
}

/// Formats `time` as RFC 3339 in UTC with whole seconds (`2025-05-20T12:00:00Z`).
pub(crate) fn rfc3339_utc(time: SystemTime) -> String {
    let secs = time
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    hutch_proto::time::rfc3339_utc(secs as i64)
}

/// Default resources a build gives the template's sandboxes (each `None` keeps the base's).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SandboxResources {
    /// CPU bandwidth in cores.
    pub cpus: Option<f64>,
    /// Memory limit in MiB.
    pub memory_mib: Option<u64>,
    /// Writable disk in MiB.
    pub disk_mib: Option<u64>,
}

impl SandboxResources {
    /// The `cpus` a build may give.
    pub const CPUS: std::ops::RangeInclusive<f64> = 0.05..=256.0;
    /// The `memory_mib` a build may give.
    pub const MEMORY_MIB: std::ops::RangeInclusive<u64> = 16..=1 << 20;
    /// The `disk_mib` a build may give.
    pub const DISK_MIB: std::ops::RangeInclusive<u64> = 16..=1 << 24;

    /// `defaults` with these set.
    pub fn apply(&self, defaults: &mut ResourceDefaults) {
        if let Some(cpus) = self.cpus {
            defaults.cpus = cpus;
        }
        if let Some(memory_mib) = self.memory_mib {
            defaults.memory_mib = memory_mib;
        }
        if let Some(disk_mib) = self.disk_mib {
            defaults.disk_mib = disk_mib;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339_utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_747_742_400 + 3_661);
        assert_eq!(rfc3339_utc(t), "2025-05-20T13:01:01Z");
        // A leap day.
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339_utc(t), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn template_file_round_trips_with_flattened_info() {
        let file = TemplateFile {
            format: FORMAT_VERSION,
            recipe: "minimal".into(),
            revision: 2,
            info: TemplateInfo {
                name: "minimal".into(),
                rev: 1,
                ready: true,
                isolations: vec!["ns".into()],
                size_bytes: 42,
                created_at: Some("2025-05-20T12:00:00Z".into()),
                description: "d".into(),
                defaults: ResourceDefaults::default(),
                image: None,
                start: None,
                build_key: None,
            },
        };
        let json = serde_json::to_value(&file).expect("serializable");
        assert_eq!(json["format"], 1);
        assert_eq!(json["ready"], true);
        assert_eq!(json["isolations"][0], "ns");
        assert_eq!(json["defaults"]["pids_max"], 256);
        let back: TemplateFile = serde_json::from_value(json).expect("parses");
        assert_eq!(back.info, file.info);
    }

    #[test]
    fn unready_info_omits_created_at() {
        let json = serde_json::to_value(TemplateInfo::unready("x")).expect("serializable");
        assert_eq!(json["ready"], false);
        assert!(json.get("created_at").is_none());
    }
}
