//! `--start-cmd`, `--ready-port`, `--ready-cmd` …: a template's start command and ready
//! check, as `hutch template build` and `hutch template set-start` take them.

use anyhow::bail;
use hutch_proto::{Command, ReadyCheck, ReadyProbe, ServiceSpec};

/// The start command options.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct StartArgs {
    /// Start command every sandbox of the template runs (under `/bin/sh -c`), supervised by
    /// its agent; its output is the sandbox's `start` log.
    #[arg(long, value_name = "CMD")]
    pub start_cmd: Option<String>,
    /// Working directory of the start command.
    #[arg(long, value_name = "DIR", requires = "start_cmd")]
    pub start_cwd: Option<String>,
    /// User of the start command (name or uid; default root).
    #[arg(long, value_name = "USER", requires = "start_cmd")]
    pub start_user: Option<String>,
    /// Ready when this TCP port on the sandbox's loopback accepts connections.
    #[arg(
        long,
        value_name = "PORT",
        requires = "start_cmd",
        conflicts_with = "ready_cmd"
    )]
    pub ready_port: Option<u16>,
    /// Ready when this command (under `/bin/sh -c`) exits 0.
    #[arg(long, value_name = "CMD", requires = "start_cmd")]
    pub ready_cmd: Option<String>,
    /// Longest a create waits for the ready check, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub ready_timeout: u64,
}

impl StartArgs {
    /// The spec these options describe (`None` without `--start-cmd`).
    pub fn spec(&self) -> anyhow::Result<Option<ServiceSpec>> {
        let Some(cmd) = &self.start_cmd else {
            return Ok(None);
        };
        if cmd.trim().is_empty() {
            bail!("--start-cmd must not be empty");
        }
        if self.ready_timeout == 0 {
            bail!("--ready-timeout must be at least 1 second");
        }
        let probe = match (self.ready_port, &self.ready_cmd) {
            (Some(0), _) => bail!("--ready-port must be between 1 and 65535"),
            (Some(port), _) => Some(ReadyProbe::Port(port)),
            (None, Some(cmd)) => Some(ReadyProbe::Cmd(Command::Shell(cmd.clone()))),
            (None, None) => None,
        };
        Ok(Some(ServiceSpec {
            cmd: Command::Shell(cmd.clone()),
            env: Default::default(),
            cwd: self.start_cwd.clone(),
            user: self.start_user.clone(),
            ready: probe.map(|probe| ReadyCheck {
                timeout_ms: self.ready_timeout.saturating_mul(1000),
                ..ReadyCheck::new(probe)
            }),
        }))
    }
}

/// How a start command is shown (`hutch template set-start`'s answer).
pub fn describe(spec: Option<&ServiceSpec>) -> String {
    let Some(spec) = spec else {
        return "no start command".into();
    };
    let cmd = match &spec.cmd {
        Command::Shell(s) => s.clone(),
        Command::Argv(argv) => argv.join(" "),
    };
    match &spec.ready {
        Some(check) => format!(
            "start command `{cmd}`, ready when {} passes (within {} s)",
            check.describe(),
            check.timeout_ms / 1000
        ),
        None => format!("start command `{cmd}`, no ready check"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_make_a_spec() {
        let args = StartArgs {
            start_cmd: Some("httpd -f -p 8080".into()),
            ready_port: Some(8080),
            ready_timeout: 5,
            ..StartArgs::default()
        };
        let spec = args.spec().expect("valid").expect("a spec");
        assert_eq!(spec.cmd, Command::Shell("httpd -f -p 8080".into()));
        let ready = spec.ready.as_ref().expect("a check");
        assert_eq!(ready.probe, ReadyProbe::Port(8080));
        assert_eq!(ready.timeout_ms, 5000);
        assert!(describe(Some(&spec)).contains("ready when port 8080 passes"));
        assert!(StartArgs::default().spec().expect("valid").is_none());
        let empty = StartArgs {
            start_cmd: Some(" ".into()),
            ready_timeout: 60,
            ..StartArgs::default()
        };
        assert!(empty.spec().is_err());
    }
}
