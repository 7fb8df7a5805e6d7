//! [`StageConfig`]: a stage's image configuration as it stands after a step (environment,
//! working directory, user, shell, labels, ports, start command, health check…).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `PATH` when neither the base image nor an `ENV` sets one (BuildKit's default on Linux).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The shell of shell-form commands when no `SHELL` instruction changed it.
pub fn default_shell() -> Vec<String> {
    vec!["/bin/sh".to_owned(), "-c".to_owned()]
}

/// A stage's image configuration. The final stage's is the template's.
///
/// `FROM scratch` starts from [`StageConfig::scratch`]; `FROM <image>` from the image's
/// configuration when the caller gives it ([`crate::plan_with_bases`]), else from
/// [`StageConfig::default`]; `FROM <stage>` from that stage's final configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageConfig {
    /// `ENV` variables in the order first set (`KEY`, `value`); ARGs are not here.
    pub env: Vec<(String, String)>,
    /// The working directory (absolute, cleaned); `/` when never set.
    pub workdir: String,
    /// `USER` (`name`, `uid`, `uid:gid`, `name:group`); `None`: root.
    pub user: Option<String>,
    /// The shell of shell-form commands (`SHELL`).
    pub shell: Vec<String>,
    /// `LABEL`s (and `MAINTAINER`, as `maintainer`).
    pub labels: BTreeMap<String, String>,
    /// `EXPOSE`d ports as `port/protocol` (`8080/tcp`, `53/udp`).
    pub exposed_ports: BTreeSet<String>,
    /// `ENTRYPOINT` as an argument vector (shell form already wrapped in the shell).
    pub entrypoint: Vec<String>,
    /// `CMD` as an argument vector (shell form already wrapped in the shell).
    pub cmd: Vec<String>,
    /// `HEALTHCHECK`; `None` when there is none or after `HEALTHCHECK NONE`.
    pub healthcheck: Option<Healthcheck>,
    /// `VOLUME`s: recorded only, they have no effect on Hutch templates.
    pub volumes: BTreeSet<String>,
    /// `STOPSIGNAL` (`SIGTERM`, `9`…): recorded.
    pub stop_signal: Option<String>,
}

impl Default for StageConfig {
    fn default() -> Self {
        Self {
            env: Vec::new(),
            workdir: "/".to_owned(),
            user: None,
            shell: default_shell(),
            labels: BTreeMap::new(),
            exposed_ports: BTreeSet::new(),
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            healthcheck: None,
            volumes: BTreeSet::new(),
            stop_signal: None,
        }
    }
}

impl StageConfig {
    /// The configuration `FROM scratch` starts with: only `PATH` (as BuildKit sets it).
    pub fn scratch() -> Self {
        Self {
            env: vec![("PATH".to_owned(), DEFAULT_PATH.to_owned())],
            ..Self::default()
        }
    }

    /// The value of an `ENV` variable.
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Sets an `ENV` variable, in place when it exists (keeping its position).
    pub fn set_env(&mut self, name: &str, value: &str) {
        match self.env.iter_mut().find(|(k, _)| k == name) {
            Some(entry) => entry.1 = value.to_owned(),
            None => self.env.push((name.to_owned(), value.to_owned())),
        }
    }

    /// The environment as `KEY=value` strings (the OCI image config's form).
    pub fn env_strings(&self) -> Vec<String> {
        self.env.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    /// The start command: `entrypoint` followed by `cmd`.
    pub fn start_command(&self) -> Vec<String> {
        self.entrypoint.iter().chain(&self.cmd).cloned().collect()
    }
}

/// A `HEALTHCHECK CMD` with Docker's defaults filled in for the options not given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Healthcheck {
    /// What to run.
    pub test: HealthTest,
    /// Time between checks (`--interval`, default 30 s).
    pub interval: Duration,
    /// Time after which one check counts as failed (`--timeout`, default 30 s).
    pub timeout: Duration,
    /// Start-up time during which failures do not count (`--start-period`, default 0 s).
    pub start_period: Duration,
    /// Time between checks during the start period (`--start-interval`, default 5 s).
    pub start_interval: Duration,
    /// Consecutive failures that make the container unhealthy (`--retries`, default 3).
    pub retries: u32,
}

/// The command of a health check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthTest {
    /// Shell form (Docker's `CMD-SHELL`): run with the stage's shell.
    Shell(String),
    /// Exec form (Docker's `CMD`): an argument vector.
    Exec(Vec<String>),
}

impl Healthcheck {
    /// Docker's default interval.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
    /// Docker's default timeout.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
    /// Docker's default start period.
    pub const DEFAULT_START_PERIOD: Duration = Duration::ZERO;
    /// Docker's default start interval.
    pub const DEFAULT_START_INTERVAL: Duration = Duration::from_secs(5);
    /// Docker's default retries.
    pub const DEFAULT_RETRIES: u32 = 3;

    /// The check as an argument vector: exec form as is, shell form wrapped in `shell`.
    pub fn argv(&self, shell: &[String]) -> Vec<String> {
        match &self.test {
            HealthTest::Exec(argv) => argv.clone(),
            HealthTest::Shell(command) => {
                let mut argv = shell.to_vec();
                argv.push(command.clone());
                argv
            }
        }
    }
}
