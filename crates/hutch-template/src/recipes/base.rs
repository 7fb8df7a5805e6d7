//! The `base` recipe: Debian 12 (bookworm) from Debian's packages via `debootstrap`, with
//! python3, pip, venv, git, curl, ca-certificates and build-essential.

use std::fs;
use std::io;
use std::path::Path;
use std::process::Command;

use crate::build::BuildContext;
use crate::error::{IoContext, Result, TemplateError};
use crate::recipes::{apt_sources, command, layout};
use crate::{sys, tree};

/// The Debian release installed.
pub(crate) const SUITE: &str = "bookworm";

/// Used when neither the options nor the host's apt sources name a mirror.
pub(crate) const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// Packages installed on top of the `minbase` variant.
const INCLUDE: &str = "python3,python3-pip,python3-venv,git,curl,ca-certificates,build-essential";

/// What the `code-interpreter` template adds to `base`: a Jupyter kernel for Python with
/// the usual data libraries, R with its Jupyter kernel (IRkernel, which registers the `ir`
/// kernelspec), and Node.js, all from Debian. Installed with `apt-get` after debootstrap
/// (debootstrap's own resolver cannot configure `python3-zmq`'s dependencies).
pub(crate) const CODE_INTERPRETER_PACKAGES: &[&str] = &[
    "python3-ipykernel",
    "python3-jupyter-client",
    "python3-numpy",
    "python3-pandas",
    "python3-matplotlib",
    "python3-pil",
    "fonts-dejavu-core",
    "r-base-core",
    "r-cran-irkernel",
    "nodejs",
];

/// Builds the `base` root into the empty directory `rootfs`.
pub(crate) fn build(rootfs: &Path, ctx: &mut BuildContext<'_>) -> Result<()> {
    build_with(rootfs, &[], ctx)
}

/// Builds a Debian root: debootstrap's `minbase` with `base`'s packages, then `extra` with
/// `apt-get install --no-install-recommends` in a chroot (with `/proc` mounted meanwhile).
pub(crate) fn build_with(rootfs: &Path, extra: &[&str], ctx: &mut BuildContext<'_>) -> Result<()> {
    ctx.step("checking for debootstrap")?;
    let debootstrap =
        command::find_program("debootstrap").ok_or_else(|| TemplateError::MissingTool {
            tool: String::from("debootstrap"),
            package: String::from("debootstrap"),
        })?;
    let chroot = command::find_program("chroot").ok_or_else(|| TemplateError::MissingTool {
        tool: String::from("chroot"),
        package: String::from("coreutils"),
    })?;
    if !sys::is_root() {
        return Err(ctx.fail("debootstrap must run as root"));
    }
    let mirror = match &ctx.options.mirror {
        Some(mirror) => mirror.clone(),
        None => apt_sources::host_mirror(Path::new("/"), SUITE)
            .unwrap_or_else(|| DEFAULT_MIRROR.to_owned()),
    };

    ctx.step(format!("debootstrap {SUITE} from {mirror}"))?;
    let mut cmd = Command::new(debootstrap);
    cmd.arg("--variant=minbase")
        .arg(format!("--include={INCLUDE}"))
        .arg(SUITE)
        .arg(rootfs)
        .arg(&mirror);
    command::run(ctx, cmd)?;

    if !extra.is_empty() {
        ctx.step(format!("apt-get install {}", extra.join(" ")))?;
        let proc = rootfs.join("proc");
        let mut mount = Command::new("mount");
        mount.args(["-t", "proc", "proc"]).arg(&proc);
        command::run(ctx, mount)?;
        let installed = (|| {
            let apt = |args: &[&str]| {
                let mut cmd = Command::new(&chroot);
                cmd.arg(rootfs)
                    .arg("apt-get")
                    .args(args)
                    .env("DEBIAN_FRONTEND", "noninteractive");
                cmd
            };
            command::run(ctx, apt(&["update"]))?;
            let mut install = vec!["install", "-y", "--no-install-recommends"];
            install.extend_from_slice(extra);
            command::run(ctx, apt(&install))
        })();
        let mut umount = Command::new("umount");
        umount.arg(&proc);
        let unmounted = command::run(ctx, umount);
        installed?;
        unmounted?;
    }

    ctx.step("cleaning the apt cache")?;
    let mut cmd = Command::new(&chroot);
    cmd.arg(rootfs).args(["apt-get", "clean"]);
    command::run(ctx, cmd)?;
    clear_dir(&rootfs.join("var/lib/apt/lists"))?;

    ctx.step("adding the user account")?;
    let passwd_path = rootfs.join("etc/passwd");
    let passwd = fs::read_to_string(&passwd_path).at("reading", &passwd_path)?;
    if !layout::has_account(&passwd, "user") {
        let mut cmd = Command::new(&chroot);
        cmd.arg(rootfs).args([
            "useradd",
            "--create-home",
            "--uid",
            "1000",
            "--user-group",
            "--shell",
            "/bin/bash",
            "user",
        ]);
        command::run(ctx, cmd)?;
    }

    ctx.step("preparing sandbox directories and /etc")?;
    layout::make_dirs(rootfs, layout::SANDBOX_DIRS)?;
    // debootstrap copies the host's hostname; do not leak it into sandboxes.
    layout::write_file(rootfs, "etc/hostname", layout::HOSTNAME, 0o644)?;
    layout::write_file(rootfs, "etc/hosts", layout::HOSTS, 0o644)?;
    let resolv = rootfs.join("etc/resolv.conf");
    if fs::symlink_metadata(&resolv).is_err() {
        layout::write_file(rootfs, "etc/resolv.conf", layout::RESOLV_CONF, 0o644)?;
    }
    Ok(())
}

/// Deletes everything inside `dir`, keeping `dir` itself.
fn clear_dir(dir: &Path) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(TemplateError::io("listing directory", dir, e)),
    };
    for entry in entries {
        tree::remove_tree(&entry.at("listing directory", dir)?.path())?;
    }
    Ok(())
}
