//! Durable volumes on the host: an ext4 image per volume (its size is the volume's hard
//! limit: a full volume answers ENOSPC to the write that does not fit, and nothing else is
//! affected), attached through a loop device and mounted `nodev,nosuid` at a directory of
//! Hutch's state. Sandboxes get it through an idmapped bind (see [`crate::JailSpec::volumes`]),
//! so files keep 0-based owners on disk whatever sandbox wrote them.
//!
//! The loop device is set up with `LOOP_CONFIGURE` and autoclear: unmounting the filesystem
//! releases the device.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;

use crate::sys::{self, cstr};
use crate::{mountinfo, JailError};

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64` (linux/loop.h).
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` (linux/loop.h).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

fn io(op: String) -> impl FnOnce(std::io::Error) -> JailError {
    move |source| JailError::Sys { op, source }
}

/// Create a volume image of `size_mib` MiB at `image` (sparse) with an empty ext4 whose root
/// is owned by 0:0 and mode 0755 (root inside every sandbox). Fails if `image` exists.
pub fn create_image(image: &Path, size_mib: u64) -> Result<(), JailError> {
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(image)
        .map_err(io(format!("create {}", image.display())))?;
    f.set_len(size_mib << 20)
        .map_err(io(format!("size {}", image.display())))?;
    drop(f);
    let out = hutch_host_command::run(
        Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                "root_owner=0:0",
                "-O",
                "^has_journal",
            ])
            .arg(image),
        None,
    );
    let out = match out {
        Ok(out) => out,
        Err(e) => {
            let _ = std::fs::remove_file(image);
            return Err(match e {
                hutch_host_command::HostCommandError::Spawn { source, .. } => JailError::Sys {
                    op: "run mkfs.ext4 (install e2fsprogs)".into(),
                    source,
                },
                other => JailError::HostCommand(other),
            });
        }
    };
    if !out.success() {
        let _ = std::fs::remove_file(image);
        return Err(JailError::Setup(format!(
            "mkfs.ext4 {} ({}): {}",
            image.display(),
            out.how(),
            out.stderr_text()
        )));
    }
    Ok(())
}

/// Whether something is mounted at `dir`.
pub fn is_mounted(dir: &Path) -> Result<bool, JailError> {
    let canon = match dir.canonicalize() {
        Ok(c) => c,
        Err(_) => return Ok(false),
    };
    Ok(mountinfo::read()?.iter().any(|m| m.mount_point == canon))
}

/// How long an image may stay attached to a loop device after its unmount (a sandbox being
/// created elsewhere holds a copy of every mount for the few milliseconds until its
/// `pivot_root`, and with it the filesystem).
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether `image` is attached to a loop device (its filesystem is alive somewhere).
pub fn image_attached(image: &Path) -> bool {
    !loop_devices_of(image).is_empty()
}

/// Wait until no loop device holds `image` (its host filesystem is gone everywhere), so
/// something else (a `vm` guest) may open it.
pub fn wait_released(image: &Path) -> Result<(), JailError> {
    let deadline = std::time::Instant::now() + RELEASE_WAIT;
    while image_attached(image) {
        if std::time::Instant::now() > deadline {
            return Err(JailError::Setup(format!(
                "{} is still attached to a loop device {} s after its unmount",
                image.display(),
                RELEASE_WAIT.as_secs()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Ok(())
}

/// Mount `image` at `dir` (created if missing) through a free loop device. Already mounted:
/// nothing to do. An image whose filesystem is still alive elsewhere (just unmounted here,
/// a copy still held by a sandbox being created) is waited for: two live instances of one
/// ext4 would lose each other's writes. `read_only` attaches and mounts it read-only (the
/// host then never writes the image, so `vm` guests may read it at the same time).
///
/// The image's own error behaviour and stored mount options are overridden with
/// `errors=remount-ro`: an error in a volume never panics the host or reaches past that
/// volume. An image a `vm` guest wrote is checked first ([`crate::volume_check`]).
pub fn mount_image(image: &Path, dir: &Path, read_only: bool) -> Result<(), JailError> {
    mount_loop_with(image, dir, c"ext4", read_only, Some(c"errors=remount-ro"))
}

/// Mount the filesystem `fstype` of `image` at `dir` (see [`mount_image`]) with mount
/// `options` (the filesystem's data string).
pub(crate) fn mount_loop_with(
    image: &Path,
    dir: &Path,
    fstype: &std::ffi::CStr,
    read_only: bool,
    options: Option<&std::ffi::CStr>,
) -> Result<(), JailError> {
    std::fs::create_dir_all(dir).map_err(io(format!("mkdir {}", dir.display())))?;
    if is_mounted(dir)? {
        return Ok(());
    }
    wait_released(image)?;
    let backing = OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(image)
        .map_err(io(format!("open {}", image.display())))?;
    let ctl = File::open("/dev/loop-control").map_err(io("open /dev/loop-control".into()))?;
    // A free device may be taken by someone else between GET_FREE and CONFIGURE: retry.
    for _ in 0..8 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(io("LOOP_CTL_GET_FREE".into())(
                std::io::Error::last_os_error(),
            ));
        }
        let dev_path = format!("/dev/loop{n}");
        let dev = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&dev_path)
            .map_err(io(format!("open {dev_path}")))?;
        // SAFETY: all-zero is a valid loop_config.
        let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
        cfg.fd = backing.as_raw_fd() as u32;
        cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
        if read_only {
            cfg.info.lo_flags |= LO_FLAGS_READ_ONLY;
        }
        // SAFETY: `cfg` is a valid loop_config that outlives the call.
        let ret = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &cfg) };
        if ret != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EBUSY) {
                continue;
            }
            return Err(io(format!("LOOP_CONFIGURE {dev_path}"))(e));
        }
        let src = cstr(&dev_path)?;
        let mounted = sys::mount(
            Some(&src),
            dir,
            Some(fstype),
            libc::MS_NODEV | libc::MS_NOSUID | if read_only { libc::MS_RDONLY } else { 0 },
            options,
            "mount loop image",
        );
        // The loop device stays bound only while mounted (autoclear once `dev` closes).
        drop(dev);
        mounted?;
        if !is_mounted(dir)? {
            return Err(JailError::Setup(format!(
                "mounting {} at {} did not take",
                image.display(),
                dir.display()
            )));
        }
        return Ok(());
    }
    Err(JailError::Setup(format!(
        "no free loop device for {}",
        image.display()
    )))
}

/// Unmount the volume at `dir` (which releases its loop device once no other mount
/// namespace holds a copy). Its data is synced first, so what sandboxes wrote is in the image
/// whatever holds the filesystem a little longer. Not mounted: nothing to do.
pub fn unmount_image(dir: &Path) -> Result<(), JailError> {
    if !is_mounted(dir)? {
        return Ok(());
    }
    let root = File::open(dir).map_err(io(format!("open {}", dir.display())))?;
    // SAFETY: syncfs takes an open descriptor, valid for the call.
    if unsafe { libc::syncfs(root.as_raw_fd()) } != 0 {
        return Err(io(format!("syncfs {}", dir.display()))(
            std::io::Error::last_os_error(),
        ));
    }
    drop(root);
    sys::umount2(dir, 0).map_err(JailError::from)
}

/// The loop devices (`loopN`) `image` is attached to.
pub fn loop_devices_of(image: &Path) -> Vec<String> {
    let Ok(canon) = image.canonicalize() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name().to_string_lossy().starts_with("loop")
                && std::fs::read_to_string(e.path().join("loop/backing_file"))
                    .is_ok_and(|b| Path::new(b.trim()) == canon)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Bytes an unprivileged write may still take on the filesystem at `dir` (`f_bavail`).
pub fn available(dir: &Path) -> Result<u64, JailError> {
    let p = sys::cpath(dir)?;
    // SAFETY: statvfs is plain old data; all-zero is valid to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `p` is NUL-terminated and `st` a valid out-pointer, both outliving the call.
    let ret = unsafe { libc::statvfs(p.as_ptr(), &mut st) };
    if ret != 0 {
        return Err(io(format!("statvfs {}", dir.display()))(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(st.f_bavail * st.f_frsize)
}

/// Bytes used and total of the filesystem at `dir`.
pub fn usage(dir: &Path) -> Result<(u64, u64), JailError> {
    let p = sys::cpath(dir)?;
    // SAFETY: statvfs is plain old data; all-zero is valid to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `p` is NUL-terminated and `st` a valid out-pointer, both outliving the call.
    let ret = unsafe { libc::statvfs(p.as_ptr(), &mut st) };
    if ret != 0 {
        return Err(io(format!("statvfs {}", dir.display()))(
            std::io::Error::last_os_error(),
        ));
    }
    let total = st.f_blocks * st.f_frsize;
    Ok((total - st.f_bfree * st.f_frsize, total))
}

/// Unmount the volume at `dir` without flushing it: for a volume being deleted, whose data
/// is going anyway (a filesystem that turned read-only after an error cannot be flushed, and
/// must not keep its volume from being deleted). Not mounted: nothing to do.
pub fn unmount_image_discarding(dir: &Path) -> Result<(), JailError> {
    if !is_mounted(dir)? {
        return Ok(());
    }
    sys::umount2(dir, libc::MNT_DETACH).map_err(JailError::from)
}
