//! [`ImageConfig`]: what a template records of an image's configuration (the OCI image
//! config's `config` object, or Docker's `container_config` equivalent in `config`).
//!
//! The start command (`entrypoint` + `cmd`), `working_dir` and `user` are recorded here
//! and not applied: a registry image's `CMD` is usually a shell, not a service; a template
//! runs a start command only when given one (`hutch_proto::ServiceSpec`). `env` is applied:
//! it becomes the template's default environment.

use oci_spec::image::{Arch, ImageConfiguration, Os};
use serde::{Deserialize, Serialize};

use crate::error::{ImageError, Result};

/// An image's runtime configuration, as saved in `template.json` under `image`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ImageConfig {
    /// The reference the template was built from (`127.0.0.1:5000/tools:1`).
    pub reference: String,
    /// Digest of the image manifest that was unpacked (for an index, the linux/amd64 one).
    pub digest: String,
    /// `KEY=value` pairs.
    #[serde(default)]
    pub env: Vec<String>,
    /// Working directory of the start command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// User of the start command (`name`, `uid`, `uid:gid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// `ENTRYPOINT`.
    #[serde(default)]
    pub entrypoint: Vec<String>,
    /// `CMD`.
    #[serde(default)]
    pub cmd: Vec<String>,
    /// `EXPOSE`d ports (`8080/tcp`).
    #[serde(default)]
    pub exposed_ports: Vec<String>,
    /// The blobs of the store this image was unpacked from (its config and layers): the
    /// blob collector keeps them while the template exists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blobs: Vec<String>,
}

impl ImageConfig {
    /// The start command the image asks for: `entrypoint` followed by `cmd`.
    pub fn start_command(&self) -> Vec<String> {
        self.entrypoint.iter().chain(&self.cmd).cloned().collect()
    }
}

/// Reads an image config blob: the recorded configuration and the layers' `diff_ids`.
/// Images for another platform than linux/amd64 are refused.
pub(crate) fn parse(
    reference: &str,
    digest: &str,
    bytes: &[u8],
) -> Result<(ImageConfig, Vec<String>)> {
    let bad = |reason: String| ImageError::Config {
        reference: reference.to_owned(),
        reason,
    };
    let parsed: ImageConfiguration =
        serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    if *parsed.os() != Os::Linux || *parsed.architecture() != Arch::Amd64 {
        return Err(ImageError::WrongPlatform {
            reference: reference.to_owned(),
            found: format!("the image is {}/{}", parsed.os(), parsed.architecture()),
        });
    }
    let empty = oci_spec::image::Config::default();
    let c = parsed.config().as_ref().unwrap_or(&empty);
    let non_empty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
    let config = ImageConfig {
        reference: reference.to_owned(),
        digest: digest.to_owned(),
        env: c.env().clone().unwrap_or_default(),
        working_dir: non_empty(c.working_dir()),
        user: non_empty(c.user()),
        entrypoint: c.entrypoint().clone().unwrap_or_default(),
        cmd: c.cmd().clone().unwrap_or_default(),
        exposed_ports: c.exposed_ports().clone().unwrap_or_default(),
        blobs: Vec::new(),
    };
    Ok((config, parsed.rootfs().diff_ids().clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_runtime_config_and_diff_ids() {
        let json = br#"{"architecture": "amd64", "os": "linux",
            "config": {"Env": ["PATH=/bin", "A=b"], "WorkingDir": "/srv", "User": "1000:1000",
                       "Entrypoint": ["/bin/sh", "-c"], "Cmd": ["echo hi"],
                       "ExposedPorts": {"8080/tcp": {}}},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:aa"]}}"#;
        let (config, diff_ids) = parse("r", "sha256:d", json).expect("parses");
        assert_eq!(config.env, vec!["PATH=/bin", "A=b"]);
        assert_eq!(config.working_dir.as_deref(), Some("/srv"));
        assert_eq!(config.user.as_deref(), Some("1000:1000"));
        assert_eq!(config.start_command(), vec!["/bin/sh", "-c", "echo hi"]);
        assert_eq!(config.exposed_ports, vec!["8080/tcp"]);
        assert_eq!(diff_ids, vec!["sha256:aa"]);
    }

    #[test]
    fn refuses_other_platforms() {
        let json = br#"{"architecture": "arm64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}"#;
        let err = parse("r", "d", json).expect_err("arm64");
        assert!(
            err.to_string()
                .contains("no linux/amd64 variant (the image is linux/arm64)"),
            "{err}"
        );
    }
}
