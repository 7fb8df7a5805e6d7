//! Landlock in the child, after `pivot_root` and before seccomp.
//!
//! The sandbox gets every filesystem right **beneath its new `/`** and nothing else: an object
//! reachable only outside that tree — a host file behind a leaked descriptor reopened through
//! `/proc/self/fd`, the detached old root — is refused even where mount namespaces and DAC
//! would allow it. The domain is also scoped: processes inside cannot connect to abstract unix
//! sockets created outside it, nor signal processes outside it.
//!
//! Compatibility is best-effort: on a kernel without Landlock (or with an older ABI) the
//! sandbox still starts and the child notes it in `agent.log`.

use ::landlock::{
    path_beneath_rules, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use crate::sys::SysError;

/// The newest Landlock ABI this code asks for (filesystem rights incl. `ioctl` on devices,
/// and scoping).
const WANTED_ABI: ABI = ABI::V6;

/// How much of the ruleset the kernel enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enforced {
    /// Everything requested.
    Fully,
    /// A subset (older kernel ABI).
    Partially,
    /// Nothing (Landlock missing or disabled).
    Not,
}

fn err(what: &str, e: impl std::fmt::Display) -> SysError {
    SysError::new(format!("landlock {what}: {e}"), libc::EINVAL)
}

/// Restrict the calling process (and its future children) to the tree beneath `/`.
pub(crate) fn restrict_to_root() -> Result<Enforced, SysError> {
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(WANTED_ABI))
        .map_err(|e| err("handle filesystem access", e))?
        .scope(Scope::from_all(WANTED_ABI))
        .map_err(|e| err("scope", e))?
        .create()
        .map_err(|e| err("create ruleset", e))?
        .add_rules(path_beneath_rules(["/"], AccessFs::from_all(WANTED_ABI)))
        .map_err(|e| err("allow beneath /", e))?
        .restrict_self()
        .map_err(|e| err("restrict_self", e))?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Enforced::Fully,
        RulesetStatus::PartiallyEnforced => Enforced::Partially,
        RulesetStatus::NotEnforced => Enforced::Not,
    })
}
