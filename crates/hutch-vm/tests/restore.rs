//! End to end: bake a snapshot of a real guest booted on a real root disk, restore it on
//! per-guest overlays, talk to its agent (reconnecting, identity, exec).
//!
//! Needs QEMU, qemu-img, mkfs.ext4, the static agent and a busybox, and fetches the Debian
//! cloud kernel unless `HUTCH_VM_KERNEL_ROOT` names an unpacked one; run with
//! `cargo test -p hutch-vm -- --ignored --nocapture`. `HUTCH_VM_AGENT` and
//! `HUTCH_VM_BUSYBOX` override the other inputs; `HUTCH_VM_CACHE` the cache directory
//! (default: a temporary one).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hutch_proto::{Command, ExecRequest, IdentityRequest};
use hutch_vm::assets::{AssetConfig, Assets};
use hutch_vm::qemu::{self, Accel};
use hutch_vm::snapshot;

fn env_path(var: &str, default: &Path) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| default.to_path_buf())
}

fn host_release() -> String {
    let out = std::process::Command::new("uname")
        .arg("-r")
        .output()
        .expect("uname");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A tiny root: busybox as /bin/sh and friends, a marker file.
fn make_root(dir: &Path, busybox: &Path) {
    std::fs::create_dir_all(dir.join("bin")).expect("mkdir");
    std::fs::create_dir_all(dir.join("etc")).expect("mkdir");
    std::fs::copy(busybox, dir.join("bin/busybox")).expect("copy busybox");
    for tool in ["sh", "cat", "uname", "head", "od", "hostname", "echo"] {
        std::os::unix::fs::symlink("busybox", dir.join("bin").join(tool)).expect("symlink");
    }
    std::fs::write(dir.join("etc/marker"), b"from the root disk\n").expect("marker");
}

async fn sh(client: &hutch_proto::client::AgentClient, script: &str) -> String {
    let request = ExecRequest {
        cmd: Command::Shell(script.into()),
        env: Default::default(),
        cwd: None,
        user: None,
        timeout_ms: Some(20_000),
        pty: None,
        stdin: false,
        background: false,
        handle: None,
    };
    let out = client
        .exec_collect(request, None, 1 << 20)
        .await
        .expect("exec");
    assert_eq!(out.exit.exit_code, 0, "{script}: {:?}", out.stderr);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs QEMU, qemu-img, mkfs.ext4, the static agent; takes seconds under TCG"]
async fn bake_restore_and_ask_the_agent() {
    let version = qemu::check_version(Path::new(qemu::QEMU_BINARY)).expect("QEMU");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let agent = env_path(
        "HUTCH_VM_AGENT",
        &manifest.join("../../target/x86_64-unknown-linux-gnu/release-agent/hutch-agent"),
    );
    let busybox = env_path("HUTCH_VM_BUSYBOX", Path::new("/bin/busybox"));
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    let cache = env_path("HUTCH_VM_CACHE", &w.join("cache"));
    let assets = Assets::new(AssetConfig {
        dir: cache,
        qemu: qemu::QEMU_BINARY.into(),
        agent,
        busybox: busybox.clone(),
        kernel_root: std::env::var_os("HUTCH_VM_KERNEL_ROOT").map(PathBuf::from),
        accel: Accel::Tcg,
        // As root, the bake and every other restore run jailed (own root, pid namespace,
        // uid), with the backend's memory group and bake uid (the cache may be shared).
        memory_group: root_user().then_some(MEMORY_GID),
        bake_uid: root_user().then_some(MEMORY_GID - 1),
    });

    let t = Instant::now();
    let boot = assets.boot().expect("kernel and initramfs");
    let boot_time = t.elapsed();
    let root = w.join("root");
    make_root(&root, &busybox);
    let t = Instant::now();
    let image = assets.image("restore-test", "fixed", &root).expect("image");
    let image_time = t.elapsed();
    let t = Instant::now();
    let snap = assets
        .snapshot(&boot, &image, 256, 1, None)
        .await
        .expect("bake");
    println!(
        "QEMU {version}; kernel {}; boot assets {boot_time:?}, image {image_time:?}, bake {:?}",
        boot.package,
        t.elapsed()
    );

    let host = host_release();
    let mut firsts = Vec::new();
    let mut jailed_firsts = Vec::new();
    let mut randoms = Vec::new();
    let guests = if root_user() { 8 } else { 4 };
    for i in 0..guests {
        let dir = w.join(format!("r{i}"));
        std::fs::create_dir(&dir).expect("mkdir");
        let overlay = dir.join("disk.qcow2");
        let t = Instant::now();
        let root_disk = snap
            .config
            .root_disk
            .as_ref()
            .expect("baked with a disk")
            .overlay_at(&overlay)
            .expect("overlay");
        let overlay_time = t.elapsed();
        let jail = (i % 2 == 1 && root_user()).then(|| {
            for path in [&dir, &overlay] {
                std::os::unix::fs::chown(path, Some(JAIL_UID), Some(JAIL_UID)).expect("chown");
            }
            qemu::QemuJail {
                uid: JAIL_UID,
                gid: JAIL_UID,
                groups: vec![MEMORY_GID],
                cgroup_procs: vec![],
            }
        });
        let jailed = jail.is_some();
        let (guest, client, report) = snapshot::restore(
            &snap,
            snapshot::Placement {
                dir: dir.clone(),
                root_disk: Some(root_disk),
                console: qemu::Console::File(dir.join("console.log")),
                jail,
            },
            Duration::from_secs(20),
        )
        .await
        .expect("restore");
        if jailed {
            let pid = guest.pid();
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
            assert!(
                status
                    .lines()
                    .any(|l| l.starts_with("NSpid:") && l.ends_with("\t1")),
                "a jailed QEMU is pid 1 of its namespace: {status}"
            );
            assert!(
                !Path::new(&format!("/proc/{pid}/root/etc")).exists(),
                "a jailed QEMU has its own root"
            );
        }
        assert_ne!(
            report.info.kernel, host,
            "guest kernel differs from the host's"
        );
        assert_eq!(report.info.pid, 1, "the agent is the guest's init");
        client
            .identity(&IdentityRequest {
                hostname: Some(format!("guest-{i}")),
                entropy: (0..64).map(|b| b ^ (i as u8) ^ 0x5a).collect(),
                unix_time_ms: Some(1_700_000_000_000),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| {
                let console = std::fs::read_to_string(dir.join("console.log")).unwrap_or_default();
                panic!("identity: {e}\n--- console ---\n{console}")
            });
        assert_eq!(sh(&client, "cat /etc/marker").await, "from the root disk");
        assert_eq!(sh(&client, "hostname").await, format!("guest-{i}"));
        randoms.push(sh(&client, "head -c 16 /dev/urandom | od -An -tx1").await);
        sh(&client, "echo written > /etc/mine").await;
        // Hang up, wait until the agent has ended that session, reconnect.
        let mut guest = guest;
        guest.qmp.clear_events().await.expect("events");
        drop(client);
        let t = Instant::now();
        let reopened = guest
            .qmp
            .wait_port_reopened(hutch_vm::qemu::AGENT_PORT_ID, Duration::from_secs(10))
            .await
            .expect("events");
        assert!(
            reopened,
            "the agent closed and reopened its port after the hang-up"
        );
        let (again, info) = {
            let r = guest
                .agent(Duration::from_secs(10))
                .await
                .expect("reconnect");
            (guest, r)
        };
        let reconnect = t.elapsed();
        assert_eq!(info.1.pid, 1);
        assert_eq!(sh(&info.0, "cat /etc/mine").await, "written");
        println!(
            "restore {i}{}: overlay {overlay_time:?}, QMP ready {:?}, running {:?}, first /v1/info {:?}, reconnect {reconnect:?}",
            if jailed { " (jailed)" } else { "" },
            report.qmp_ready, report.resumed, report.to_first_reply
        );
        let times = (report.qmp_ready, report.to_first_reply);
        if jailed {
            jailed_firsts.push(times);
        } else {
            firsts.push(times);
        }
        drop(info);
        again.shutdown().await.expect("shutdown");
    }
    randoms.sort();
    randoms.dedup();
    assert_eq!(
        randoms.len(),
        guests,
        "every restored guest reads its own random bytes"
    );
    for (what, times) in [("unjailed", firsts), ("jailed", jailed_firsts)] {
        let median = |mut d: Vec<Duration>| {
            d.sort();
            d.get(d.len() / 2).copied()
        };
        if let (Some(qmp), Some(reply)) = (
            median(times.iter().map(|t| t.0).collect()),
            median(times.iter().map(|t| t.1).collect()),
        ) {
            println!(
                "{what}: median QEMU start to QMP ready {qmp:?}, to the first reply {reply:?}"
            );
        }
    }
}

/// The backend's memory group (`hutch_core::backend::vm::MEMORY_GID`).
const MEMORY_GID: u32 = 16 * 65536 - 1;
/// The uid of this test's jailed QEMUs.
const JAIL_UID: u32 = MEMORY_GID - 2;

fn root_user() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// What the jail costs a QEMU start: `QemuProcess::spawn` returns once QEMU is exec'd, so
/// its time is the fork (clone) plus, jailed, the namespaces, the new root and the uid.
#[test]
#[ignore = "needs QEMU and root"]
fn jail_setup_cost() {
    if !root_user() {
        return;
    }
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();
    for file in ["vmlinux", "initrd"] {
        std::fs::write(w.join(file), b"not a kernel").expect("write");
    }
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for i in 0..40 {
        let jailed = i % 2 == 1;
        let dir = w.join(format!("q{i}"));
        std::fs::create_dir(&dir).expect("mkdir");
        let mut config = qemu::VmConfig::new(w.join("vmlinux"), w.join("initrd"), &dir);
        if jailed {
            std::os::unix::fs::chown(&dir, Some(JAIL_UID), Some(JAIL_UID)).expect("chown");
            config.jail = Some(qemu::QemuJail {
                uid: JAIL_UID,
                gid: JAIL_UID,
                groups: vec![],
                cgroup_procs: vec![],
            });
        }
        let t = Instant::now();
        let process = qemu::QemuProcess::spawn(&config, &dir.join("qemu.log")).expect("spawn");
        times[usize::from(jailed)].push(t.elapsed());
        drop(process);
    }
    for (what, mut t) in ["unjailed", "jailed"].into_iter().zip(times) {
        t.sort();
        println!(
            "{what}: spawn to exec min {:?}, median {:?}, max {:?}",
            t[0],
            t[t.len() / 2],
            t[t.len() - 1]
        );
    }
}
