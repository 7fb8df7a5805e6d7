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
use hutch_vm::{disk, snapshot};

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
        memory_group: None,
        bake_uid: None,
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
    let snap = assets.snapshot(&boot, &image, 256, 1).await.expect("bake");
    println!(
        "QEMU {version}; kernel {}; boot assets {boot_time:?}, image {image_time:?}, bake {:?}",
        boot.package,
        t.elapsed()
    );

    let host = host_release();
    let mut firsts = Vec::new();
    let mut randoms = Vec::new();
    for i in 0..4 {
        let dir = w.join(format!("r{i}"));
        std::fs::create_dir(&dir).expect("mkdir");
        let overlay = dir.join("disk.qcow2");
        let t = Instant::now();
        disk::make_overlay(
            snap.config.root_disk.as_ref().expect("baked with a disk"),
            "qcow2",
            &overlay,
        )
        .expect("overlay");
        let overlay_time = t.elapsed();
        let (guest, client, report) =
            snapshot::restore(&snap, &dir, Some(overlay), None, Duration::from_secs(20))
                .await
                .expect("restore");
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
            "restore {i}: overlay {overlay_time:?}, QMP ready {:?}, running {:?}, first /v1/info {:?}, reconnect {reconnect:?}",
            report.qmp_ready, report.resumed, report.to_first_reply
        );
        firsts.push(report.to_first_reply);
        drop(info);
        again.shutdown().await.expect("shutdown");
    }
    randoms.sort();
    randoms.dedup();
    assert_eq!(
        randoms.len(),
        4,
        "every restored guest reads its own random bytes"
    );
    firsts.sort();
    println!(
        "restore-to-first-reply median {:?}",
        firsts[firsts.len() / 2]
    );
}
