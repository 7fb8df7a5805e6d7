//! Where the things under test are: the `hutch` binary, the static agent, the repository, and
//! the caches every test on this machine shares (templates, the vm backend's images).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The `hutch` binary under test.
///
/// Cargo builds a package's binaries before its integration tests and puts them next to the
/// test executables' `deps/` directory; `CARGO_BIN_EXE_hutch`, when set at run time (as
/// nextest does), wins.
pub fn hutch_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("CARGO_BIN_EXE_hutch") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    // target/<profile>/deps/<test>-<hash> -> target/<profile>/hutch
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("a test executable lives in target/<profile>/deps");
    let bin = profile_dir.join("hutch");
    assert!(
        bin.is_file(),
        "the hutch binary {} is missing: run the tests of the hutch package (cargo builds it \
         for them)",
        bin.display()
    );
    bin
}

/// Repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The static agent, built by `scripts/build-agent.sh`.
pub fn agent_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("HUTCH_AGENT") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let p = target.join("x86_64-unknown-linux-gnu/release-agent/hutch-agent");
    assert!(
        p.is_file(),
        "the static agent {} is missing: run scripts/build-agent.sh first",
        p.display()
    );
    p
}

/// The vm backend's cache shared by all tests on this machine (guest kernel, initramfs,
/// template images and snapshots are built once and reused).
pub fn vm_cache_dir() -> PathBuf {
    std::env::var_os("HUTCH_TEST_VM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/hutch-test/vm"))
}

/// Templates shared by all tests on this machine (built once, reused).
pub fn templates_dir() -> PathBuf {
    std::env::var_os("HUTCH_TEST_TEMPLATES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/hutch-test/templates"))
}

/// Build a template into the shared directory if it is not ready (the store's lock makes
/// concurrent calls from parallel tests safe).
pub fn ensure_template(name: &str) {
    let dir = templates_dir();
    std::fs::create_dir_all(&dir).expect("create templates dir");
    let status = Command::new(hutch_bin())
        .args(["template", "build", name, "--templates-dir"])
        .arg(&dir)
        .stdout(Stdio::null())
        .status()
        .expect("run hutch template build");
    assert!(status.success(), "building template {name} failed");
}

/// A templates directory of a test's own at `dir` (made if missing) with `minimal` built in
/// it, for tests whose server changes or deletes templates.
pub fn private_templates(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).expect("create templates dir");
    let out = Command::new(hutch_bin())
        .args(["template", "build", "minimal", "--templates-dir"])
        .arg(dir)
        .output()
        .expect("run hutch template build");
    assert!(out.status.success(), "building minimal in {dir:?}: {out:?}");
}

/// [`ensure_template`] of `minimal` (every test server's default), once per test process.
pub(crate) fn ensure_minimal() {
    static MINIMAL: OnceLock<()> = OnceLock::new();
    MINIMAL.get_or_init(|| ensure_template("minimal"));
}
