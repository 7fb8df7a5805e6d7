//! Files and directories every template root has, whatever built it: the sandbox user,
//! `/workspace`, `/.hutch`, and the `/etc` files the jail replaces per sandbox.

use std::path::Path;

use hutch_image::RootDir;

use crate::error::{Result, TemplateError};

/// Uid and gid of the unprivileged `user` account inside sandboxes.
pub(crate) const USER_ID: u32 = 1000;

/// `/etc/hostname` of a template; the jail sets the real hostname per sandbox.
pub(crate) const HOSTNAME: &str = "sandbox\n";

/// `/etc/hosts` of a template.
pub(crate) const HOSTS: &str = "\
127.0.0.1\tlocalhost
127.0.1.1\tsandbox
::1\tlocalhost ip6-localhost ip6-loopback
";

/// `/etc/resolv.conf` placeholder; sandbox networking provides the real one.
pub(crate) const RESOLV_CONF: &str =
    "# Placeholder from the Hutch template; sandbox networking replaces it.\n";

/// A directory in a template root: path relative to the root, mode, owner uid/gid.
pub(crate) type DirSpec = (&'static str, u32, u32);

/// Directories Hutch itself relies on in every template.
pub(crate) const SANDBOX_DIRS: &[DirSpec] = &[("workspace", 0o755, USER_ID), (".hutch", 0o755, 0)];

/// Creates (or fixes up) each directory in `dirs` under `root` with its exact mode and
/// owner (ownership only when running as root). Whatever is not a directory there is
/// replaced; nothing is followed through a symlink ([`RootDir`]), since an image's root may
/// link `workspace` or `etc` anywhere on the host.
pub(crate) fn make_dirs(root: &Path, dirs: &[DirSpec]) -> Result<()> {
    let root = open(root)?;
    for &(rel, mode, owner) in dirs {
        root.ensure_dir(rel, mode, owner).map_err(image_error)?;
    }
    Ok(())
}

/// Writes `contents` to `rel` under `root` with `mode`, owned by root, replacing any file
/// or symlink there (never writing through a symlink, also not through a symlinked parent).
pub(crate) fn write_file(root: &Path, rel: &str, contents: &str, mode: u32) -> Result<()> {
    open(root)?
        .write_file(rel, contents.as_bytes(), mode)
        .map_err(image_error)
}

/// What every root made from an image gets: the mount points the jail and the vm image
/// need (kept if the image has them as directories), [`SANDBOX_DIRS`], and Hutch's
/// `/etc/hostname`, `/etc/hosts` and `/etc/resolv.conf` in place of the image's.
pub(crate) fn prepare_image_root(root: &Path) -> Result<()> {
    let dir = open(root)?;
    for (rel, mode) in [
        ("etc", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("tmp", 0o1777),
        ("run", 0o755),
    ] {
        dir.ensure_dir_keeping(rel, mode).map_err(image_error)?;
    }
    make_dirs(root, SANDBOX_DIRS)?;
    write_file(root, "etc/hostname", HOSTNAME, 0o644)?;
    write_file(root, "etc/hosts", HOSTS, 0o644)?;
    write_file(root, "etc/resolv.conf", RESOLV_CONF, 0o644)
}

/// Opens `root` for descriptor-relative writes.
fn open(root: &Path) -> Result<RootDir> {
    RootDir::open(root).map_err(image_error)
}

/// Attributes a root-writing error to the step that runs it.
fn image_error(source: hutch_image::ImageError) -> TemplateError {
    TemplateError::Image {
        step: String::from("preparing sandbox directories and /etc"),
        source,
    }
}

/// Whether the `/etc/passwd` text `passwd` has an account named `name`.
pub(crate) fn has_account(passwd: &str, name: &str) -> bool {
    passwd
        .lines()
        .any(|line| line.split(':').next() == Some(name))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{symlink, PermissionsExt};

    use super::*;

    /// An image root whose `etc`, `workspace` and `.hutch` link to host directories: the
    /// layout replaces the links with real directories and writes nothing on the host (the
    /// path-based writes this replaced chmodded the link's target and wrote `etc/hosts`
    /// through the `etc` link).
    #[test]
    fn image_roots_never_lead_layout_writes_to_the_host() {
        let host = tempfile::tempdir().expect("tempdir");
        fs::write(host.path().join("hosts"), b"host hosts").expect("write");
        fs::set_permissions(host.path(), fs::Permissions::from_mode(0o700)).expect("chmod");
        let scratch = tempfile::tempdir().expect("tempdir");
        let root = scratch.path();
        for name in ["etc", "workspace", ".hutch", "tmp"] {
            symlink(host.path(), root.join(name)).expect("symlink");
        }
        fs::create_dir(root.join("proc")).expect("mkdir");
        fs::set_permissions(root.join("proc"), fs::Permissions::from_mode(0o700)).expect("chmod");

        prepare_image_root(root).expect("prepares");

        assert_eq!(
            fs::read(host.path().join("hosts")).expect("read"),
            b"host hosts"
        );
        assert_eq!(fs::read_dir(host.path()).expect("ls").count(), 1);
        let host_mode = fs::metadata(host.path())
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(
            host_mode & 0o7777,
            0o700,
            "the host directory's mode is unchanged"
        );
        for (name, mode) in [
            ("etc", 0o755),
            ("workspace", 0o755),
            (".hutch", 0o755),
            ("tmp", 0o1777),
        ] {
            let meta = fs::symlink_metadata(root.join(name)).expect("stat");
            assert!(meta.is_dir(), "{name} is a real directory now");
            assert_eq!(meta.permissions().mode() & 0o7777, mode, "{name}");
        }
        let proc_mode = fs::metadata(root.join("proc"))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(proc_mode & 0o777, 0o700, "an image's own directory is kept");
        assert_eq!(
            fs::read_to_string(root.join("etc/hosts")).expect("hosts"),
            HOSTS
        );
        assert_eq!(
            fs::read_to_string(root.join("etc/hostname")).expect("hostname"),
            HOSTNAME
        );
    }

    #[test]
    fn finds_accounts_by_name_only() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nusers:x:100:100::/:/bin/false\n";
        assert!(has_account(passwd, "root"));
        assert!(!has_account(passwd, "user"));
    }
}
