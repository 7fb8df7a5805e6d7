//! [`ExecPlan`] for real: cloned from this multi-threaded test process (the case it exists
//! for) into new mount and pid namespaces. Needs root; skipped otherwise.

use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use super::*;

fn root() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: needs root");
    }
    root
}

fn c(path: &Path) -> CString {
    c_path(path).expect("no NUL")
}

/// Exit status of the child `pid`.
fn wait(pid: libc::pid_t) -> ExitStatus {
    let (_, status) = sys::waitpid(pid, 0).expect("waitpid");
    ExitStatus::from_raw(status)
}

/// A shell in a private mount and pid namespace, as `nobody`.
fn shell<'fd>(script: &str) -> ExecPlan<'fd> {
    let mut plan = ExecPlan::new(Path::new("/bin/sh"), &["-c", script]).expect("plan");
    plan.push(
        "make the mounts private",
        Step::Mount {
            source: MountSource::None,
            target: c"/".into(),
            fstype: None,
            flags: libc::MS_REC | libc::MS_PRIVATE,
            data: None,
        },
    );
    plan
}

fn drop_to_nobody(plan: &mut ExecPlan<'_>) {
    plan.push("setgroups", Step::SetGroups(vec![]))
        .push("setresgid", Step::SetGid(65534))
        .push("setresuid", Step::SetUid(65534))
        .push("no_new_privs", Step::NoNewPrivs)
        .push("reset signals", Step::ClearSignalMask)
        .push("reset signals", Step::DefaultSignal(libc::SIGPIPE));
}

const NAMESPACES: libc::c_int = libc::CLONE_NEWNS | libc::CLONE_NEWPID;

#[test]
fn the_steps_run_in_order_and_the_program_is_execd_in_its_namespaces() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let hidden = dir.path().join("hidden");
    std::fs::create_dir(&hidden).expect("mkdir");
    std::fs::write(hidden.join("marker"), b"seen").expect("marker");
    let log = tempfile::NamedTempFile::new().expect("log");
    // pid 1 of its namespace, uid and gid nobody, no capabilities, no_new_privs, the hidden
    // directory visible only through the descriptor opened before the tmpfs covered it, the
    // file mount point created, the log on stdout.
    let script = "[ $$ = 1 ] && [ \"$(/usr/bin/id -u):$(/usr/bin/id -g)\" = 65534:65534 ] \
        && /bin/grep -q '^CapEff:.0000000000000000$' /proc/self/status \
        && /bin/grep -q '^NoNewPrivs:.1$' /proc/self/status \
        && [ ! -e marker ] && [ \"$(/bin/cat again/marker)\" = seen ] && [ -f file ] \
        && echo confined";
    let mut plan = shell(script);
    plan.push("open the directory", Step::OpenDirectory(c(&hidden)))
        .push(
            "mount a tmpfs",
            Step::Mount {
                source: MountSource::Path(c"tmpfs".into()),
                target: c(&hidden),
                fstype: Some(c"tmpfs".into()),
                flags: libc::MS_NOSUID | libc::MS_NODEV,
                data: Some(c"mode=0755,size=1m".into()),
            },
        )
        .push("enter it", Step::Chdir(c(&hidden)))
        .push("mkdir", Step::Mkdir(c"again".into()))
        .push("mkdir again", Step::Mkdir(c"again".into()))
        .push("create", Step::CreateFile(c"file".into()))
        .push("bind", Step::bind(MountSource::Opened(0), c"again".into()))
        .push(
            "remount",
            Step::remount_bind(c"again".into(), libc::MS_RDONLY),
        )
        .push(
            "stdout",
            Step::Dup {
                from: log.as_file().as_fd(),
                to: 1,
            },
        );
    drop_to_nobody(&mut plan);
    assert_eq!(plan.labels().next(), Some("make the mounts private"));
    let pid = plan.spawn(NAMESPACES).expect("spawn");
    assert!(wait(pid).success());
    assert_eq!(
        std::fs::read_to_string(log.path()).expect("log"),
        "confined\n"
    );
    // Nothing of the child's mounts is seen here.
    assert_eq!(
        std::fs::read(hidden.join("marker")).expect("marker"),
        b"seen"
    );
    assert!(!hidden.join("again").exists() && !hidden.join("file").exists());
}

#[test]
fn a_failing_step_is_named_by_its_label_with_its_errno() {
    if !root() {
        return;
    }
    let mut plan = shell("exit 0");
    plan.push(
        "enter the missing directory",
        Step::Chdir(c"/nonexistent/x".into()),
    )
    .push("never run", Step::NoNewPrivs);
    let err = plan.spawn(NAMESPACES).expect_err("chdir fails");
    match &err {
        ExecPlanError::Step { label, source } => {
            assert_eq!(label, "enter the missing directory");
            assert_eq!(source.raw_os_error(), Some(libc::ENOENT));
        }
        other => panic!("expected a step error, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        format!(
            "enter the missing directory: {}",
            std::io::Error::from_raw_os_error(libc::ENOENT)
        )
    );
    // A mount from a directory never opened fails there, with EBADF.
    let mut plan = shell("exit 0");
    plan.push("bind", Step::bind(MountSource::Opened(0), c"/mnt".into()));
    match plan.spawn(NAMESPACES) {
        Err(ExecPlanError::Step { label, source }) => {
            assert_eq!(
                (label.as_str(), source.raw_os_error()),
                ("bind", Some(libc::EBADF))
            );
        }
        other => panic!("expected EBADF, got {other:?}"),
    }
}

#[test]
fn a_missing_program_is_an_exec_error() {
    if !root() {
        return;
    }
    let mut plan = ExecPlan::new(Path::new("/nonexistent/program"), &["x"]).expect("plan");
    plan.push("no_new_privs", Step::NoNewPrivs);
    match plan.spawn(NAMESPACES) {
        Err(ExecPlanError::Exec { program, source }) => {
            assert_eq!(program, "/nonexistent/program");
            assert_eq!(source.raw_os_error(), Some(libc::ENOENT));
        }
        other => panic!("expected an exec error, got {other:?}"),
    }
}

#[test]
fn nul_bytes_are_refused_before_the_clone() {
    let err = ExecPlan::new(Path::new("/bin/sh"), &["a\0b"]).expect_err("NUL");
    assert_eq!(err.to_string(), "argument \"a\\0b\" contains a NUL byte");
    let err = c_path(Path::new("/x\0y")).expect_err("NUL");
    assert_eq!(err.to_string(), "/x\0y contains a NUL byte");
}

#[test]
fn reports_round_trip() {
    for (index, errno) in [(0, libc::EPERM), (7, libc::ENOENT), (62, 4095)] {
        assert_eq!(decode(&encode(index, errno)), (index, errno));
    }
}
