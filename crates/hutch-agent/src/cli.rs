//! Command line of the agent, parsed by hand (the binary stays small and static).
//!
//! ```text
//! hutch-agent serve [--listen-fd N]... [--listen PATH]... [--serial PATH]... [--root DIR]
//! hutch-agent version
//! hutch-agent help
//! ```
//!
//! * `--listen-fd N`: accept connections on an inherited listening unix socket (the jail
//!   passes fd 3, `hutch_proto::AGENT_LISTEN_FD`).
//! * `--listen PATH`: bind a unix socket at PATH (replacing a stale socket file); for tests
//!   and manual runs.
//! * `--serial PATH`: serve one connection at a time on a character device (the `vm`
//!   backend's virtio-serial port), reopening it whenever the host side goes away.
//! * `--root DIR`: `chroot` into DIR before serving (the `vm` guest's init script mounts the
//!   root disk there and moves it over `/`). Refused unless the agent is PID 1, so a test or
//!   a person on the host can never re-root a host process by accident.

use std::ffi::OsString;
use std::os::fd::RawFd;
use std::path::PathBuf;

/// Usage text for `help` and errors.
pub const USAGE: &str = "\
usage: hutch-agent serve [--listen-fd N]... [--listen PATH]... [--serial PATH]... [--root DIR]
       hutch-agent version
       hutch-agent help";

/// Where the agent takes connections from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listener {
    /// An inherited listening unix socket.
    Fd(RawFd),
    /// A unix socket path to bind.
    Path(PathBuf),
    /// A character device carrying one connection at a time.
    Serial(PathBuf),
}

/// What `serve` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serve {
    /// Where connections come from.
    pub listeners: Vec<Listener>,
    /// Directory to `chroot` into first (guest init only).
    pub root: Option<PathBuf>,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cli {
    /// Serve the protocol.
    Serve(Serve),
    /// Print the version.
    Version,
    /// Print usage.
    Help,
}

/// Why the command line was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CliError {
    /// No subcommand.
    #[error("missing command")]
    MissingCommand,
    /// An unknown subcommand or option.
    #[error("unknown argument {0:?}")]
    Unknown(String),
    /// An option without its value.
    #[error("{0} needs a value")]
    MissingValue(&'static str),
    /// A bad file descriptor number.
    #[error("--listen-fd needs a file descriptor number of 3 or more, got {0:?}")]
    BadFd(String),
    /// `serve` without a listener.
    #[error("serve needs at least one of --listen-fd, --listen, --serial")]
    NoListener,
}

/// Parse the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Cli, CliError> {
    let mut args = args.into_iter();
    let command = args.next().ok_or(CliError::MissingCommand)?;
    match command.to_str() {
        Some("serve") => {}
        Some("version" | "--version" | "-V") => return Ok(Cli::Version),
        Some("help" | "--help" | "-h") => return Ok(Cli::Help),
        _ => return Err(CliError::Unknown(command.to_string_lossy().into_owned())),
    }
    let mut listeners = Vec::new();
    let mut root = None;
    while let Some(arg) = args.next() {
        let listener = match arg.to_str() {
            Some("--listen-fd") => {
                let value = args.next().ok_or(CliError::MissingValue("--listen-fd"))?;
                let text = value.to_string_lossy().into_owned();
                match text.parse::<RawFd>() {
                    Ok(fd) if fd >= 3 => Listener::Fd(fd),
                    _ => return Err(CliError::BadFd(text)),
                }
            }
            Some("--listen") => Listener::Path(
                args.next()
                    .ok_or(CliError::MissingValue("--listen"))?
                    .into(),
            ),
            Some("--serial") => Listener::Serial(
                args.next()
                    .ok_or(CliError::MissingValue("--serial"))?
                    .into(),
            ),
            Some("--root") => {
                root = Some(PathBuf::from(
                    args.next().ok_or(CliError::MissingValue("--root"))?,
                ));
                continue;
            }
            _ => return Err(CliError::Unknown(arg.to_string_lossy().into_owned())),
        };
        listeners.push(listener);
    }
    if listeners.is_empty() {
        return Err(CliError::NoListener);
    }
    Ok(Cli::Serve(Serve { listeners, root }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(args: &[&str]) -> Result<Cli, CliError> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn parses_listeners() {
        assert_eq!(
            parse_str(&[
                "serve",
                "--listen-fd",
                "3",
                "--listen",
                "/tmp/a.sock",
                "--serial",
                "/dev/vport0p1"
            ]),
            Ok(Cli::Serve(Serve {
                listeners: vec![
                    Listener::Fd(3),
                    Listener::Path("/tmp/a.sock".into()),
                    Listener::Serial("/dev/vport0p1".into()),
                ],
                root: None,
            }))
        );
        assert_eq!(
            parse_str(&["serve", "--serial", "/dev/p", "--root", "."]),
            Ok(Cli::Serve(Serve {
                listeners: vec![Listener::Serial("/dev/p".into())],
                root: Some(".".into()),
            }))
        );
        assert_eq!(
            parse_str(&["serve", "--root", "/r"]),
            Err(CliError::NoListener)
        );
    }

    #[test]
    fn rejects_bad_command_lines() {
        assert_eq!(parse_str(&[]), Err(CliError::MissingCommand));
        assert_eq!(parse_str(&["serve"]), Err(CliError::NoListener));
        assert_eq!(
            parse_str(&["serve", "--listen-fd", "1"]),
            Err(CliError::BadFd("1".into()))
        );
        assert_eq!(
            parse_str(&["serve", "--listen"]),
            Err(CliError::MissingValue("--listen"))
        );
        assert_eq!(
            parse_str(&["serve", "--bogus"]),
            Err(CliError::Unknown("--bogus".into()))
        );
        assert_eq!(parse_str(&["run"]), Err(CliError::Unknown("run".into())));
        assert_eq!(parse_str(&["--version"]), Ok(Cli::Version));
    }
}
