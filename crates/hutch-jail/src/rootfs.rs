//! Building the sandbox's root inside its own mount namespace (runs in the cloned child,
//! already root of its user namespace), ending with `pivot_root`.
//!
//! Order and traps (each proven on the development machines):
//! 1. `/` is made `MS_REC|MS_PRIVATE` so nothing propagates back to the host.
//! 2. `merged` is bind-mounted onto itself: the overlay inherited from the host namespace is
//!    locked, and `pivot_root` onto a locked mount fails with EINVAL.
//! 3. `/proc` is a new procfs (nosuid, nodev, noexec) of the sandbox's pid namespace, with
//!    kernel-wide files masked by `/dev/null` (kcore, keys, timer_list, sched_debug, kallsyms,
//!    …), kernel-wide directories hidden under empty read-only tmpfs, and the writable
//!    kernel knobs (`sys`, `sysrq-trigger`, `irq`, `bus`, `fs`) bound read-only.
//! 4. `/sys` is a read-only sysfs of the sandbox's network namespace (so `class/net` shows only
//!    its own interfaces) with firmware and power-capping counters hidden. Where the kernel
//!    refuses a new sysfs (locked mounts over non-empty directories of the host's `/sys`), an
//!    empty read-only tmpfs takes its place and the agent log says so.
//! 5. `/dev` is a small tmpfs with binds of the harmless host devices (`null zero full random
//!    urandom tty`), a private devpts instance, `ptmx`/`fd`/`std*` links and a `/dev/shm`
//!    tmpfs; `/tmp` is a tmpfs of the sandbox's size.
//! 6. `/.hutch` is a read-only tmpfs holding a read-only bind of the agent binary.
//! 7. `pivot_root(".", ".")` in `merged`, then the old root is detached.

use std::ffi::CString;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use crate::sys::{self, cstr, SysError};

/// Files of procfs that expose kernel-wide state: replaced by `/dev/null`.
const PROC_MASKED_FILES: &[&str] = &[
    "kcore",
    "keys",
    "key-users",
    "timer_list",
    "sched_debug",
    "kallsyms",
    "latency_stats",
    "timer_stats",
    "kpageflags",
    "kpagecount",
    "kpagecgroup",
];
/// Directories of procfs with host hardware details: hidden under an empty read-only tmpfs.
const PROC_MASKED_DIRS: &[&str] = &["acpi", "asound", "scsi"];
/// Writable kernel knobs in procfs: bound read-only.
const PROC_READONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus", "fs"];
/// Directories of sysfs hidden under an empty read-only tmpfs.
const SYS_MASKED_DIRS: &[&str] = &["firmware", "devices/virtual/powercap"];
/// Host device nodes bound into the sandbox's `/dev`.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// Links created in the sandbox's `/dev`.
const DEV_LINKS: &[(&str, &str)] = &[
    ("ptmx", "pts/ptmx"),
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
];
/// Mount points the template must provide (created in the upper layer when it does not).
const MOUNT_POINTS: &[(&str, u32)] = &[
    ("proc", 0o555),
    ("sys", 0o555),
    ("dev", 0o755),
    ("tmp", 0o1777),
    (".hutch", 0o755),
];

/// What the child needs to build the root.
pub(crate) struct RootfsPlan<'a> {
    /// The overlay mount point (the future `/`).
    pub merged: &'a Path,
    /// Host path of the agent binary.
    pub agent_binary: &'a Path,
    /// Size of `/tmp` and `/dev/shm` in bytes (0: no size option).
    pub tmp_bytes: u64,
    /// Host file bound read-only at `/etc/resolv.conf`.
    pub resolv_conf: Option<&'a Path>,
    /// Volumes: (source mount, path inside, read-only).
    pub volumes: &'a [(std::path::PathBuf, String, bool)],
}

fn bind(src: &Path, dst: &Path, what: &str) -> Result<(), SysError> {
    let s = sys::cpath(src)?;
    sys::mount(Some(&s), dst, None, libc::MS_BIND, None, what)
}

fn tmpfs(dst: &Path, flags: libc::c_ulong, options: &str, what: &str) -> Result<(), SysError> {
    let o = cstr(options)?;
    sys::mount(Some(c"tmpfs"), dst, Some(c"tmpfs"), flags, Some(&o), what)
}

/// The per-mount flags of `path` that a remount inside a user namespace must keep (the
/// kernel locks them on mounts inherited from a more privileged namespace).
fn kept_flags(path: &Path) -> Result<libc::c_ulong, SysError> {
    let p = sys::cpath(path)?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `p` is NUL-terminated and `st` is a valid out-pointer, both outliving the call.
    let ret = unsafe { libc::statvfs(p.as_ptr(), &mut st) };
    sys::check(ret.into(), || format!("statvfs {}", path.display()))?;
    let map = [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ];
    Ok(map
        .iter()
        .filter(|(st_flag, _)| st.f_flag & st_flag != 0)
        .fold(0, |acc, (_, ms)| acc | ms))
}

/// Make the mount at `path` read-only, keeping its locked flags and adding `extra`.
fn remount_ro(path: &Path, extra: libc::c_ulong, what: &str) -> Result<(), SysError> {
    let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | kept_flags(path)? | extra;
    sys::mount(None, path, None, flags, None, what)
}

fn exists(path: &Path) -> bool {
    path.symlink_metadata().is_ok()
}

/// Create the mount point `dir` unless it exists; a symlink is refused (the mount would follow
/// it out of the sandbox's tree).
fn ensure_dir(dir: &Path, mode: u32) -> Result<(), SysError> {
    match dir.symlink_metadata() {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(SysError::new(
            format!("template mount point {} is not a directory", dir.display()),
            libc::ENOTDIR,
        )),
        Err(e) if e.kind() == ErrorKind::NotFound => std::fs::DirBuilder::new()
            .mode(mode)
            .create(dir)
            .map_err(|e| SysError::io(format!("mkdir {}", dir.display()), &e)),
        Err(e) => Err(SysError::io(format!("stat {}", dir.display()), &e)),
    }
}

fn touch(path: &Path, mode: u32) -> Result<(), SysError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(mode)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
        .map(drop)
        .map_err(|e| SysError::io(format!("create {}", path.display()), &e))
}

fn mount_proc(proc: &Path) -> Result<(), SysError> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    sys::mount(
        Some(c"proc"),
        proc,
        Some(c"proc"),
        flags,
        None,
        "mount proc",
    )?;
    for f in PROC_MASKED_FILES {
        let p = proc.join(f);
        if exists(&p) {
            bind(Path::new("/dev/null"), &p, "mask /proc file")?;
        }
    }
    for d in PROC_MASKED_DIRS {
        let p = proc.join(d);
        if p.is_dir() {
            tmpfs(&p, libc::MS_RDONLY | flags, "size=0", "mask /proc dir")?;
        }
    }
    for r in PROC_READONLY {
        let p = proc.join(r);
        if exists(&p) {
            bind(&p, &p, "bind /proc knob")?;
            remount_ro(&p, flags, "make /proc knob read-only")?;
        }
    }
    Ok(())
}

/// What became of `/sys`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SysfsMount {
    /// A read-only sysfs of the sandbox's network namespace.
    Sysfs,
    /// The kernel refused sysfs (a host whose `/sys` has locked mounts over non-empty
    /// directories): an empty read-only tmpfs instead.
    EmptyTmpfs,
}

fn mount_sys(sysfs: &Path) -> Result<SysfsMount, SysError> {
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    match sys::mount(
        Some(c"sysfs"),
        sysfs,
        Some(c"sysfs"),
        flags,
        None,
        "mount sysfs",
    ) {
        Ok(()) => {}
        Err(e) if e.errno == libc::EPERM || e.errno == libc::EACCES => {
            tmpfs(sysfs, flags, "size=0,mode=555", "mount empty /sys")?;
            return Ok(SysfsMount::EmptyTmpfs);
        }
        Err(e) => return Err(e),
    }
    for d in SYS_MASKED_DIRS {
        let p = sysfs.join(d);
        if p.is_dir() {
            tmpfs(&p, flags, "size=0", "mask /sys dir")?;
        }
    }
    Ok(SysfsMount::Sysfs)
}

fn size_option(base: &str, bytes: u64) -> String {
    if bytes > 0 {
        format!("{base},size={bytes}")
    } else {
        base.to_string()
    }
}

fn mount_dev(dev: &Path, shm_bytes: u64) -> Result<(), SysError> {
    tmpfs(
        dev,
        libc::MS_NOSUID | libc::MS_NOEXEC,
        "mode=755,size=1m",
        "mount /dev tmpfs",
    )?;
    for d in DEVICES {
        let target = dev.join(d);
        touch(&target, 0o666)?;
        bind(&Path::new("/dev").join(d), &target, "bind device")?;
    }
    let pts = dev.join("pts");
    ensure_dir(&pts, 0o755)?;
    sys::mount(
        Some(c"devpts"),
        &pts,
        Some(c"devpts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some(c"newinstance,ptmxmode=0666,mode=620,gid=5"),
        "mount devpts",
    )?;
    for (name, target) in DEV_LINKS {
        let link = dev.join(name);
        std::os::unix::fs::symlink(target, &link)
            .map_err(|e| SysError::io(format!("symlink {}", link.display()), &e))?;
    }
    let shm = dev.join("shm");
    ensure_dir(&shm, 0o1777)?;
    tmpfs(
        &shm,
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        &size_option("mode=1777", shm_bytes),
        "mount /dev/shm",
    )
}

fn mount_agent(dir: &Path, agent_binary: &Path) -> Result<(), SysError> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    tmpfs(dir, flags, "mode=755,size=64k", "mount /.hutch")?;
    let target = dir.join("hutch-agent");
    touch(&target, 0o755)?;
    bind(agent_binary, &target, "bind agent binary")?;
    remount_ro(&target, flags, "make agent binary read-only")?;
    remount_ro(dir, flags, "make /.hutch read-only")
}

fn pivot(merged: &Path) -> Result<(), SysError> {
    sys::chdir(merged)?;
    sys::pivot_root_here()?;
    sys::umount2(Path::new("."), libc::MNT_DETACH)?;
    sys::chdir(Path::new("/"))
}

/// Build the root described by `plan` and pivot into it.
/// Bind `src` read-only over `etc/resolv.conf` of the new root. A symlink or anything but a
/// regular file there is replaced by an empty file first (a symlink would be followed
/// against the host's root before `pivot_root`).
fn bind_resolv_conf(src: &Path, etc: &Path) -> Result<(), SysError> {
    ensure_dir(etc, 0o755)?;
    let dst = etc.join("resolv.conf");
    match std::fs::symlink_metadata(&dst) {
        Ok(m) if m.file_type().is_file() => {}
        Ok(m) => {
            let removed = if m.is_dir() {
                std::fs::remove_dir(&dst)
            } else {
                std::fs::remove_file(&dst)
            };
            removed.map_err(|e| SysError::io("replace /etc/resolv.conf", &e))?;
            touch(&dst, 0o644)?;
        }
        Err(_) => touch(&dst, 0o644)?,
    }
    bind(src, &dst, "bind /etc/resolv.conf")?;
    remount_ro(
        &dst,
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        "resolv.conf read-only",
    )
}

/// Bind a volume at `target` inside the new root. Every component of the path is created as
/// a directory if missing and refused if it is a symlink or not a directory (a symlink would
/// be followed against the host's root before `pivot_root`).
fn bind_volume(root: &Path, src: &Path, target: &str, read_only: bool) -> Result<(), SysError> {
    let mut at = root.to_path_buf();
    for part in target.split('/').filter(|p| !p.is_empty()) {
        at.push(part);
        ensure_dir(&at, 0o755)?;
    }
    let s = sys::cpath(src)?;
    sys::mount(Some(&s), &at, None, libc::MS_BIND, None, "bind volume")?;
    if read_only {
        remount_ro(&at, libc::MS_NOSUID | libc::MS_NODEV, "volume read-only")?;
    }
    Ok(())
}

pub(crate) fn assemble(plan: &RootfsPlan<'_>) -> Result<SysfsMount, SysError> {
    let m = plan.merged;
    sys::mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
        "make / private",
    )?;
    let mc: CString = sys::cpath(m)?;
    sys::mount(
        Some(&mc),
        m,
        None,
        libc::MS_BIND | libc::MS_REC,
        None,
        "self-bind the new root",
    )?;
    for (dir, mode) in MOUNT_POINTS {
        ensure_dir(&m.join(dir), *mode)?;
    }
    mount_proc(&m.join("proc"))?;
    let sysfs = mount_sys(&m.join("sys"))?;
    mount_dev(&m.join("dev"), plan.tmp_bytes)?;
    tmpfs(
        &m.join("tmp"),
        libc::MS_NOSUID | libc::MS_NODEV,
        &size_option("mode=1777", plan.tmp_bytes),
        "mount /tmp",
    )?;
    mount_agent(&m.join(".hutch"), plan.agent_binary)?;
    if let Some(src) = plan.resolv_conf {
        bind_resolv_conf(src, &m.join("etc"))?;
    }
    for (src, target, read_only) in plan.volumes {
        bind_volume(m, src, target, *read_only)?;
    }
    pivot(m)?;
    Ok(sysfs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_option_omits_zero() {
        assert_eq!(size_option("mode=1777", 0), "mode=1777");
        assert_eq!(size_option("mode=1777", 4096), "mode=1777,size=4096");
    }

    #[test]
    fn masks_cover_the_known_leaks() {
        for f in ["kcore", "keys", "timer_list", "sched_debug", "kallsyms"] {
            assert!(PROC_MASKED_FILES.contains(&f));
        }
        for f in ["sys", "sysrq-trigger", "irq", "bus", "fs"] {
            assert!(PROC_READONLY.contains(&f));
        }
    }
}
