//! What this host offers the backends, for `hutch doctor` and the bench: the binary asks
//! here rather than reaching past the core into `hutch-jail` or `hutch-vm`.
//!
//! - [`report`]: kernel, namespaces, cgroups, seccomp, Landlock (the `ns` backend's needs);
//! - [`vm_support`], [`vm_acceleration`]: whether `vm` sandboxes can run, and KVM or TCG;
//! - [`ns_disk_quota`]: whether `disk_mib` would be enforced on `ns` (the btrfs disk pool);
//! - [`find_program`]: the one `PATH` lookup of the host tools;
//! - [`vm_cold_boot`]: a cold boot of a bake's guest (the bench's comparison for restores).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The `__jail-spawn` helper's entry point: the binary runs it when started as the helper.
pub use hutch_jail::helper_main as jail_helper_main;
/// Unescape a path as `/proc/self/mountinfo` writes it (`\040` for a space, ...).
pub use hutch_jail::mountinfo::unescape as unescape_mount_path;
pub use hutch_jail::HostReport;

use crate::error::{CoreError, CoreResult};

/// Where `program` is on `PATH` (a regular file with an execute bit), if anywhere.
pub fn find_program(program: &str) -> Option<PathBuf> {
    hutch_jail::find_program(program)
}

/// The host report (blocking: probes namespaces in a short-lived helper).
pub fn report() -> HostReport {
    hutch_jail::host_report()
}

/// Whether `vm` sandboxes can run here: `Ok(true)` when KVM is likely (so `auto` may pick
/// vm once the server's probe guest boots), `Ok(false)` under TCG, else why not. `missing`
/// lists the host tools `vm` needs that are not installed.
pub fn vm_support(missing: &[String], agent_ok: bool) -> Result<bool, String> {
    if !missing.is_empty() {
        return Err(format!("unavailable: missing {}", missing.join(", ")));
    }
    let version = hutch_vm::qemu::check_version(Path::new(hutch_vm::qemu::QEMU_BINARY))
        .map_err(|e| format!("unavailable: {e}"))?;
    if !agent_ok {
        return Err(format!(
            "QEMU {version} found but the static agent is missing"
        ));
    }
    let host = hutch_vm::accel::host_virt();
    Ok(hutch_vm::accel::choose_without_probe(&host).is_none())
}

/// The one-line explanation of the acceleration `vm` gets here.
pub fn vm_acceleration() -> String {
    let host = hutch_vm::accel::host_virt();
    match hutch_vm::accel::choose_without_probe(&host) {
        Some(choice) => format!("{}; so auto = ns, vm is opt-in", choice.why),
        None => "the CPU has hardware virtualization and /dev/kvm opens; `hutch serve` boots a probe guest and uses KVM (and auto = vm) if it answers".into(),
    }
}

/// Whether `hutch serve` on `state_dir` enforces `disk_mib` on ns sandboxes (a btrfs image of
/// subvolumes with qgroup limits, `<state>/layers.btrfs`), with the pool's size; or why not.
/// `pool_gib` is `hutch serve --ns-disk-pool-gib`.
pub fn ns_disk_quota(state_dir: &Path, pool_gib: Option<u64>) -> Result<String, String> {
    use hutch_jail::btrfs;
    let image = state_dir.join("layers.btrfs");
    let dir = state_dir.join("layers");
    let off = "ns sandboxes get no disk limit (disk_mib is not enforced)";
    if pool_gib == Some(0) {
        return Err(format!("off (--ns-disk-pool-gib 0): {off}"));
    }
    if !btrfs::kernel_has_btrfs() {
        return Err(format!(
            "not enforced: the kernel has no btrfs (CONFIG_BTRFS_FS); {off}"
        ));
    }
    if btrfs::is_btrfs(&dir) {
        let size = btrfs::fs_size(&dir).unwrap_or(0);
        return Ok(format!(
            "enforced (btrfs qgroups): pool {} mounted at {}, {}",
            image.display(),
            dir.display(),
            gib_text(size)
        ));
    }
    if let Ok(m) = image.metadata() {
        return Ok(format!(
            "enforced (btrfs qgroups): pool {} of {}, mounted by hutch serve when it starts",
            image.display(),
            gib_text(m.len())
        ));
    }
    let Some(mkfs) = btrfs::mkfs_path() else {
        return Err(format!(
            "not enforced: mkfs.btrfs is not on PATH (apt-get install btrfs-progs); {off}"
        ));
    };
    let space = state_dir.ancestors().find_map(crate::state_disk::space);
    let size = pool_gib
        .map(|g| g << 30)
        .or_else(|| space.map(|(free, total)| crate::state_disk::default_pool_bytes(free, total)));
    let size = size.unwrap_or(crate::state_disk::MAX_DEFAULT_POOL);
    if let Some(why) =
        space.and_then(|(free, total)| crate::state_disk::pool_does_not_fit(size, free, total))
    {
        return Err(format!("not enforced: {why}; {off}"));
    }
    Ok(format!(
        "enforced (btrfs qgroups): hutch serve makes a {} pool {} (allocated on the state disk) with {} on the first ns create",
        gib_text(size),
        image.display(),
        mkfs.display()
    ))
}

fn gib_text(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// A cold boot of a guest of `memory_mib` from the newest complete bake in `vm_dir` (QEMU
/// start to the agent's first answer, TCG, on a fresh overlay of the bake's disk in a
/// temporary directory; no snapshot), shut down after.
pub async fn vm_cold_boot(vm_dir: &Path, memory_mib: u32) -> CoreResult<Duration> {
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        CoreError::Internal(format!("cold boot: {what}: {e}"))
    };
    let complete = |dir: PathBuf| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.join("complete").is_file())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut bakes = complete(vm_dir.join("bakes"));
    bakes.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    let bake = bakes
        .pop()
        .ok_or_else(|| CoreError::NotFound("no bake to cold boot from".into()))?;
    let boot = complete(vm_dir.join("boot"))
        .pop()
        .ok_or_else(|| CoreError::NotFound("no boot assets".into()))?;
    let work = tempfile::Builder::new()
        .prefix("hutch-bench-cold-")
        .tempdir_in("/tmp")
        .map_err(|e| failed("a work directory", &e))?;
    let w = work.path();
    let bake_disk = hutch_vm::disk::RootDisk::load_chain(
        &bake.join("disk.qcow2"),
        &bake.join(hutch_vm::assets::DISK_CHAIN),
    )
    .map_err(|e| failed("the bake's disk", &e))?;
    let root_disk = bake_disk
        .overlay_at(&w.join("disk.qcow2"))
        .map_err(|e| failed("an overlay", &e))?;
    let mut config = hutch_vm::qemu::VmConfig::new(boot.join("vmlinux"), boot.join("initrd"), w);
    config.memory_mib = memory_mib;
    config.append = hutch_vm::assets::guest_append(hutch_vm::qemu::Accel::Tcg);
    config.root_disk = Some(root_disk);
    let t0 = Instant::now();
    let mut guest = hutch_vm::snapshot::Guest::start(config, &w.join("qemu.log"))
        .await
        .map_err(|e| failed("QEMU", &e))?;
    guest
        .agent(Duration::from_secs(120))
        .await
        .map_err(|e| failed("the agent", &e))?;
    let took = t0.elapsed();
    guest.shutdown().await.map_err(|e| failed("shutdown", &e))?;
    Ok(took)
}
