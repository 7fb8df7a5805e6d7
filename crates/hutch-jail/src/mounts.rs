//! Host-side mounts of a sandbox: the uid-mapping user namespace, the idmapped read-only bind
//! of the template, and the overlay on top of it.
//!
//! Without the idmapped lower, files of the template (owned by host root) would appear as
//! `nobody` inside the sandbox and copy-up of them would fail (EOVERFLOW/EACCES): the
//! sandbox's root is host uid `uid_base`. The idmapped bind shows host uid `n` as
//! `uid_base + n`, i.e. as uid `n` inside, and is read-only so nothing can ever write the
//! shared template through it.

use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::spec::SandboxPaths;
use crate::sys::{
    self, cstr, SysError, MOUNT_ATTR_IDMAP, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
};

/// Write `0 base count` into `/proc/PID/{uid,gid}_map`.
pub(crate) fn write_id_maps(pid: libc::pid_t, base: u32, count: u32) -> Result<(), SysError> {
    let line = format!("0 {base} {count}\n");
    for file in ["uid_map", "gid_map"] {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, &line).map_err(|e| SysError::io(format!("write {path}"), &e))?;
    }
    Ok(())
}

/// A user namespace holding the mapping `0 base count`, as a file descriptor (for
/// `MOUNT_ATTR_IDMAP`).
///
/// A short-lived child is cloned straight into a new user namespace and waits; the parent
/// writes the maps, opens `/proc/PID/ns/user`, then kills and reaps it. The namespace lives on
/// through the descriptor.
///
/// # Safety
/// The caller must be single-threaded (see [`sys::clone_process`]).
pub(crate) unsafe fn userns_fd(base: u32, count: u32) -> Result<OwnedFd, SysError> {
    // SAFETY: getpid cannot fail.
    let parent = unsafe { libc::getpid() };
    // SAFETY: single-threadedness is the caller's promise.
    let pid = unsafe { sys::clone_process(libc::CLONE_NEWUSER)? };
    if pid == 0 {
        // SAFETY: prctl and getppid take and return integers only.
        unsafe {
            // Never outlive a parent that dies before killing us.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != parent {
                libc::_exit(0);
            }
        }
        loop {
            // SAFETY: pause only waits for a signal; the parent ends this child with SIGKILL.
            unsafe { libc::pause() };
        }
    }
    let result = write_id_maps(pid, base, count).and_then(|()| {
        let path = format!("/proc/{pid}/ns/user");
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map(OwnedFd::from)
            .map_err(|e| SysError::io(format!("open {path}"), &e))
    });
    let _ = sys::kill(pid, libc::SIGKILL);
    let _ = sys::waitpid(pid, 0);
    result
}

/// Bind `template` (or a read-only layer) read-only, idmapped through `userns` and without
/// device files or setuid, at `lower`.
pub(crate) fn idmapped_bind(
    template: &Path,
    lower: &Path,
    userns: &OwnedFd,
) -> Result<(), SysError> {
    let tree = sys::open_tree_clone(template)?;
    sys::mount_setattr(
        &tree,
        MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID,
        Some(userns),
    )?;
    sys::move_mount(&tree, lower)
}

/// An idmapped bind of a volume's filesystem at `at` (read-only when asked; never devices or
/// setuid).
pub(crate) fn idmapped_bind_volume(
    source: &Path,
    at: &Path,
    userns: &OwnedFd,
    read_only: bool,
) -> Result<(), SysError> {
    let tree = sys::open_tree_clone(source)?;
    let ro = if read_only { MOUNT_ATTR_RDONLY } else { 0 };
    sys::mount_setattr(
        &tree,
        MOUNT_ATTR_IDMAP | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID | ro,
        Some(userns),
    )?;
    sys::move_mount(&tree, at)
}

/// The overlay's option string (paths were validated free of `,`, `:` and `\`).
///
/// The lower layers are the read-only layers (topmost first) and then the template. Redirects,
/// the inode index and metadata-only copy-up are turned off explicitly, whatever the module
/// defaults: an upper directory then holds nothing but files, directories, symlinks, whiteouts
/// and `trusted.overlay.opaque` markers, which is what [`crate::export_layer`] understands.
pub(crate) fn overlay_options(p: &SandboxPaths) -> String {
    let mut lower: Vec<String> = p.layers.iter().map(|l| l.display().to_string()).collect();
    lower.push(p.lower.display().to_string());
    format!(
        "lowerdir={},upperdir={},workdir={},redirect_dir=off,index=off,metacopy=off",
        lower.join(":"),
        p.upper.display(),
        p.work.display()
    )
}

/// Mount the copy-on-write root at `merged` (no device files, no setuid: `no_new_privs`
/// already makes setuid inert inside, and on the host a setuid file the sandbox planted must
/// not run as its owner).
pub(crate) fn overlay(p: &SandboxPaths) -> Result<(), SysError> {
    let data = cstr(&overlay_options(p))?;
    sys::mount(
        Some(c"overlay"),
        &p.merged,
        Some(c"overlay"),
        libc::MS_NODEV | libc::MS_NOSUID,
        Some(&data),
        "mount overlay",
    )
}

/// Detach whatever is mounted at `target`; "not mounted" and "gone" are success.
pub(crate) fn detach(target: &Path) -> Result<(), SysError> {
    match sys::umount2(target, libc::MNT_DETACH) {
        Err(e) if e.errno == libc::EINVAL || e.errno == libc::ENOENT => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_options_name_the_three_dirs() {
        let p = SandboxPaths::new(Path::new("/srv/sbx/a"));
        assert_eq!(
            overlay_options(&p),
            "lowerdir=/srv/sbx/a/lower,upperdir=/srv/sbx/a/upper,workdir=/srv/sbx/a/work,\
             redirect_dir=off,index=off,metacopy=off"
        );
        let p = SandboxPaths::with_layers(Path::new("/srv/sbx/a"), 1);
        assert!(overlay_options(&p)
            .starts_with("lowerdir=/srv/sbx/a/layer-0:/srv/sbx/a/lower,upperdir="));
    }
}
