//! The cache of everything a `vm` sandbox is restored from, in one directory, each entry
//! keyed by a hash of its inputs so a changed input makes a new entry:
//!
//! ```text
//! <dir>/kernel/…                      the unpacked Debian kernel package (package.rs)
//! <dir>/boot/<key>/{vmlinux,initrd}   key = sha256(vmlinuz, agent, busybox, modules, /init)
//! <dir>/images/<template>-<key>.ext4  key = sha256(template name, build stamp)
//! <dir>/bakes/<key>/                  key = sha256(boot key, image, memory, vCPUs, accel)
//!     memory      guest RAM (the bake maps it share=on; restores map it share=off)
//!     state       device state (RAM excluded: x-ignore-shared)
//!     disk.qcow2  the bake's root disk overlay; every sandbox's overlay is backed by it
//!     console.log, bake.log
//! ```
//!
//! An entry is complete once its `complete` marker exists; each is built under an `flock`
//! (`<entry>.lock`), so parallel creates and servers build it once. Old entries are not
//! collected yet.
//!
//! Everything here blocks (files, `mkfs.ext4`, `flock`); [`Assets::snapshot`] is async
//! because it drives a guest, but also blocks on its lock: call it from a blocking thread.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::initramfs::{self, InitramfsSpec};
use crate::lock::FileLock;
use crate::package::{self, KernelPackage};
use crate::qemu::{Accel, VmConfig};
use crate::snapshot::{self, Snapshot};
use crate::{disk, kernel, modules, VmError};

/// Modules the guest loads, in any order (dependencies are added and ordered).
pub const GUEST_MODULES: &[&str] = &["virtio_mmio", "virtio_console", "virtio_blk", "virtio_net"];
/// Marker of a complete cache entry.
const COMPLETE: &str = "complete";
/// A bake's record of its disk's chain ([`disk::RootDisk::save_chain`]).
pub const DISK_CHAIN: &str = "disk-chain";
/// How long a bake's cold boot may take (TCG on a busy host is slow).
const BAKE_BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// Bumped when the command line or the bake procedure changes, so old bakes are not used.
const BAKE_FORMAT: &str = "hutch-bake-6";
/// Free space given to a template image beyond its files.
const IMAGE_HEADROOM_MIB: u64 = 1024;

/// Where the cache is and what goes into it.
#[derive(Debug, Clone)]
pub struct AssetConfig {
    /// The cache directory.
    pub dir: PathBuf,
    /// The QEMU binary.
    pub qemu: PathBuf,
    /// The static `hutch-agent`.
    pub agent: PathBuf,
    /// A static busybox for the initramfs.
    pub busybox: PathBuf,
    /// An already unpacked kernel package to use instead of fetching one.
    pub kernel_root: Option<PathBuf>,
    /// Accelerator the bakes (and so every restore) use.
    pub accel: Accel,
    /// Group given read-write access to bakes' memory files (mode 0660, owner root), for
    /// QEMUs that run as unprivileged uids: QEMU 7.2 opens a `memory-backend-file`
    /// read-write even when it maps it privately.
    pub memory_group: Option<u32>,
    /// Unprivileged uid the bake's QEMU runs as (in its own namespaces, see
    /// [`crate::qemu::QemuJail`]); `None` runs it as the caller.
    pub bake_uid: Option<u32>,
}

/// A bootable kernel and initramfs.
#[derive(Debug, Clone)]
pub struct Boot {
    /// Hash of the inputs.
    pub key: String,
    /// The kernel package it came from.
    pub package: String,
    /// The ELF kernel.
    pub vmlinux: PathBuf,
    /// The initramfs.
    pub initrd: PathBuf,
}

/// The cache.
#[derive(Debug)]
pub struct Assets {
    cfg: AssetConfig,
    boot: Mutex<Option<Boot>>,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VmError {
    let what = what.into();
    move |source| VmError::Io { what, source }
}

fn read(path: &Path) -> Result<Vec<u8>, VmError> {
    std::fs::read(path).map_err(io(format!("read {}", path.display())))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Hash of length-prefixed parts (so `("ab","c")` and `("a","bc")` differ).
fn key_of(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for part in parts {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    hex(&h.finalize())
}

impl Assets {
    /// A cache in `cfg.dir` (nothing is built until asked).
    pub fn new(cfg: AssetConfig) -> Self {
        Self {
            cfg,
            boot: Mutex::new(None),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &AssetConfig {
        &self.cfg
    }

    /// The kernel package (fetched on first use).
    pub fn kernel_package(&self) -> Result<KernelPackage, VmError> {
        match &self.cfg.kernel_root {
            Some(root) => Ok(KernelPackage::at(root)),
            None => Ok(package::ensure(&self.cfg.dir.join("kernel"))?),
        }
    }

    /// The kernel and initramfs, built on first use (remembered for this process).
    pub fn boot(&self) -> Result<Boot, VmError> {
        let mut cached = self.boot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(boot) = cached.as_ref() {
            return Ok(boot.clone());
        }
        let boot = self.build_boot()?;
        *cached = Some(boot.clone());
        Ok(boot)
    }

    fn build_boot(&self) -> Result<Boot, VmError> {
        let pkg = self.kernel_package()?;
        let vmlinuz = pkg.vmlinuz()?;
        let mods = modules::resolve(&pkg.module_dir()?, GUEST_MODULES)?;
        let script = initramfs::init_script(&mods);
        let mut inputs: Vec<Vec<u8>> = vec![
            read(&vmlinuz)?,
            read(&self.cfg.agent)?,
            read(&self.cfg.busybox)?,
            script.into_bytes(),
        ];
        for m in &mods {
            inputs.push(m.name.clone().into_bytes());
            inputs.push(read(&m.path)?);
        }
        let parts: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let key = key_of(&parts);
        drop(inputs);
        let dir = self.cfg.dir.join("boot").join(&key);
        let boot = Boot {
            key: key.clone(),
            package: pkg.name.clone(),
            vmlinux: dir.join("vmlinux"),
            initrd: dir.join("initrd"),
        };
        if dir.join(COMPLETE).is_file() {
            return Ok(boot);
        }
        std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
        let _lock = FileLock::exclusive(&dir.with_extension("lock")).map_err(io("lock boot"))?;
        if dir.join(COMPLETE).is_file() {
            return Ok(boot);
        }
        kernel::extract_vmlinux_file(&vmlinuz, &boot.vmlinux)?;
        initramfs::build_file(
            &InitramfsSpec {
                agent: self.cfg.agent.clone(),
                busybox: self.cfg.busybox.clone(),
                modules: mods,
            },
            &boot.initrd,
        )?;
        std::fs::write(dir.join(COMPLETE), pkg.name.as_bytes()).map_err(io("mark boot"))?;
        tracing::info!(key, package = %pkg.name, "guest kernel and initramfs built");
        Ok(boot)
    }

    /// The ext4 image of template `name` (root `rootfs`, built at `stamp`), made on first
    /// use; a rebuilt template has a new stamp and so gets a new image.
    pub fn image(&self, name: &str, stamp: &str, rootfs: &Path) -> Result<PathBuf, VmError> {
        let dir = self.cfg.dir.join("images");
        let key = key_of(&[name.as_bytes(), stamp.as_bytes()]);
        let image = dir.join(format!("{name}-{key}.ext4"));
        if image.is_file() {
            return Ok(image);
        }
        std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
        let _lock =
            FileLock::exclusive(&dir.join(format!("{name}.lock"))).map_err(io("lock the image"))?;
        if image.is_file() {
            return Ok(image);
        }
        let used_mib = disk::tree_bytes(rootfs)?.div_ceil(1 << 20);
        let size_mib = used_mib + used_mib / 4 + IMAGE_HEADROOM_MIB;
        let started = std::time::Instant::now();
        disk::make_ext4(rootfs, &image, size_mib)?;
        tracing::info!(
            template = name,
            size_mib,
            ms = started.elapsed().as_millis() as u64,
            "template image built"
        );
        Ok(image)
    }

    /// The baked snapshot of `image` for a guest of `memory_mib` MiB and `cpus` vCPUs,
    /// baked (cold boot, save) on first use. Blocks on the bake's lock.
    pub async fn snapshot(
        &self,
        boot: &Boot,
        image: &Path,
        memory_mib: u32,
        cpus: u32,
        service: Option<&hutch_proto::ServiceSpec>,
    ) -> Result<Snapshot, VmError> {
        let accel = format!("{:?}", self.cfg.accel);
        let append = guest_append(self.cfg.accel);
        // A template with a start command is baked with it running: its bake is its own.
        let service_key = service
            .map(|s| serde_json::to_vec(s).unwrap_or_default())
            .unwrap_or_default();
        let key = key_of(&[
            &service_key,
            append.as_bytes(),
            BAKE_FORMAT.as_bytes(),
            boot.key.as_bytes(),
            image.as_os_str().as_encoded_bytes(),
            &memory_mib.to_le_bytes(),
            &cpus.to_le_bytes(),
            accel.as_bytes(),
            self.cfg.qemu.as_os_str().as_encoded_bytes(),
        ]);
        let dir = self.cfg.dir.join("bakes").join(&key);
        let mut config = VmConfig::new(boot.vmlinux.clone(), boot.initrd.clone(), &dir);
        config.qemu = self.cfg.qemu.clone();
        config.accel = self.cfg.accel;
        config.memory_mib = memory_mib;
        config.cpus = cpus;
        config.append = append;
        // A bake boots the operator's template (trusted input), for seconds.
        config.console = crate::qemu::Console::File(dir.join("console.log"));
        let image_disk = disk::RootDisk::raw(image);
        config.root_disk = Some(disk::RootDisk::qcow2(
            &dir.join("disk.qcow2"),
            image_disk.chain_below_overlay(),
        ));
        let snap = Snapshot {
            ram_in_memory_file: true,
            config: config.clone(),
            state: dir.join("state"),
        };
        if dir.join(COMPLETE).is_file() {
            self.share_memory_file(&dir)?;
            record_chain(&snap, &dir, false)?;
            return Ok(snap);
        }
        std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
        let _lock = FileLock::exclusive(&dir.with_extension("lock")).map_err(io("lock bake"))?;
        if dir.join(COMPLETE).is_file() {
            self.share_memory_file(&dir)?;
            return Ok(snap);
        }
        for stale in ["disk.qcow2", "memory", "state", "console.log"] {
            let _ = std::fs::remove_file(dir.join(stale));
        }
        image_disk.overlay_at(&dir.join("disk.qcow2"))?;
        if let Some(uid) = self.cfg.bake_uid {
            // The bake's QEMU writes its disk, memory file, sockets and console here.
            chown_mode(&dir, uid, 0o700)?;
            chown_mode(&dir.join("disk.qcow2"), uid, 0o600)?;
            config.jail = Some(crate::qemu::QemuJail {
                uid,
                gid: uid,
                groups: vec![],
                cgroup_procs: vec![],
            });
        }
        let baked = snapshot::bake(
            config,
            &snap.state,
            &dir.join("bake.log"),
            BAKE_BOOT_TIMEOUT,
            service,
        )
        .await;
        if self.cfg.bake_uid.is_some() {
            // Hand everything back to root: restores read the disk and map the memory file,
            // but no QEMU may change them.
            chown_mode(&dir, 0, 0o755)?;
            for (file, mode) in [
                ("disk.qcow2", 0o644),
                ("memory", 0o644),
                ("console.log", 0o644),
            ] {
                if dir.join(file).exists() {
                    chown_mode(&dir.join(file), 0, mode)?;
                }
            }
        }
        let (snap, report) = baked?;
        let snap = Snapshot {
            ram_in_memory_file: true,
            config: Snapshot::restorable(snap.config),
            ..snap
        };
        self.share_memory_file(&dir)?;
        record_chain(&snap, &dir, true)?;
        std::fs::write(dir.join(COMPLETE), b"").map_err(io("mark bake"))?;
        tracing::info!(
            key,
            memory_mib,
            cold_boot_ms = report.cold_boot.as_millis() as u64,
            save_ms = report.save.as_millis() as u64,
            "template snapshot baked"
        );
        Ok(snap)
    }
}

fn chown_mode(path: &Path, uid: u32, mode: u32) -> Result<(), VmError> {
    use std::os::unix::fs::PermissionsExt;
    std::os::unix::fs::chown(path, Some(uid), Some(uid))
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)))
        .map_err(io(format!("chown {}", path.display())))
}

impl Assets {
    /// Give [`AssetConfig::memory_group`] read-write access to a bake's memory file.
    fn share_memory_file(&self, dir: &Path) -> Result<(), VmError> {
        use std::os::unix::fs::PermissionsExt;
        let Some(group) = self.cfg.memory_group else {
            return Ok(());
        };
        let memory = dir.join("memory");
        std::os::unix::fs::chown(&memory, Some(0), Some(group))
            .map_err(io(format!("chown {}", memory.display())))?;
        std::fs::set_permissions(&memory, std::fs::Permissions::from_mode(0o660))
            .map_err(io(format!("chmod {}", memory.display())))
    }
}

/// The guest kernel command line. Under TCG the guest's TSC is the host's, and the
/// kernel's own calibration against the PIT fails when the host is busy ("Fast TSC
/// calibration failed", then no usable clocksource and a hung boot); so the frequency is
/// given (`tsc_early_khz`, from the host's `/proc/cpuinfo`).
pub fn guest_append(accel: Accel) -> String {
    let base = "console=ttyS0 quiet panic=-1 reboot=t";
    match (accel, host_tsc_khz()) {
        (Accel::Tcg, Some(khz)) => format!("{base} tsc_early_khz={khz}"),
        _ => base.to_string(),
    }
}

/// The host CPU's frequency in kHz from `/proc/cpuinfo` (`cpu MHz`).
fn host_tsc_khz() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("cpu MHz"))?
        .trim_start_matches([' ', '\t', ':'])
        .trim()
        .parse()
        .ok()?;
    (mhz > 0.0).then(|| (mhz * 1000.0).round() as u64)
}

/// Record the bake's disk chain in `<bake>/disk-chain` (once: a bake made before chains
/// were recorded gets its record on its next use), for tools that start from a bake
/// directory alone (`hutch bench`); the bake directory is root's once baked. `fresh` (just
/// baked, when the bake's QEMU owned the directory and might have left a file of that name)
/// writes it whatever is there.
fn record_chain(snap: &Snapshot, dir: &Path, fresh: bool) -> Result<(), VmError> {
    let record = dir.join(DISK_CHAIN);
    match &snap.config.root_disk {
        Some(disk) if fresh || !record.exists() => disk.save_chain(&record).map_err(VmError::from),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_on_every_part_and_its_bounds() {
        let a = key_of(&[b"ab", b"c"]);
        assert_eq!(a, key_of(&[b"ab", b"c"]));
        assert_ne!(a, key_of(&[b"a", b"bc"]));
        assert_ne!(a, key_of(&[b"ab", b"d"]));
        assert_eq!(a.len(), 16);
    }

    #[test]
    fn tcg_guests_are_told_the_tsc_frequency() {
        let tcg = guest_append(Accel::Tcg);
        assert!(tcg.starts_with("console=ttyS0 quiet panic=-1"), "{tcg}");
        if host_tsc_khz().is_some() {
            assert!(tcg.contains(" tsc_early_khz="), "{tcg}");
        }
        assert!(!guest_append(Accel::Kvm).contains("tsc_early_khz"));
    }
}
