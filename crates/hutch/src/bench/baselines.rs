//! Baselines measured in the same run: plain fork/exec, `unshare` of all namespaces,
//! `bwrap --unshare-all`, and gVisor's `runsc do` when installed (containers: `containers.rs`).

use std::process::{Command, Stdio};
use std::time::Instant;

use super::containers::failure;
use super::stats::{summarize, Summary};

/// A baseline that could not run, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Skipped {
    /// Baseline name.
    pub name: String,
    /// Why it was skipped.
    pub reason: String,
}

/// Whether `prog` is an executable file in one of `$PATH`'s directories.
pub(super) fn on_path(prog: &str) -> bool {
    hutch_core::host::find_program(prog).is_some()
}

fn time_command(name: &str, argv: &[&str], n: usize) -> Result<Summary, String> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        let out = Command::new(argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("{}: {e}", argv[0]))?;
        if !out.status.success() {
            return Err(failure(&argv.join(" "), &out));
        }
        samples.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(summarize(name, "ms", &samples))
}

/// Run every available baseline `n` times.
pub fn run(n: usize) -> (Vec<Summary>, Vec<Skipped>) {
    let truebin = if std::path::Path::new("/bin/true").exists() {
        "/bin/true"
    } else {
        "/usr/bin/true"
    };
    let candidates: Vec<(&str, &str, Vec<&str>)> = vec![
        ("fork_exec_true", truebin, vec![truebin]),
        (
            "unshare_all_true",
            "unshare",
            vec![
                "unshare",
                "--user",
                "--map-root-user",
                "--pid",
                "--fork",
                "--mount",
                "--net",
                "--ipc",
                "--uts",
                "--cgroup",
                truebin,
            ],
        ),
        (
            "bwrap_unshare_all_true",
            "bwrap",
            vec![
                "bwrap",
                "--unshare-all",
                "--ro-bind",
                "/",
                "/",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                truebin,
            ],
        ),
        (
            "runsc_do_true",
            "runsc",
            vec!["runsc", "--rootless", "--network=none", "do", truebin],
        ),
    ];
    let mut done = Vec::new();
    let mut skipped = Vec::new();
    for (name, prog, argv) in candidates {
        if !prog.starts_with('/') && !on_path(prog) {
            skipped.push(Skipped {
                name: name.into(),
                reason: format!("{prog} is not installed"),
            });
            continue;
        }
        match time_command(name, &argv, n) {
            Ok(s) => done.push(s),
            Err(reason) => skipped.push(Skipped {
                name: name.into(),
                reason,
            }),
        }
    }
    (done, skipped)
}
