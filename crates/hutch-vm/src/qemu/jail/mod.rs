//! Confining QEMU: the `vm` backend's defense in depth (code that escapes the guest into
//! QEMU is still in all of this).
//!
//! [`spawn`] clones QEMU straight into new **mount, pid**, IPC, UTS and network namespaces
//! (so the process that execs QEMU is pid 1 of its own pid namespace, and its host pid is
//! the one the server records, watches and kills). The child of the multi-threaded server
//! runs an [`ExecPlan`] (`hutch_jail::exec_plan`: steps prepared here, run there without
//! allocating), built by [`plan`]:
//!
//! 1. join the sandbox's cgroups (descriptors of their `cgroup.procs` opened before);
//! 2. make every mount private, mount an empty tmpfs on QEMU's own directory and build the
//!    new root in it: each path of the [`root::RootPlan`] bound at its own path (read-only
//!    where QEMU only reads), its own directory bound read-write from a descriptor;
//!    `pivot_root` into it, detach the old root, remount the tmpfs read-only;
//! 3. drop to the unprivileged uid, gid and groups, `no_new_privs`;
//! 4. reset the signal mask and `SIGPIPE`, connect stdin to `/dev/null` and stdout/stderr to
//!    the log, the TAP device to fd [`TAP_FD`]; exec QEMU with an empty environment. QEMU's
//!    own seccomp filter (`-sandbox`) comes on top.
//!
//! A failing step is reported by the plan with the label given here and its errno:
//! `confine QEMU: bind /usr/lib/…: …`.

pub(crate) mod root;

use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

use hutch_jail::exec_plan::{c_path, ExecPlan, ExecPlanError, MountSource, Step};

use crate::qemu::config::{QemuJail, VmConfig, TAP_FD};
use crate::qemu::error::QemuError;
use root::{ProgramFiles, RootPlan};

/// Namespaces QEMU is cloned into.
const NAMESPACES: libc::c_int = libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWNET;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> QemuError {
    let what = what.into();
    move |source| QemuError::Io { what, source }
}

/// The files QEMU's child uses: opened before the clone, borrowed by its plan.
struct Descriptors<'a> {
    /// `cgroup.procs` of each of its cgroups, for writing.
    cgroups: Vec<File>,
    /// `/dev/null`, its stdin.
    null: File,
    /// Its stdout and stderr.
    log: &'a File,
}

/// Start QEMU for `config` in `jail`, its output going to `log`; returns its host pid once
/// it has been exec'd. The caller reaps it.
pub(crate) fn spawn(config: &VmConfig, jail: &QemuJail, log: &File) -> Result<i32, QemuError> {
    if jail.uid == 0 {
        return Err(io("confine QEMU")(std::io::Error::other(
            "refusing to run a jailed QEMU as uid 0",
        )));
    }
    let started = std::time::Instant::now();
    let program = root::program_files(&config.qemu)?;
    let cwd = std::env::current_dir().map_err(io("the working directory"))?;
    let config = &root::with_absolute_paths(config, &cwd);
    let root = RootPlan::new(config, &program, &cwd)?;
    let cgroups = jail
        .cgroup_procs
        .iter()
        .map(|p| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .map_err(io(format!("open {}", p.display())))
        })
        .collect::<Result<Vec<File>, _>>()?;
    let null = File::open("/dev/null").map_err(io("open /dev/null"))?;
    let fds = Descriptors { cgroups, null, log };
    let plan = plan(config, jail, &program, &root, &fds).map_err(from_plan(&program))?;
    let pid = plan.spawn(NAMESPACES).map_err(from_plan(&program))?;
    tracing::debug!(
        pid,
        binds = root.binds.len(),
        spawn_us = started.elapsed().as_micros() as u64,
        "QEMU exec'd in its jail"
    );
    Ok(pid)
}

/// The steps from the clone to QEMU's `execve` (see the module documentation).
fn plan<'a>(
    config: &'a VmConfig,
    jail: &QemuJail,
    program: &ProgramFiles,
    root: &RootPlan,
    fds: &'a Descriptors<'a>,
) -> Result<ExecPlan<'a>, ExecPlanError> {
    let mut plan = ExecPlan::new(&program.binary, &config.argv())?;
    for procs in &fds.cgroups {
        plan.push("join its cgroups", Step::JoinCgroup(procs.as_fd()));
    }
    let own_dir = c_path(&root.own_dir)?;
    plan.push(
        "make the mounts private",
        Step::Mount {
            source: MountSource::None,
            target: c"/".into(),
            fstype: None,
            flags: libc::MS_REC | libc::MS_PRIVATE,
            data: None,
        },
    )
    // Opened in the child's mount namespace before the tmpfs hides it; closed at exec.
    .push("open its directory", Step::OpenDirectory(own_dir.clone()))
    .push(
        "mount the tmpfs root",
        Step::Mount {
            source: MountSource::Path(c"tmpfs".into()),
            target: own_dir.clone(),
            fstype: Some(c"tmpfs".into()),
            flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            data: Some(c"mode=0755,size=1m,nr_inodes=4096".into()),
        },
    )
    .push("enter the new root", Step::Chdir(own_dir));
    for dir in root.directories() {
        let label = format!("create directory {}", Path::new("/").join(&dir).display());
        plan.push(label, Step::Mkdir(c_path(&dir)?));
    }
    let relative = |p: &Path| c_path(p.strip_prefix("/").unwrap_or(p));
    for bind in root.binds.iter().filter(|b| !b.dir) {
        plan.push(
            "create the mount point",
            Step::CreateFile(relative(&bind.path)?),
        );
    }
    for bind in &root.binds {
        // The own directory is hidden under the tmpfs by now: bound from its descriptor.
        let source = if bind.path == root.own_dir {
            MountSource::Opened(0)
        } else {
            MountSource::Path(c_path(&bind.path)?)
        };
        let target = relative(&bind.path)?;
        let shown = bind.path.display();
        plan.push(format!("bind {shown}"), Step::bind(source, target.clone()))
            .push(
                format!("remount {shown}"),
                Step::remount_bind(target, bind.access.flags()),
            );
    }
    plan.push("pivot_root", Step::PivotRootHere)
        .push(
            "detach the old root",
            Step::Unmount {
                target: c".".into(),
                flags: libc::MNT_DETACH,
            },
        )
        .push("chdir", Step::Chdir(c"/".into()))
        .push(
            "make the root read-only",
            Step::remount_bind(
                c"/".into(),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            ),
        )
        .push("setgroups", Step::SetGroups(jail.groups.clone()))
        .push("setresgid", Step::SetGid(jail.gid))
        .push("setresuid", Step::SetUid(jail.uid))
        .push("no_new_privs", Step::NoNewPrivs)
        // What Rust's `Command` does for a child: an empty signal mask, SIGPIPE back to
        // default (the server ignores it).
        .push("reset signals", Step::ClearSignalMask)
        .push("reset signals", Step::DefaultSignal(libc::SIGPIPE));
    for to in 0..3 {
        let from = if to == 0 {
            fds.null.as_fd()
        } else {
            fds.log.as_fd()
        };
        plan.push("connect stdio", Step::Dup { from, to });
    }
    if let Some(tap) = &config.tap {
        let from = tap.as_fd();
        plan.push("pass the TAP device", Step::Dup { from, to: TAP_FD });
    }
    Ok(plan)
}

/// The error a failed plan surfaces as (`confine QEMU: <step>: <errno>`; a missing binary
/// is [`QemuError::Missing`]).
fn from_plan(program: &ProgramFiles) -> impl Fn(ExecPlanError) -> QemuError + '_ {
    move |e| match e {
        ExecPlanError::Nul(_) => QemuError::Jail(e.to_string()),
        ExecPlanError::Pipe(source) => io("pipe")(source),
        ExecPlanError::Clone(source) => io("clone QEMU into its namespaces")(source),
        ExecPlanError::Report(source) => io("read QEMU's start report")(source),
        ExecPlanError::Step { label, source } => io(format!("confine QEMU: {label}"))(source),
        ExecPlanError::Exec { source, .. } if source.raw_os_error() == Some(libc::ENOENT) => {
            QemuError::Missing(program.binary.display().to_string())
        }
        ExecPlanError::Exec { source, .. } => io("confine QEMU: exec QEMU")(source),
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    /// The order of the child's steps, what the own directory is bound from, and where the
    /// credentials and descriptors go, without cloning anything.
    #[test]
    fn the_plan_builds_the_root_then_drops_privileges_then_passes_descriptors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = VmConfig::new("/vm/vmlinux".into(), "/vm/initrd".into(), dir.path());
        let tap: std::os::fd::OwnedFd = File::open("/dev/null").expect("null").into();
        let tap_raw = tap.as_raw_fd();
        config.tap = Some(std::sync::Arc::new(tap));
        let program = ProgramFiles {
            binary: "/usr/bin/qemu-system-x86_64".into(),
            libraries: vec!["/lib64/ld-linux-x86-64.so.2".into()],
            modules: vec![],
            data: vec!["/usr/share/qemu".into()],
        };
        let root = RootPlan::new(&config, &program, Path::new("/")).expect("root");
        let jail = QemuJail {
            uid: 65536 * 3,
            gid: 65536 * 3,
            groups: vec![991],
            cgroup_procs: vec![],
        };
        let log = tempfile::tempfile().expect("log");
        let fds = Descriptors {
            cgroups: vec![File::open("/dev/null").expect("null")],
            null: File::open("/dev/null").expect("null"),
            log: &log,
        };
        let plan = plan(&config, &jail, &program, &root, &fds).expect("plan");
        let labels: Vec<&str> = plan.labels().collect();
        let own = dir.path().display().to_string();
        let at = |label: &str| {
            labels
                .iter()
                .position(|l| *l == label)
                .unwrap_or_else(|| panic!("no step {label:?} in {labels:?}"))
        };
        assert_eq!(
            labels[..5],
            [
                "join its cgroups",
                "make the mounts private",
                "open its directory",
                "mount the tmpfs root",
                "enter the new root"
            ]
        );
        assert!(at("create directory /usr/share/qemu") < at("bind /usr/share/qemu"));
        assert!(at("bind /usr/share/qemu") + 1 == at("remount /usr/share/qemu"));
        assert!(at(&format!("remount {own}")) < at("pivot_root"));
        assert!(at("pivot_root") < at("make the root read-only"));
        assert!(at("make the root read-only") < at("setgroups"));
        assert!(at("setgroups") < at("setresgid") && at("setresgid") < at("setresuid"));
        assert!(at("setresuid") < at("no_new_privs"));
        assert_eq!(labels.last(), Some(&"pass the TAP device"));
        let steps: Vec<&Step<'_>> = plan.steps().collect();
        let own_bind = &steps[at(&format!("bind {own}"))];
        assert!(
            matches!(
                own_bind,
                Step::Mount {
                    source: MountSource::Opened(0),
                    ..
                }
            ),
            "the own directory is bound from the descriptor opened before the tmpfs: {own_bind:?}"
        );
        assert!(matches!(steps[at("setresuid")], Step::SetUid(uid) if *uid == 65536 * 3));
        assert!(matches!(steps[at("setgroups")], Step::SetGroups(g) if g == &[991]));
        let dups: Vec<(i32, i32)> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Dup { from, to } => Some((from.as_raw_fd(), *to)),
                _ => None,
            })
            .collect();
        assert_eq!(
            dups,
            [
                (fds.null.as_raw_fd(), 0),
                (log.as_raw_fd(), 1),
                (log.as_raw_fd(), 2),
                (tap_raw, TAP_FD)
            ]
        );
    }

    #[test]
    fn a_jailed_qemu_never_runs_as_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = VmConfig::new("/vm/vmlinux".into(), "/vm/initrd".into(), dir.path());
        let log = tempfile::tempfile().expect("log");
        let err = spawn(&config, &QemuJail::default(), &log).expect_err("uid 0");
        assert!(err.to_string().contains("as uid 0"), "{err}");
    }
}
