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
    let given = explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("HUTCH_AGENT").map(PathBuf::from));
    if let Some(p) = given {
        if !p.is_file() {
            bail!("agent binary {} does not exist", p.display());
        }
        if !is_static_elf(&p) {
            bail!(
                "agent binary {} is not a static executable (templates have no dynamic loader): build it with scripts/build-agent.sh",
                p.display()
            );
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("locating the hutch executable")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let mut candidates = Vec::new();
    // target/{debug,release}/hutch → target/x86_64-unknown-linux-gnu/release-agent/hutch-agent
    // (before `dir/hutch-agent`: in a build tree that one is the dynamic test build).
    if let Some(target) = dir.parent() {
        candidates.push(target.join("x86_64-unknown-linux-gnu/release-agent/hutch-agent"));
    }
    candidates.push(dir.join("hutch-agent"));
    candidates.push(PathBuf::from("/usr/local/lib/hutch/hutch-agent"));
    for c in &candidates {
        if c.is_file() && is_static_elf(c) {
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

/// Whether `path` is an ELF executable without a program interpreter (statically linked).
pub fn is_static_elf(path: &Path) -> bool {
    const PT_INTERP: u32 = 3;
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 {
        return false;
    }
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let mut ph = [0u8; 8];
    ph.copy_from_slice(&bytes[0x20..0x28]);
    let phoff = u64::from_le_bytes(ph) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).all(|i| {
        let o = phoff + i * phentsize;
        bytes
            .get(o..o + 4)
            .map(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]) != PT_INTERP)
            .unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_static_from_dynamic_executables() {
        // This test binary is dynamically linked.
        let me = std::env::current_exe().expect("current exe");
        assert!(!is_static_elf(&me));
        assert!(!is_static_elf(Path::new("/etc/passwd")));
        if Path::new("/bin/busybox").exists() {
            assert!(
                is_static_elf(Path::new("/bin/busybox")),
                "busybox-static is static"
            );
        }
    }
}
