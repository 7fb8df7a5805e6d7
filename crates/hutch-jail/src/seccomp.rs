//! The sandbox's seccomp filters, installed last, right before `execve`.
//!
//! Three filters, compiled in the parent (so a compile error is a clean parent error) and
//! installed by the child:
//! 1. **ABI guard** (hand-written BPF): any architecture other than x86_64 — in particular the
//!    32-bit `int 0x80` ABI, which IA32 emulation leaves enabled — and any x32 syscall number
//!    (bit 30) kill the process. Deny-lists are per-ABI; a second ABI would bypass them.
//! 2. **`clone3` → ENOSYS**: its flags live in a struct seccomp cannot read, so it is refused in
//!    a way that makes libc fall back to `clone`, whose flags the third filter checks.
//! 3. **Deny-list → EPERM** (Docker-like): mount APIs, namespace creation and entry, tracing
//!    and cross-process memory access, kernel keyrings, BPF, perf, userfaultfd, io_uring,
//!    kexec and modules, file handles, swap, reboot, accounting, clock setters, port I/O,
//!    syslog, quotas, NUMA policy, fanotify, `personality` other than the usual personas,
//!    `ioctl(TIOCSTI/TIOCLINUX)`, and sockets of any family except unix, inet, inet6 and
//!    netlink.
//!
//! Capabilities already refuse many of these; the filter is the second wall, and it also
//! covers kernel code reachable without capabilities (io_uring, userfaultfd, perf, bpf).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::sys::SysError;
use crate::JailError;

/// `AUDIT_ARCH_X86_64` (EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE).
const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
/// The x32 ABI marks its syscall numbers with this bit.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// `open_tree_attr(2)` (Linux 6.15); not yet in `libc`.
const SYS_OPEN_TREE_ATTR: i64 = 467;
/// `TIOCLINUX`: console ioctls, including selection-paste injection.
const TIOCLINUX: u64 = 0x541C;

/// Syscalls refused with EPERM whatever their arguments.
const DENIED: &[i64] = &[
    // Mount APIs: the sandbox's mount table is final.
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_open_tree,
    SYS_OPEN_TREE_ATTR,
    libc::SYS_move_mount,
    libc::SYS_mount_setattr,
    // Namespaces.
    libc::SYS_setns,
    libc::SYS_unshare,
    // Tracing and other processes' memory.
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_process_madvise,
    libc::SYS_kcmp,
    libc::SYS_pidfd_getfd,
    // Kernel keyrings (not namespaced).
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    // Large kernel attack surface reachable without privileges.
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_fanotify_init,
    // The kernel itself.
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_syslog,
    libc::SYS_quotactl,
    libc::SYS_quotactl_fd,
    libc::SYS_lookup_dcookie,
    libc::SYS_uselib,
    libc::SYS_vhangup,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    // File handles bypass path-based checks.
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    // Clocks are not namespaced.
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    // NUMA placement (Docker: CAP_SYS_NICE only).
    libc::SYS_mbind,
    libc::SYS_migrate_pages,
    libc::SYS_move_pages,
    libc::SYS_set_mempolicy,
    libc::SYS_set_mempolicy_home_node,
];

/// Namespace flags refused in `clone(2)`'s first argument. (`CLONE_NEWTIME` can only be
/// requested through `unshare` and `clone3`, both refused.)
const CLONE_NS_FLAGS: &[i64] = &[
    libc::CLONE_NEWUSER as i64,
    libc::CLONE_NEWNS as i64,
    libc::CLONE_NEWPID as i64,
    libc::CLONE_NEWNET as i64,
    libc::CLONE_NEWIPC as i64,
    libc::CLONE_NEWUTS as i64,
    libc::CLONE_NEWCGROUP as i64,
];

/// Socket families a sandbox may create; everything else is refused.
const ALLOWED_FAMILIES: &[i32] = &[
    libc::AF_UNIX,
    libc::AF_INET,
    libc::AF_INET6,
    libc::AF_NETLINK,
];

/// `personality(2)` values Docker allows: PER_LINUX, PER_LINUX32, UNAME26 variants, query.
const ALLOWED_PERSONAS: &[u64] = &[0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// The three compiled filters, in installation order.
#[derive(Debug, Clone)]
pub(crate) struct Filters {
    /// Kill anything that is not the native x86_64 ABI.
    pub abi_guard: BpfProgram,
    /// `clone3` → ENOSYS.
    pub clone3: BpfProgram,
    /// The deny-list → EPERM.
    pub deny: BpfProgram,
}

fn seccomp_err(what: &str, e: impl std::fmt::Display) -> JailError {
    JailError::Unsupported(format!("seccomp filter ({what}): {e}"))
}

fn cond(
    arg: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    value: u64,
) -> Result<SeccompCondition, JailError> {
    SeccompCondition::new(arg, len, op, value).map_err(|e| seccomp_err("condition", e))
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, JailError> {
    SeccompRule::new(conds).map_err(|e| seccomp_err("rule", e))
}

/// The hand-written ABI guard.
fn abi_guard() -> BpfProgram {
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const JSET_K: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    let insn = |code: u16, jt: u8, jf: u8, k: u32| seccompiler::sock_filter { code, jt, jf, k };
    vec![
        // A = seccomp_data.arch
        insn(LD_W_ABS, 0, 0, 4),
        // if (A != AUDIT_ARCH_X86_64) kill
        insn(JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        insn(RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        // A = seccomp_data.nr
        insn(LD_W_ABS, 0, 0, 0),
        // if (A & X32_SYSCALL_BIT) kill
        insn(JSET_K, 0, 1, X32_SYSCALL_BIT),
        insn(RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        insn(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Compile the filters.
pub(crate) fn filters() -> Result<Filters, JailError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &nr in DENIED {
        rules.insert(nr, vec![]);
    }
    let mut clone_rules = Vec::new();
    for &flag in CLONE_NS_FLAGS {
        let f = flag as u64;
        clone_rules.push(rule(vec![cond(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(f),
            f,
        )?])?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(
                1,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                libc::TIOCSTI,
            )?])?,
            rule(vec![cond(
                1,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                TIOCLINUX,
            )?])?,
        ],
    );
    let not_allowed_family = ALLOWED_FAMILIES
        .iter()
        .map(|&af| cond(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, af as u64))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_socket, vec![rule(not_allowed_family)?]);
    let not_allowed_persona = ALLOWED_PERSONAS
        .iter()
        .map(|&p| cond(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, p))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_personality, vec![rule(not_allowed_persona)?]);

    let deny = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )
    .map_err(|e| seccomp_err("deny-list", e))?;
    let mut c3 = BTreeMap::new();
    c3.insert(libc::SYS_clone3, vec![]);
    let clone3 = SeccompFilter::new(
        c3,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        TargetArch::x86_64,
    )
    .map_err(|e| seccomp_err("clone3", e))?;
    Ok(Filters {
        abi_guard: abi_guard(),
        clone3: clone3.try_into().map_err(|e| seccomp_err("clone3", e))?,
        deny: deny.try_into().map_err(|e| seccomp_err("deny-list", e))?,
    })
}

/// Install the filters on the calling thread (the child, just before `execve`).
pub(crate) fn install(f: &Filters) -> Result<(), SysError> {
    for (what, prog) in [
        ("abi guard", &f.abi_guard),
        ("clone3", &f.clone3),
        ("deny-list", &f.deny),
    ] {
        seccompiler::apply_filter(prog).map_err(|e| {
            let errno = match &e {
                seccompiler::Error::Seccomp(io) | seccompiler::Error::Prctl(io) => {
                    io.raw_os_error().unwrap_or(libc::EINVAL)
                }
                _ => libc::EINVAL,
            };
            SysError::new(format!("install seccomp {what} filter"), errno)
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile_and_fit() {
        let f = filters().unwrap();
        assert_eq!(f.abi_guard.len(), 7);
        assert!(!f.clone3.is_empty());
        // The kernel's limit is 4096 instructions per filter.
        assert!(
            f.deny.len() < 4096,
            "deny filter has {} instructions",
            f.deny.len()
        );
    }

    #[test]
    fn deny_list_has_no_duplicates_and_covers_the_brief() {
        let mut v = DENIED.to_vec();
        v.sort_unstable();
        v.dedup();
        assert_eq!(v.len(), DENIED.len());
        for nr in [
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_ptrace,
            libc::SYS_keyctl,
            libc::SYS_bpf,
            libc::SYS_io_uring_setup,
            libc::SYS_perf_event_open,
            libc::SYS_open_by_handle_at,
            libc::SYS_init_module,
        ] {
            assert!(DENIED.contains(&nr), "syscall {nr} missing");
        }
        assert!(
            !DENIED.contains(&libc::SYS_clone3),
            "clone3 must be ENOSYS, not EPERM"
        );
    }

    #[test]
    fn abi_guard_checks_arch_first() {
        let g = abi_guard();
        assert_eq!(g[0].k, 4, "loads seccomp_data.arch");
        assert_eq!(g[1].k, AUDIT_ARCH_X86_64);
        assert_eq!(g[2].k, libc::SECCOMP_RET_KILL_PROCESS);
        assert_eq!(g[4].k, X32_SYSCALL_BIT);
        assert_eq!(g[6].k, libc::SECCOMP_RET_ALLOW);
    }
}
