//! Container baselines, measured in the same run as Hutch's series: an OCI runtime (`crun`,
//! `runc`) running `/bin/true` from a bundle whose root is the benchmarked template's rootfs,
//! and `podman run --rm --network none --rootfs` of the same rootfs.
//!
//! Nothing here touches the template: the bundle's root is read-only (every mount point
//! the spec needs must already exist in it, or the baseline is skipped) and podman runs it
//! as `--rootfs DIR:O` (an overlay whose upper layer podman throws away). Everything the
//! runtimes create lives in one private temporary directory (bundle, runtime state, podman's
//! storage, run and tmp directories) or in one cgroup named for this run in every hierarchy,
//! and is removed at the end; the host's default podman storage (`/var/lib/containers`) is
//! never used.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::baselines::{on_path, Skipped};
use super::stats::{summarize, Summary};

/// The OCI runtimes measured, in the order podman prefers them (Debian's podman uses crun).
const OCI_RUNTIMES: [&str; 2] = ["crun", "runc"];

/// The directories podman and the runtimes create outside the private directories they are
/// given (netavark's run directory; podman's cleanup runs the runtime with its default
/// `--root`), innermost first: removed again when empty if this run created them.
const HOST_DIRS: [&str; 4] = [
    "/run/containers/networks",
    "/run/containers",
    "/run/runc",
    "/run/crun",
];

/// What one baseline came to.
type Outcome = Result<Summary, String>;

/// Run `crun_run_true`, `runc_run_true` and `podman_run_true` `n` times each over `rootfs`.
pub fn run(rootfs: &Path, n: usize) -> (Vec<Summary>, Vec<Skipped>) {
    let names = OCI_RUNTIMES
        .iter()
        .map(|rt| format!("{rt}_run_true"))
        .chain(["podman_run_true".to_string()]);
    let outcomes: Vec<(String, Outcome)> = match Workspace::new() {
        Ok(ws) => {
            let outcomes = measure(&ws, rootfs, n);
            ws.clean_up();
            outcomes
        }
        Err(reason) => names.map(|name| (name, Err(reason.clone()))).collect(),
    };
    let mut done = Vec::new();
    let mut skipped = Vec::new();
    for (name, outcome) in outcomes {
        match outcome {
            Ok(s) => done.push(s),
            Err(reason) => skipped.push(Skipped { name, reason }),
        }
    }
    (done, skipped)
}

fn measure(ws: &Workspace, rootfs: &Path, n: usize) -> Vec<(String, Outcome)> {
    let bundle = ws.dir.join("bundle");
    let bundle_ready = write_bundle(&bundle, rootfs, &ws.cgroup);
    let mut outcomes = Vec::new();
    let mut podman_runtime = None;
    let mut runtime_failures = Vec::new();
    for rt in OCI_RUNTIMES {
        let name = format!("{rt}_run_true");
        let outcome = if !on_path(rt) {
            Err(format!("{rt} is not installed"))
        } else {
            bundle_ready
                .clone()
                .and_then(|()| time_oci_runtime(&name, rt, &bundle, &ws.dir, n))
        };
        match &outcome {
            Ok(_) if podman_runtime.is_none() => podman_runtime = Some(rt),
            Ok(_) => {}
            Err(reason) => runtime_failures.push(format!("{rt}: {reason}")),
        }
        outcomes.push((name, outcome));
    }
    let podman = if !on_path("podman") {
        Err("podman is not installed".to_string())
    } else if !rootfs.is_dir() {
        Err(format!("no template rootfs at {}", rootfs.display()))
    } else {
        match podman_runtime {
            Some(rt) => time_podman(ws, rootfs, rt, n),
            None => Err(format!(
                "no OCI runtime runs containers here, so podman cannot ({})",
                runtime_failures.join("; ")
            )),
        }
    };
    outcomes.push(("podman_run_true".to_string(), podman));
    outcomes
}

/// Write `config.json` into `bundle`: the runtime's default spec (`crun spec` or `runc
/// spec`), adjusted to run `/bin/true` without a terminal in a read-only `rootfs`, in a new
/// network namespace, under this run's cgroup.
fn write_bundle(bundle: &Path, rootfs: &Path, cgroup: &str) -> Result<(), String> {
    if !rootfs.is_dir() {
        return Err(format!("no template rootfs at {}", rootfs.display()));
    }
    if !rootfs.join("bin/true").exists() {
        return Err(format!(
            "the template rootfs {} has no /bin/true",
            rootfs.display()
        ));
    }
    let generator = OCI_RUNTIMES
        .into_iter()
        .find(|rt| on_path(rt))
        .ok_or("neither crun nor runc is installed")?;
    std::fs::create_dir_all(bundle).map_err(|e| format!("{}: {e}", bundle.display()))?;
    // `--root`: crun creates its state directory (default `/run/crun`) for any command.
    let state = bundle.with_file_name(format!("{generator}-state"));
    let out = Command::new(generator)
        .arg("--root")
        .arg(&state)
        .arg("spec")
        .current_dir(bundle)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{generator} spec: {e}"))?;
    if !out.status.success() {
        return Err(failure(&format!("{generator} spec"), &out));
    }
    let path = bundle.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut spec: Value =
        serde_json::from_str(&text).map_err(|e| format!("{generator} spec wrote {e}"))?;
    adjust_spec(&mut spec, rootfs, cgroup)?;
    let text = serde_json::to_string_pretty(&spec).expect("a JSON value serialises");
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The changes to a default OCI spec; refuses a rootfs lacking a mount point the spec
/// needs (the runtime would create it in the template).
fn adjust_spec(spec: &mut Value, rootfs: &Path, cgroup: &str) -> Result<(), String> {
    spec["process"]["terminal"] = json!(false);
    spec["process"]["args"] = json!(["/bin/true"]);
    spec["root"] = json!({"path": rootfs, "readonly": true});
    spec["hostname"] = json!("hutch-bench");
    let linux = &mut spec["linux"];
    linux["cgroupsPath"] = json!(format!("/{cgroup}/oci"));
    let namespaces = linux["namespaces"]
        .as_array_mut()
        .ok_or("the default spec has no linux.namespaces")?;
    if !namespaces.iter().any(|ns| ns["type"] == "network") {
        namespaces.push(json!({"type": "network"}));
    }
    for mount in spec["mounts"].as_array().into_iter().flatten() {
        let Some(dest) = mount["destination"].as_str() else {
            continue;
        };
        // Mount points under /dev live in the tmpfs the spec mounts there, and /sys/fs/cgroup
        // in sysfs.
        let first = Path::new(dest.trim_start_matches('/'))
            .components()
            .next()
            .map(|c| PathBuf::from(c.as_os_str()));
        if let Some(first) = first {
            if !rootfs.join(&first).is_dir() {
                return Err(format!(
                    "the template rootfs has no /{} (the runtime would create it in the template)",
                    first.display()
                ));
            }
        }
    }
    Ok(())
}

fn time_oci_runtime(
    name: &str,
    rt: &str,
    bundle: &Path,
    work: &Path,
    n: usize,
) -> Result<Summary, String> {
    let state = work.join(format!("{rt}-state"));
    let prefix = format!("hutch-bench-{}-{rt}", std::process::id());
    let run_one = |i: usize| -> Result<f64, String> {
        let id = format!("{prefix}-{i}");
        let mut cmd = Command::new(rt);
        cmd.arg("--root").arg(&state).arg("run").arg("--bundle");
        cmd.arg(bundle).arg(&id);
        let t0 = Instant::now();
        let out = quiet(&mut cmd).output().map_err(|e| format!("{rt}: {e}"))?;
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        if out.status.success() {
            return Ok(ms);
        }
        // A container left created (or stopped) by a failed run goes; it may not exist.
        let _ = quiet(Command::new(rt).arg("--root").arg(&state))
            .args(["delete", "-f", &id])
            .status();
        Err(failure(&format!("{rt} run"), &out))
    };
    // One run first (the runtime's state directory, the page cache), untimed.
    run_one(0)?;
    let samples = (1..=n).map(run_one).collect::<Result<Vec<_>, _>>()?;
    Ok(summarize(name, "ms", &samples))
}

fn time_podman(ws: &Workspace, rootfs: &Path, rt: &str, n: usize) -> Result<Summary, String> {
    let p = ws.dir.join("podman");
    let runtime =
        hutch_core::host::find_program(rt).ok_or_else(|| format!("{rt} is not on PATH"))?;
    let mut rootfs_arg = rootfs.as_os_str().to_owned();
    rootfs_arg.push(":O");
    let run_one = || -> Result<f64, String> {
        let mut cmd = Command::new("podman");
        // Storage, state and runtime state all private to this run.
        cmd.arg("--root").arg(p.join("storage"));
        cmd.arg("--runroot").arg(p.join("run"));
        cmd.arg("--tmpdir").arg(p.join("tmp"));
        cmd.arg("--network-config-dir").arg(p.join("networks"));
        cmd.args(["--storage-driver", "vfs", "--events-backend", "none"]);
        cmd.args(["--cgroup-manager", "cgroupfs", "--runtime"]);
        cmd.arg(&runtime).arg("--runtime-flag");
        cmd.arg(format!("root={}", p.join("runtime").display()));
        cmd.args(["run", "--rm", "--network", "none", "--cgroup-parent"]);
        cmd.arg(format!("/{}/podman", ws.cgroup));
        // podman raises RLIMIT_NOFILE and RLIMIT_NPROC to values that need CAP_SYS_RESOURCE,
        // which a root without it (a container host) lacks: the OCI default spec's 1024.
        cmd.args([
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ]);
        cmd.arg("--rootfs").arg(&rootfs_arg).arg("/bin/true");
        let t0 = Instant::now();
        let out = quiet(&mut cmd)
            .output()
            .map_err(|e| format!("podman: {e}"))?;
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        if out.status.success() {
            Ok(ms)
        } else {
            Err(failure(&format!("podman run (runtime {rt})"), &out))
        }
    };
    // podman initialises its storage and database on first use: a warm-up run, untimed.
    run_one()?;
    let samples = (0..n).map(|_| run_one()).collect::<Result<Vec<_>, _>>()?;
    Ok(summarize("podman_run_true", "ms", &samples))
}

fn quiet(cmd: &mut Command) -> &mut Command {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
}

/// "`what` failed (exit status 1): the last line of its stderr".
pub fn failure(what: &str, out: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no message")
        .trim();
    format!("`{what}` failed ({}): {last}", out.status)
}

/// The private directory and cgroup name of one run, and what it must remove at the end.
struct Workspace {
    /// Bundle, runtime state, podman's storage.
    dir: PathBuf,
    /// Cgroup (relative to every hierarchy's root) holding every container of this run.
    cgroup: String,
    /// Which of [`HOST_DIRS`] existed before the run.
    host_dirs_before: Vec<bool>,
}

impl Workspace {
    fn new() -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("hutch-bench-containers-")
            .tempdir_in("/tmp")
            .map_err(|e| format!("a temporary directory in /tmp: {e}"))?
            .keep();
        Ok(Self {
            dir,
            cgroup: format!("hutch-bench-containers-{}", std::process::id()),
            host_dirs_before: HOST_DIRS.iter().map(|d| Path::new(d).exists()).collect(),
        })
    }

    /// Wait (10 s at most) for the runtimes' last processes (podman's cleanup after
    /// `--rm`, conmon) to leave this run's cgroups and for their mounts to go, then remove
    /// the cgroups and the directory. A mount still under the directory keeps it, with a
    /// warning: nothing is ever deleted through a mount point.
    fn clean_up(self) {
        let cgroup_dirs: Vec<PathBuf> = cgroup_mount_points()
            .into_iter()
            .map(|mp| mp.join(&self.cgroup))
            .filter(|d| d.is_dir())
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline
            && (cgroup_dirs.iter().any(|d| has_processes(d)) || !mounts_under(&self.dir).is_empty())
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        for d in &cgroup_dirs {
            if let Err(e) = remove_cgroup_tree(d) {
                eprintln!("warning: cannot remove cgroup {}: {e}", d.display());
            }
        }
        for (dir, existed) in HOST_DIRS.iter().zip(&self.host_dirs_before) {
            if !existed {
                // Only when empty: something else may have started using it meanwhile.
                let _ = std::fs::remove_dir(dir);
            }
        }
        let mounts = mounts_under(&self.dir);
        if mounts.is_empty() {
            if let Err(e) = std::fs::remove_dir_all(&self.dir) {
                eprintln!("warning: cannot remove {}: {e}", self.dir.display());
            }
        } else {
            eprintln!(
                "warning: {} left in place: still mounted under it: {mounts:?}",
                self.dir.display()
            );
        }
    }
}

/// Mount points of every cgroup hierarchy (v1 and v2).
fn cgroup_mount_points() -> Vec<PathBuf> {
    mountinfo()
        .into_iter()
        .filter(|(_, fstype)| fstype == "cgroup" || fstype == "cgroup2")
        .map(|(mp, _)| mp)
        .collect()
}

fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    mountinfo()
        .into_iter()
        .map(|(mp, _)| mp)
        .filter(|mp| mp.starts_with(dir))
        .collect()
}

/// (mount point, filesystem type) of every line of this process's mountinfo.
fn mountinfo() -> Vec<(PathBuf, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            let fstype = right.split(' ').next()?;
            Some((
                PathBuf::from(hutch_core::host::unescape_mount_path(mount_point)),
                fstype.to_string(),
            ))
        })
        .collect()
}

/// Whether any process is in the cgroup `dir` or below it.
fn has_processes(dir: &Path) -> bool {
    let here = std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| !s.trim().is_empty())
        .unwrap_or(false);
    here || child_dirs(dir).iter().any(|c| has_processes(c))
}

/// Remove a cgroup and its descendants, deepest first (`rmdir` is how cgroups go).
fn remove_cgroup_tree(dir: &Path) -> std::io::Result<()> {
    for child in child_dirs(dir) {
        remove_cgroup_tree(&child)?;
    }
    std::fs::remove_dir(dir)
}

fn child_dirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_spec() -> Value {
        json!({
            "process": {"terminal": true, "args": ["sh"]},
            "root": {"path": "rootfs", "readonly": true},
            "mounts": [
                {"destination": "/proc", "type": "proc"},
                {"destination": "/dev/pts", "type": "devpts"},
                {"destination": "/sys/fs/cgroup", "type": "cgroup"}
            ],
            "linux": {"namespaces": [{"type": "pid"}, {"type": "mount"}]}
        })
    }

    #[test]
    fn the_spec_runs_true_read_only_in_a_network_namespace_under_the_runs_cgroup() {
        let root = tempfile::tempdir().expect("tempdir");
        for d in ["proc", "dev", "sys"] {
            std::fs::create_dir(root.path().join(d)).expect("mkdir");
        }
        let mut spec = default_spec();
        adjust_spec(&mut spec, root.path(), "hutch-bench-containers-1").expect("adjusted");
        assert_eq!(spec["process"]["terminal"], json!(false));
        assert_eq!(spec["process"]["args"], json!(["/bin/true"]));
        assert_eq!(spec["root"]["path"], json!(root.path()));
        assert_eq!(spec["root"]["readonly"], json!(true));
        assert_eq!(
            spec["linux"]["cgroupsPath"],
            json!("/hutch-bench-containers-1/oci")
        );
        let namespaces = spec["linux"]["namespaces"].as_array().expect("array");
        assert!(namespaces.iter().any(|ns| ns["type"] == "network"));
    }

    #[test]
    fn a_rootfs_missing_a_mount_point_is_refused_not_written_to() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(root.path().join("proc")).expect("mkdir");
        let mut spec = default_spec();
        let err = adjust_spec(&mut spec, root.path(), "x").expect_err("no /dev");
        assert_eq!(
            err,
            "the template rootfs has no /dev (the runtime would create it in the template)"
        );
        assert!(!root.path().join("dev").exists());
    }
}
