//! Turning an [`ExecRequest`] into something to fork: program, argv, environment, user and
//! working directory, resolved the way a login shell would.
//!
//! * `Command::Argv` runs `argv[0]` directly; without a `/` it is looked up in the `PATH` of
//!   the process's final environment. `Command::Shell` runs `/bin/sh -c STRING`.
//! * Environment, lowest to highest precedence: the agent's own environment, the identity
//!   environment (`POST /v1/identity`), `HOME`/`USER`/`LOGNAME` of the user, a default
//!   `PATH` if none is set, then the request's `env`. PTY execs get `TERM=xterm-256color`
//!   unless the identity or the request sets `TERM` (the agent's own `TERM` describes its
//!   console, not the host's terminal).
//! * The working directory defaults to the user's home if it exists, else `/`.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use hutch_proto::{Command, ExecRequest};

use super::spawn::Credentials;
use crate::passwd::{self, Account};

/// `PATH` when neither the agent, the identity nor the request sets one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// `TERM` of PTY execs unless set.
pub const DEFAULT_TERM: &str = "xterm-256color";

/// A request resolved against the sandbox's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// What to pass to `execve` (a path; relative ones resolve against `cwd`).
    pub program: String,
    /// The argument vector.
    pub argv: Vec<String>,
    /// The complete environment, sorted by name.
    pub env: Vec<(String, String)>,
    /// Working directory.
    pub cwd: String,
    /// Whom to run as.
    pub account: Account,
}

/// Why a request cannot run. Each maps to an `Error` frame, except the two "program"
/// outcomes, which look like a shell's (`127` / `126` exit codes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The request itself is unusable.
    #[error("{0}")]
    BadRequest(String),
    /// The user is not known to the sandbox.
    #[error(transparent)]
    User(#[from] passwd::PasswdError),
    /// The working directory does not exist.
    #[error("working directory {0} does not exist")]
    CwdMissing(String),
    /// The working directory is not a directory.
    #[error("working directory {0} is not a directory")]
    CwdNotDirectory(String),
    /// No program of that name in `PATH` (exit 127).
    #[error("command not found: {0}")]
    CommandNotFound(String),
    /// Found only without execute permission (exit 126).
    #[error("permission denied: {0}")]
    NotExecutable(String),
}

/// The sandbox-wide inputs of resolution.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The agent's own environment.
    pub agent_env: &'a [(String, String)],
    /// The identity environment.
    pub identity_env: &'a BTreeMap<String, String>,
    /// Contents of `/etc/passwd` (empty if missing).
    pub passwd: &'a str,
    /// Contents of `/etc/group` (empty if missing).
    pub group: &'a str,
}

/// Resolve `request` within `ctx`, looking at the filesystem for the cwd and `PATH`.
pub fn resolve(request: &ExecRequest, ctx: Context<'_>) -> Result<Resolved, PlanError> {
    let argv = match &request.cmd {
        Command::Argv(argv) => {
            if argv.first().is_none_or(|a| a.is_empty()) {
                return Err(PlanError::BadRequest("cmd must name a program".into()));
            }
            argv.clone()
        }
        Command::Shell(line) => vec!["/bin/sh".to_string(), "-c".to_string(), line.clone()],
    };
    let user = request.user.as_deref().unwrap_or("root");
    let account = passwd::resolve(user, ctx.passwd, ctx.group)?;

    let mut env: BTreeMap<String, String> = ctx.agent_env.iter().cloned().collect();
    env.extend(ctx.identity_env.iter().map(|(k, v)| (k.clone(), v.clone())));
    env.insert("HOME".into(), account.home.clone());
    env.insert("USER".into(), account.name.clone());
    env.insert("LOGNAME".into(), account.name.clone());
    env.entry("PATH".into())
        .or_insert_with(|| DEFAULT_PATH.into());
    env.extend(request.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    // The agent's own TERM describes its console (the kernel gives init TERM=linux), not
    // the terminal the host attaches to a PTY exec.
    let term_chosen = request.env.contains_key("TERM") || ctx.identity_env.contains_key("TERM");
    if request.pty.is_some() && !term_chosen {
        env.insert("TERM".into(), DEFAULT_TERM.into());
    }
    if let Some(bad) = env.keys().find(|k| k.is_empty() || k.contains('=')) {
        return Err(PlanError::BadRequest(format!(
            "bad environment variable name {bad:?}"
        )));
    }

    let cwd = match &request.cwd {
        Some(cwd) => {
            if !cwd.starts_with('/') {
                return Err(PlanError::BadRequest(format!(
                    "cwd must be an absolute path, got {cwd:?}"
                )));
            }
            match std::fs::metadata(cwd) {
                Ok(m) if m.is_dir() => cwd.clone(),
                Ok(_) => return Err(PlanError::CwdNotDirectory(cwd.clone())),
                Err(_) => return Err(PlanError::CwdMissing(cwd.clone())),
            }
        }
        None if Path::new(&account.home).is_dir() => account.home.clone(),
        None => "/".to_string(),
    };

    let program = if argv[0].contains('/') {
        argv[0].clone()
    } else {
        let path = env.get("PATH").map_or(DEFAULT_PATH, String::as_str);
        find_in_path(&argv[0], path, &cwd)?
    };
    Ok(Resolved {
        program,
        argv,
        env: env.into_iter().collect(),
        cwd,
        account,
    })
}

/// The credentials to switch to, or `None` when we already are that user.
pub fn credentials(account: &Account, our_euid: u32) -> Option<Credentials> {
    if our_euid != 0 && account.uid == our_euid {
        // An unprivileged agent (tests) cannot switch, and need not.
        return None;
    }
    Some(Credentials {
        uid: account.uid,
        gid: account.gid,
        groups: account.groups.clone(),
    })
}

/// Look `name` up in `path` like `execvp`: the first executable regular file wins; a file
/// without execute permission is remembered and reported only if nothing else is found.
fn find_in_path(name: &str, path: &str, cwd: &str) -> Result<String, PlanError> {
    let mut not_executable = None;
    for dir in path.split(':') {
        let dir = if dir.is_empty() { "." } else { dir };
        let candidate = format!("{dir}/{name}");
        let on_disk = if candidate.starts_with('/') {
            candidate.clone()
        } else {
            format!("{cwd}/{candidate}")
        };
        match std::fs::metadata(&on_disk) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => return Ok(candidate),
            Ok(m) if m.is_file() => {
                not_executable.get_or_insert(candidate);
            }
            _ => {}
        }
    }
    match not_executable {
        Some(_) => Err(PlanError::NotExecutable(name.to_string())),
        None => Err(PlanError::CommandNotFound(name.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn request(cmd: Command) -> ExecRequest {
        ExecRequest {
            cmd,
            env: BTreeMap::new(),
            cwd: None,
            user: None,
            timeout_ms: None,
            pty: None,
            stdin: false,
            background: false,
            handle: None,
        }
    }

    fn ctx<'a>(
        agent_env: &'a [(String, String)],
        identity: &'a BTreeMap<String, String>,
    ) -> Context<'a> {
        Context {
            agent_env,
            identity_env: identity,
            passwd: "root:x:0:0:root:/nonexistent-home:/bin/sh\n",
            group: "",
        }
    }

    #[test]
    fn environment_layers_in_order() {
        let agent = vec![
            ("A".to_string(), "agent".to_string()),
            ("PATH".into(), "/bin".into()),
            ("TERM".into(), "linux".into()),
        ];
        let identity = BTreeMap::from([
            ("A".to_string(), "identity".to_string()),
            ("B".into(), "identity".into()),
        ]);
        let mut req = request(Command::Shell("true".into()));
        req.env.insert("B".into(), "request".into());
        req.env.insert("HOME".into(), "/custom".into());
        req.pty = Some(hutch_proto::PtySize { cols: 80, rows: 24 });
        let r = resolve(&req, ctx(&agent, &identity)).expect("resolves");
        let env: BTreeMap<_, _> = r.env.into_iter().collect();
        assert_eq!(env["A"], "identity");
        assert_eq!(env["B"], "request");
        assert_eq!(env["HOME"], "/custom");
        assert_eq!(env["USER"], "root");
        assert_eq!(env["PATH"], "/bin");
        assert_eq!(env["TERM"], DEFAULT_TERM);
        assert_eq!(r.program, "/bin/sh");
        assert_eq!(r.argv, vec!["/bin/sh", "-c", "true"]);
        // The home does not exist, so the cwd falls back to "/".
        assert_eq!(r.cwd, "/");
    }

    #[test]
    fn path_lookup_distinguishes_missing_and_not_executable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let exe = dir.path().join("tool");
        fs::write(&exe, "#!/bin/sh\n").expect("write");
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).expect("chmod");
        let plain = dir.path().join("data");
        fs::write(&plain, "x").expect("write");
        let path = format!("/nonexistent:{}", dir.path().display());
        assert_eq!(
            find_in_path("tool", &path, "/"),
            Ok(format!("{}/tool", dir.path().display()))
        );
        assert_eq!(
            find_in_path("data", &path, "/"),
            Err(PlanError::NotExecutable("data".into()))
        );
        assert_eq!(
            find_in_path("nope", &path, "/"),
            Err(PlanError::CommandNotFound("nope".into()))
        );
    }

    #[test]
    fn rejects_bad_requests() {
        let none = BTreeMap::new();
        let r = resolve(&request(Command::Argv(vec![])), ctx(&[], &none));
        assert!(matches!(r, Err(PlanError::BadRequest(_))));
        let mut req = request(Command::Shell("true".into()));
        req.cwd = Some("relative".into());
        assert!(matches!(
            resolve(&req, ctx(&[], &none)),
            Err(PlanError::BadRequest(_))
        ));
        req.cwd = Some("/definitely/not/here".into());
        assert_eq!(
            resolve(&req, ctx(&[], &none)),
            Err(PlanError::CwdMissing("/definitely/not/here".into()))
        );
        req.cwd = None;
        req.user = Some("mallory".into());
        assert!(matches!(
            resolve(&req, ctx(&[], &none)),
            Err(PlanError::User(_))
        ));
    }
}
