//! Dropping capabilities in the child to a Docker-like set.
//!
//! Root inside the sandbox keeps only what ordinary package installs and services need:
//! `CHOWN`, `DAC_OVERRIDE`, `FOWNER`, `FSETID`, `KILL`, `SETGID`, `SETUID`, `SETPCAP`,
//! `NET_BIND_SERVICE`, `AUDIT_WRITE`, `SETFCAP`. Compared with Docker's default set it also
//! lacks `NET_RAW` (no raw/packet sockets: no spoofing on the sandbox network), `MKNOD`
//! (device nodes never work in a user namespace anyway) and `SYS_CHROOT` (`chroot` is refused
//! by seccomp). `SYS_ADMIN` is never kept. All of these are capabilities *in the sandbox's user
//! namespace*; none is valid on the host.
//!
//! The bounding set is cut to the kept set, so `execve` of a root-owned program cannot regain
//! more; the ambient and inheritable sets are cleared.

use crate::sys::{check, SysError};

/// Capability numbers kept (see linux/capability.h).
pub(crate) const KEPT: &[u32] = &[
    0,  // CAP_CHOWN
    1,  // CAP_DAC_OVERRIDE
    3,  // CAP_FOWNER
    4,  // CAP_FSETID
    5,  // CAP_KILL
    6,  // CAP_SETGID
    7,  // CAP_SETUID
    8,  // CAP_SETPCAP
    10, // CAP_NET_BIND_SERVICE
    29, // CAP_AUDIT_WRITE
    31, // CAP_SETFCAP
];

/// Highest capability number assumed when `/proc/sys/kernel/cap_last_cap` is unreadable.
const FALLBACK_LAST_CAP: u32 = 40;
/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets as two 32-bit halves.
const CAP_VERSION_3: u32 = 0x2008_0522;

/// The kept set as a 64-bit mask.
pub(crate) fn kept_mask() -> u64 {
    KEPT.iter().fold(0u64, |m, c| m | (1u64 << c))
}

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(FALLBACK_LAST_CAP)
}

/// Drop every capability outside [`KEPT`] from all five sets of the calling thread.
pub(crate) fn drop_to_kept() -> Result<(), SysError> {
    let mask = kept_mask();
    for cap in 0..=last_cap() {
        if mask & (1u64 << cap) != 0 {
            continue;
        }
        // SAFETY: PR_CAPBSET_DROP takes integer arguments only.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
        // EINVAL: a capability this kernel does not know.
        if ret < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(SysError::last(format!(
                "drop capability {cap} from the bounding set"
            )));
        }
    }
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes integer arguments only.
    let ret = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    check(ret.into(), || "clear ambient capabilities".into())?;
    let lo = (mask & 0xffff_ffff) as u32;
    let hi = (mask >> 32) as u32;
    let header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: lo,
            permitted: lo,
            inheritable: 0,
        },
        CapData {
            effective: hi,
            permitted: hi,
            inheritable: 0,
        },
    ];
    // SAFETY: `header` and the two-element `data` array are the layout capset(2) expects for
    // version 3 and outlive the call.
    let ret =
        unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) };
    check(ret, || "capset (effective, permitted, inheritable)".into()).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_set_lacks_dangerous_capabilities() {
        let m = kept_mask();
        for (cap, name) in [
            (21, "SYS_ADMIN"),
            (13, "NET_RAW"),
            (12, "NET_ADMIN"),
            (19, "SYS_PTRACE"),
            (16, "SYS_MODULE"),
            (27, "MKNOD"),
            (39, "BPF"),
            (38, "PERFMON"),
        ] {
            assert_eq!(m & (1 << cap), 0, "CAP_{name} must not be kept");
        }
        assert_ne!(m & (1 << 0), 0, "CAP_CHOWN is kept");
        assert_eq!(m.count_ones() as usize, KEPT.len());
    }
}
