//! Where things are: the state directory, the admin key, the agent binary.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// Default state directory: `/var/lib/hutch` as root, else `$XDG_DATA_HOME/hutch`.
pub fn default_state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HUTCH_STATE_DIR") {
        return PathBuf::from(d);
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/lib/hutch");
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    data.join("hutch")
}

/// The static agent binary: `--agent`, `HUTCH_AGENT`, next to this executable, or in the
/// cargo target directory this executable was built in.
pub fn find_agent(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() {
            return Ok(p.to_path_buf());
        }
        bail!("agent binary {} does not exist", p.display());
    }
    if let Some(p) = std::env::var_os("HUTCH_AGENT") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("HUTCH_AGENT={} does not exist", p.display());
    }
    let exe = std::env::current_exe().context("locating the hutch executable")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let mut candidates = vec![dir.join("hutch-agent")];
    // target/{debug,release}/hutch → target/x86_64-unknown-linux-gnu/release-agent/hutch-agent
    if let Some(target) = dir.parent() {
        candidates.push(target.join("x86_64-unknown-linux-gnu/release-agent/hutch-agent"));
    }
    if let Some(target) = dir.parent().and_then(Path::parent) {
        candidates.push(target.join("x86_64-unknown-linux-gnu/release-agent/hutch-agent"));
    }
    candidates.push(PathBuf::from("/usr/local/lib/hutch/hutch-agent"));
    for c in &candidates {
        if c.is_file() {
            return Ok(c.clone());
        }
    }
    bail!(
        "the static hutch-agent binary was not found (looked in {}); build it with scripts/build-agent.sh or pass --agent",
        candidates
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}
