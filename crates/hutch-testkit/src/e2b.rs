//! E2B's published Python SDK run against a server's E2B listener: one scenario of
//! `crates/hutch/tests/e2b/scenarios.py`, as a user would point the SDK (environment
//! variables only).

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;

use crate::paths::repo_root;

/// The Python with the SDKs (`HUTCH_TEST_PYTHON`, from scripts/venv.sh; `python3` when
/// unset).
pub fn e2b_python() -> PathBuf {
    PathBuf::from(std::env::var_os("HUTCH_TEST_PYTHON").unwrap_or_else(|| "python3".into()))
}

/// Run scenario `name` with `python`, the SDK pointed at `url` with `key`, and `env` on
/// top (which wins over those); fails the test with the scenario's output unless it
/// passes. Its output.
pub fn e2b_scenario(
    python: &std::path::Path,
    url: &str,
    key: &str,
    name: &str,
    env: &[(&str, &OsStr)],
) -> String {
    let out = Command::new(python)
        .arg(repo_root().join("crates/hutch/tests/e2b/scenarios.py"))
        .arg(name)
        .env("E2B_API_URL", url)
        .env("E2B_SANDBOX_URL", url)
        .env("E2B_API_KEY", key)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .envs(env.iter().copied())
        .output()
        .expect("run python (HUTCH_TEST_PYTHON from scripts/venv.sh, with e2b installed)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("ok"),
        "scenario {name} failed:\n{text}"
    );
    text
}
