//! Disk quota of `ns` sandboxes: one btrfs filesystem (an image attached through a loop
//! device with `LOOP_CONFIGURE` and autoclear, like volumes) holds every sandbox's upper
//! layer, each in its own subvolume with a qgroup limit. A write that does not fit answers
//! `EDQUOT` to that write only; the host's disk and other sandboxes are not affected.
//!
//! The image is **allocated**, never sparse: every block of it is reserved on the host
//! filesystem when it is made (`fallocate`), so btrfs never needs a block the host may not
//! have. (A sparse image on a host filesystem that fills makes the loop device fail writes
//! btrfs has already acknowledged: btrfs aborts its transaction, turns read-only, and what
//! sandboxes had written and synced is gone.) The pool is mounted `nodiscard` and its loop
//! device takes no discards (`discard_max_bytes` 0), so neither btrfs's own asynchronous
//! discard nor an `fstrim` of the host punches holes into it again; an image an earlier
//! version made sparse is allocated when it is mounted. On a btrfs host the new image is
//! made `nocow` first, so its writes land in the blocks allocated for them (a host that
//! always copies on write, such as ZFS, cannot promise that).
//!
//! Only the filesystem is made by a tool (`mkfs.btrfs`, once); quota, subvolumes and limits
//! are ioctls (linux/btrfs.h), so a sandbox create costs no process spawn.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use crate::JailError;

/// `_IOW(0x94, 14, struct btrfs_ioctl_vol_args)`: create subvolume `name` in the directory.
const BTRFS_IOC_SUBVOL_CREATE: libc::c_ulong = 0x5000_940E;
/// `_IOW(0x94, 15, struct btrfs_ioctl_vol_args)`: delete subvolume `name` of the directory
/// (with its contents).
const BTRFS_IOC_SNAP_DESTROY: libc::c_ulong = 0x5000_940F;
/// `_IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)`.
const BTRFS_IOC_QUOTA_CTL: libc::c_ulong = 0xC010_9428;
/// `_IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)`.
const BTRFS_IOC_QGROUP_LIMIT: libc::c_ulong = 0x8030_942B;
/// `BTRFS_QUOTA_CTL_ENABLE` (full qgroup accounting).
const BTRFS_QUOTA_CTL_ENABLE: u64 = 1;
/// `BTRFS_QGROUP_LIMIT_MAX_RFER`: limit the bytes the subvolume references.
const BTRFS_QGROUP_LIMIT_MAX_RFER: u64 = 1;
/// `BTRFS_PATH_NAME_MAX`.
const PATH_NAME_MAX: usize = 4087;
/// `BTRFS_SUPER_MAGIC` (statfs `f_type`).
const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;
/// `FS_IOC_GETFLAGS` (`_IOR('f', 1, long)`; the kernel reads and writes an `int`).
const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
/// `FS_IOC_SETFLAGS` (`_IOW('f', 2, long)`).
const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
/// `FS_NOCOW_FL`: overwrite in place (a copy-on-write host filesystem would otherwise need
/// new blocks for every write into the allocated image).
const FS_NOCOW_FL: libc::c_int = 0x0080_0000;

/// `struct btrfs_ioctl_vol_args` (4096 bytes).
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; PATH_NAME_MAX + 1],
}

/// `struct btrfs_ioctl_quota_ctl_args`.
#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

/// `struct btrfs_qgroup_limit`.
#[repr(C)]
struct QgroupLimit {
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

/// `struct btrfs_ioctl_qgroup_limit_args` (qgroupid 0: the subvolume of the descriptor).
#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    lim: QgroupLimit,
}

fn io(op: String) -> impl FnOnce(std::io::Error) -> JailError {
    move |source| JailError::Sys { op, source }
}

fn open_dir(dir: &Path) -> Result<File, JailError> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(io(format!("open {}", dir.display())))
}

/// Whether the filesystem at `dir` is btrfs.
pub fn is_btrfs(dir: &Path) -> bool {
    let Ok(f) = open_dir(dir) else {
        return false;
    };
    // SAFETY: statfs is plain old data; all-zero is valid to be overwritten.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `f` is an open descriptor and `st` a valid out-pointer for the call.
    let ret = unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) };
    ret == 0 && st.f_type as i64 == BTRFS_SUPER_MAGIC
}

/// Ask the filesystem holding the empty file `f` to overwrite it in place (btrfs' `nocow`;
/// other filesystems do so anyway and refuse the flag, which is fine).
fn overwrite_in_place(f: &File) {
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int through the valid pointer.
    if unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_GETFLAGS, &mut flags) } != 0 {
        return;
    }
    flags |= FS_NOCOW_FL;
    // SAFETY: FS_IOC_SETFLAGS reads one int through the valid pointer.
    let _ = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_SETFLAGS, &flags) };
}

/// Reserve every block of `f` (its first `len` bytes) on the filesystem holding it: the
/// file grows to `len` if shorter, holes are filled, data is kept.
fn allocate(f: &File, len: u64, image: &Path) -> Result<(), JailError> {
    let len = i64::try_from(len)
        .map_err(|_| JailError::InvalidSpec(format!("pool size {len} is too large")))?;
    // SAFETY: fallocate on a descriptor we own, with plain integers (mode 0: allocate).
    let ret = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len) };
    if ret != 0 {
        return Err(io(format!(
            "allocate {} MiB on the host for {}",
            len >> 20,
            image.display()
        ))(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// `image`'s size and the bytes of it allocated on the host (equal when nothing is sparse).
pub fn allocation(image: &Path) -> Result<(u64, u64), JailError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(image).map_err(io(format!("stat {}", image.display())))?;
    Ok((meta.len(), meta.blocks().saturating_mul(512)))
}

/// Make sure the btrfs `image` is mounted at `dir` with quota enabled, allocated on the host
/// (see the module docs). A missing image is made: `size_bytes` allocated, then
/// `mkfs.btrfs`. An existing one keeps its size and is allocated now where it has holes; if
/// the host has no room for that, it is mounted all the same and the error is returned
/// beside (the pool works, but is at risk when the host fills: see [`allocation`]).
/// Idempotent: a server restart finds it mounted or mounts it again.
pub fn setup_pool(
    image: &Path,
    dir: &Path,
    size_bytes: u64,
) -> Result<Option<JailError>, JailError> {
    let mut not_allocated = None;
    if !image.exists() {
        // The image holds every sandbox's files: root only.
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(image)
            .map_err(io(format!("create {}", image.display())))?;
        overwrite_in_place(&f);
        if let Err(e) = allocate(&f, size_bytes, image) {
            drop(f);
            let _ = std::fs::remove_file(image);
            return Err(e);
        }
        drop(f);
        // `-K`: no discard of the new filesystem's blocks (it would punch the image sparse).
        let out = hutch_host_command::run(
            Command::new("mkfs.btrfs")
                .args(["-q", "-f", "-K"])
                .arg(image),
            None,
        );
        let failed = match out {
            Err(e @ hutch_host_command::HostCommandError::Spawn { .. }) => {
                Some(format!("{e} (install btrfs-progs)"))
            }
            Err(e) => Some(e.to_string()),
            Ok(o) if !o.success() => Some(format!(
                "mkfs.btrfs {} ({}): {}",
                image.display(),
                o.how(),
                o.stderr_text()
            )),
            Ok(_) => None,
        };
        if let Some(msg) = failed {
            let _ = std::fs::remove_file(image);
            return Err(JailError::Unsupported(msg));
        }
    } else {
        let f = OpenOptions::new()
            .write(true)
            .open(image)
            .map_err(io(format!("open {}", image.display())))?;
        let (len, allocated) = allocation(image)?;
        if allocated < len {
            not_allocated = allocate(&f, len, image).err();
        }
    }
    // An image an earlier server made world-readable is closed too.
    std::fs::set_permissions(image, std::fs::Permissions::from_mode(0o600))
        .map_err(io(format!("chmod {}", image.display())))?;
    crate::volume::mount_loop_with(image, dir, c"btrfs", false, Some(c"nodiscard"))?;
    if !is_btrfs(dir) {
        return Err(JailError::Setup(format!(
            "{} is not a btrfs filesystem",
            dir.display()
        )));
    }
    refuse_discards(image)?;
    // Only root (the overlay's mounter) walks the upper layers; no host user may.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(io(format!("chmod {}", dir.display())))?;
    let root = open_dir(dir)?;
    let mut args = QuotaCtlArgs {
        cmd: BTRFS_QUOTA_CTL_ENABLE,
        status: 0,
    };
    // SAFETY: `args` is a valid quota_ctl_args that outlives the call.
    let ret = unsafe { libc::ioctl(root.as_raw_fd(), BTRFS_IOC_QUOTA_CTL, &mut args) };
    if ret != 0 {
        return Err(io(format!("enable btrfs quota on {}", dir.display()))(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(not_allocated)
}

/// Make the loop devices of `image` refuse discards (an `fstrim` of the pool would punch
/// holes into the allocated image).
fn refuse_discards(image: &Path) -> Result<(), JailError> {
    for dev in crate::volume::loop_devices_of(image) {
        let knob = Path::new("/sys/block")
            .join(&dev)
            .join("queue/discard_max_bytes");
        match std::fs::write(&knob, "0") {
            Ok(()) => {}
            // A kernel without the knob, or a device without discard: nothing to refuse.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(format!("write {}", knob.display()))(e)),
        }
    }
    Ok(())
}

fn vol_args(name: &str) -> Result<Box<VolArgs>, JailError> {
    let bytes = name.as_bytes();
    if bytes.is_empty()
        || bytes.len() > PATH_NAME_MAX
        || name == "."
        || name == ".."
        || bytes.iter().any(|&b| b == b'/' || b == 0)
    {
        return Err(JailError::InvalidSpec(format!(
            "{name:?} is not a subvolume name"
        )));
    }
    let mut args = Box::new(VolArgs {
        fd: 0,
        name: [0; PATH_NAME_MAX + 1],
    });
    args.name[..bytes.len()].copy_from_slice(bytes);
    Ok(args)
}

/// Create subvolume `parent/name` (kept if it exists: a woken or re-adopted sandbox) and
/// limit what it references to `limit_bytes`.
pub fn create_subvolume(parent: &Path, name: &str, limit_bytes: u64) -> Result<(), JailError> {
    let args = vol_args(name)?;
    let path = parent.join(name);
    if path.symlink_metadata().is_ok() {
        return set_limit(&path, limit_bytes);
    }
    let dir = open_dir(parent)?;
    // SAFETY: `args` is a valid, NUL-terminated vol_args that outlives the call.
    let ret = unsafe { libc::ioctl(dir.as_raw_fd(), BTRFS_IOC_SUBVOL_CREATE, &*args) };
    if ret != 0 {
        return Err(io(format!("create subvolume {}", path.display()))(
            std::io::Error::last_os_error(),
        ));
    }
    let limited = set_limit(&path, limit_bytes);
    if limited.is_err() {
        let _ = delete_subvolume(parent, name);
    }
    limited
}

/// Limit the bytes subvolume `subvol` references (its files and their metadata).
pub fn set_limit(subvol: &Path, limit_bytes: u64) -> Result<(), JailError> {
    let f = open_dir(subvol)?;
    let mut args = QgroupLimitArgs {
        qgroupid: 0,
        lim: QgroupLimit {
            flags: BTRFS_QGROUP_LIMIT_MAX_RFER,
            max_rfer: limit_bytes,
            max_excl: 0,
            rsv_rfer: 0,
            rsv_excl: 0,
        },
    };
    // SAFETY: `args` is a valid qgroup_limit_args that outlives the call.
    let ret = unsafe { libc::ioctl(f.as_raw_fd(), BTRFS_IOC_QGROUP_LIMIT, &mut args) };
    if ret != 0 {
        return Err(io(format!("limit subvolume {}", subvol.display()))(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Delete subvolume `parent/name` and everything in it (one ioctl: no walk through the
/// sandbox's files). Missing: nothing to do.
pub fn delete_subvolume(parent: &Path, name: &str) -> Result<(), JailError> {
    let args = vol_args(name)?;
    let path = parent.join(name);
    if path.symlink_metadata().is_err() {
        return Ok(());
    }
    let dir = open_dir(parent)?;
    // SAFETY: `args` is a valid, NUL-terminated vol_args that outlives the call.
    let ret = unsafe { libc::ioctl(dir.as_raw_fd(), BTRFS_IOC_SNAP_DESTROY, &*args) };
    if ret != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(io(format!("delete subvolume {}", path.display()))(e));
        }
    }
    Ok(())
}

/// Whether the running kernel has btrfs: built in or loaded (`/proc/filesystems`), or a
/// module the first mount would load.
pub fn kernel_has_btrfs() -> bool {
    let listed = std::fs::read_to_string("/proc/filesystems").is_ok_and(|t| {
        t.lines()
            .any(|l| l.split_whitespace().last() == Some("btrfs"))
    });
    listed || {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let dir = Path::new("/lib/modules")
            .join(release.trim())
            .join("kernel/fs/btrfs");
        std::fs::read_dir(dir).is_ok_and(|mut d| {
            d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("btrfs.ko")))
        })
    }
}

/// Where `mkfs.btrfs` is found on `PATH` (as [`setup_pool`] runs it), if anywhere.
pub fn mkfs_path() -> Option<std::path::PathBuf> {
    crate::host::find_program("mkfs.btrfs")
}

/// Size of the filesystem holding `dir`, in bytes (the default size of the pool's image).
pub fn fs_size(dir: &Path) -> Option<u64> {
    crate::volume::usage(dir).ok().map(|(_, total)| total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_sizes_match_the_ioctl_numbers() {
        assert_eq!(std::mem::size_of::<VolArgs>(), 4096);
        assert_eq!(std::mem::size_of::<QuotaCtlArgs>(), 16);
        assert_eq!(std::mem::size_of::<QgroupLimitArgs>(), 48);
        assert_eq!((BTRFS_IOC_SUBVOL_CREATE >> 16) & 0x3fff, 4096);
        assert_eq!((BTRFS_IOC_QGROUP_LIMIT >> 16) & 0x3fff, 48);
        assert_eq!((BTRFS_IOC_QUOTA_CTL >> 16) & 0x3fff, 16);
        assert_eq!((FS_IOC_GETFLAGS >> 16) & 0x3fff, 8);
        assert_eq!((FS_IOC_SETFLAGS >> 16) & 0x3fff, 8);
    }

    #[test]
    fn names_are_one_component() {
        assert!(vol_args("sbx_1").is_ok());
        for bad in ["", ".", "..", "a/b"] {
            assert!(vol_args(bad).is_err(), "{bad:?}");
        }
    }
}
