//! What defines one QEMU: the `microvm` command line and how the process is confined.
//!
//! The device set is fixed and built in one place ([`VmConfig::argv`]) because a restore
//! needs the identical devices in the identical order as the bake ("Unknown savevm
//! section" otherwise). Only the memory backend's `share=` and `-incoming defer` differ.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::console::ConsoleRing;
use crate::disk::RootDisk;
use crate::initramfs::AGENT_PORT;

/// Device id of the agent's virtio-serial port (names its `VSERPORT_CHANGE` events).
pub const AGENT_PORT_ID: &str = "agent-port";
/// Default QEMU binary.
pub const QEMU_BINARY: &str = "qemu-system-x86_64";
/// Oldest QEMU this driver is written against (Debian 12).
pub const MIN_VERSION: (u32, u32) = (7, 2);

/// How guest code is executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization.
    Kvm,
    /// QEMU's software emulator (the only option with PVM `/dev/kvm`).
    Tcg,
}

/// How QEMU is confined when it starts (see [`super::jail`]). The uid, gid and groups are
/// the sandbox's; the file tree and the namespaces follow from its [`VmConfig`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QemuJail {
    /// The uid QEMU runs as (never 0).
    pub uid: u32,
    /// Its gid.
    pub gid: u32,
    /// Supplementary groups (the group that may open template memory files; `kvm`).
    pub groups: Vec<u32>,
    /// `cgroup.procs` files QEMU moves itself into.
    pub cgroup_procs: Vec<PathBuf>,
}

/// Everything that defines one VM's command line.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// The QEMU binary.
    pub qemu: PathBuf,
    /// Accelerator.
    pub accel: Accel,
    /// The ELF `vmlinux`, booted PVH.
    pub kernel: PathBuf,
    /// The initramfs.
    pub initrd: PathBuf,
    /// Kernel command line.
    pub append: String,
    /// Guest RAM in MiB.
    pub memory_mib: u32,
    /// Virtual CPUs.
    pub cpus: u32,
    /// File backing guest RAM.
    pub memory_file: PathBuf,
    /// Map guest RAM at a 2 MiB boundary, for a memory file on a tmpfs with huge pages (a
    /// fork's); elsewhere it only makes each process map more of a shared file.
    pub huge_page_align: bool,
    /// `share=on` (bake: writes go to the file) or `share=off` (restore: copy-on-write).
    pub share_memory: bool,
    /// The QMP unix socket QEMU listens on.
    pub qmp_socket: PathBuf,
    /// The unix socket QEMU listens on for the agent's virtio-serial port.
    pub agent_socket: PathBuf,
    /// Where the guest's serial console goes.
    pub console: Console,
    /// The root disk and its whole chain, attached as `virtio-blk` (`/dev/vda` in the
    /// guest); QEMU is given every backing file by name, never from the image's header.
    pub root_disk: Option<RootDisk>,
    /// Start with `-incoming defer` (restore).
    pub incoming: bool,
    /// Apply QEMU's seccomp sandbox (`spawn=deny` and friends).
    pub seccomp: bool,
    /// Confine the process (not part of the command line).
    pub jail: Option<QemuJail>,
    /// The TAP device of the sandbox's network (`vm` slot, see `hutch_net::tap`), handed to
    /// QEMU as fd [`TAP_FD`]. Without one the guest's NIC sits on an empty hub: the device
    /// set is the same either way, so every restore matches the bake.
    pub tap: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    /// What each of the [`VOLUME_SLOTS`] volume slots holds (`None`: an empty placeholder,
    /// QEMU's `null-co` driver, which opens no file and discards writes).
    pub volumes: [Option<VolumeDrive>; VOLUME_SLOTS],
}

/// Where a guest's serial console goes. Not part of the device set (the serial port is the
/// same whichever way), so a guest baked with one restores with another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Console {
    /// Discarded (`-serial null`).
    Discard,
    /// Appended by QEMU to a file in its directory, **without bound**: only for guests
    /// running code the host trusts (a bake of an operator's template, the KVM probe).
    File(PathBuf),
    /// A chardev socket at `socket` in QEMU's directory that the host drains into the
    /// bounded `ring`, in a directory of the host's own ([`crate::console`]).
    Ring {
        /// QEMU's listening socket.
        socket: PathBuf,
        /// Where the host keeps the console.
        ring: ConsoleRing,
    },
}

/// How many volume slots every guest has. Each is a `virtio-blk` device that exists in every
/// bake and every restore (a restore's device set must be the bake's), backed by an empty
/// placeholder unless a volume is attached there.
pub const VOLUME_SLOTS: usize = 4;

/// The serial number the guest sees on volume slot `slot` (`/sys/block/vdX/serial`).
pub fn volume_serial(slot: usize) -> String {
    format!("hutch-vol{slot}")
}

/// A volume image attached to a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeDrive {
    /// The raw ext4 image.
    pub image: PathBuf,
    /// Attach read-only: QEMU opens the image read-only and offers the guest a read-only disk.
    pub read_only: bool,
}

/// The descriptor number QEMU finds the TAP device at.
pub const TAP_FD: i32 = 200;
/// The guest NIC's MAC address (every guest sits alone on its slot's segment).
pub const GUEST_MAC: &str = "52:54:00:68:75:01";

impl VmConfig {
    /// A config with the defaults used by Hutch: TCG, 256 MiB, 1 vCPU, seccomp on.
    pub fn new(kernel: PathBuf, initrd: PathBuf, dir: &Path) -> Self {
        Self {
            qemu: PathBuf::from(QEMU_BINARY),
            accel: Accel::Tcg,
            kernel,
            initrd,
            append: "console=ttyS0 quiet panic=-1 reboot=t".into(),
            memory_mib: 256,
            cpus: 1,
            memory_file: dir.join("memory"),
            share_memory: true,
            qmp_socket: dir.join("qmp.sock"),
            agent_socket: dir.join("agent.sock"),
            console: Console::Discard,
            root_disk: None,
            incoming: false,
            seccomp: true,
            jail: None,
            tap: None,
            volumes: Default::default(),
            huge_page_align: false,
        }
    }

    /// The full argument vector (without the program name).
    pub fn argv(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |parts: &[&str]| a.extend(parts.iter().map(OsString::from));
        let mem = self.memory_mib;
        push(&[
            "-M",
            "microvm,x-option-roms=off,isa-serial=on,memory-backend=mem",
        ]);
        match self.accel {
            Accel::Kvm => push(&["-accel", "kvm", "-cpu", "host"]),
            Accel::Tcg => push(&["-accel", "tcg", "-cpu", "max"]),
        }
        push(&["-m", &format!("{mem}M"), "-smp", &self.cpus.to_string()]);
        push(&[
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
        ]);
        if self.seccomp {
            push(&[
                "-sandbox",
                "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
            ]);
        }
        push(&["-kernel", &self.kernel.to_string_lossy()]);
        push(&["-initrd", &self.initrd.to_string_lossy()]);
        push(&["-append", &self.append]);
        let share = if self.share_memory { "on" } else { "off" };
        // The kernel maps and allocates a tmpfs file with huge pages only where the mapping
        // is 2 MiB-aligned; QEMU aligns a file to its page size (4 KiB) otherwise.
        let align = if self.huge_page_align {
            ",align=2M"
        } else {
            ""
        };
        push(&[
            "-object",
            &format!(
                "memory-backend-file,id=mem,size={mem}M,mem-path={},share={share}{align}",
                escape(&self.memory_file)
            ),
        ]);
        match &self.console {
            Console::Discard => push(&["-serial", "null"]),
            Console::File(path) => push(&["-serial", &format!("file:{}", path.to_string_lossy())]),
            Console::Ring { socket, .. } => push(&[
                "-chardev",
                &format!(
                    "socket,id=console,path={},server=on,wait=off",
                    escape(socket)
                ),
                "-serial",
                "chardev:console",
            ]),
        }
        push(&[
            "-qmp",
            &format!("unix:{},server=on,wait=off", escape(&self.qmp_socket)),
        ]);
        push(&[
            "-chardev",
            &format!(
                "socket,id=agent,path={},server=on,wait=off",
                escape(&self.agent_socket)
            ),
        ]);
        if let Some(disk) = &self.root_disk {
            push(&[
                "-drive",
                &format!(
                    "{},if=none,id=root,cache=writeback,discard=unmap",
                    disk.drive_options()
                ),
            ]);
            push(&["-device", "virtio-blk-device,drive=root"]);
        }
        for (slot, volume) in self.volumes.iter().enumerate() {
            let drive = match volume {
                Some(v) => format!(
                    "file={},format=raw,if=none,id=vol{slot},cache=writeback,readonly={}",
                    escape(&v.image),
                    if v.read_only { "on" } else { "off" }
                ),
                // Writable in a bake, where the guest negotiates the disk's features: a
                // guest that took the read-only bit could not be restored onto a writable
                // disk. Read-only in a restore: an unused slot (or one whose volume the
                // guest had but this sandbox has not) takes no writes.
                None => format!(
                    "driver=null-co,read-zeroes=on,size=0,if=none,id=vol{slot},readonly={}",
                    if self.incoming { "on" } else { "off" }
                ),
            };
            push(&["-drive", &drive]);
            push(&[
                "-device",
                &format!(
                    "virtio-blk-device,drive=vol{slot},serial={}",
                    volume_serial(slot)
                ),
            ]);
        }
        push(&["-device", "virtio-serial-device,max_ports=2"]);
        push(&[
            "-device",
            &format!("virtserialport,chardev=agent,name={AGENT_PORT},id={AGENT_PORT_ID}"),
        ]);
        // No vnet header on either backend, so a guest baked on the hub restores on a TAP.
        match &self.tap {
            Some(_) => push(&["-netdev", &format!("tap,id=net0,fd={TAP_FD},vhost=off")]),
            None => push(&["-netdev", "hubport,id=net0,hubid=0"]),
        }
        push(&[
            "-device",
            &format!("virtio-net-device,netdev=net0,mac={GUEST_MAC}"),
        ]);
        if self.incoming {
            push(&["-incoming", "defer"]);
        }
        a
    }
}

/// Escape a path for a QEMU option value (commas are doubled).
fn escape(path: &Path) -> String {
    path.to_string_lossy().replace(',', ",,")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> VmConfig {
        VmConfig::new(
            "/k/vmlinux".into(),
            "/k/initrd".into(),
            Path::new("/run/vm,1"),
        )
    }

    fn joined(c: &VmConfig) -> String {
        c.argv()
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn bake_command_line() {
        let argv = joined(&config());
        assert!(argv.starts_with("-M microvm,"), "{argv}");
        assert!(argv.contains("-accel tcg -cpu max -m 256M -smp 1 -nodefaults -no-user-config"));
        assert!(argv.contains("spawn=deny"));
        assert!(
            argv.contains("mem-path=/run/vm,,1/memory,share=on -serial"),
            "{argv}"
        );
        assert!(argv.contains("-qmp unix:/run/vm,,1/qmp.sock,server=on,wait=off"));
        assert!(
            argv.contains("-device virtserialport,chardev=agent,name=hutch.agent,id=agent-port")
        );
        assert!(!argv.contains("-incoming"));
    }

    #[test]
    fn restore_differs_only_in_share_and_incoming() {
        let bake = config();
        let restore = VmConfig {
            share_memory: false,
            incoming: true,
            ..config()
        };
        let b = joined(&bake);
        let r = joined(&restore);
        // Empty volume slots are writable in a bake, read-only in a restore.
        let expected = (0..VOLUME_SLOTS).fold(b.replace("share=on", "share=off"), |argv, slot| {
            argv.replace(
                &format!(",size=0,if=none,id=vol{slot},readonly=off"),
                &format!(",size=0,if=none,id=vol{slot},readonly=on"),
            )
        });
        assert_eq!(r, format!("{expected} -incoming defer"));
    }

    #[test]
    fn volume_slots_are_always_there() {
        let mut config = config();
        let empty = joined(&config);
        for slot in 0..VOLUME_SLOTS {
            assert!(empty.contains(&format!(
                "-drive driver=null-co,read-zeroes=on,size=0,if=none,id=vol{slot},readonly=off -device virtio-blk-device,drive=vol{slot},serial=hutch-vol{slot}"
            )), "{empty}");
        }
        config.volumes[2] = Some(VolumeDrive {
            image: "/v/a,b.ext4".into(),
            read_only: true,
        });
        let attached = joined(&config);
        assert!(attached.contains(
            "-drive file=/v/a,,b.ext4,format=raw,if=none,id=vol2,cache=writeback,readonly=on -device virtio-blk-device,drive=vol2,serial=hutch-vol2"
        ), "{attached}");
        // The device set (what a restore must match) is the same.
        let devices = |argv: &str| {
            argv.split(" -")
                .filter(|a| a.starts_with("device"))
                .map(String::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(devices(&empty), devices(&attached));
    }

    #[test]
    fn a_console_ring_is_a_socket_and_the_root_disk_names_its_whole_chain() {
        let mut config = config();
        config.console = Console::Ring {
            socket: "/run/vm,1/console.sock".into(),
            ring: ConsoleRing::new("/host/console.log".into(), 1 << 20),
        };
        config.root_disk = Some(RootDisk::qcow2(
            Path::new("/run/vm,1/disk.qcow2"),
            vec![
                crate::disk::BackingFile {
                    path: "/bakes/k/disk.qcow2".into(),
                    format: crate::disk::ImageFormat::Qcow2,
                },
                crate::disk::BackingFile {
                    path: "/images/t.ext4".into(),
                    format: crate::disk::ImageFormat::Raw,
                },
            ],
        ));
        let argv = joined(&config);
        assert!(argv.contains(
            "-chardev socket,id=console,path=/run/vm,,1/console.sock,server=on,wait=off -serial chardev:console"
        ), "{argv}");
        assert!(
            !argv.contains("/host/console.log"),
            "QEMU never sees the ring"
        );
        assert!(argv.contains(
            "-drive file=/run/vm,,1/disk.qcow2,format=qcow2,backing.driver=qcow2,backing.file.filename=/bakes/k/disk.qcow2,backing.backing.driver=raw,backing.backing.file.filename=/images/t.ext4,if=none,id=root"
        ), "{argv}");
    }
}
