//! The single-threaded spawn helper (`hutch __jail-spawn`) and the server's side of it.
//!
//! Wire format (one exchange per helper process):
//! - stdin: one [`JailSpec`] as JSON (unknown fields rejected);
//! - stdout: one [`SpawnedJail`] as JSON and exit status 0, or
//!   `{"error": "<full message>", "kind": "setup|invalid_spec|…", "detail": "<message>"}` and
//!   exit status 1 (`kind` and `detail` let [`spawn_with_helper`] rebuild the same
//!   [`JailError`] variant).
//!
//! The helper exits right after answering; the sandbox's init is re-parented to the nearest
//! subreaper (the server).

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::{spawn, JailError, JailSpec, SpawnedJail};

/// The first argument that makes the `hutch` binary run [`helper_main`].
pub const HELPER_ARG: &str = "__jail-spawn";

/// The helper's answer on stdout.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Reply {
    Ok(SpawnedJail),
    Err {
        error: String,
        #[serde(default)]
        kind: String,
        #[serde(default)]
        detail: String,
    },
}

impl Reply {
    fn from_error(e: &JailError) -> Self {
        let (kind, detail) = match e {
            JailError::Setup(d) => ("setup", d.clone()),
            JailError::InvalidSpec(d) => ("invalid_spec", d.clone()),
            JailError::Unsupported(d) => ("unsupported", d.clone()),
            JailError::Protocol(d) => ("protocol", d.clone()),
            JailError::Refused(d) => ("refused", d.clone()),
            JailError::Timeout(d) => ("timeout", d.clone()),
            JailError::Sys { .. } | JailError::VolumeDamaged { .. } | JailError::HostCommand(_) => {
                ("sys", e.to_string())
            }
        };
        Reply::Err {
            error: e.to_string(),
            kind: kind.into(),
            detail,
        }
    }
}

/// The error a helper reported, as the variant it had in the helper (a failed syscall, whose
/// `io::Error` does not cross the pipe, becomes [`JailError::Setup`] with the full message).
fn rebuild_error(error: String, kind: &str, detail: String) -> JailError {
    match kind {
        "invalid_spec" => JailError::InvalidSpec(detail),
        "unsupported" => JailError::Unsupported(detail),
        "protocol" => JailError::Protocol(detail),
        "refused" => JailError::Refused(detail),
        "timeout" => JailError::Timeout(detail),
        "setup" => JailError::Setup(detail),
        _ => JailError::Setup(error),
    }
}

fn answer(reply: &Reply) -> i32 {
    let code = match reply {
        Reply::Ok(_) => 0,
        Reply::Err { .. } => 1,
    };
    let text = serde_json::to_string(reply)
        .unwrap_or_else(|e| format!("{{\"error\":\"cannot encode the reply: {e}\"}}"));
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{text}").and_then(|()| out.flush()).is_err() {
        return 2;
    }
    code
}

/// Body of `hutch __jail-spawn`: read a [`JailSpec`] from stdin, [`spawn`] it, print the
/// result. Must run before any other thread exists. Returns the process exit status.
pub fn helper_main() -> i32 {
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        return answer(&Reply::from_error(&JailError::Protocol(format!(
            "reading stdin: {e}"
        ))));
    }
    let spec: JailSpec = match serde_json::from_str(&input) {
        Ok(s) => s,
        Err(e) => {
            return answer(&Reply::from_error(&JailError::Protocol(format!(
                "jail spec: {e}"
            ))))
        }
    };
    match spawn(&spec) {
        Ok(s) => answer(&Reply::Ok(s)),
        Err(e) => answer(&Reply::from_error(&e)),
    }
}

/// Spawn a sandbox through the helper: run `program __jail-spawn` (normally the running
/// `hutch` binary, `std::env::current_exe()`), pass `spec`, and decode the answer. Blocking,
/// safe from a multi-threaded process.
///
/// A failure inside the helper comes back as the same [`JailError`] variant (see
/// [`rebuild_error`]); its message names the failing step.
pub fn spawn_with_helper(program: &Path, spec: &JailSpec) -> Result<SpawnedJail, JailError> {
    let input = serde_json::to_vec(spec).map_err(|e| JailError::Protocol(e.to_string()))?;
    let mut child = Command::new(program)
        .arg(HELPER_ARG)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| JailError::Sys {
            op: format!("run {} {HELPER_ARG}", program.display()),
            source: e,
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(&input).map_err(|e| JailError::Sys {
            op: "write the jail spec to the helper".into(),
            source: e,
        })?;
    }
    let out = child.wait_with_output().map_err(|e| JailError::Sys {
        op: "wait for the jail helper".into(),
        source: e,
    })?;
    match serde_json::from_slice::<Reply>(&out.stdout) {
        Ok(Reply::Ok(s)) if out.status.success() => Ok(s),
        Ok(Reply::Err {
            error,
            kind,
            detail,
        }) => Err(rebuild_error(error, &kind, detail)),
        _ => Err(JailError::Protocol(format!(
            "jail helper exited with {}: stdout {:?}, stderr {:?}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_round_trip() {
        let ok = Reply::Ok(SpawnedJail {
            init_pid: 42,
            init_start_time: 7,
            cgroups: vec!["/sys/fs/cgroup/pids/hutch/sbx_a".into()],
            setup_ms: 1.5,
        });
        let text = serde_json::to_string(&ok).unwrap();
        assert!(
            matches!(serde_json::from_str::<Reply>(&text).unwrap(), Reply::Ok(s) if s.init_pid == 42)
        );
        let err: Reply = serde_json::from_str(r#"{"error": "boom"}"#).unwrap();
        assert!(matches!(err, Reply::Err { ref error, .. } if error == "boom"));
        let e = JailError::Setup("mount proc: EPERM (Operation not permitted)".into());
        let Reply::Err {
            error,
            kind,
            detail,
        } = Reply::from_error(&e)
        else {
            panic!("expected an error reply");
        };
        assert_eq!(
            error,
            "sandbox setup failed: mount proc: EPERM (Operation not permitted)"
        );
        let back = rebuild_error(error, &kind, detail);
        assert_eq!(back.to_string(), e.to_string());
    }

    #[test]
    fn spec_rejects_unknown_fields() {
        let text = r#"{"id":"a","bogus":1}"#;
        let e = serde_json::from_str::<JailSpec>(text)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown field") || e.contains("missing field"),
            "{e}"
        );
    }
}
