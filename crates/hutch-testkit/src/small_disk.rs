//! A small filesystem of a test's own: an ext4 image under `/tmp`, loop-mounted, for tests
//! that fill a server's state disk. Dropping it unmounts it, makes sure its loop device is
//! detached, and deletes the image; nothing is ever deleted through the mount point (the
//! server's own cleanup removes the state directory inside it first).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A loop-mounted ext4 filesystem of a given size (see the module docs).
pub struct SmallDisk {
    /// The directory holding the image and the mount point.
    root: PathBuf,
    image: PathBuf,
    mount: PathBuf,
}

/// Run `cmd`, panicking with its output unless it succeeds.
fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl SmallDisk {
    /// Make and mount a filesystem of `size_mib` (no blocks reserved for root, so "full"
    /// means full for the server too).
    pub fn new(size_mib: u64) -> Self {
        let root = tempfile::Builder::new()
            .prefix("hutch-small-disk-")
            .tempdir_in("/tmp")
            .expect("tempdir")
            .keep();
        // Sandbox directories below it must be reachable by sandboxes' uids.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let image = root.join("disk.ext4");
        let mount = root.join("mnt");
        std::fs::create_dir(&mount).expect("mkdir mount point");
        File::create(&image)
            .and_then(|f| f.set_len(size_mib << 20))
            .expect("create the image");
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&image));
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mount));
        std::fs::set_permissions(&mount, std::fs::Permissions::from_mode(0o755))
            .expect("chmod the mounted root");
        Self { root, image, mount }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mount
    }

    /// A new empty directory on it, for a server's state.
    pub fn state_dir(&self) -> PathBuf {
        let dir = self.mount.join("state");
        std::fs::create_dir_all(&dir).expect("mkdir state");
        dir
    }

    /// Bytes an unprivileged write could still take (`f_bavail`).
    pub fn free_bytes(&self) -> u64 {
        let path = std::ffi::CString::new(self.mount.to_str().expect("utf-8 path"))
            .expect("no NUL in the path");
        // SAFETY: statvfs is plain old data; all-zero is valid to be overwritten.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `path` is NUL-terminated and `st` a valid out-pointer for the call.
        let ret = unsafe { libc::statvfs(path.as_ptr(), &mut st) };
        assert_eq!(ret, 0, "statvfs {}", self.mount.display());
        st.f_bavail * st.f_frsize
    }

    /// Take every free block with one file (allocated, not written: instant), leaving the
    /// filesystem full; returns the file.
    pub fn fill(&self) -> PathBuf {
        let filler = self.mount.join("filler");
        let f = File::options()
            .create(true)
            .append(true)
            .open(&filler)
            .expect("open the filler");
        let mut len = f.metadata().expect("stat the filler").len();
        for chunk in [16u64 << 20, 1 << 20, 4096] {
            loop {
                let offset = i64::try_from(len).expect("size");
                let add = i64::try_from(chunk).expect("size");
                // SAFETY: fallocate on a descriptor we own, with plain integers.
                let ret = unsafe { libc::fallocate(f.as_raw_fd(), 0, offset, add) };
                if ret != 0 {
                    break;
                }
                len += chunk;
            }
        }
        assert!(
            self.free_bytes() < 64 << 10,
            "the filesystem is not full: {} bytes free",
            self.free_bytes()
        );
        filler
    }

    /// Give back what [`SmallDisk::fill`] took.
    pub fn unfill(&self) {
        match std::fs::remove_file(self.mount.join("filler")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => panic!("remove the filler: {e}"),
            _ => {}
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // A loop mount made by a sandbox server may take a moment to be released.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = Command::new("umount").arg(&self.mount).output();
            let mounted = std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap_or_default()
                .lines()
                .any(|l| l.split_whitespace().nth(4) == self.mount.to_str());
            if !mounted {
                break;
            }
            if Instant::now() > deadline {
                if !std::thread::panicking() {
                    panic!(
                        "{} is still mounted: {:?}",
                        self.mount.display(),
                        out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                    );
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // `mount -o loop` attaches with autoclear; detach anything left all the same.
        if let Ok(out) = Command::new("losetup").arg("-j").arg(&self.image).output() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some(dev) = line.split(':').next() {
                    let _ = Command::new("losetup").args(["-d", dev]).status();
                }
            }
        }
        let _ = std::fs::remove_file(&self.image);
        let _ = std::fs::remove_dir(&self.mount);
        let _ = std::fs::remove_dir(&self.root);
    }
}
