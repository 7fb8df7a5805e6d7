//! Tests of [`TemplateStore`] with real builds of `minimal` in temporary directories, and
//! one real build of `base` (ignored by default: it needs Debian's mirror and minutes).

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use super::*;
use crate::builtin_names;

/// A store in a fresh temporary directory.
fn temp_store() -> (tempfile::TempDir, TemplateStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = TemplateStore::open(dir.path().join("templates")).expect("open");
    (dir, store)
}

/// Builds `name`, returning the result and every progress event.
fn build_collecting(
    store: &TemplateStore,
    name: &str,
    options: &BuildOptions,
) -> (Result<TemplateInfo>, Vec<Progress>) {
    let mut events = Vec::new();
    let result = store.build(name, options, &mut |p: Progress| events.push(p));
    (result, events)
}

/// The build's own steps: without "waiting for another build", which a parallel test's
/// fork can cause (a child holds a copy of the lock's descriptor until it execs).
fn own_steps(events: &[Progress]) -> usize {
    steps(events)
        .iter()
        .filter(|s| !s.starts_with("waiting for another build"))
        .count()
}

/// Names in the store directory other than lock files.
fn entries(store: &TemplateStore) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(store.dir())
        .expect("readable")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".lock-"))
        .collect();
    names.sort();
    names
}

/// Mode bits (with setuid/setgid/sticky) of `path`, not following symlinks.
fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path)
        .expect("exists")
        .permissions()
        .mode()
        & 0o7777
}

fn steps(events: &[Progress]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|e| match e {
            Progress::Step(s) => Some(s.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn minimal_builds_and_is_ready() {
    let (_tmp, store) = temp_store();
    let (result, events) = build_collecting(&store, "minimal", &BuildOptions::default());
    let info = result.expect("minimal builds");
    assert!(info.ready);
    assert_eq!(info.name, "minimal");
    assert_eq!(info.isolations, vec!["ns".to_owned(), "vm".to_owned()]);
    assert!(
        info.size_bytes > 1_000_000,
        "busybox alone is ~2 MB: {}",
        info.size_bytes
    );
    let created = info.created_at.as_deref().expect("created_at");
    assert!(created.len() == 20 && created.ends_with('Z'), "{created}");
    assert_eq!(info.defaults.memory_mib, 256);
    assert_eq!(info.defaults.pids_max, 256);
    assert!(matches!(events.last(), Some(Progress::Done { .. })));
    assert!(steps(&events).contains(&"copying busybox"));

    assert_eq!(store.get("minimal"), Some(info.clone()));
    assert_eq!(store.list().expect("list"), vec![info.clone()]);
    assert_eq!(entries(&store), vec!["minimal"]);

    let api = serde_json::to_value(&info).expect("json");
    for key in [
        "name",
        "ready",
        "isolations",
        "size_bytes",
        "created_at",
        "description",
        "defaults",
    ] {
        assert!(api.get(key).is_some(), "template object lacks {key}: {api}");
    }

    // A default isolation can be set and cleared; bad values and names are refused.
    assert_eq!(info.defaults.isolation, None);
    let vm = store.set_isolation("minimal", "vm").expect("set vm");
    assert_eq!(vm.defaults.isolation.as_deref(), Some("vm"));
    assert_eq!(
        store
            .get("minimal")
            .expect("ready")
            .defaults
            .isolation
            .as_deref(),
        Some("vm")
    );
    assert!(matches!(
        store.set_isolation("minimal", "kvm"),
        Err(TemplateError::InvalidIsolation(_))
    ));
    assert!(matches!(
        store.set_isolation("nope", "ns"),
        Err(TemplateError::NotReady(_))
    ));
    let auto = store.set_isolation("minimal", "auto").expect("set auto");
    assert_eq!(auto, info);

    let root = store.rootfs("minimal");
    assert_eq!(mode(&root), 0o755);
    assert_eq!(mode(&root.join("bin/busybox")), 0o755);
    assert_eq!(
        fs::canonicalize(root.join("bin/sh")).expect("sh resolves"),
        root.join("bin/busybox")
    );
    assert_eq!(
        fs::canonicalize(root.join("usr/bin/env")).expect("env resolves"),
        root.join("bin/busybox")
    );
    let passwd = fs::read_to_string(root.join("etc/passwd")).expect("passwd");
    assert!(
        passwd.contains("root:x:0:0:root:/root:/bin/sh\n"),
        "{passwd}"
    );
    assert!(
        passwd.contains("user:x:1000:1000:user:/home/user:/bin/sh\n"),
        "{passwd}"
    );
    assert!(passwd.contains("nobody:x:65534:65534:"), "{passwd}");
    let group = fs::read_to_string(root.join("etc/group")).expect("group");
    assert!(group.contains("user:x:1000:"), "{group}");
    for file in ["etc/hostname", "etc/hosts", "etc/resolv.conf"] {
        assert!(root.join(file).is_file(), "{file}");
    }
    assert_eq!(mode(&root.join("tmp")), 0o1777);
    assert_eq!(mode(&root.join("var/tmp")), 0o1777);
    assert_eq!(mode(&root.join("root")), 0o700);
    assert_eq!(mode(&root.join("proc")), 0o555);
    for dir in ["dev", "sys", "run", "home/user", "workspace", ".hutch"] {
        assert!(root.join(dir).is_dir(), "{dir}");
    }
    if sys::is_root() {
        let meta = fs::metadata(&root).expect("rootfs");
        assert_eq!((meta.uid(), meta.gid()), (0, 0));
        let meta = fs::metadata(root.join("home/user")).expect("home");
        assert_eq!((meta.uid(), meta.gid()), (1000, 1000));
        // The root really works: busybox's shell runs inside it.
        let out = Command::new("chroot")
            .arg(&root)
            .args(["/bin/sh", "-c", "id -u; cat /etc/hostname; ls /usr/bin/env"])
            .output()
            .expect("chroot runs");
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "0\nsandbox\n/usr/bin/env\n"
        );
    }
}

#[test]
fn building_again_reuses_and_force_replaces() {
    let (_tmp, store) = temp_store();
    let first = store
        .build("minimal", &BuildOptions::default(), &mut |_| {})
        .expect("builds");
    let marker = store.rootfs("minimal").join("marker");
    fs::write(&marker, b"old").expect("write marker");

    let (again, events) = build_collecting(&store, "minimal", &BuildOptions::default());
    assert_eq!(again.expect("ready"), first);
    assert_eq!(steps(&events), vec!["template `minimal` is already built"]);
    assert!(marker.exists());

    let force = BuildOptions {
        force: true,
        ..BuildOptions::default()
    };
    let rebuilt = store
        .build("minimal", &force, &mut |_| {})
        .expect("rebuilds");
    assert!(rebuilt.ready);
    assert!(!marker.exists(), "the old root was replaced");
    // The replaced build is kept as an old revision, found by its number, until removed.
    assert_eq!(rebuilt.rev, first.rev + 1);
    assert_eq!(store.old_revisions("minimal"), vec![first.rev]);
    let old_root = store.rootfs_at("minimal", Some(first.rev));
    assert!(
        old_root.join("marker").exists(),
        "the old revision keeps its files"
    );
    assert_eq!(
        store.get_at("minimal", Some(first.rev)).map(|i| i.rev),
        Some(first.rev)
    );
    assert_eq!(
        store.rootfs_at("minimal", Some(rebuilt.rev)),
        store.rootfs("minimal")
    );
    assert!(store
        .remove_revision("minimal", first.rev)
        .expect("removed"));
    assert!(store.get_at("minimal", Some(first.rev)).is_none());
    assert_eq!(entries(&store), vec![".revisions", "minimal"]);
    assert!(store.remove("minimal").expect("removed"));
    assert_eq!(entries(&store), vec![".revisions"]);
}

#[test]
fn a_failure_at_any_step_leaves_nothing() {
    let (_tmp, store) = temp_store();
    let (result, events) = build_collecting(&store, "minimal", &BuildOptions::default());
    result.expect("builds");
    let total_steps = own_steps(&events);
    assert!(store.remove("minimal").expect("removed"));

    for n in 0..total_steps {
        let options = BuildOptions {
            fail_after_step: Some(n),
            ..BuildOptions::default()
        };
        let (result, events) = build_collecting(&store, "minimal", &options);
        let err = result.expect_err("injected failure");
        assert!(
            err.to_string().contains("injected failure"),
            "step {n}: {err}"
        );
        assert_eq!(own_steps(&events), n);
        assert_eq!(
            entries(&store),
            Vec::<String>::new(),
            "after failing at step {n}"
        );
        assert_eq!(store.get("minimal"), None);
    }
}

#[test]
fn a_failed_rebuild_keeps_the_old_template() {
    let (_tmp, store) = temp_store();
    let old = store
        .build("minimal", &BuildOptions::default(), &mut |_| {})
        .expect("builds");
    let options = BuildOptions {
        force: true,
        fail_after_step: Some(3),
        ..BuildOptions::default()
    };
    store
        .build("minimal", &options, &mut |_| {})
        .expect_err("fails");
    assert_eq!(store.get("minimal"), Some(old));
    assert_eq!(entries(&store), vec!["minimal"]);
}

#[test]
fn a_failed_build_unmounts_before_deleting() {
    if !sys::is_root() {
        eprintln!("skipping: mounting needs root");
        return;
    }
    let (_tmp, store) = temp_store();
    let options = BuildOptions {
        fail_after_step: Some(3),
        ..BuildOptions::default()
    };
    let dir = store.dir().to_path_buf();
    let mut mounted = None;
    let result = store.build("minimal", &options, &mut |p: Progress| {
        // Like debootstrap: mount something inside the build's root, then fail.
        if p == Progress::Step("creating directories".into()) {
            return;
        }
        if p == Progress::Step("copying busybox".into()) {
            let build = fs::read_dir(&dir)
                .expect("store")
                .map(|e| e.expect("entry").path())
                .find(|p| p.to_string_lossy().contains(".build-minimal-"))
                .expect("build dir exists");
            let proc_dir = build.join("rootfs/proc");
            let ok = Command::new("mount")
                .args(["-t", "tmpfs", "hutch-test"])
                .arg(&proc_dir)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "mount tmpfs");
            fs::write(proc_dir.join("inside"), b"x").expect("write into the mount");
            mounted = Some(proc_dir);
        }
    });
    result.expect_err("injected failure");
    let proc_dir = mounted.expect("the hook ran");
    assert!(!proc_dir.exists());
    assert!(crate::mounts::mounts_under(store.dir())
        .expect("mountinfo")
        .is_empty());
    assert_eq!(entries(&store), Vec::<String>::new());
}

#[test]
fn busybox_problems_are_named() {
    let (_tmp, store) = temp_store();
    let missing = BuildOptions {
        busybox: Some("/nonexistent/busybox".into()),
        ..BuildOptions::default()
    };
    let err = store
        .build("minimal", &missing, &mut |_| {})
        .expect_err("missing");
    assert_eq!(
        err.to_string(),
        "`/nonexistent/busybox` is not installed on this host; install it with \
         `apt-get install busybox-static`"
    );
    let dynamic = BuildOptions {
        busybox: Some("/bin/sh".into()),
        ..BuildOptions::default()
    };
    let err = store
        .build("minimal", &dynamic, &mut |_| {})
        .expect_err("dynamic");
    assert!(matches!(err, TemplateError::NotStatic(_)), "{err}");
    assert!(err.to_string().contains("busybox-static"), "{err}");
    assert_eq!(entries(&store), Vec::<String>::new());
}

#[test]
fn unknown_and_invalid_names() {
    let (_tmp, store) = temp_store();
    let err = store
        .build("nope", &BuildOptions::default(), &mut |_| {})
        .expect_err("unknown");
    assert_eq!(
        err.to_string(),
        "unknown template `nope`; built-in templates are: minimal, base, code-interpreter"
    );
    let err = store
        .build("../minimal", &BuildOptions::default(), &mut |_| {})
        .expect_err("unknown");
    assert!(matches!(err, TemplateError::Unknown(_)), "{err}");
    assert_eq!(store.get("../etc"), None);
    assert_eq!(store.get("absent"), None);
    let err = store.remove("../x").expect_err("invalid");
    assert_eq!(
        err.to_string(),
        "invalid template name `../x`: use 1 to 63 characters from a-z, 0-9, `.`, `_` and `-`, \
         starting with a letter or digit"
    );
    assert!(!store.remove("absent").expect("nothing to remove"));
    assert_eq!(builtin_names(), ["minimal", "base", "code-interpreter"]);
}

#[test]
fn listing_shows_ready_and_unready() {
    let (_tmp, store) = temp_store();
    store
        .build("minimal", &BuildOptions::default(), &mut |_| {})
        .expect("builds");
    let dir = store.dir();
    fs::create_dir_all(dir.join("half/rootfs")).expect("mkdir");
    fs::create_dir_all(dir.join("garbled/rootfs")).expect("mkdir");
    fs::write(dir.join("garbled/template.json"), b"{not json").expect("write");
    fs::create_dir_all(dir.join("unfinished/rootfs")).expect("mkdir");
    let mut file: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("minimal/template.json")).expect("read"))
            .expect("json");
    file["ready"] = serde_json::Value::Bool(false);
    fs::write(dir.join("unfinished/template.json"), file.to_string()).expect("write");
    fs::create_dir_all(dir.join(".build-base-0123456789abcdef/rootfs")).expect("mkdir");
    fs::write(dir.join("stray-file"), b"").expect("write");

    let listed: Vec<(String, bool)> = store
        .list()
        .expect("list")
        .into_iter()
        .map(|t| (t.name, t.ready))
        .collect();
    assert_eq!(
        listed,
        vec![
            ("garbled".to_owned(), false),
            ("half".to_owned(), false),
            ("minimal".to_owned(), true),
            ("unfinished".to_owned(), false),
        ]
    );
    let half = store.get("half").expect("listed");
    assert!(!half.ready && half.isolations.is_empty() && half.created_at.is_none());
}

#[test]
fn leftovers_of_a_crashed_build_are_deleted_by_the_next() {
    let (_tmp, store) = temp_store();
    let dir = store.dir();
    let stale = dir.join(".build-minimal-0123456789abcdef");
    fs::create_dir_all(stale.join("rootfs/bin")).expect("mkdir");
    let other = dir.join(".build-minimal-x-0123456789abcdef");
    fs::create_dir_all(&other).expect("mkdir");
    store
        .build("minimal", &BuildOptions::default(), &mut |_| {})
        .expect("builds");
    assert!(!stale.exists());
    assert!(other.exists(), "belongs to template `minimal-x`");
}

#[test]
fn concurrent_builds_build_once() {
    let (_tmp, store) = temp_store();
    let (building_tx, building_rx) = mpsc::channel::<()>();
    let (waiting_tx, waiting_rx) = mpsc::channel::<()>();

    std::thread::scope(|scope| {
        let store = &store;
        let first = scope.spawn(move || {
            let mut events = Vec::new();
            let result = store.build("minimal", &BuildOptions::default(), &mut |p: Progress| {
                if p == Progress::Step("copying busybox".into()) {
                    building_tx.send(()).expect("main listens");
                    // Hold the build until the second caller is known to wait for it.
                    waiting_rx
                        .recv_timeout(Duration::from_secs(60))
                        .expect("the second build waits on the lock");
                }
                events.push(p);
            });
            (result, events)
        });
        building_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the first build starts");
        let second = scope.spawn(move || {
            let mut events = Vec::new();
            let result = store.build("minimal", &BuildOptions::default(), &mut |p: Progress| {
                if matches!(&p, Progress::Step(s) if s.starts_with("waiting for another build")) {
                    waiting_tx.send(()).expect("first build listens");
                }
                events.push(p);
            });
            (result, events)
        });
        let (first_result, first_events) = first.join().expect("first thread");
        let (second_result, second_events) = second.join().expect("second thread");
        let (a, b) = (first_result.expect("first"), second_result.expect("second"));
        assert_eq!(a, b);
        assert!(steps(&first_events).contains(&"copying busybox"));
        assert_eq!(
            steps(&second_events),
            vec![
                "waiting for another build of `minimal`",
                "template `minimal` is already built"
            ]
        );
    });
    assert_eq!(entries(&store), vec!["minimal"]);
}

/// Builds `base` for real. Needs root, `debootstrap` and Debian's mirror; takes minutes.
/// Run with `cargo test -p hutch-template -- --ignored base_builds --nocapture`.
#[test]
#[ignore = "downloads Debian; takes 1-3 minutes"]
fn base_builds_for_real() {
    let (_tmp, store) = temp_store();
    let start = std::time::Instant::now();
    let info = store
        .build(
            "base",
            &BuildOptions::default(),
            &mut |p: Progress| match p {
                Progress::Step(s) => eprintln!("step: {s}"),
                Progress::Output(_) | Progress::Transfer(_) => {}
                Progress::Done { seconds } => eprintln!("done in {seconds:.1} s"),
            },
        )
        .expect("base builds");
    eprintln!(
        "base: {:.1} s, {} MB",
        start.elapsed().as_secs_f64(),
        info.size_bytes / 1_000_000
    );
    assert!(info.ready);
    assert_eq!(info.defaults.memory_mib, 512);
    assert_eq!(info.defaults.pids_max, 1024);
    let root = store.rootfs("base");
    let passwd = fs::read_to_string(root.join("etc/passwd")).expect("passwd");
    assert!(passwd.contains("user:x:1000:1000:"), "{passwd}");
    assert!(root.join("workspace").is_dir() && root.join(".hutch").is_dir());
    assert!(root.join("etc/resolv.conf").exists());
    let lists: Vec<_> = fs::read_dir(root.join("var/lib/apt/lists"))
        .expect("lists")
        .collect();
    assert!(lists.is_empty(), "apt lists removed");
    let out = Command::new("chroot")
        .arg(&root)
        .args([
            "/bin/sh",
            "-c",
            "python3 -c 'print(6*7)' && git --version && curl --version >/dev/null && \
             gcc --version >/dev/null && python3 -m venv /tmp/v && pip3 --version >/dev/null",
        ])
        .output()
        .expect("chroot runs");
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("42\n"));
    assert!(crate::mounts::mounts_under(store.dir())
        .expect("mountinfo")
        .is_empty());
    assert!(store.remove("base").expect("removed"));
    assert_eq!(entries(&store), Vec::<String>::new());
}

#[test]
fn base_with_an_unreachable_mirror_fails_cleanly() {
    if !sys::is_root() || crate::recipes::command::find_program("debootstrap").is_none() {
        eprintln!("skipping: needs root and debootstrap");
        return;
    }
    let (_tmp, store) = temp_store();
    let options = BuildOptions {
        mirror: Some("file:///nonexistent".into()),
        ..BuildOptions::default()
    };
    let (result, events) = build_collecting(&store, "base", &options);
    let err = result.expect_err("no such mirror");
    let text = err.to_string();
    assert!(
        text.starts_with(
            "template build step `debootstrap bookworm from file:///nonexistent` failed: `"
        ),
        "{text}"
    );
    assert!(text.contains("Failed getting release file"), "{text}");
    assert!(events.iter().any(|e| matches!(e, Progress::Output(_))));
    assert_eq!(entries(&store), Vec::<String>::new());
}
