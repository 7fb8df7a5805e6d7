//! Programs the tests run inside sandboxes or beside the server: static probes compiled from
//! C, and a `PATH` that lacks some host programs.

use std::process::Command;

use crate::paths::repo_root;

/// Compile a C program statically and return its bytes. Built once per version of its
/// source into one shared directory (`/tmp/hutch-probe/<name>-<hash>`), atomically, so
/// parallel test processes share it and nothing piles up.
pub fn static_c_binary(name: &str) -> Vec<u8> {
    use std::hash::{Hash, Hasher};
    let src = repo_root()
        .join("crates/hutch/tests/probe")
        .join(format!("{name}.c"));
    let text = std::fs::read(&src).expect("probe source");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    let out_dir = std::env::temp_dir().join("hutch-probe");
    std::fs::create_dir_all(&out_dir).expect("probe dir");
    let out = out_dir.join(format!("{name}-{:016x}", h.finish()));
    if !out.exists() {
        let tmp = out_dir.join(format!("{name}.{}.tmp", std::process::id()));
        let status = Command::new("cc")
            .args(["-static", "-O1", "-o"])
            .arg(&tmp)
            .arg(&src)
            .status()
            .expect("run cc");
        assert!(status.success(), "compiling {}", src.display());
        std::fs::rename(&tmp, &out).expect("install probe");
    }
    std::fs::read(&out).expect("read probe")
}

/// A directory of links to every program on `PATH` but those named in `left_out` (to run a
/// command as on a host that lacks them).
pub fn path_without(left_out: &[&str]) -> tempfile::TempDir {
    let bin = tempfile::Builder::new()
        .prefix("hutch-test-path-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let path = std::env::var_os("PATH").expect("PATH");
    for dir in std::env::split_paths(&path) {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let link = bin.path().join(&name);
            if left_out.iter().any(|l| name == *l) || link.symlink_metadata().is_ok() {
                continue;
            }
            std::os::unix::fs::symlink(e.path(), link).expect("symlink");
        }
    }
    bin
}
