//! Validating a [`JailSpec`] before anything touches the host.
//!
//! Every check here is pure logic on the spec's values (plus, in [`check_searchable`], the
//! modes of existing directories), so a bad spec fails with a precise message and leaves
//! nothing behind.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::{JailError, JailSpec};

/// Lowest accepted `uid_base`: the sandbox's ids must not overlap the host's system and user
/// ids.
pub(crate) const MIN_UID_BASE: u32 = 65_536;
/// Longest unix socket path (`sun_path` is 108 bytes including the NUL).
pub(crate) const MAX_SOCKET_PATH: usize = 107;

/// The per-sandbox paths derived from `sandbox_dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SandboxPaths {
    /// `sandbox_dir` itself.
    pub root: PathBuf,
    /// Overlay upper directory (the sandbox's writes).
    pub upper: PathBuf,
    /// Overlay work directory.
    pub work: PathBuf,
    /// Mount point of the idmapped read-only template.
    pub lower: PathBuf,
    /// Mount point of the overlay (the sandbox's root before `pivot_root`).
    pub merged: PathBuf,
    /// The agent's stdout and stderr.
    pub log: PathBuf,
    /// Mount points of the read-only layers between `upper` and `lower`, topmost first.
    pub layers: Vec<PathBuf>,
    /// Mount points of the idmapped volume binds (`vol-N`).
    pub volumes: Vec<PathBuf>,
}

impl SandboxPaths {
    /// The layout inside `sandbox_dir`, for a sandbox with `layers` read-only layers above its
    /// template.
    pub fn with_layers(sandbox_dir: &Path, layers: usize) -> Self {
        Self {
            layers: (0..layers)
                .map(|i| sandbox_dir.join(format!("layer-{i}")))
                .collect(),
            ..Self::new(sandbox_dir)
        }
    }

    /// The layout inside `sandbox_dir` (no layers between upper and template).
    pub fn new(sandbox_dir: &Path) -> Self {
        Self {
            layers: Vec::new(),
            volumes: Vec::new(),
            root: sandbox_dir.to_path_buf(),
            upper: sandbox_dir.join("upper"),
            work: sandbox_dir.join("work"),
            lower: sandbox_dir.join("lower"),
            merged: sandbox_dir.join("merged"),
            log: sandbox_dir.join("agent.log"),
        }
    }
}

fn invalid(msg: impl Into<String>) -> JailError {
    JailError::InvalidSpec(msg.into())
}

/// A name usable as one path component: `[A-Za-z0-9_.-]`, not `.`/`..`, at most 128 bytes.
fn check_component(what: &str, s: &str) -> Result<(), JailError> {
    let ok_chars = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if s.is_empty() || s.len() > 128 || !ok_chars || s == "." || s == ".." {
        return Err(invalid(format!(
            "{what} {s:?} must be 1-128 characters of [A-Za-z0-9_.-]"
        )));
    }
    Ok(())
}

fn check_absolute(what: &str, p: &Path) -> Result<(), JailError> {
    if !p.is_absolute() {
        return Err(invalid(format!(
            "{what} {} must be an absolute path",
            p.display()
        )));
    }
    if p.components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(invalid(format!(
            "{what} {} must not contain `..`",
            p.display()
        )));
    }
    let bytes = p.as_os_str().as_encoded_bytes();
    if bytes.contains(&0) || bytes.contains(&b'\n') {
        return Err(invalid(format!(
            "{what} {} contains NUL or newline",
            p.display()
        )));
    }
    Ok(())
}

/// Directories a volume may not cover: the sandbox's machinery and kernel interfaces.
const RESERVED_TARGETS: &[&str] = &["/", "/proc", "/sys", "/dev", "/.hutch", "/etc"];

/// A volume's path inside the sandbox: absolute, normalised, at most 4096 bytes, not a
/// reserved directory or beneath `/proc`, `/sys`, `/dev` or `/.hutch`.
pub fn check_volume_target(t: &str) -> Result<(), JailError> {
    let bad = |why: &str| invalid(format!("volume path {t:?}: {why}"));
    if !t.starts_with('/') || t.len() > 4096 || t.contains('\0') || t.contains('\n') {
        return Err(bad("must be an absolute path"));
    }
    if t.len() > 1
        && (t.ends_with('/')
            || t[1..]
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == ".."))
    {
        return Err(bad(
            "must be normalised (no empty, `.` or `..` components, no trailing `/`)",
        ));
    }
    if RESERVED_TARGETS.contains(&t)
        || ["/proc/", "/sys/", "/dev/", "/.hutch/"]
            .iter()
            .any(|p| t.starts_with(p))
    {
        return Err(bad("is reserved"));
    }
    Ok(())
}

/// Check the spec's values; no filesystem access.
pub(crate) fn validate(spec: &JailSpec) -> Result<(), JailError> {
    check_component("id", &spec.id)?;
    if spec.cgroup_parent.is_empty() {
        return Err(invalid("cgroup_parent must not be empty"));
    }
    for part in spec.cgroup_parent.split('/') {
        check_component("cgroup_parent component", part)?;
    }
    check_absolute("template_rootfs", &spec.template_rootfs)?;
    check_absolute("sandbox_dir", &spec.sandbox_dir)?;
    check_absolute("agent_binary", &spec.agent_binary)?;
    check_absolute("agent_socket", &spec.agent_socket)?;
    if spec.layers.len() > crate::MAX_LAYERS {
        return Err(invalid(format!(
            "at most {} layers may sit between upper and template, got {}",
            crate::MAX_LAYERS,
            spec.layers.len()
        )));
    }
    for layer in &spec.layers {
        check_absolute("layer", layer)?;
    }
    if spec.volumes.len() > crate::MAX_VOLUMES {
        return Err(invalid(format!(
            "at most {} volumes per sandbox, got {}",
            crate::MAX_VOLUMES,
            spec.volumes.len()
        )));
    }
    for v in &spec.volumes {
        check_absolute("volume source", &v.source)?;
        check_volume_target(&v.target)?;
    }
    if spec.sandbox_dir.parent().is_none() {
        return Err(invalid("sandbox_dir must not be /"));
    }
    let dirs = std::iter::once(("sandbox_dir", &spec.sandbox_dir))
        .chain(spec.upper_dir.iter().map(|d| ("upper_dir", d)));
    for (what, d) in dirs {
        check_absolute(what, d)?;
        // The overlay's option string is comma- and colon-separated.
        let bytes = d.as_os_str().as_encoded_bytes();
        if bytes
            .iter()
            .any(|b| matches!(b, b',' | b':' | b'\\' | b' ' | b'\t'))
        {
            return Err(invalid(format!(
                "{what} {} must not contain `,`, `:`, `\\` or whitespace (overlayfs options)",
                d.display()
            )));
        }
    }
    if spec.agent_socket.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(invalid(format!(
            "agent_socket {} is longer than {MAX_SOCKET_PATH} bytes",
            spec.agent_socket.display()
        )));
    }
    if spec.uid_base < MIN_UID_BASE {
        return Err(invalid(format!(
            "uid_base {} must be at least {MIN_UID_BASE} (host ids must stay out of sandboxes)",
            spec.uid_base
        )));
    }
    if spec.uid_count == 0 || spec.uid_base.checked_add(spec.uid_count).is_none() {
        return Err(invalid(format!(
            "uid range {}+{} is empty or overflows",
            spec.uid_base, spec.uid_count
        )));
    }
    let host_ok = spec
        .hostname
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if spec.hostname.is_empty() || spec.hostname.len() > 64 || !host_ok {
        return Err(invalid(format!(
            "hostname {:?} must be 1-64 characters of [A-Za-z0-9.-]",
            spec.hostname
        )));
    }
    for (k, v) in &spec.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(invalid(format!("environment variable {k:?} is not valid")));
        }
    }
    if spec.agent_args.iter().any(|a| a.contains('\0')) {
        return Err(invalid("agent_args must not contain NUL bytes"));
    }
    Ok(())
}

/// The jail's child walks `dir` (and every ancestor) as the sandbox's root uid, which is an
/// "other" user for host-owned directories: every one of them needs the `o+x` bit.
pub(crate) fn check_searchable(what: &str, path: &Path) -> Result<(), JailError> {
    for dir in path.ancestors().filter(|d| !d.as_os_str().is_empty()) {
        let meta = std::fs::metadata(dir).map_err(|e| JailError::Sys {
            op: format!("stat {}", dir.display()),
            source: e,
        })?;
        if meta.is_dir() && meta.permissions().mode() & 0o001 == 0 {
            return Err(invalid(format!(
                "{what}: directory {} must be searchable by other users (o+x): the sandbox's \
                 root is an unprivileged host uid",
                dir.display()
            )));
        }
    }
    Ok(())
}

/// The agent binary must be a regular file executable by other users.
pub(crate) fn check_agent_binary(path: &Path) -> Result<(), JailError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| invalid(format!("agent_binary {}: {e}", path.display())))?;
    if !meta.is_file() {
        return Err(invalid(format!(
            "agent_binary {} is not a regular file",
            path.display()
        )));
    }
    if meta.permissions().mode() & 0o001 == 0 {
        return Err(invalid(format!(
            "agent_binary {} must be executable by other users (o+x)",
            path.display()
        )));
    }
    let parent = path.parent().unwrap_or(Path::new("/"));
    check_searchable("agent_binary", parent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Limits;

    fn spec() -> JailSpec {
        JailSpec {
            id: "sbx_abc".into(),
            template_rootfs: "/srv/t/rootfs".into(),
            sandbox_dir: "/srv/s/sbx_abc".into(),
            uid_base: 2_000_000,
            uid_count: 65_536,
            agent_binary: "/usr/lib/hutch/hutch-agent".into(),
            agent_args: vec![],
            agent_socket: "/srv/s/sbx_abc.sock".into(),
            layers: vec![],
            hostname: "sbx-abc".into(),
            env: vec![("PATH".into(), "/bin".into())],
            limits: Limits {
                memory_bytes: 1 << 30,
                cpu_millis: 1000,
                pids_max: 512,
                tmp_bytes: 1 << 28,
            },
            cgroup_parent: "hutch".into(),
            netns: None,
            resolv_conf: None,
            volumes: vec![],
            upper_dir: None,
        }
    }

    fn err(s: JailSpec) -> String {
        validate(&s).unwrap_err().to_string()
    }

    #[test]
    fn accepts_a_good_spec() {
        validate(&spec()).unwrap();
        let mut s = spec();
        s.cgroup_parent = "hutch/tenant-1".into();
        validate(&s).unwrap();
    }

    #[test]
    fn rejects_bad_values_with_precise_messages() {
        let mut s = spec();
        s.id = "../x".into();
        assert_eq!(
            err(s),
            "invalid jail spec: id \"../x\" must be 1-128 characters of [A-Za-z0-9_.-]"
        );
        let mut s = spec();
        s.sandbox_dir = "/srv/a,b".into();
        assert!(err(s).contains("overlayfs options"));
        let mut s = spec();
        s.template_rootfs = "rel/path".into();
        assert_eq!(
            err(s),
            "invalid jail spec: template_rootfs rel/path must be an absolute path"
        );
        let mut s = spec();
        s.uid_base = 0;
        assert!(err(s).contains("uid_base 0 must be at least 65536"));
        let mut s = spec();
        s.uid_base = u32::MAX - 10;
        assert!(err(s).contains("overflows"));
        let mut s = spec();
        s.hostname = "a b".into();
        assert!(err(s).contains("hostname"));
        let mut s = spec();
        s.env.push(("A=B".into(), "x".into()));
        assert!(err(s).contains("environment variable"));
        let mut s = spec();
        s.agent_socket = PathBuf::from(format!("/{}", "s".repeat(120)));
        assert!(err(s).contains("longer than 107 bytes"));
        let mut s = spec();
        s.cgroup_parent = "hutch/../x".into();
        assert!(err(s).contains("cgroup_parent component"));
        let mut s = spec();
        s.sandbox_dir = "/srv/../etc".into();
        assert!(err(s).contains("must not contain `..`"));
    }

    #[test]
    fn rejects_too_many_or_relative_layers() {
        let mut s = spec();
        s.layers = vec![PathBuf::from("/srv/snap/upper"); crate::MAX_LAYERS + 1];
        assert!(err(s).contains("at most 8 layers"));
        let mut s = spec();
        s.layers = vec![PathBuf::from("snap")];
        assert_eq!(
            err(s),
            "invalid jail spec: layer snap must be an absolute path"
        );
    }

    #[test]
    fn derives_paths_inside_the_sandbox_dir() {
        let p = SandboxPaths::with_layers(Path::new("/s/x"), 2);
        assert_eq!(
            p.layers,
            [PathBuf::from("/s/x/layer-0"), PathBuf::from("/s/x/layer-1")]
        );
        let p = SandboxPaths::new(Path::new("/s/x"));
        assert_eq!(p.upper, PathBuf::from("/s/x/upper"));
        assert_eq!(p.merged, PathBuf::from("/s/x/merged"));
        assert_eq!(p.log, PathBuf::from("/s/x/agent.log"));
    }
}
