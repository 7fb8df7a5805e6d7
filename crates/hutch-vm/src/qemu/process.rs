//! A running QEMU: started (jailed when its config says so), watched, killed on drop; and
//! the binary's version check.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use super::config::{VmConfig, MIN_VERSION, TAP_FD};
use super::error::QemuError;
use crate::disk::create_fresh;

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

/// A running QEMU, killed (SIGKILL by pid) and reaped when dropped, unless detached.
#[derive(Debug)]
pub struct QemuProcess {
    handle: Option<Handle>,
    log: PathBuf,
}

/// How this process knows its QEMU child.
#[derive(Debug)]
enum Handle {
    /// Started with `Command` (no jail).
    Command(Child),
    /// Cloned into its jail ([`super::jail`]); `exited` once reaped.
    Jailed {
        pid: libc::pid_t,
        exited: Option<ExitStatus>,
    },
}

impl Handle {
    fn pid(&self) -> u32 {
        match self {
            Handle::Command(child) => child.id(),
            Handle::Jailed { pid, .. } => *pid as u32,
        }
    }

    fn try_exit(&mut self) -> Option<ExitStatus> {
        match self {
            Handle::Command(child) => child.try_wait().ok().flatten(),
            Handle::Jailed { pid, exited } => {
                if exited.is_none() {
                    let mut status = 0;
                    // SAFETY: waitpid on our own child with a valid status pointer; WNOHANG.
                    if unsafe { libc::waitpid(*pid, &mut status, libc::WNOHANG) } == *pid {
                        *exited = Some(ExitStatus::from_raw(status));
                    }
                }
                *exited
            }
        }
    }

    /// SIGKILL unless it exited, then reap.
    fn kill(&mut self) {
        match self {
            Handle::Command(child) => {
                if child.try_wait().ok().flatten().is_none() {
                    let _ = child.kill();
                }
                let _ = child.wait();
            }
            Handle::Jailed { pid, exited } => {
                if exited.is_none() {
                    // SAFETY: our own child, not reaped yet (so the pid is still its).
                    unsafe {
                        libc::kill(*pid, libc::SIGKILL);
                        libc::waitpid(*pid, std::ptr::null_mut(), 0);
                    }
                }
            }
        }
    }
}

impl QemuProcess {
    /// Start QEMU for `config` (in its jail when it has one, see [`super::jail`]); its
    /// stdout and stderr go to `log`.
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
        let out = create_fresh(log).map_err(io(format!("create {}", log.display())))?;
        if let Some(jail) = &config.jail {
            let pid = super::jail::spawn(config, jail, &out)?;
            return Ok(Self {
                handle: Some(Handle::Jailed { pid, exited: None }),
                log: log.to_path_buf(),
            });
        }
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
        let child = command.spawn().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => QemuError::Missing(config.qemu.display().to_string()),
            _ => QemuError::Io {
                what: "spawn QEMU".into(),
                source: e,
            },
        })?;
        Ok(Self {
            handle: Some(Handle::Command(child)),
            log: log.to_path_buf(),
        })
    }

    /// QEMU's pid (on the host: in its jail it is pid 1).
    pub fn pid(&self) -> u32 {
        self.handle.as_ref().map_or(0, Handle::pid)
    }

    /// `Some(status)` once QEMU has exited.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.handle.as_mut()?.try_exit()
    }

    /// Let QEMU run on without this handle: it is no longer killed on drop, and whoever
    /// owns its pid (the server, through a pidfd) must reap it. Returns the pid.
    pub fn detach(mut self) -> u32 {
        let pid = self.pid();
        self.handle = None;
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
        if let Some(handle) = self.handle.as_mut() {
            handle.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
