//! KVM or TCG, and one line saying why.
//!
//! `/dev/kvm` alone proves nothing: on PVM hosts (software nested virtualization, the
//! `kvm_pvm` module) creating a VM works but a stock guest kernel dies with "KVM internal
//! error … emulation failure". So KVM is chosen only when the CPU exposes hardware
//! virtualization (`vmx`/`svm`), `/dev/kvm` opens, it is not PVM, **and** a probe guest
//! actually boots to its agent ([`probe_kvm`]). Everything else runs under TCG.

use std::path::Path;
use std::time::Duration;

use crate::assets::Boot;
use crate::qemu::{Accel, VmConfig};
use crate::snapshot::Guest;
use crate::VmError;

/// How much slower guest code runs under TCG (busybox loop, measured here: 2.42 s vs
/// 0.16 s native).
pub const TCG_SLOWDOWN: &str = "~15x";
/// How long the probe guest may take to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// What the host offers, before any probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostVirt {
    /// `vmx`/`svm` and a usable, non-PVM `/dev/kvm`: worth a probe guest.
    KvmCandidate(&'static str),
    /// `/dev/kvm` is PVM.
    Pvm,
    /// No usable `/dev/kvm` or no CPU flag; the reason.
    None(String),
}

/// The decision and the line `hutch doctor` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccelChoice {
    /// The accelerator.
    pub accel: Accel,
    /// Why, in one line.
    pub why: String,
}

/// Look at the CPU flags, `/dev/kvm` and the loaded modules.
pub fn host_virt() -> HostVirt {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    host_virt_from(
        &cpuinfo,
        Path::new("/sys/module/kvm_pvm").exists(),
        kvm_opens(),
    )
}

fn kvm_opens() -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map(drop)
        .map_err(|e| e.to_string())
}

/// [`host_virt`] from its inputs (for tests).
pub fn host_virt_from(cpuinfo: &str, pvm: bool, kvm: Result<(), String>) -> HostVirt {
    let flag = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .flat_map(|l| l.split_whitespace())
        .find_map(|f| match f {
            "vmx" => Some("vmx"),
            "svm" => Some("svm"),
            _ => None,
        });
    match (kvm, pvm, flag) {
        (Ok(()), true, _) => HostVirt::Pvm,
        (Ok(()), false, Some(flag)) => HostVirt::KvmCandidate(flag),
        (Ok(()), false, None) => {
            HostVirt::None("/dev/kvm opens but the CPU shows no vmx/svm flag".into())
        }
        (Err(e), _, _) => HostVirt::None(format!("no usable /dev/kvm ({e})")),
    }
}

fn tcg(reason: &str) -> AccelChoice {
    AccelChoice {
        accel: Accel::Tcg,
        why: format!("{reason}; using TCG, guest code runs {TCG_SLOWDOWN} slower"),
    }
}

/// The choice without a probe guest: TCG with its reason, or `None` when a probe is
/// needed to decide.
pub fn choose_without_probe(host: &HostVirt) -> Option<AccelChoice> {
    match host {
        HostVirt::Pvm => Some(tcg(
            "/dev/kvm is PVM (software nested virtualization); stock guest kernels cannot run on it",
        )),
        HostVirt::None(reason) => Some(tcg(reason)),
        HostVirt::KvmCandidate(_) => None,
    }
}

/// The choice after probing: KVM when the probe booted.
pub fn choose_after_probe(host: &HostVirt, probe: Result<(), String>) -> AccelChoice {
    match (host, probe) {
        (HostVirt::KvmCandidate(flag), Ok(())) => AccelChoice {
            accel: Accel::Kvm,
            why: format!("KVM: the CPU has {flag} and a probe guest booted on /dev/kvm"),
        },
        (HostVirt::KvmCandidate(_), Err(e)) => tcg(&format!(
            "/dev/kvm is present but a probe guest did not boot on it ({e})"
        )),
        (other, _) => choose_without_probe(other).unwrap_or_else(|| tcg("no KVM")),
    }
}

/// Cold boot `boot` under KVM (no disk, 128 MiB) in `dir` until its agent answers.
pub async fn probe_kvm(boot: &Boot, qemu: &Path, dir: &Path) -> Result<(), VmError> {
    let mut config = VmConfig::new(boot.vmlinux.clone(), boot.initrd.clone(), dir);
    config.qemu = qemu.to_path_buf();
    config.accel = Accel::Kvm;
    config.memory_mib = 128;
    config.share_memory = false;
    // Our own initramfs, no template: its console is trusted.
    config.console = crate::qemu::Console::File(dir.join("console.log"));
    let mut guest = Guest::start(config, &dir.join("qemu.log")).await?;
    let answered = guest.agent(PROBE_TIMEOUT).await.map(drop);
    let _ = guest.shutdown().await;
    answered
}

#[cfg(test)]
mod tests {
    use super::*;

    const VMX: &str = "processor : 0\nflags : fpu vme vmx sse\n";
    const PLAIN: &str = "processor : 0\nflags : fpu vme hypervisor sse\n";

    #[test]
    fn pvm_and_missing_kvm_mean_tcg_with_a_reason() {
        let pvm = host_virt_from(PLAIN, true, Ok(()));
        assert_eq!(pvm, HostVirt::Pvm);
        let choice = choose_without_probe(&pvm).expect("decided");
        assert_eq!(choice.accel, Accel::Tcg);
        assert_eq!(
            choice.why,
            "/dev/kvm is PVM (software nested virtualization); stock guest kernels cannot run on it; using TCG, guest code runs ~15x slower"
        );
        let none = host_virt_from(VMX, false, Err("No such file or directory".into()));
        assert!(matches!(&none, HostVirt::None(r) if r.contains("no usable /dev/kvm")));
        assert!(
            matches!(host_virt_from(PLAIN, false, Ok(())), HostVirt::None(r) if r.contains("no vmx/svm"))
        );
    }

    #[test]
    fn kvm_only_after_a_probe_boots() {
        let host = host_virt_from(VMX, false, Ok(()));
        assert_eq!(host, HostVirt::KvmCandidate("vmx"));
        assert!(choose_without_probe(&host).is_none());
        assert_eq!(choose_after_probe(&host, Ok(())).accel, Accel::Kvm);
        let failed = choose_after_probe(&host, Err("emulation failure".into()));
        assert_eq!(failed.accel, Accel::Tcg);
        assert!(failed.why.contains("did not boot"), "{}", failed.why);
    }
}
