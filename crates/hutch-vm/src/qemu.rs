//! QEMU `microvm` command line and process handling.
//!
//! The device set is fixed and built in one place ([`VmConfig::argv`]) because a restore
//! needs the identical devices in the identical order as the bake ("Unknown savevm
//! section" otherwise). Only the memory backend's `share=` and `-incoming defer` differ.

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::initramfs::AGENT_PORT;

/// Device id of the agent's virtio-serial port (names its `VSERPORT_CHANGE` events).
pub const AGENT_PORT_ID: &str = "agent-port";
/// Default QEMU binary.
pub const QEMU_BINARY: &str = "qemu-system-x86_64";
/// Oldest QEMU this driver is written against (Debian 12).
pub const MIN_VERSION: (u32, u32) = (7, 2);

/// Why QEMU could not be used or started.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    /// The binary is not installed.
    #[error("{0} not found; install Debian's qemu-system-x86 package")]
    Missing(String),
    /// The binary is too old.
    #[error("QEMU {found} is too old; need {}.{} or newer", MIN_VERSION.0, MIN_VERSION.1)]
    TooOld {
        /// The version it reported.
        found: String,
    },
    /// `--version` output that does not parse.
    #[error("cannot parse QEMU version from {0:?}")]
    UnknownVersion(String),
    /// Spawning or waiting failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
}

/// How guest code is executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualization.
    Kvm,
    /// QEMU's software emulator (the only option with PVM `/dev/kvm`).
    Tcg,
}

/// How QEMU is confined when it starts (the `vm` backend's defense in depth: code that
/// escapes the guest into QEMU is still in this). Applied in the child between `fork` and
/// `exec`: join the cgroups, new IPC, UTS and network namespaces, then an unprivileged uid
/// and gid with no capabilities and `no_new_privs`. QEMU's own seccomp filter (`-sandbox`)
/// comes on top.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QemuJail {
    /// The uid QEMU runs as (never 0).
    pub uid: u32,
    /// Its gid.
    pub gid: u32,
    /// Supplementary groups (the group that may open template memory files; `kvm`).
    pub groups: Vec<u32>,
    /// `cgroup.procs` files QEMU moves itself into.
    pub cgroup_procs: Vec<PathBuf>,
}

/// Everything that defines one VM's command line.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// The QEMU binary.
    pub qemu: PathBuf,
    /// Accelerator.
    pub accel: Accel,
    /// The ELF `vmlinux`, booted PVH.
    pub kernel: PathBuf,
    /// The initramfs.
    pub initrd: PathBuf,
    /// Kernel command line.
    pub append: String,
    /// Guest RAM in MiB.
    pub memory_mib: u32,
    /// Virtual CPUs.
    pub cpus: u32,
    /// File backing guest RAM.
    pub memory_file: PathBuf,
    /// `share=on` (bake: writes go to the file) or `share=off` (restore: copy-on-write).
    pub share_memory: bool,
    /// The QMP unix socket QEMU listens on.
    pub qmp_socket: PathBuf,
    /// The unix socket QEMU listens on for the agent's virtio-serial port.
    pub agent_socket: PathBuf,
    /// Where the guest's serial console goes; `None` discards it.
    pub console_log: Option<PathBuf>,
    /// The root disk (a qcow2 image), attached as `virtio-blk` (`/dev/vda` in the guest).
    pub root_disk: Option<PathBuf>,
    /// Start with `-incoming defer` (restore).
    pub incoming: bool,
    /// Apply QEMU's seccomp sandbox (`spawn=deny` and friends).
    pub seccomp: bool,
    /// Confine the process (not part of the command line).
    pub jail: Option<QemuJail>,
    /// The TAP device of the sandbox's network (`vm` slot, see `hutch_net::tap`), handed to
    /// QEMU as fd [`TAP_FD`]. Without one the guest's NIC sits on an empty hub: the device
    /// set is the same either way, so every restore matches the bake.
    pub tap: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
}

/// The descriptor number QEMU finds the TAP device at.
pub const TAP_FD: i32 = 200;
/// The guest NIC's MAC address (every guest sits alone on its slot's segment).
pub const GUEST_MAC: &str = "52:54:00:68:75:01";

impl VmConfig {
    /// A config with the defaults used by Hutch: TCG, 256 MiB, 1 vCPU, seccomp on.
    pub fn new(kernel: PathBuf, initrd: PathBuf, dir: &Path) -> Self {
        Self {
            qemu: PathBuf::from(QEMU_BINARY),
            accel: Accel::Tcg,
            kernel,
            initrd,
            append: "console=ttyS0 quiet panic=-1 reboot=t".into(),
            memory_mib: 256,
            cpus: 1,
            memory_file: dir.join("memory"),
            share_memory: true,
            qmp_socket: dir.join("qmp.sock"),
            agent_socket: dir.join("agent.sock"),
            console_log: None,
            root_disk: None,
            incoming: false,
            seccomp: true,
            jail: None,
            tap: None,
        }
    }

    /// The full argument vector (without the program name).
    pub fn argv(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |parts: &[&str]| a.extend(parts.iter().map(OsString::from));
        let mem = self.memory_mib;
        push(&[
            "-M",
            "microvm,x-option-roms=off,isa-serial=on,memory-backend=mem",
        ]);
        match self.accel {
            Accel::Kvm => push(&["-accel", "kvm", "-cpu", "host"]),
            Accel::Tcg => push(&["-accel", "tcg", "-cpu", "max"]),
        }
        push(&["-m", &format!("{mem}M"), "-smp", &self.cpus.to_string()]);
        push(&[
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
        ]);
        if self.seccomp {
            push(&[
                "-sandbox",
                "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
            ]);
        }
        push(&["-kernel", &self.kernel.to_string_lossy()]);
        push(&["-initrd", &self.initrd.to_string_lossy()]);
        push(&["-append", &self.append]);
        let share = if self.share_memory { "on" } else { "off" };
        push(&[
            "-object",
            &format!(
                "memory-backend-file,id=mem,size={mem}M,mem-path={},share={share}",
                escape(&self.memory_file)
            ),
        ]);
        let serial = match &self.console_log {
            Some(path) => format!("file:{}", path.to_string_lossy()),
            None => "null".into(),
        };
        push(&["-serial", &serial]);
        push(&[
            "-qmp",
            &format!("unix:{},server=on,wait=off", escape(&self.qmp_socket)),
        ]);
        push(&[
            "-chardev",
            &format!(
                "socket,id=agent,path={},server=on,wait=off",
                escape(&self.agent_socket)
            ),
        ]);
        if let Some(disk) = &self.root_disk {
            push(&[
                "-drive",
                &format!(
                    "file={},format=qcow2,if=none,id=root,cache=writeback,discard=unmap",
                    escape(disk)
                ),
            ]);
            push(&["-device", "virtio-blk-device,drive=root"]);
        }
        push(&["-device", "virtio-serial-device,max_ports=2"]);
        push(&[
            "-device",
            &format!("virtserialport,chardev=agent,name={AGENT_PORT},id={AGENT_PORT_ID}"),
        ]);
        // No vnet header on either backend, so a guest baked on the hub restores on a TAP.
        match &self.tap {
            Some(_) => push(&["-netdev", &format!("tap,id=net0,fd={TAP_FD},vhost=off")]),
            None => push(&["-netdev", "hubport,id=net0,hubid=0"]),
        }
        push(&[
            "-device",
            &format!("virtio-net-device,netdev=net0,mac={GUEST_MAC}"),
        ]);
        if self.incoming {
            push(&["-incoming", "defer"]);
        }
        a
    }
}

/// Escape a path for a QEMU option value (commas are doubled).
fn escape(path: &Path) -> String {
    path.to_string_lossy().replace(',', ",,")
}

/// Check that `qemu` exists and is new enough; returns its version string.
pub fn check_version(qemu: &Path) -> Result<String, QemuError> {
    let out = Command::new(qemu).arg("--version").output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            QemuError::Missing(qemu.display().to_string())
        } else {
            QemuError::Io {
                what: format!("run {} --version", qemu.display()),
                source: e,
            }
        }
    })?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let version = parse_version(&text).ok_or_else(|| QemuError::UnknownVersion(text.clone()))?;
    let found = version.2.clone();
    if (version.0, version.1) < MIN_VERSION {
        return Err(QemuError::TooOld { found });
    }
    Ok(found)
}

/// Parse `QEMU emulator version 7.2.19 (Debian ...)` into (major, minor, full).
pub fn parse_version(text: &str) -> Option<(u32, u32, String)> {
    let rest = text.split("version ").nth(1)?;
    let full = rest.split_whitespace().next()?.to_string();
    let mut parts = full.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor, full))
}

/// The child side of [`QemuJail`] (between fork and exec: no allocation).
fn confine(cgroup_fds: &[i32], uid: u32, gid: u32, groups: &[u32]) -> std::io::Result<()> {
    let check = |rc: libc::c_int| {
        if rc < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    for &fd in cgroup_fds {
        // SAFETY: writes two bytes from a static buffer to an fd opened before the fork.
        let n = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: unshare, setgroups, setresgid, setresuid and prctl take plain values and a
    // pointer to `groups`, which outlives the calls.
    unsafe {
        check(libc::unshare(
            libc::CLONE_NEWIPC | libc::CLONE_NEWUTS | libc::CLONE_NEWNET,
        ))?;
        check(libc::setgroups(groups.len(), groups.as_ptr()))?;
        check(libc::setresgid(gid, gid, gid))?;
        check(libc::setresuid(uid, uid, uid))?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
    }
    Ok(())
}

/// A running QEMU, killed (SIGKILL by pid) and reaped when dropped, unless detached.
#[derive(Debug)]
pub struct QemuProcess {
    child: Option<Child>,
    log: PathBuf,
}

impl QemuProcess {
    /// Start QEMU for `config`; its stdout and stderr go to `log`.
    pub fn spawn(config: &VmConfig, log: &Path) -> Result<Self, QemuError> {
        let io = |what: String| move |source| QemuError::Io { what, source };
        for socket in [&config.qmp_socket, &config.agent_socket] {
            match std::fs::remove_file(socket) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io(format!("remove {}", socket.display()))(e));
                }
                _ => {}
            }
        }
        let out = std::fs::File::create(log).map_err(io(format!("create {}", log.display())))?;
        let err = out.try_clone().map_err(io("dup log".into()))?;
        let mut command = Command::new(&config.qemu);
        command
            .args(config.argv())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if let Some(tap) = &config.tap {
            let raw = tap.as_raw_fd();
            // SAFETY: dup2 is async-signal-safe and only uses two integers prepared before
            // the fork; the copy at TAP_FD is not close-on-exec, so QEMU inherits it.
            unsafe {
                command.pre_exec(move || {
                    if libc::dup2(raw, TAP_FD) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        // Kept open until the child has exec'd (they are close-on-exec).
        let mut cgroup_files = Vec::new();
        if let Some(jail) = &config.jail {
            if jail.uid == 0 {
                return Err(QemuError::Io {
                    what: "confine QEMU".into(),
                    source: std::io::Error::other("refusing to run a jailed QEMU as uid 0"),
                });
            }
            for procs in &jail.cgroup_procs {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(procs)
                    .map_err(io(format!("open {}", procs.display())))?;
                cgroup_files.push(f);
            }
            let fds: Vec<i32> = cgroup_files.iter().map(|f| f.as_raw_fd()).collect();
            let (uid, gid, groups) = (jail.uid, jail.gid, jail.groups.clone());
            // SAFETY: the closure runs in the forked child before exec and only makes
            // async-signal-safe system calls (write, unshare, setgroups, setres[ug]id,
            // prctl) on values prepared before the fork; it allocates nothing.
            unsafe {
                command.pre_exec(move || confine(&fds, uid, gid, &groups));
            }
        }
        let child = command.spawn().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => QemuError::Missing(config.qemu.display().to_string()),
            _ => QemuError::Io {
                what: "spawn QEMU".into(),
                source: e,
            },
        })?;
        drop(cgroup_files);
        Ok(Self {
            child: Some(child),
            log: log.to_path_buf(),
        })
    }

    /// QEMU's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// `Some(status)` once QEMU has exited.
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// Let QEMU run on without this handle: it is no longer killed on drop, and whoever
    /// owns its pid (the server, through a pidfd) must reap it. Returns the pid.
    pub fn detach(mut self) -> u32 {
        let pid = self.pid();
        self.child = None;
        pid
    }

    /// The tail of QEMU's stdout/stderr, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(2000);
        text.get(start..).unwrap_or_default().trim().to_string()
    }
}

impl Drop for QemuProcess {
    fn drop(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        if child.try_wait().ok().flatten().is_none() {
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> VmConfig {
        VmConfig::new(
            "/k/vmlinux".into(),
            "/k/initrd".into(),
            Path::new("/run/vm,1"),
        )
    }

    fn joined(c: &VmConfig) -> String {
        c.argv()
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn bake_command_line() {
        let argv = joined(&config());
        assert!(argv.starts_with("-M microvm,"), "{argv}");
        assert!(argv.contains("-accel tcg -cpu max -m 256M -smp 1 -nodefaults -no-user-config"));
        assert!(argv.contains("spawn=deny"));
        assert!(
            argv.contains("mem-path=/run/vm,,1/memory,share=on"),
            "{argv}"
        );
        assert!(argv.contains("-qmp unix:/run/vm,,1/qmp.sock,server=on,wait=off"));
        assert!(
            argv.contains("-device virtserialport,chardev=agent,name=hutch.agent,id=agent-port")
        );
        assert!(!argv.contains("-incoming"));
    }

    #[test]
    fn restore_differs_only_in_share_and_incoming() {
        let bake = config();
        let restore = VmConfig {
            share_memory: false,
            incoming: true,
            ..config()
        };
        let b = joined(&bake);
        let r = joined(&restore);
        assert_eq!(
            r,
            format!("{} -incoming defer", b.replace("share=on", "share=off"))
        );
    }

    #[test]
    fn versions() {
        let v = parse_version("QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u16)\n");
        assert_eq!(v, Some((7, 2, "7.2.19".into())));
        assert_eq!(parse_version("garbage"), None);
        assert!(matches!(
            check_version(Path::new("/nonexistent/qemu")),
            Err(QemuError::Missing(_))
        ));
    }
}
