//! Files and directories every template root has, whatever built it: the sandbox user,
//! `/workspace`, `/.hutch`, and the `/etc` files the jail replaces per sandbox.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::error::{IoContext, Result};
use crate::sys;

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
/// owner. Ownership is only set when running as root.
pub(crate) fn make_dirs(root: &Path, dirs: &[DirSpec]) -> Result<()> {
    for &(rel, mode, owner) in dirs {
        let path = root.join(rel);
        match fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {}
            Err(e) => return Err(crate::TemplateError::io("creating directory", &path, e)),
        }
        set_owner(&path, owner)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))
            .at("setting mode of", &path)?;
    }
    Ok(())
}

/// Writes `contents` to `rel` under `root` with `mode`, owned by root, replacing any file
/// or symlink there (never writing through a symlink).
pub(crate) fn write_file(root: &Path, rel: &str, contents: &str, mode: u32) -> Result<()> {
    let path = root.join(rel);
    if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
        fs::remove_file(&path).at("replacing symlink", &path)?;
    }
    fs::write(&path, contents).at("writing", &path)?;
    set_owner(&path, 0)?;
    fs::set_permissions(&path, fs::Permissions::from_mode(mode)).at("setting mode of", &path)
}

/// Sets uid and gid of `path` to `id` (without following a final symlink) when running as
/// root; unprivileged builds keep the builder's ownership.
fn set_owner(path: &Path, id: u32) -> Result<()> {
    if !sys::is_root() {
        return Ok(());
    }
    std::os::unix::fs::lchown(path, Some(id), Some(id)).at("changing owner of", path)
}

/// Whether the `/etc/passwd` text `passwd` has an account named `name`.
pub(crate) fn has_account(passwd: &str, name: &str) -> bool {
    passwd
        .lines()
        .any(|line| line.split(':').next() == Some(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_accounts_by_name_only() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nusers:x:100:100::/:/bin/false\n";
        assert!(has_account(passwd, "root"));
        assert!(!has_account(passwd, "user"));
    }
}
