//! The `minimal` recipe: Debian's static busybox on an otherwise empty root. Builds in well
//! under a second; meant for tests and tiny sandboxes.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use crate::build::BuildContext;
use crate::error::{IoContext, Result, TemplateError};
use crate::recipes::layout::{self, DirSpec, USER_ID};

/// Where Debian's `busybox-static` installs the binary.
pub(crate) const HOST_BUSYBOX: &str = "/bin/busybox";

/// The root's directory skeleton (beyond [`layout::SANDBOX_DIRS`]).
const DIRS: &[DirSpec] = &[
    ("bin", 0o755, 0),
    ("sbin", 0o755, 0),
    ("usr", 0o755, 0),
    ("usr/bin", 0o755, 0),
    ("usr/sbin", 0o755, 0),
    ("etc", 0o755, 0),
    ("root", 0o700, 0),
    ("home", 0o755, 0),
    ("home/user", 0o755, USER_ID),
    ("tmp", 0o1777, 0),
    ("proc", 0o555, 0),
    ("dev", 0o755, 0),
    ("sys", 0o555, 0),
    ("run", 0o755, 0),
    ("var", 0o755, 0),
    ("var/tmp", 0o1777, 0),
];

/// `/etc/passwd`.
const PASSWD: &str = "\
root:x:0:0:root:/root:/bin/sh
user:x:1000:1000:user:/home/user:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
";

/// `/etc/group`.
const GROUP: &str = "\
root:x:0:
user:x:1000:
nogroup:x:65534:
";

/// Builds the `minimal` root into the empty directory `rootfs`.
pub(crate) fn build(rootfs: &Path, ctx: &mut BuildContext<'_>) -> Result<()> {
    ctx.step("checking the host's static busybox")?;
    let busybox = ctx
        .options
        .busybox
        .clone()
        .unwrap_or_else(|| PathBuf::from(HOST_BUSYBOX));
    check_static(&busybox)?;

    ctx.step("creating directories")?;
    layout::make_dirs(rootfs, DIRS)?;
    layout::make_dirs(rootfs, layout::SANDBOX_DIRS)?;

    ctx.step("copying busybox")?;
    let target = rootfs.join("bin/busybox");
    fs::copy(&busybox, &target).at("copying busybox to", &target)?;
    fs::set_permissions(&target, fs::Permissions::from_mode(0o755))
        .at("setting mode of", &target)?;

    ctx.step("linking busybox applets")?;
    let applets = list_applets(ctx, &busybox)?;
    let linked = link_applets(rootfs, &applets)?;
    ctx.output(format!("{linked} applets linked"));

    ctx.step("writing /etc")?;
    layout::write_file(rootfs, "etc/passwd", PASSWD, 0o644)?;
    layout::write_file(rootfs, "etc/group", GROUP, 0o644)?;
    layout::write_file(rootfs, "etc/hostname", layout::HOSTNAME, 0o644)?;
    layout::write_file(rootfs, "etc/hosts", layout::HOSTS, 0o644)?;
    layout::write_file(rootfs, "etc/resolv.conf", layout::RESOLV_CONF, 0o644)?;
    Ok(())
}

/// Errors unless `path` is a static ELF executable (one without a `PT_INTERP` program
/// header, i.e. with no dynamic loader to find inside the template).
fn check_static(path: &Path) -> Result<()> {
    let missing = || TemplateError::MissingTool {
        tool: path.display().to_string(),
        package: String::from("busybox-static"),
    };
    let mut file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(missing()),
        Err(e) => return Err(TemplateError::io("opening", path, e)),
    };
    let mut image = Vec::new();
    file.by_ref()
        .take(1 << 16)
        .read_to_end(&mut image)
        .at("reading", path)?;
    match elf_has_interpreter(&image) {
        Some(false) => Ok(()),
        Some(true) | None => Err(TemplateError::NotStatic(path.to_path_buf())),
    }
}

/// Whether the ELF image (at least its headers) has a `PT_INTERP` program header;
/// `None` if it is not a little-endian ELF file whose headers lie in `image`.
fn elf_has_interpreter(image: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if image.get(..4)? != b"\x7fELF" || *image.get(5)? != 1 {
        return None;
    }
    let u16_at = |at: usize| Some(u16::from_le_bytes(image.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(image.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(image.get(at..at + 8)?.try_into().ok()?));
    let (phoff, phentsize, phnum) = match image.get(4)? {
        1 => (u64::from(u32_at(0x1c)?), u16_at(0x2a)?, u16_at(0x2c)?),
        2 => (u64_at(0x20)?, u16_at(0x36)?, u16_at(0x38)?),
        _ => return None,
    };
    let phoff = usize::try_from(phoff).ok()?;
    for i in 0..usize::from(phnum) {
        let p_type = u32_at(phoff.checked_add(i.checked_mul(usize::from(phentsize))?)?)?;
        if p_type == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

/// Asks busybox for the full path of every applet (`bin/ls`, `usr/bin/[`).
fn list_applets(ctx: &mut BuildContext<'_>, busybox: &Path) -> Result<Vec<PathBuf>> {
    let output = Command::new(busybox)
        .arg("--list-full")
        .output()
        .map_err(|e| {
            ctx.fail(format!(
                "could not run `{} --list-full`: {e}",
                busybox.display()
            ))
        })?;
    if !output.status.success() {
        return Err(TemplateError::ToolFailed {
            step: ctx.current_step().to_owned(),
            command: format!("{} --list-full", busybox.display()),
            status: output.status.to_string(),
            tail: String::from_utf8_lossy(&output.stderr)
                .trim_end()
                .to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(PathBuf::from)
        .filter(|p| is_plain_relative(p))
        .collect())
}

/// Whether `path` is non-empty, relative and made only of normal components.
fn is_plain_relative(path: &Path) -> bool {
    path.components().next().is_some()
        && path.components().all(|c| matches!(c, Component::Normal(_)))
}

/// Links each applet to `/bin/busybox` with a relative symlink, skipping paths that
/// already exist; `bin/sh` is always present afterwards. Returns how many were linked.
fn link_applets(rootfs: &Path, applets: &[PathBuf]) -> Result<usize> {
    let mut linked = 0;
    let sh = PathBuf::from("bin/sh");
    for applet in applets.iter().chain(std::iter::once(&sh)) {
        let path = rootfs.join(applet);
        if fs::symlink_metadata(&path).is_ok() {
            continue;
        }
        let parent = applet.parent().unwrap_or(Path::new(""));
        if let Some(dir) = path.parent() {
            if !dir.is_dir() {
                fs::create_dir_all(dir).at("creating directory", dir)?;
                fs::set_permissions(dir, fs::Permissions::from_mode(0o755))
                    .at("setting mode of", dir)?;
            }
        }
        symlink(link_target(parent), &path).at("creating symlink", &path)?;
        linked += 1;
    }
    Ok(linked)
}

/// Relative path from a directory (relative to the root) to `bin/busybox`.
fn link_target(parent: &Path) -> PathBuf {
    if parent == Path::new("bin") {
        return PathBuf::from("busybox");
    }
    let mut target = PathBuf::new();
    for _ in parent.components() {
        target.push("..");
    }
    target.join("bin/busybox")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_targets_are_relative_to_the_link() {
        assert_eq!(link_target(Path::new("bin")), PathBuf::from("busybox"));
        assert_eq!(
            link_target(Path::new("sbin")),
            PathBuf::from("../bin/busybox")
        );
        assert_eq!(
            link_target(Path::new("usr/bin")),
            PathBuf::from("../../bin/busybox")
        );
        assert_eq!(link_target(Path::new("")), PathBuf::from("bin/busybox"));
    }

    #[test]
    fn rejects_unsafe_applet_paths() {
        assert!(is_plain_relative(Path::new("usr/bin/[")));
        assert!(!is_plain_relative(Path::new("/bin/sh")));
        assert!(!is_plain_relative(Path::new("../etc/x")));
        assert!(!is_plain_relative(Path::new("")));
    }

    #[test]
    fn detects_dynamic_executables() {
        let sh = fs::read("/bin/sh").expect("host has /bin/sh");
        // Debian's /bin/sh (dash) is dynamically linked.
        assert_eq!(elf_has_interpreter(&sh), Some(true));
        assert_eq!(elf_has_interpreter(b"#!/bin/sh\n"), None);
    }
}
