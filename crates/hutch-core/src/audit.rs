//! The audit log: one [`AuditEntry`] per mutating API call and per exec or terminal (who,
//! with which key, for which tenant, the route, the sandbox, the command's argv, the
//! status, when), never the output of a command nor the contents of a file.
//!
//! The server notes each entry in memory as the call ends (`Manager::record_audit`); the
//! manager writes them to the store in batches with the TTL refreshes (every few seconds and
//! at shutdown, `manager/audit.rs`), never on the request's path. Read back with
//! `GET /v1/audit` (filters and pagination, [`AuditQuery`]).

use serde::Serialize;

use crate::ids::{KeyId, SandboxId};
use crate::tenant::{Tenant, TenantScope};

/// Longest argv kept in an entry: arguments past it are dropped and the entry says so.
pub const MAX_AUDIT_ARGS: usize = 64;
/// Longest argument kept (longer ones are cut, on a character boundary).
pub const MAX_AUDIT_ARG_BYTES: usize = 1024;

/// One audited call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEntry {
    /// Its place in the log (given by the store; 0 before it is written).
    pub id: i64,
    /// When the call ended (ms since the epoch).
    pub at_ms: i64,
    /// The key that made it.
    pub key_id: Option<KeyId>,
    /// The tenant it acted for (`None`: an admin key acting for no tenant).
    pub tenant: Option<Tenant>,
    /// The HTTP method.
    pub method: String,
    /// The route's template (`/v1/sandboxes/{id}/exec`).
    pub route: String,
    /// The path as called (no query string).
    pub path: String,
    /// The sandbox of the path, if any.
    pub sandbox: Option<SandboxId>,
    /// The command of an exec or terminal (a shell string is `["sh", "-c", …]`).
    pub argv: Option<Vec<String>>,
    /// The answer's status.
    pub status: u16,
}

impl AuditEntry {
    /// `argv` bounded to [`MAX_AUDIT_ARGS`] arguments of at most [`MAX_AUDIT_ARG_BYTES`].
    pub fn bounded_argv(argv: &[String]) -> Vec<String> {
        let mut out: Vec<String> = argv
            .iter()
            .take(MAX_AUDIT_ARGS)
            .map(|a| {
                if a.len() <= MAX_AUDIT_ARG_BYTES {
                    return a.clone();
                }
                let mut end = MAX_AUDIT_ARG_BYTES;
                while !a.is_char_boundary(end) {
                    end -= 1;
                }
                format!("{}…", &a[..end])
            })
            .collect();
        if argv.len() > MAX_AUDIT_ARGS {
            out.push(format!("… {} more", argv.len() - MAX_AUDIT_ARGS));
        }
        out
    }

    /// The JSON the API shows.
    pub fn view(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "at": crate::time::rfc3339(self.at_ms),
            "key_id": self.key_id,
            "tenant": self.tenant,
            "method": self.method,
            "route": self.route,
            "path": self.path,
            "sandbox_id": self.sandbox,
            "argv": self.argv,
            "status": self.status,
        })
    }
}

/// Which entries a listing returns.
#[derive(Debug, Clone)]
pub struct AuditQuery {
    /// Whose (a tenant's key: its tenant's only).
    pub scope: TenantScope,
    /// Only this key's.
    pub key_id: Option<KeyId>,
    /// Only those on this sandbox.
    pub sandbox: Option<SandboxId>,
    /// Only at or after this time (ms).
    pub since_ms: Option<i64>,
    /// Only before this time (ms).
    pub until_ms: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_is_bounded() {
        let long = "é".repeat(600);
        let argv: Vec<String> = std::iter::once(long)
            .chain((0..70).map(|i| i.to_string()))
            .collect();
        let kept = AuditEntry::bounded_argv(&argv);
        assert_eq!(kept.len(), MAX_AUDIT_ARGS + 1);
        assert!(kept[0].ends_with('…') && kept[0].len() <= MAX_AUDIT_ARG_BYTES + 3);
        assert_eq!(kept[MAX_AUDIT_ARGS], "… 7 more");
        assert_eq!(AuditEntry::bounded_argv(&["ls".into()]), ["ls"]);
    }
}
