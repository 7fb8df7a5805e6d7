//! `hutch-vm`: the building blocks of the `vm` isolation backend.
//!
//! * [`kernel`]: extract the ELF `vmlinux` from Debian's LZ4 bzImage (booted PVH).
//! * [`modules`]: find virtio modules in an unpacked kernel package, dependency-ordered.
//! * [`initramfs`]: a reproducible newc cpio with busybox, the static agent and an `/init`.
//! * [`qemu`]: the QEMU `microvm` command line, a process handle killed on drop, and QEMU's
//!   jail: cloned into its own mount, pid, IPC, UTS and network namespaces with a minimal
//!   root, an unprivileged uid, cgroups ([`qemu::QemuJail`]), on `hutch_jail::exec_plan`.
//! * [`qmp`]: an async QMP client, including `getfd` with `SCM_RIGHTS`.
//! * [`snapshot`]: bake a template snapshot (cold boot, device state with RAM in a memory
//!   file) and restore it copy-on-write until the agent answers `GET /v1/info`.
//!
//! * [`disk`]: template ext4 images (`mkfs.ext4 -d`), qcow2 overlays and the root disk's
//!   backing chain as the host made it.
//! * [`console`]: a guest's serial console drained into a bounded ring on the host.
//! * [`package`]: Debian's cloud kernel package, fetched with `apt-get download`.
//! * [`assets`]: the cache of kernels, initramfs, images and bakes, keyed by input hashes.
//! * [`accel`]: KVM or TCG, and why.
//! * [`capture`]: a stopped guest's device state and RAM copied without a migration stream.
//! * [`share`]: one memory file for every guest restored from a memory snapshot.
//! * [`gc`]: deleting cache entries unused for a week.
//!
//! See `docs/vm.md` for what was measured on the development machine.

pub mod accel;
pub mod assets;
pub mod capture;
pub mod console;
pub mod disk;
pub mod gc;
pub mod initramfs;
pub mod kernel;
mod lock;
pub mod modules;
pub mod package;
pub mod qemu;
pub mod qmp;
pub mod share;
pub mod snapshot;

/// Any failure of this crate.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// Kernel extraction.
    #[error(transparent)]
    Kernel(#[from] kernel::KernelError),
    /// Module resolution.
    #[error(transparent)]
    Modules(#[from] modules::ModuleError),
    /// Initramfs building.
    #[error(transparent)]
    Initramfs(#[from] initramfs::InitramfsError),
    /// Starting QEMU.
    #[error(transparent)]
    Qemu(#[from] qemu::QemuError),
    /// Talking to QEMU.
    #[error(transparent)]
    Qmp(#[from] qmp::QmpError),
    /// Making disks.
    #[error(transparent)]
    Disk(#[from] disk::DiskError),
    /// Getting the kernel package.
    #[error(transparent)]
    Package(#[from] package::PackageError),
    /// The template's start command did not become ready in the bake.
    #[error("the template's start command, started before the bake's snapshot: {0}")]
    Service(#[source] Box<hutch_proto::client::service::ServiceError>),
    /// Filesystem work around snapshots.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// QEMU exited while it was expected to run.
    #[error("QEMU exited ({status}): {log}")]
    Exited {
        /// Its exit status.
        status: String,
        /// The tail of its output and the guest console.
        log: String,
    },
    /// The agent did not answer in time.
    #[error("agent did not answer within {seconds:.1} s (last error: {last}); console: {console}")]
    AgentTimeout {
        /// How long we waited.
        seconds: f64,
        /// The last client error.
        last: String,
        /// The tail of the guest console, if logged.
        console: String,
    },
}
