//! The single-threaded spawn helper (`hutch __jail-spawn`) and the server's side of it.
//!
//! Wire format (one exchange per helper process):
//! - stdin: one [`JailSpec`] as JSON (unknown fields rejected);
//! - stdout: one [`SpawnedJail`] as JSON and exit status 0, or `{"error": "…"}` and exit
//!   status 1.
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
    Err { error: String },
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
        return answer(&Reply::Err {
            error: JailError::Protocol(format!("reading stdin: {e}")).to_string(),
        });
    }
    let spec: JailSpec = match serde_json::from_str(&input) {
        Ok(s) => s,
        Err(e) => {
            return answer(&Reply::Err {
                error: JailError::Protocol(format!("jail spec: {e}")).to_string(),
            })
        }
    };
    match spawn(&spec) {
        Ok(s) => answer(&Reply::Ok(s)),
        Err(e) => answer(&Reply::Err {
            error: e.to_string(),
        }),
    }
}

/// Spawn a sandbox through the helper: run `program __jail-spawn` (normally the running
/// `hutch` binary, `std::env::current_exe()`), pass `spec`, and decode the answer. Blocking,
/// safe from a multi-threaded process.
///
/// A failure inside the helper comes back as [`JailError::Setup`] carrying the helper's
/// message (which names the failing step).
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
        Ok(Reply::Err { error }) => Err(JailError::Setup(error)),
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
        assert!(matches!(err, Reply::Err { error } if error == "boom"));
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
