//! Checking a volume image that a `vm` guest may have crafted before the host kernel mounts
//! it.
//!
//! A guest with a read-write volume has raw block access to its image: every byte of the
//! ext4 in it is the guest's choice, including the superblock's error behaviour
//! (`errors=panic` takes the host down at the first error it meets), its stored mount options
//! and corrupt metadata that the host's ext4 driver would trip over. So an image a guest has
//! written (marked by [`mark_guest_written`] before the guest gets it) is never mounted by
//! the host again before [`check_untrusted_image`] has
//!
//! 1. run `e2fsck -f -p` on it (a full check, repairing only what is safe without a human),
//! 2. reset the superblock's error behaviour to `remount-ro` and cleared its stored mount
//!    options (`tune2fs -e remount-ro -E mount_opts=`),
//!
//! and the host mounts every volume with `errors=remount-ro` forced anyway
//! ([`crate::volume::mount_image`]). Damage `-p` will not repair leaves the image unmounted
//! and the volume refused ([`crate::JailError::VolumeDamaged`]) until it is repaired
//! ([`CheckMode::Repair`], `e2fsck -f -y`).
//!
//! e2fsprogs parse the untrusted image in user space, so they run jailed: as
//! [`VOLUME_CHECK_UID`] (a uid no sandbox and no host user has), with no capabilities and
//! `no_new_privs` (`setpriv`), in new user, mount, pid, network, IPC and UTS namespaces
//! (`bwrap --unshare-all`) whose only files are a read-only `/usr`; the image is their
//! standard input (opened by root, reopened through `/proc/self/fd/0`, owned by the checker's
//! uid only while the check runs). A check is killed after [`CHECK_TIMEOUT`].

use std::fs::OpenOptions;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::JailError;

/// The uid and gid the checkers run as: in the host range Hutch keeps for itself (below the
/// first sandbox's range, next to the vm backend's bake uid and memory gid).
pub const VOLUME_CHECK_UID: u32 = 16 * 65_536 - 4;
/// How long one e2fsprogs run may take before it is killed.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(300);
/// The marker file next to an image: a guest may have written it since the last check.
const GUEST_WRITTEN: &str = "guest-written";

/// How far a check may change the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckMode {
    /// Repair only what is safe without a human (`e2fsck -p`); anything else is refused.
    Preen,
    /// Repair everything e2fsck can (`e2fsck -y`), as a boot-time fsck would after a failed
    /// preen; what sat in damaged structures may end in `lost+found` or be gone.
    Repair,
}

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// e2fsck changed the image.
    pub repaired: bool,
    /// What e2fsck printed (its last lines).
    pub output: String,
}

/// The marker of `image`.
fn marker(image: &Path) -> PathBuf {
    image.with_file_name(GUEST_WRITTEN)
}

/// Record that a guest is about to get `image` read-write (before it does: a crash in
/// between leaves an extra check, never a missing one).
pub fn mark_guest_written(image: &Path) -> Result<(), JailError> {
    let m = marker(image);
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&m)
        .map_err(io(format!("create {}", m.display())))?;
    f.sync_all().map_err(io(format!("sync {}", m.display())))?;
    Ok(())
}

/// Drop `image`'s marker (after a check, or with the image when its volume is deleted);
/// no marker is fine.
pub fn forget_guest_written(image: &Path) -> Result<(), JailError> {
    let m = marker(image);
    match std::fs::remove_file(&m) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(io(format!("remove {}", m.display()))(e))
        }
        _ => Ok(()),
    }
}

/// Whether `image` must be checked before the host mounts it.
pub fn needs_check(image: &Path) -> bool {
    marker(image).symlink_metadata().is_ok()
}

fn io(op: String) -> impl FnOnce(std::io::Error) -> JailError {
    move |source| JailError::Sys { op, source }
}

/// Check (and in `mode`, repair) `image` and make its superblock safe to mount; clears the
/// marker on success. The image must not be attached anywhere while this runs.
pub fn check_untrusted_image(image: &Path, mode: CheckMode) -> Result<CheckReport, JailError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(image)
        .map_err(io(format!("open {}", image.display())))?;
    let meta = file
        .metadata()
        .map_err(io(format!("stat {}", image.display())))?;
    if !meta.is_file() {
        return Err(JailError::Refused(format!(
            "check {}: not a regular file",
            image.display()
        )));
    }
    let mode_bits = meta.permissions().mode() & 0o7777;
    let (uid, gid) = (
        std::os::unix::fs::MetadataExt::uid(&meta),
        std::os::unix::fs::MetadataExt::gid(&meta),
    );
    // The checker reopens the image through /proc/self/fd/0, which checks the inode's owner.
    std::os::unix::fs::fchown(&file, Some(VOLUME_CHECK_UID), Some(VOLUME_CHECK_UID))
        .map_err(io(format!("chown {}", image.display())))?;
    let result = run_checks(&file, mode);
    let restored = std::os::unix::fs::fchown(&file, Some(uid), Some(gid))
        .and_then(|()| file.set_permissions(std::fs::Permissions::from_mode(mode_bits)));
    let report = result?;
    restored.map_err(io(format!("restore owner of {}", image.display())))?;
    forget_guest_written(image)?;
    Ok(report)
}

fn run_checks(file: &std::fs::File, mode: CheckMode) -> Result<CheckReport, JailError> {
    let flag = match mode {
        CheckMode::Preen => "-p",
        CheckMode::Repair => "-y",
    };
    let fsck = run_jailed(file, &["/sbin/e2fsck", "-f", flag, "/proc/self/fd/0"])?;
    let output = tail(&fsck.output);
    // e2fsck: 0 clean, 1 repaired, 2 repaired (reboot), 4 left uncorrected, 8+ failed.
    let repaired = match fsck.code {
        Some(0) => false,
        Some(1 | 2) => true,
        Some(4) => {
            return Err(JailError::VolumeDamaged {
                repairable: mode == CheckMode::Preen,
                report: output,
            })
        }
        other => {
            return Err(JailError::Setup(format!(
                "e2fsck failed ({}): {output}",
                other.map_or("killed".to_string(), |c| format!("exit {c}"))
            )))
        }
    };
    let tune = run_jailed(
        file,
        &[
            "/sbin/tune2fs",
            "-e",
            "remount-ro",
            "-E",
            "mount_opts=",
            "/proc/self/fd/0",
        ],
    )?;
    if tune.code != Some(0) {
        return Err(JailError::Setup(format!(
            "tune2fs failed: {}",
            tail(&tune.output)
        )));
    }
    Ok(CheckReport { repaired, output })
}

/// The last lines of `text` (what a user needs of e2fsck's report).
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

struct Jailed {
    code: Option<i32>,
    output: String,
}

/// Run `argv` jailed (see the module doc) with `file` as its standard input.
fn run_jailed(file: &std::fs::File, argv: &[&str]) -> Result<Jailed, JailError> {
    let stdin = file
        .try_clone()
        .map_err(io("duplicate the image descriptor".into()))?;
    let id = VOLUME_CHECK_UID.to_string();
    let mut child = Command::new("setpriv")
        .arg(format!("--reuid={id}"))
        .arg(format!("--regid={id}"))
        .args([
            "--clear-groups",
            "--no-new-privs",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
            "bwrap",
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--ro-bind",
            "/usr",
            "/usr",
            "--symlink",
            "usr/bin",
            "/bin",
            "--symlink",
            "usr/sbin",
            "/sbin",
            "--symlink",
            "usr/lib",
            "/lib",
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--",
        ])
        .args(argv)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin")
        .env("LC_ALL", "C")
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io(format!(
            "run {} jailed (needs setpriv from util-linux and bwrap from bubblewrap)",
            argv[0]
        )))?;
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let readers = [
        std::thread::spawn(move || read_capped(&mut out)),
        std::thread::spawn(move || read_capped(&mut err)),
    ];
    let deadline = Instant::now() + CHECK_TIMEOUT;
    let status = loop {
        match child
            .try_wait()
            .map_err(io(format!("wait for {}", argv[0])))?
        {
            Some(status) => break status,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(JailError::Timeout(format!(
                    "{} on a volume image ({} s)",
                    argv[0],
                    CHECK_TIMEOUT.as_secs()
                )));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let mut output = String::new();
    for r in readers {
        output.push_str(&r.join().unwrap_or_default());
    }
    Ok(Jailed {
        code: status.code(),
        output,
    })
}

/// Read all of `r`, keeping its last 64 KiB: a crafted image can make e2fsck verbose, and
/// its summary comes last.
fn read_capped(r: &mut impl std::io::Read) -> String {
    const CAP: usize = 64 << 10;
    let mut kept: Vec<u8> = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 2 * CAP {
                    kept.drain(..kept.len() - CAP);
                }
            }
        }
    }
    if kept.len() > CAP {
        kept.drain(..kept.len() - CAP);
    }
    String::from_utf8_lossy(&kept).into_owned()
}
