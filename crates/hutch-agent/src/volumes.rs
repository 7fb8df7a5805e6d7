//! Volumes of a `vm` guest.
//!
//! Every guest has the same few `virtio-blk` volume slots, named by their serial number
//! (`hutch-vol0`, …). A slot that was empty when the guest's memory was saved was probed by
//! the guest's kernel as an empty disk. When the host restores that memory with a volume's
//! image in the slot, the kernel still believes the old capacity and the old read-only bit.
//! The agent makes the driver probe the device again (unbind, bind: the capacity and the
//! negotiated features are read afresh), waits for the disk to show its size and mounts it.
//!
//! Mounts the guest's memory had but the new sandbox does not have (a read-write volume of
//! a forked parent) are detached lazily first; the host backs those slots with a read-only
//! empty disk, so nothing written there goes anywhere.

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hutch_proto::GuestVolume;

use crate::sys::cvt;

/// The virtio-blk driver's directory in sysfs.
const DRIVER: &str = "/sys/bus/virtio/drivers/virtio_blk";
/// Every virtio device.
const DEVICES: &str = "/sys/bus/virtio/devices";
/// How often the disk is looked at while waiting for the new probe.
const POLL: Duration = Duration::from_millis(5);

/// Why a volume could not be mounted or detached.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// A mount point that is not an absolute path.
    #[error("volume path {0:?} is not absolute")]
    Path(String),
    /// No disk has that serial number.
    #[error("no disk with serial {0:?}")]
    NoDisk(String),
    /// The driver did not probe the disk again in time.
    #[error("the disk {serial:?} did not come back with its capacity within {waited:?}")]
    NotProbed {
        /// The serial.
        serial: String,
        /// How long the agent waited.
        waited: Duration,
    },
    /// A sysfs or mount call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> VolumeError {
    let what = what.into();
    move |source| VolumeError::Io { what, source }
}

fn cstring(path: &Path) -> Result<CString, VolumeError> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| VolumeError::Path(path.display().to_string()))
}

/// Detach each mount point of `paths` (lazily: processes with files open there keep them).
/// A path that is not mounted is not an error.
pub fn detach(paths: &[String]) -> Result<(), VolumeError> {
    for path in paths {
        let c = cstring(Path::new(path))?;
        // SAFETY: a valid NUL-terminated path; umount2 does not keep the pointer.
        match cvt(unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) }) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) => {}
            Err(e) => return Err(io_err(format!("detach {path}"))(e)),
        }
    }
    Ok(())
}

/// Probe each volume's disk again and mount it (waiting at most `wait` per disk).
pub fn mount_all(volumes: &[GuestVolume], wait: Duration) -> Result<(), VolumeError> {
    for volume in volumes {
        if !volume.path.starts_with('/') {
            return Err(VolumeError::Path(volume.path.clone()));
        }
    }
    for volume in volumes {
        let device = virtio_device(&volume.serial)?;
        reprobe(&device)?;
        let disk = wait_for_disk(&volume.serial, wait)?;
        mount(&disk, Path::new(&volume.path), volume.read_only)?;
    }
    Ok(())
}

/// The name of the virtio device (`virtioN`) whose disk has serial `serial`.
fn virtio_device(serial: &str) -> Result<String, VolumeError> {
    let entries = std::fs::read_dir(DEVICES).map_err(io_err(format!("list {DEVICES}")))?;
    for entry in entries.flatten() {
        let Ok(disks) = std::fs::read_dir(entry.path().join("block")) else {
            continue; // not a disk
        };
        for disk in disks.flatten() {
            if read_trimmed(&disk.path().join("serial")).as_deref() == Some(serial) {
                return Ok(entry.file_name().to_string_lossy().into_owned());
            }
        }
    }
    Err(VolumeError::NoDisk(serial.to_string()))
}

/// Unbind `device` from the virtio-blk driver and bind it again.
fn reprobe(device: &str) -> Result<(), VolumeError> {
    for action in ["unbind", "bind"] {
        let file = Path::new(DRIVER).join(action);
        std::fs::write(&file, device).map_err(io_err(format!("{action} {device}")))?;
    }
    Ok(())
}

/// The block device (`/dev/vdX`) with serial `serial` once it shows a capacity.
fn wait_for_disk(serial: &str, wait: Duration) -> Result<PathBuf, VolumeError> {
    let started = Instant::now();
    loop {
        if let Ok(device) = virtio_device(serial) {
            let block = Path::new(DEVICES).join(&device).join("block");
            if let Some(disk) = std::fs::read_dir(&block)
                .ok()
                .and_then(|mut d| d.next())
                .and_then(Result::ok)
            {
                let sectors: u64 = read_trimmed(&disk.path().join("size"))
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                let node = Path::new("/dev").join(disk.file_name());
                if sectors > 0 && node.exists() {
                    return Ok(node);
                }
            }
        }
        if started.elapsed() >= wait {
            return Err(VolumeError::NotProbed {
                serial: serial.to_string(),
                waited: started.elapsed(),
            });
        }
        std::thread::sleep(POLL);
    }
}

/// Mount the ext4 on `disk` at `path` (created with its parents), `nodev,nosuid`.
fn mount(disk: &Path, path: &Path, read_only: bool) -> Result<(), VolumeError> {
    std::fs::create_dir_all(path).map_err(io_err(format!("create {}", path.display())))?;
    let source = cstring(disk)?;
    let target = cstring(path)?;
    let mut flags = libc::MS_NODEV | libc::MS_NOSUID;
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    // SAFETY: valid NUL-terminated strings that outlive the call; no data argument.
    cvt(unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            c"ext4".as_ptr(),
            flags,
            std::ptr::null(),
        )
    })
    .map_err(io_err(format!(
        "mount {} at {}",
        disk.display(),
        path.display()
    )))?;
    Ok(())
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_refused_before_anything_is_touched() {
        let volumes = [GuestVolume {
            serial: "hutch-vol0".into(),
            path: "data".into(),
            read_only: false,
        }];
        assert!(matches!(
            mount_all(&volumes, Duration::ZERO),
            Err(VolumeError::Path(_))
        ));
    }

    #[test]
    fn detaching_what_is_not_mounted_is_fine() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("not-a-mount");
        std::fs::create_dir(&path).expect("mkdir");
        detach(&[path.display().to_string()]).expect("nothing to detach");
    }
}
