//! Growing a `vm` guest's root filesystem to the size of its disk (`disk_mib`).
//!
//! Every guest is restored from a snapshot whose root disk is the template image's size. A
//! sandbox asking for a bigger disk has its disk grown by the host after the restore (QMP
//! `block_resize`); the guest kernel learns the new capacity from a virtio config change,
//! asynchronously. The identity call then names the size: the agent waits until the root's
//! block device shows it and grows the mounted ext4 online (`EXT4_IOC_RESIZE_FS`).

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::sys::{self, cvt};

/// `EXT4_IOC_RESIZE_FS` = `_IOW('f', 16, __u64)`: grow a mounted ext4 to this many blocks.
const EXT4_IOC_RESIZE_FS: libc::Ioctl = 0x4008_6610;
/// How often the block device's size is read while waiting for the capacity change.
const POLL: Duration = Duration::from_millis(5);

/// Why the root filesystem could not be grown.
#[derive(Debug, thiserror::Error)]
pub enum GrowError {
    /// Reading the root's device or its size failed.
    #[error("the root's block device: {0}")]
    Device(#[source] io::Error),
    /// The kernel did not see the new capacity in time.
    #[error("the root disk still has {seen} bytes after {waited:?}, expected {wanted}")]
    NotResized {
        /// Bytes the block device has.
        seen: u64,
        /// Bytes asked for.
        wanted: u64,
        /// How long the agent waited.
        waited: Duration,
    },
    /// The resize ioctl failed.
    #[error("growing the root filesystem to {blocks} blocks: {source}")]
    Resize {
        /// The new block count.
        blocks: u64,
        /// The ioctl's error.
        #[source]
        source: io::Error,
    },
}

/// Grow the filesystem mounted at `/` to fill its disk once that disk has `disk_bytes`
/// bytes (waiting at most `wait` for it). Returns the filesystem's new size in bytes.
pub fn grow_root(disk_bytes: u64, wait: Duration) -> Result<u64, GrowError> {
    let root = Path::new("/");
    let size_file = device_size_file(root).map_err(GrowError::Device)?;
    let started = Instant::now();
    let seen = loop {
        let seen = device_bytes(&size_file).map_err(GrowError::Device)?;
        if seen >= disk_bytes {
            break seen;
        }
        if started.elapsed() >= wait {
            return Err(GrowError::NotResized {
                seen,
                wanted: disk_bytes,
                waited: started.elapsed(),
            });
        }
        std::thread::sleep(POLL);
    };
    let dir = sys::open(c"/", libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .map_err(GrowError::Device)?;
    let block_size = block_size(dir.as_raw_fd()).map_err(GrowError::Device)?;
    let blocks = seen / block_size;
    // Nothing to do when the size is already that (the kernel refuses to shrink).
    sys::ioctl_ptr(dir.as_raw_fd(), EXT4_IOC_RESIZE_FS, &blocks)
        .map_err(|source| GrowError::Resize { blocks, source })?;
    Ok(blocks * block_size)
}

/// `/sys/dev/block/MAJOR:MINOR/size` of the device `path` is on.
fn device_size_file(path: &Path) -> io::Result<std::path::PathBuf> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a zeroed stat is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: stat writes into the struct we pass and reads the NUL-terminated path.
    cvt(unsafe { libc::stat(c.as_ptr(), &mut st) })?;
    let (major, minor) = (libc::major(st.st_dev), libc::minor(st.st_dev));
    Ok(format!("/sys/dev/block/{major}:{minor}/size").into())
}

/// A block device's size from its sysfs `size` file (in 512-byte sectors).
fn device_bytes(size_file: &Path) -> io::Result<u64> {
    let text = std::fs::read_to_string(size_file)?;
    let sectors: u64 = text
        .trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("size {text:?}")))?;
    Ok(sectors * 512)
}

/// The block size of the filesystem `fd` is on.
fn block_size(fd: libc::c_int) -> io::Result<u64> {
    // SAFETY: a zeroed statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatvfs writes into the struct we pass.
    cvt(unsafe { libc::fstatvfs(fd, &mut st) })?;
    match st.f_frsize as u64 {
        0 => Err(io::Error::new(io::ErrorKind::InvalidData, "block size 0")),
        size => Ok(size),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_come_from_sysfs_in_sectors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("size");
        std::fs::write(&file, "2097152\n").expect("write");
        assert_eq!(device_bytes(&file).expect("size"), 1 << 30);
        std::fs::write(&file, "x").expect("write");
        assert!(device_bytes(&file).is_err());
        let name = device_size_file(dir.path()).expect("stat");
        assert!(name.starts_with("/sys/dev/block/"), "{name:?}");
        let fd = sys::open(c"/", libc::O_RDONLY | libc::O_DIRECTORY).expect("open /");
        assert!(block_size(fd.as_raw_fd()).expect("statvfs") >= 512);
    }
}
