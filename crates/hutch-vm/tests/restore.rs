//! End to end: bake a snapshot of a real guest, restore it, talk to its agent.
//!
//! Needs QEMU, the unpacked Debian cloud kernel and the static agent; run with
//! `cargo test -p hutch-vm -- --ignored --nocapture`. Paths can be overridden with
//! `HUTCH_VM_KERNEL_ROOT` (a `dpkg-deb -x` of `linux-image-*-cloud-amd64`),
//! `HUTCH_VM_AGENT` and `HUTCH_VM_BUSYBOX`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hutch_vm::initramfs::{self, InitramfsSpec};
use hutch_vm::qemu::{self, VmConfig};
use hutch_vm::{kernel, modules, snapshot};

fn env_path(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

fn only_entry(dir: &Path) -> PathBuf {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    entries.pop().expect("an entry")
}

fn host_release() -> String {
    let out = std::process::Command::new("uname")
        .arg("-r")
        .output()
        .expect("uname");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs QEMU, the Debian cloud kernel and the static agent; takes seconds under TCG"]
async fn bake_restore_and_ask_the_agent() {
    let version = qemu::check_version(Path::new(qemu::QEMU_BINARY)).expect("QEMU");
    let root = env_path("HUTCH_VM_KERNEL_ROOT", "/work/cache/kernel/root");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let agent = env_path(
        "HUTCH_VM_AGENT",
        &manifest
            .join("../../target/x86_64-unknown-linux-gnu/release-agent/hutch-agent")
            .to_string_lossy(),
    );
    let busybox = env_path("HUTCH_VM_BUSYBOX", "/bin/busybox");
    let work = tempfile::tempdir().expect("tempdir");
    let w = work.path();

    let t = std::time::Instant::now();
    let bzimage = std::fs::read_dir(root.join("boot"))
        .expect("boot dir")
        .map(|e| e.expect("entry").path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .expect("vmlinuz");
    let vmlinux = w.join("vmlinux");
    kernel::extract_vmlinux_file(&bzimage, &vmlinux).expect("extract vmlinux");
    let extract = t.elapsed();

    let t = std::time::Instant::now();
    let module_dir = only_entry(&root.join("lib/modules"));
    let mods = modules::resolve(&module_dir, &["virtio_mmio", "virtio_console"]).expect("modules");
    let names: Vec<_> = mods.iter().map(|m| m.name.clone()).collect();
    let initrd = w.join("initrd.cpio");
    initramfs::build_file(
        &InitramfsSpec {
            agent,
            busybox,
            modules: mods,
        },
        &initrd,
    )
    .expect("initramfs");
    let build = t.elapsed();

    let mut config = VmConfig::new(vmlinux, initrd, w);
    config.console_log = Some(w.join("console.log"));
    let (snap, bake) = snapshot::bake(
        config,
        &w.join("state"),
        &w.join("bake.log"),
        Duration::from_secs(60),
    )
    .await
    .expect("bake");

    println!("QEMU {version}; modules {names:?}");
    println!("extract vmlinux {extract:?}, build initramfs {build:?}");
    println!(
        "bake: cold boot to first /v1/info {:?}, save {:?}, state {} bytes, guest kernel {}",
        bake.cold_boot, bake.save, bake.state_bytes, bake.info.kernel
    );

    let host = host_release();
    let mut firsts = Vec::new();
    let mut stables = Vec::new();
    for i in 0..5 {
        let dir = w.join(format!("r{i}"));
        std::fs::create_dir(&dir).expect("mkdir");
        let (guest, client, report) = snapshot::restore(&snap, &dir, Duration::from_secs(20))
            .await
            .expect("restore");
        assert_ne!(
            report.info.kernel, host,
            "guest kernel must differ from the host's"
        );
        assert_eq!(report.info.kernel, bake.info.kernel);
        assert_eq!(report.info.pid, 1, "the agent is the guest's init");
        let again = match client.info().await {
            Ok(info) => info,
            Err(e) => {
                let console = std::fs::read_to_string(dir.join("console.log")).unwrap_or_default();
                let bake_console =
                    std::fs::read_to_string(w.join("console.log")).unwrap_or_default();
                panic!("second call: {e}\n--- restore console ---\n{console}\n--- bake console ---\n{bake_console}");
            }
        };
        assert_eq!(again.kernel, report.info.kernel);
        println!(
            "restore {i}: QMP ready {:?}, running {:?}, first /v1/info {:?}, stable connection {:?} (kernel {}, host {host})",
            report.qmp_ready,
            report.resumed,
            report.to_first_reply,
            report.stable,
            report.info.kernel
        );
        firsts.push(report.to_first_reply);
        stables.push(report.stable);
        drop(client);
        guest.shutdown().await.expect("shutdown");
    }
    firsts.sort();
    println!(
        "restore-to-first-reply median {:?}",
        firsts[firsts.len() / 2]
    );
}
