//! What this host offers the jail and the VM backend, for `hutch doctor` and `auto` isolation.
//!
//! Every check is a read of `/proc`, `/sys` or a harmless syscall probe: nothing forks, mounts
//! or creates anything.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cgroup::Layout;
use crate::sys;

/// One capability of the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCheck {
    /// Short name (`user_namespaces`, `cgroups`, `landlock`, …).
    pub name: String,
    /// Whether it is usable.
    pub ok: bool,
    /// One line for a human: what was found, or what is missing and why it matters.
    pub detail: String,
    /// Which backend needs it: `ns` (the jail; also used around VMs) or `vm`.
    pub needed_by: String,
}

/// Everything `hutch doctor` reports about the isolation features of this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostReport {
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// `v1-hybrid`, `v1`, `v2` or `none`.
    pub cgroup_mode: String,
    /// cgroup controllers available to sandboxes.
    pub cgroup_controllers: Vec<String>,
    /// Landlock ABI version, if Landlock is enabled.
    pub landlock_abi: Option<u32>,
    /// Every check, in a stable order.
    pub checks: Vec<HostCheck>,
}

impl HostReport {
    /// Whether every check the `ns` backend needs passed.
    pub fn ns_supported(&self) -> bool {
        self.checks
            .iter()
            .filter(|c| c.needed_by == "ns")
            .all(|c| c.ok)
    }

    /// Whether every check the `vm` backend needs passed.
    pub fn vm_supported(&self) -> bool {
        self.checks
            .iter()
            .filter(|c| c.needed_by == "vm")
            .all(|c| c.ok)
    }

    /// One line per check: `ok  `, `FAIL` (needed by `ns`) or `--  ` (needed by `vm` only),
    /// the name and the detail.
    pub fn human_lines(&self) -> Vec<String> {
        let mut lines = vec![format!("ok   kernel {}", self.kernel)];
        lines.extend(self.checks.iter().map(|c| {
            let mark = match (c.ok, c.needed_by.as_str()) {
                (true, _) => "ok  ",
                (false, "ns") => "FAIL",
                (false, _) => "--  ",
            };
            format!("{mark} {}: {}", c.name, c.detail)
        }));
        lines
    }

    /// Which isolation levels work here and why, in one line.
    pub fn isolation_summary(&self) -> String {
        let failing = |backend: &str| -> Vec<&str> {
            self.checks
                .iter()
                .filter(|c| c.needed_by == backend && !c.ok)
                .map(|c| c.name.as_str())
                .collect()
        };
        let ns = if self.ns_supported() {
            format!(
                "ns ready (user namespaces, cgroup {}, Landlock {}, seccomp, idmapped overlay)",
                self.cgroup_mode,
                self.landlock_abi
                    .map_or("off".to_string(), |v| format!("ABI {v}"))
            )
        } else {
            format!("ns unavailable (missing: {})", failing("ns").join(", "))
        };
        let missing = failing("vm");
        let vm = if self.vm_supported() {
            "vm ready (KVM + QEMU)".to_string()
        } else if missing == ["kvm"] {
            "vm under TCG only (no usable KVM; see the vm line)".to_string()
        } else {
            format!("vm unavailable (missing: {})", missing.join(", "))
        };
        format!("{ns}; {vm}")
    }
}

fn check(name: &str, ok: bool, detail: impl Into<String>, needed_by: &str) -> HostCheck {
    HostCheck {
        name: name.into(),
        ok,
        detail: detail.into(),
        needed_by: needed_by.into(),
    }
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn kernel_release() -> String {
    // SAFETY: utsname is plain old data; all-zero is valid and uname overwrites it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid out-pointer.
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    // SAFETY: uname NUL-terminates `release` within the array.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// `(major, minor)` from a release like `6.18.44-fc`.
pub(crate) fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// `program`'s path on `PATH`: the first regular file of that name with an execute bit.
pub fn find_program(program: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|f| {
            f.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

fn cgroup_check() -> (String, Vec<String>, HostCheck) {
    let layout = crate::mountinfo::read()
        .ok()
        .and_then(|m| Layout::from_mounts(&m));
    match layout {
        Some(Layout::V1 {
            hierarchies,
            unified,
        }) => {
            let ctrls: Vec<String> = hierarchies
                .iter()
                .flat_map(|h| h.controllers.iter().map(|c| c.name().to_string()))
                .collect();
            let mode = if unified.is_some() { "v1-hybrid" } else { "v1" };
            let ok = ctrls.iter().any(|c| c == "pids");
            let kill = unified.is_some();
            let detail = format!(
                "cgroup {mode}: {}{}",
                ctrls.join(", "),
                if kill {
                    "; unified cgroup2 for cgroup.kill/freeze"
                } else {
                    "; no cgroup2: teardown kills the init"
                }
            );
            (mode.into(), ctrls, check("cgroups", ok, detail, "ns"))
        }
        Some(Layout::V2 { root }) => {
            let avail = read(&root.join("cgroup.controllers").to_string_lossy());
            let ctrls: Vec<String> = avail.split_whitespace().map(String::from).collect();
            let ok = ["memory", "pids"]
                .iter()
                .all(|c| ctrls.iter().any(|x| x == c));
            let detail = format!("cgroup v2 at {}: {}", root.display(), ctrls.join(", "));
            ("v2".into(), ctrls, check("cgroups", ok, detail, "ns"))
        }
        None => (
            "none".into(),
            vec![],
            check(
                "cgroups",
                false,
                "no cgroup hierarchy mounted: no memory, pids or cpu limits",
                "ns",
            ),
        ),
    }
}

/// Probe the host. Cheap (a few file reads and two syscalls); does not fork.
pub fn host_report() -> HostReport {
    let kernel = kernel_release();
    let mut checks = Vec::new();

    let max_userns: u64 = read("/proc/sys/user/max_user_namespaces")
        .trim()
        .parse()
        .unwrap_or(0);
    let userns = Path::new("/proc/self/ns/user").exists() && max_userns > 0;
    checks.push(check(
        "user_namespaces",
        userns,
        if userns {
            format!("enabled (max {max_userns})")
        } else {
            "disabled: the jail maps each sandbox to its own uid range with them".into()
        },
        "ns",
    ));

    let (cgroup_mode, cgroup_controllers, cg) = cgroup_check();
    checks.push(cg);

    let landlock_abi = sys::landlock_abi().ok().and_then(|v| u32::try_from(v).ok());
    checks.push(match landlock_abi {
        Some(v) if v >= 6 => check(
            "landlock",
            true,
            format!("ABI {v}: filesystem rules and scoping"),
            "ns",
        ),
        Some(v) => check(
            "landlock",
            true,
            format!("ABI {v}: partial (no scoping before ABI 6)"),
            "ns",
        ),
        None => check(
            "landlock",
            false,
            "not enabled (add `landlock` to the lsm= boot parameter); one layer fewer",
            "ns",
        ),
    });

    let actions = read("/proc/sys/kernel/seccomp/actions_avail");
    let seccomp_ok = ["kill_process", "errno"]
        .iter()
        .all(|a| actions.contains(a));
    checks.push(check(
        "seccomp",
        seccomp_ok,
        if seccomp_ok {
            format!("filters available ({})", actions.trim())
        } else {
            "seccomp filters missing: syscall deny-list unavailable".into()
        },
        "ns",
    ));

    let overlay = read("/proc/filesystems")
        .lines()
        .any(|l| l.ends_with("overlay"))
        || Path::new("/sys/module/overlay").exists();
    checks.push(check(
        "overlayfs",
        overlay,
        if overlay {
            "available"
        } else {
            "missing (modprobe overlay): no copy-on-write roots"
        },
        "ns",
    ));

    let version_ok = kernel_version(&kernel).is_some_and(|v| v >= (5, 19));
    let idmap = version_ok && sys::mount_setattr_exists();
    checks.push(check(
        "idmapped_mounts",
        idmap,
        if idmap {
            "mount_setattr(MOUNT_ATTR_IDMAP) and idmapped overlay layers (kernel >= 5.19)"
                .to_string()
        } else {
            format!("kernel {kernel} lacks idmapped overlay layers (needs >= 5.19)")
        },
        "ns",
    ));

    let kvm = Path::new("/dev/kvm").exists();
    let pvm = Path::new("/sys/module/kvm_pvm").exists();
    checks.push(match (kvm, pvm) {
        (true, true) => check(
            "kvm",
            false,
            "/dev/kvm is PVM (kvm_pvm): stock guest kernels fail with emulation errors; vm needs TCG",
            "vm",
        ),
        (true, false) => check("kvm", true, "/dev/kvm with hardware virtualization", "vm"),
        (false, _) => check("kvm", false, "no /dev/kvm: vm sandboxes would run under TCG (~15x slower)", "vm"),
    });

    let qemu = find_program("qemu-system-x86_64");
    checks.push(match qemu {
        Some(p) => check("qemu", true, format!("{}", p.display()), "vm"),
        None => check(
            "qemu",
            false,
            "qemu-system-x86_64 not on PATH (apt install qemu-system-x86)",
            "vm",
        ),
    });

    HostReport {
        kernel,
        cgroup_mode,
        cgroup_controllers,
        landlock_abi,
        checks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_versions() {
        assert_eq!(kernel_version("6.18.44-fc-v669"), Some((6, 18)));
        assert_eq!(kernel_version("5.4.0"), Some((5, 4)));
        assert_eq!(kernel_version("weird"), None);
    }

    #[test]
    fn report_is_complete_and_serializable() {
        let r = host_report();
        let names: Vec<&str> = r.checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "user_namespaces",
                "cgroups",
                "landlock",
                "seccomp",
                "overlayfs",
                "idmapped_mounts",
                "kvm",
                "qemu"
            ]
        );
        let text = serde_json::to_string(&r).unwrap();
        let back: HostReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        assert_eq!(r.human_lines().len(), r.checks.len() + 1);
        assert!(r.isolation_summary().contains("; vm "));
    }
}
