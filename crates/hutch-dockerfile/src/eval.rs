//! Evaluating the instructions of one stage into [`Instruction`]s, updating the stage's
//! configuration and ARG scope as Docker does.

use std::collections::{BTreeMap, BTreeSet};

use parse_dockerfile::{
    Command, HealthcheckArguments, Instruction as Parsed, JsonOrStringArray, Source,
    UnescapedString,
};

use crate::config::{HealthTest, Healthcheck, StageConfig};
use crate::error::DockerfileError;
use crate::flags::Flags;
use crate::mounts::{self, RunMount};
use crate::paths;
use crate::source::{Located, SourceText};
use crate::step::{
    CopyFrom, CopyKind, CopySource, CopyStep, HeredocScript, Instruction, RunNetwork, RunStep,
};
use crate::substitute;
use crate::values;
use crate::words;

/// Build args Docker accepts without an `ARG`: visible to `RUN`, never in the image, and
/// left out of cache keys.
pub(crate) const PROXY_ARGS: [&str; 10] = [
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "FTP_PROXY",
    "ftp_proxy",
    "NO_PROXY",
    "no_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// ARGs BuildKit defines for the platform; usable in `FROM` and, once declared with `ARG`,
/// in a stage. Hutch builds linux/amd64 only.
pub(crate) const PLATFORM_ARGS: [(&str, &str); 8] = [
    ("TARGETPLATFORM", "linux/amd64"),
    ("TARGETOS", "linux"),
    ("TARGETARCH", "amd64"),
    ("TARGETVARIANT", ""),
    ("BUILDPLATFORM", "linux/amd64"),
    ("BUILDOS", "linux"),
    ("BUILDARCH", "amd64"),
    ("BUILDVARIANT", ""),
];

/// A stage being evaluated: its configuration and the ARGs in scope.
#[derive(Debug, Clone)]
pub(crate) struct StageState {
    pub(crate) config: StageConfig,
    /// ARGs with a value, in declaration order.
    pub(crate) args: Vec<(String, String)>,
    /// A `CMD` was given in this stage (so `ENTRYPOINT` keeps it).
    pub(crate) cmd_set: bool,
}

impl StageState {
    pub(crate) fn new(config: StageConfig) -> Self {
        Self {
            config,
            args: Vec::new(),
            cmd_set: false,
        }
    }

    /// A variable for substitution: `ENV` first (it overrides an ARG of the same name).
    fn lookup(&self, name: &str) -> Option<String> {
        self.config
            .env_var(name)
            .map(str::to_owned)
            .or_else(|| arg_value(&self.args, name))
    }

    fn set_arg(&mut self, name: &str, value: Option<String>) {
        self.args.retain(|(n, _)| n != name);
        if let Some(value) = value {
            self.args.push((name.to_owned(), value));
        }
    }
}

fn arg_value(args: &[(String, String)], name: &str) -> Option<String> {
    args.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
}

/// What evaluation needs from the whole Dockerfile.
pub(crate) struct Evaluator<'a> {
    pub(crate) source: &'a SourceText<'a>,
    pub(crate) build_args: &'a BTreeMap<String, String>,
    /// Global ARGs (before the first `FROM`) and their values.
    pub(crate) global_args: Vec<(String, Option<String>)>,
    /// Each stage's name (lowercase), by index.
    pub(crate) stage_names: Vec<Option<String>>,
    /// Build args some `ARG` declared.
    pub(crate) consumed: BTreeSet<String>,
    /// Things the user should know that do not stop the build.
    pub(crate) warnings: Vec<String>,
}

impl Evaluator<'_> {
    /// Expands one word in the stage's scope.
    fn expand(
        &self,
        state: &StageState,
        word: &str,
        at: &Located,
    ) -> Result<String, DockerfileError> {
        substitute::expand(word, self.source.escape, &|n| state.lookup(n))
            .map_err(|e| at.invalid(e))
    }

    /// Evaluates an `ARG` in global scope (before the first `FROM`).
    pub(crate) fn global_arg(
        &mut self,
        arguments: &str,
        at: &Located,
    ) -> Result<(), DockerfileError> {
        for (name, default) in self.arg_words(arguments, at)? {
            let scope = self.global_scope();
            let value = match self.build_args.get(&name) {
                Some(v) => Some(v.clone()),
                None => match default {
                    Some(d) => Some(
                        substitute::expand(&d, self.source.escape, &|n| arg_value(&scope, n))
                            .map_err(|e| at.invalid(e))?,
                    ),
                    None => None,
                },
            };
            self.consumed.insert(name.clone());
            self.global_args.retain(|(n, _)| *n != name);
            self.global_args.push((name, value));
        }
        Ok(())
    }

    /// The variables a `FROM` line sees: the platform ARGs, then the global ARGs.
    pub(crate) fn global_scope(&self) -> Vec<(String, String)> {
        let mut scope: Vec<(String, String)> = PLATFORM_ARGS
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect();
        for (name, value) in &self.global_args {
            if let Some(value) = value {
                scope.retain(|(n, _)| n != name);
                scope.push((name.clone(), value.clone()));
            }
        }
        scope
    }

    fn arg_words(
        &self,
        arguments: &str,
        at: &Located,
    ) -> Result<Vec<(String, Option<String>)>, DockerfileError> {
        let mut out = Vec::new();
        for word in words::split_words(arguments, self.source.escape) {
            let (name, default) = match word.split_once('=') {
                Some((n, d)) => (n.to_owned(), Some(d.to_owned())),
                None => (word.clone(), None),
            };
            if name.is_empty() {
                return Err(at.invalid(format!("`{word}` has no name (ARG name[=default])")));
            }
            out.push((name, default));
        }
        Ok(out)
    }

    /// Evaluates one instruction of stage `stage`, updating `state`. Returns the
    /// instruction and, for `COPY --from=<stage>`, the stage it reads.
    pub(crate) fn step(
        &mut self,
        stage: usize,
        state: &mut StageState,
        parsed: &Parsed<'_>,
        at: &Located,
    ) -> Result<Instruction, DockerfileError> {
        let escape = self.source.escape;
        let instruction = match parsed {
            Parsed::Run(run) => {
                let flags = Flags::check_repeatable(
                    &run.options,
                    "RUN",
                    &["network", "mount"],
                    &["mount"],
                    &[(
                        "security",
                        "every RUN runs in an unprivileged build sandbox",
                    )],
                    at,
                )?;
                let mut mounts: Vec<RunMount> = Vec::new();
                for raw in flags.all("mount", at)? {
                    let raw = self.expand(state, raw, at)?;
                    let workdir = state.config.workdir.clone();
                    let mount = mounts::parse_mount(&raw, &workdir, at, |from| {
                        self.copy_from(stage, state, from, at)
                    })?;
                    if let Some(t) = mount.target() {
                        if mounts.iter().any(|m| m.target() == Some(t)) {
                            return Err(at.invalid(format!("two mounts have the target {t}")));
                        }
                    }
                    mounts.push(mount);
                }
                let network = match flags.value("network", at)? {
                    None => None,
                    Some("default") => Some(RunNetwork::Default),
                    Some("none") => Some(RunNetwork::None),
                    Some("host") => {
                        return Err(at.unsupported(
                            "RUN --network=host",
                            "build steps never share the host's network; the build's network policy applies",
                        ))
                    }
                    Some(other) => {
                        return Err(at.invalid(format!(
                            "--network=`{other}` must be default or none"
                        )))
                    }
                };
                let (argv, script) = self.run_command(state, run, at)?;
                Instruction::Run(RunStep {
                    argv,
                    script,
                    network,
                    mounts,
                })
            }
            Parsed::Copy(copy) => {
                let flags = Flags::check(
                    &copy.options,
                    "COPY",
                    &["from", "chown", "chmod", "link"],
                    &[
                        ("parents", "copy each directory with its own COPY"),
                        ("exclude", "leave the files out with .dockerignore"),
                    ],
                    at,
                )?;
                Instruction::Copy(self.copy(
                    stage,
                    state,
                    CopyKind::Copy,
                    &flags,
                    &copy.src,
                    &copy.dest,
                    at,
                )?)
            }
            Parsed::Add(add) => {
                let flags = Flags::check(
                    &add.options,
                    "ADD",
                    &["chown", "chmod", "link", "checksum"],
                    &[
                        ("keep-git-dir", "ADD from git repositories is not built"),
                        ("exclude", "leave the files out with .dockerignore"),
                        (
                            "unpack",
                            "ADD unpacks local archives and never URLs, as Docker does by default",
                        ),
                    ],
                    at,
                )?;
                Instruction::Copy(self.copy(
                    stage,
                    state,
                    CopyKind::Add,
                    &flags,
                    &add.src,
                    &add.dest,
                    at,
                )?)
            }
            Parsed::Env(env) => {
                let pairs = words::name_values(&env.arguments.value, escape, "ENV")
                    .map_err(|e| at.invalid(e))?;
                let mut set = Vec::with_capacity(pairs.len());
                for (key, value) in pairs {
                    let key = self.expand(state, &key, at)?;
                    let value = self.expand(state, &value, at)?;
                    if key.is_empty() {
                        return Err(at.invalid("ENV names cannot be empty"));
                    }
                    set.push((key, value));
                }
                for (key, value) in &set {
                    state.config.set_env(key, value);
                }
                Instruction::Env(set)
            }
            Parsed::Arg(arg) => {
                let mut declared = Vec::new();
                for (name, default) in self.arg_words(&arg.arguments.value, at)? {
                    let value = match self.build_args.get(&name) {
                        Some(v) => Some(v.clone()),
                        None => match default {
                            Some(d) => Some(self.expand(state, &d, at)?),
                            None => self
                                .global_args
                                .iter()
                                .find(|(n, _)| *n == name)
                                .and_then(|(_, v)| v.clone())
                                .or_else(|| {
                                    PLATFORM_ARGS
                                        .iter()
                                        .find(|(n, _)| *n == name)
                                        .map(|(_, v)| (*v).to_owned())
                                }),
                        },
                    };
                    self.consumed.insert(name.clone());
                    declared.push((name, value));
                }
                for (name, value) in &declared {
                    state.set_arg(name, value.clone());
                }
                Instruction::Arg(declared)
            }
            Parsed::Workdir(workdir) => {
                let value = self.expand(state, &workdir.arguments.value, at)?;
                if value.is_empty() {
                    return Err(at.invalid("WORKDIR needs a path"));
                }
                let path = paths::join(&state.config.workdir, &value);
                state.config.workdir = path.clone();
                Instruction::Workdir { path }
            }
            Parsed::User(user) => {
                let value = self.expand(state, &user.arguments.value, at)?;
                if value.is_empty() {
                    return Err(at.invalid("USER needs a user (name, uid or uid:gid)"));
                }
                state.config.user = Some(value.clone());
                Instruction::User { user: value }
            }
            Parsed::Label(label) => {
                let pairs = words::name_values(&label.arguments.value, escape, "LABEL")
                    .map_err(|e| at.invalid(e))?;
                let mut set = BTreeMap::new();
                for (key, value) in pairs {
                    let key = self.expand(state, &key, at)?;
                    let value = self.expand(state, &value, at)?;
                    if key.is_empty() {
                        return Err(at.invalid("LABEL names cannot be empty"));
                    }
                    set.insert(key, value);
                }
                state.config.labels.extend(set.clone());
                Instruction::Label(set)
            }
            Parsed::Maintainer(maintainer) => {
                let name = maintainer.name.value.to_string();
                state
                    .config
                    .labels
                    .insert("maintainer".to_owned(), name.clone());
                Instruction::Label(BTreeMap::from([("maintainer".to_owned(), name)]))
            }
            Parsed::Expose(expose) => {
                let mut ports = Vec::new();
                for word in &expose.arguments {
                    let expanded = self.expand(state, &word.value, at)?;
                    for part in expanded.split_whitespace() {
                        ports.extend(values::ports(part).map_err(|e| at.invalid(e))?);
                    }
                }
                state.config.exposed_ports.extend(ports.iter().cloned());
                Instruction::Expose(ports)
            }
            Parsed::Shell(shell) => {
                let argv: Vec<String> = shell
                    .arguments
                    .iter()
                    .map(|a| a.value.to_string())
                    .collect();
                state.config.shell = argv.clone();
                Instruction::Shell(argv)
            }
            Parsed::Cmd(cmd) => {
                let argv = self.command_argv(state, &cmd.arguments);
                state.config.cmd = argv.clone();
                state.cmd_set = true;
                Instruction::Cmd(argv)
            }
            Parsed::Entrypoint(entrypoint) => {
                let argv = self.command_argv(state, &entrypoint.arguments);
                state.config.entrypoint = argv.clone();
                if !state.cmd_set {
                    state.config.cmd.clear();
                }
                Instruction::Entrypoint(argv)
            }
            Parsed::Healthcheck(healthcheck) => {
                let check = self.healthcheck(healthcheck, at)?;
                state.config.healthcheck = check.clone();
                Instruction::Healthcheck(check)
            }
            Parsed::Volume(volume) => {
                let words: Vec<&UnescapedString<'_>> = match &volume.arguments {
                    JsonOrStringArray::Json(j) => j.value.iter().collect(),
                    JsonOrStringArray::String(s) => s.iter().collect(),
                };
                let mut paths_set = Vec::new();
                for word in words {
                    let path = self.expand(state, &word.value, at)?;
                    if path.trim().is_empty() {
                        return Err(at.invalid("VOLUME paths cannot be empty"));
                    }
                    paths_set.push(path);
                }
                state.config.volumes.extend(paths_set.iter().cloned());
                self.warnings.push(format!(
                    "line {}: VOLUME {} is recorded but has no effect: Hutch sandboxes keep \
                     everything in their own root (use Hutch volumes for shared data)",
                    at.line,
                    paths_set.join(" ")
                ));
                Instruction::Volume(paths_set)
            }
            Parsed::Stopsignal(stopsignal) => {
                let value = self.expand(state, &stopsignal.arguments.value, at)?;
                let signal = values::signal(&value).map_err(|e| at.invalid(e))?;
                state.config.stop_signal = Some(signal.clone());
                Instruction::StopSignal(signal)
            }
            Parsed::Onbuild(_) => return Err(onbuild_unsupported(at)),
            Parsed::From(_) => unreachable!("FROM starts a stage and is planned there"),
            _ => return Err(at.invalid("this instruction is not known to Hutch")),
        };
        Ok(instruction)
    }

    /// `CMD`/`ENTRYPOINT`: exec form as written, shell form wrapped in the shell.
    fn command_argv(&self, state: &StageState, command: &Command<'_>) -> Vec<String> {
        match command {
            Command::Exec(exec) => exec.value.iter().map(|a| a.value.to_string()).collect(),
            Command::Shell(shell) => {
                let mut argv = state.config.shell.clone();
                argv.push(words::join_continuations(shell.value, self.source.escape));
                argv
            }
            _ => Vec::new(),
        }
    }

    /// `RUN`'s argument vector and, for a `#!` here-document, the script to write.
    fn run_command(
        &self,
        state: &StageState,
        run: &parse_dockerfile::RunInstruction<'_>,
        at: &Located,
    ) -> Result<(Vec<String>, Option<HeredocScript>), DockerfileError> {
        let Some(heredoc) = run.here_docs.first() else {
            let argv = self.command_argv(state, &run.arguments);
            if argv.last().is_some_and(|c| c.trim().is_empty())
                && matches!(run.arguments, Command::Shell(_))
            {
                return Err(at.invalid("RUN needs a command"));
            }
            return Ok((argv, None));
        };
        if run.here_docs.len() > 1 {
            return Err(at.unsupported(
                "RUN with several here-documents",
                "use one here-document per RUN",
            ));
        }
        let name = at
            .heredoc_names()
            .into_iter()
            .next()
            .ok_or_else(|| at.invalid("cannot find the here-document's delimiter"))?;
        let rest = match &run.arguments {
            Command::Shell(s) => s.value.trim(),
            _ => "",
        };
        let content = heredoc.value.to_string();
        let mut argv = state.config.shell.clone();
        if !rest.is_empty() {
            // `RUN <<EOF bash -e`: the shell reads the here-document itself.
            let first_line = at.text.lines().next().unwrap_or_default();
            let opener = first_line
                .find("<<")
                .map_or(first_line, |i| &first_line[i..])
                .trim_end();
            argv.push(format!("{opener}\n{content}{name}"));
            return Ok((argv, None));
        }
        if content.starts_with("#!") {
            let path = format!("/dev/pipes/{name}");
            return Ok((vec![path.clone()], Some(HeredocScript { path, content })));
        }
        argv.push(content);
        Ok((argv, None))
    }

    #[allow(clippy::too_many_arguments)]
    fn copy(
        &mut self,
        stage: usize,
        state: &StageState,
        kind: CopyKind,
        flags: &Flags,
        src: &[Source<'_>],
        dest: &UnescapedString<'_>,
        at: &Located,
    ) -> Result<CopyStep, DockerfileError> {
        let keyword = match kind {
            CopyKind::Copy => "COPY",
            CopyKind::Add => "ADD",
        };
        let from = match flags.value("from", at)? {
            None => None,
            Some(raw) => Some(self.copy_from(stage, state, raw, at)?),
        };
        let chown = match flags.value("chown", at)? {
            None => None,
            Some(raw) => {
                let owner = self.expand(state, raw, at)?;
                if owner.is_empty() {
                    return Err(at.invalid("--chown needs user[:group]"));
                }
                Some(owner)
            }
        };
        let chmod = match flags.value("chmod", at)? {
            None => None,
            Some(raw) => {
                let mode = self.expand(state, raw, at)?;
                Some(values::octal_mode(&mode).map_err(|e| at.invalid(e))?)
            }
        };
        let link = match flags.raw("link") {
            None => false,
            Some(v) => values::boolean("link", v).map_err(|e| at.invalid(e))?,
        };
        let checksum = match flags.value("checksum", at)? {
            None => None,
            Some(raw) => {
                let sum = self.expand(state, raw, at)?;
                let hex = sum.strip_prefix("sha256:").unwrap_or_default();
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(at.invalid(format!(
                        "--checksum=`{sum}` must be sha256: followed by 64 hex digits"
                    )));
                }
                Some(sum.to_ascii_lowercase())
            }
        };
        let names = at.heredoc_names();
        let mut heredocs = names.into_iter();
        let mut sources = Vec::with_capacity(src.len());
        for source in src {
            match source {
                Source::Path(path) => {
                    let value = self.expand(state, &path.value, at)?;
                    if value.is_empty() {
                        return Err(
                            at.invalid(format!("{keyword} source is empty after substitution"))
                        );
                    }
                    sources.push(classify_source(kind, value, from.is_some(), at)?);
                }
                Source::HereDoc(heredoc) => {
                    let name = heredocs
                        .next()
                        .ok_or_else(|| at.invalid("cannot find a here-document's delimiter"))?;
                    let content = if heredoc.expand {
                        substitute::expand_heredoc(&heredoc.value, self.source.escape, &|n| {
                            state.lookup(n)
                        })
                        .map_err(|e| at.invalid(e))?
                    } else {
                        heredoc.value.to_string()
                    };
                    sources.push(CopySource::Inline { name, content });
                }
                _ => return Err(at.invalid("unknown source kind")),
            }
        }
        if checksum.is_some() && !sources.iter().all(|s| matches!(s, CopySource::Url(_))) {
            return Err(at.invalid("--checksum only applies to URL sources"));
        }
        let written = self.expand(state, &dest.value, at)?;
        if written.is_empty() {
            return Err(at.invalid(format!("{keyword} needs a destination")));
        }
        let says_dir = written.ends_with('/') || written.ends_with("/.") || written == ".";
        if sources.len() > 1 && !says_dir {
            return Err(at.invalid(format!(
                "with more than one source the destination must be a directory ending in /, \
                 like `{written}/`"
            )));
        }
        let mut dest_path = paths::join(&state.config.workdir, &written);
        if says_dir && !dest_path.ends_with('/') {
            dest_path.push('/');
        }
        Ok(CopyStep {
            kind,
            from,
            dest_is_dir: says_dir || sources.len() > 1,
            sources,
            dest: dest_path,
            chown,
            chmod,
            link,
            checksum,
        })
    }

    fn copy_from(
        &self,
        stage: usize,
        state: &StageState,
        raw: &str,
        at: &Located,
    ) -> Result<CopyFrom, DockerfileError> {
        let value = self.expand(state, raw, at)?;
        if value.is_empty() {
            return Err(at.invalid("--from needs a stage name, a stage index or an image"));
        }
        if let Ok(index) = value.parse::<usize>() {
            if index >= stage {
                return Err(at.invalid(format!(
                    "--from={index} must name an earlier stage (this is stage {stage}, counting from 0)"
                )));
            }
            return Ok(CopyFrom::Stage { index });
        }
        let lower = value.to_ascii_lowercase();
        match self.stage_names.iter().position(|n| n.as_deref() == Some(&lower)) {
            Some(index) if index < stage => Ok(CopyFrom::Stage { index }),
            Some(_) => Err(at.invalid(format!(
                "--from={value} names this stage or a later one; only earlier stages can be copied from"
            ))),
            None => Ok(CopyFrom::Image { reference: value }),
        }
    }

    fn healthcheck(
        &self,
        healthcheck: &parse_dockerfile::HealthcheckInstruction<'_>,
        at: &Located,
    ) -> Result<Option<Healthcheck>, DockerfileError> {
        let known = [
            "interval",
            "timeout",
            "start-period",
            "start-interval",
            "retries",
        ];
        let flags = Flags::check(&healthcheck.options, "HEALTHCHECK", &known, &[], at)?;
        let arguments = match &healthcheck.arguments {
            HealthcheckArguments::None { .. } => {
                if !healthcheck.options.is_empty() {
                    return Err(at.invalid("HEALTHCHECK NONE takes no options"));
                }
                return Ok(None);
            }
            HealthcheckArguments::Cmd { arguments, .. } => arguments,
            _ => return Err(at.invalid("HEALTHCHECK needs CMD or NONE")),
        };
        let test = match arguments {
            Command::Exec(exec) => {
                HealthTest::Exec(exec.value.iter().map(|a| a.value.to_string()).collect())
            }
            Command::Shell(shell) => {
                let command = words::join_continuations(shell.value, self.source.escape);
                if command.trim().is_empty() {
                    return Err(at.invalid("HEALTHCHECK CMD needs a command"));
                }
                HealthTest::Shell(command)
            }
            _ => return Err(at.invalid("HEALTHCHECK CMD needs a command")),
        };
        let duration = |name: &str, default| -> Result<_, DockerfileError> {
            let Some(raw) = flags.value(name, at)? else {
                return Ok(default);
            };
            let d = values::duration(raw).map_err(|e| at.invalid(format!("--{name}: {e}")))?;
            if d.is_zero() {
                Ok(default)
            } else if d < std::time::Duration::from_millis(1) {
                Err(at.invalid(format!("--{name}={raw} cannot be less than 1ms")))
            } else {
                Ok(d)
            }
        };
        let retries = match flags.value("retries", at)? {
            None => Healthcheck::DEFAULT_RETRIES,
            Some(raw) => match raw.parse::<u32>() {
                Ok(0) => Healthcheck::DEFAULT_RETRIES,
                Ok(n) => n,
                Err(_) => {
                    return Err(at.invalid(format!(
                        "--retries=`{raw}` must be a whole number of 0 or more"
                    )))
                }
            },
        };
        Ok(Some(Healthcheck {
            test,
            interval: duration("interval", Healthcheck::DEFAULT_INTERVAL)?,
            timeout: duration("timeout", Healthcheck::DEFAULT_TIMEOUT)?,
            start_period: duration("start-period", Healthcheck::DEFAULT_START_PERIOD)?,
            start_interval: duration("start-interval", Healthcheck::DEFAULT_START_INTERVAL)?,
            retries,
        }))
    }
}

/// A COPY/ADD path: a URL only for `ADD` from the context.
fn classify_source(
    kind: CopyKind,
    value: String,
    from_elsewhere: bool,
    at: &Located,
) -> Result<CopySource, DockerfileError> {
    let lower = value.to_ascii_lowercase();
    let is_url = lower.starts_with("http://") || lower.starts_with("https://");
    let is_git = lower.starts_with("git@")
        || lower.starts_with("git://")
        || (is_url && lower.ends_with(".git"));
    if is_git {
        return Err(at.unsupported(
            "ADD from a git repository",
            "clone it in a RUN step, or copy a checkout from the build context",
        ));
    }
    if !is_url {
        return Ok(CopySource::Path(value));
    }
    match (kind, from_elsewhere) {
        (CopyKind::Add, false) => Ok(CopySource::Url(value)),
        (CopyKind::Add, true) => Err(at.invalid("ADD --from cannot download URLs")),
        (CopyKind::Copy, _) => {
            Err(at.invalid(format!("COPY cannot download `{value}`; use ADD for URLs")))
        }
    }
}

/// The refusal of `ONBUILD`.
pub(crate) fn onbuild_unsupported(at: &Located) -> DockerfileError {
    at.unsupported(
        "ONBUILD",
        "Hutch templates are not used as base images of other Dockerfiles, so a trigger \
         would never run; move the instruction into the Dockerfile that needs it",
    )
}
