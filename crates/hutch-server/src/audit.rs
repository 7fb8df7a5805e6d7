//! What the audit log records of a call (`hutch_core::audit`): every call that changes
//! something (any method but `GET` and `HEAD`) and every terminal and tunnel, once it is
//! authorized, with the command of an exec or terminal, which its handler hands over in the
//! answer's extensions ([`AuditArgv`]). Output and file contents never enter it.

use axum::http::Method;
use hutch_core::audit::AuditEntry;
use hutch_core::exec::Command;
use hutch_core::ids::SandboxId;

use crate::auth::Caller;

/// The command a handler ran, for its audit entry (put in the answer's extensions).
#[derive(Debug, Clone)]
pub struct AuditArgv(pub Vec<String>);

impl AuditArgv {
    /// The argv of `cmd` (a shell string is `["sh", "-c", …]`).
    pub fn of(cmd: &Command) -> Self {
        Self(match cmd {
            Command::Argv(argv) => argv.clone(),
            Command::Shell(s) => vec!["sh".into(), "-c".into(), s.clone()],
        })
    }
}

/// Whether a call of `method` on `route` is audited.
pub fn audited(method: &Method, route: &str) -> bool {
    (method != Method::GET && method != Method::HEAD)
        || route == "/v1/sandboxes/{id}/pty"
        || route == "/v1/sandboxes/{id}/tunnel/{port}"
}

/// The entry of one call.
pub fn entry(
    caller: &Caller,
    method: &Method,
    route: &str,
    path: &str,
    sandbox: Option<SandboxId>,
    argv: Option<&AuditArgv>,
    status: u16,
) -> AuditEntry {
    AuditEntry {
        id: 0,
        at_ms: hutch_core::time::now_ms(),
        key_id: Some(caller.key.id.clone()),
        tenant: caller.owner(),
        method: method.to_string(),
        route: route.to_string(),
        path: path.to_string(),
        sandbox,
        argv: argv.map(|a| AuditEntry::bounded_argv(&a.0)),
        status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_terminals_and_tunnels_are_audited_reads_are_not() {
        assert!(audited(&Method::POST, "/v1/sandboxes/{id}/exec"));
        assert!(audited(&Method::DELETE, "/v1/sandboxes/{id}"));
        assert!(audited(&Method::PUT, "/v1/sandboxes/{id}/files"));
        assert!(audited(&Method::GET, "/v1/sandboxes/{id}/pty"));
        assert!(!audited(&Method::GET, "/v1/sandboxes/{id}/files"));
        assert!(!audited(&Method::GET, "/v1/audit"));
        assert_eq!(
            AuditArgv::of(&Command::Shell("echo hi".into())).0,
            ["sh", "-c", "echo hi"]
        );
    }
}
