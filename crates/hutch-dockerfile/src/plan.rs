//! [`plan`]: a Dockerfile, build args and an optional target turned into a [`BuildPlan`]:
//! the stages the target needs, each with its evaluated steps.
//!
//! Stages are planned from the target back: a stage is evaluated when the target needs it
//! (its `FROM <stage>`, or a `COPY --from=<stage>`), so unused stages are skipped as
//! BuildKit skips them. Every instruction of every stage is still parsed, so a syntax
//! error anywhere fails the plan.

use std::collections::{BTreeMap, BTreeSet};

use parse_dockerfile::Instruction as Parsed;
use serde::{Deserialize, Serialize};

use crate::config::StageConfig;
use crate::error::DockerfileError;
use crate::eval::{onbuild_unsupported, Evaluator, StageState, PROXY_ARGS};
use crate::source::{Located, SourceText};
use crate::step::{CopyFrom, Step};
use crate::substitute;

/// What a Dockerfile builds: the stages the target needs, in Dockerfile order (the
/// target last).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildPlan {
    /// The stages to build, in Dockerfile order; the last is the target.
    pub stages: Vec<Stage>,
    /// How many stages the Dockerfile has in all.
    pub stage_count: usize,
    /// Indices of the stages the target does not need (not built).
    pub skipped_stages: Vec<usize>,
    /// Build args no `ARG` declared (Docker warns about these too), sorted.
    pub unused_build_args: Vec<String>,
    /// Things the user should see in the build log: unused build args, `VOLUME`s that have
    /// no effect, directives Hutch ignores.
    pub warnings: Vec<String>,
}

impl BuildPlan {
    /// The stage the template is made from.
    pub fn target(&self) -> &Stage {
        self.stages
            .last()
            .expect("a plan always has its target stage")
    }

    /// A planned stage by its index among the Dockerfile's `FROM`s.
    pub fn stage(&self, index: usize) -> Option<&Stage> {
        self.stages.iter().find(|s| s.index == index)
    }

    /// The template's configuration: the target's after its last step.
    pub fn config(&self) -> &StageConfig {
        self.target().config()
    }

    /// The images the planned stages read (`FROM image`, `COPY --from=image`), each once,
    /// in order of first use: what the engine pulls, and what [`crate::plan_with_bases`]
    /// wants configurations for.
    pub fn images(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut add = |r: &str| {
            if !out.iter().any(|o| o == r) {
                out.push(r.to_owned());
            }
        };
        for stage in &self.stages {
            if let Base::Image { reference } = &stage.base {
                add(reference);
            }
            for step in &stage.steps {
                for from in step.instruction.reads_from() {
                    if let CopyFrom::Image { reference } = from {
                        add(reference);
                    }
                }
            }
        }
        out
    }
}

/// One `FROM` and the steps after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stage {
    /// Position among the Dockerfile's `FROM`s, 0-based (what `COPY --from=0` names).
    pub index: usize,
    /// `AS name`, lowercase.
    pub name: Option<String>,
    /// 1-based line of the `FROM`.
    pub line: usize,
    /// The `FROM` line as written.
    pub text: String,
    /// What the stage starts from.
    pub base: Base,
    /// The configuration the stage starts with (from its base).
    pub base_config: StageConfig,
    /// The instructions after `FROM`, evaluated.
    pub steps: Vec<Step>,
    /// Stages this one reads (its `FROM <stage>`, its `COPY --from=<stage>`), by index,
    /// sorted.
    pub depends_on: Vec<usize>,
}

impl Stage {
    /// The configuration after the last step (the base's when there are no steps).
    pub fn config(&self) -> &StageConfig {
        self.steps
            .last()
            .map_or(&self.base_config, |step| &step.config)
    }

    /// `name` if it has one, else `stage N`, for logs.
    pub fn display_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("stage {}", self.index))
    }
}

/// What a stage starts from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Base {
    /// `FROM scratch`: an empty root.
    Scratch,
    /// `FROM <image>` (a registry image, or an existing Hutch template: the engine
    /// decides), after substitution.
    Image {
        /// The reference.
        reference: String,
    },
    /// `FROM <earlier stage>`: that stage's result.
    Stage {
        /// The stage's index.
        index: usize,
    },
}

/// The largest Dockerfile planned, in bytes.
pub const MAX_DOCKERFILE_BYTES: usize = 1024 * 1024;
/// The most instructions a Dockerfile may have.
pub const MAX_INSTRUCTIONS: usize = 1000;
/// The most bytes a stage's configuration and ARGs may hold (ENV, LABEL, EXPOSE, …), so
/// that every step's copy of it stays small.
pub const MAX_CONFIG_BYTES: usize = 128 * 1024;

/// Plans a build: parses `dockerfile`, evaluates the stages `target` (default: the last
/// stage) needs with `build_args`. Stages `FROM <image>` start from an empty
/// configuration; use [`plan_with_bases`] to start them from the images' own.
pub fn plan(
    dockerfile: &str,
    build_args: &BTreeMap<String, String>,
    target: Option<&str>,
) -> Result<BuildPlan, DockerfileError> {
    plan_with_bases(dockerfile, build_args, target, &BTreeMap::new())
}

/// [`plan`], with the configurations of base images (keyed by the reference as
/// [`BuildPlan::images`] gives it): a stage `FROM` one of them starts with its
/// environment, working directory, user, labels, ports, entrypoint and cmd, so that
/// `ENV PATH=/opt/bin:$PATH` extends the image's `PATH` as in Docker. The engine plans
/// once, pulls [`BuildPlan::images`], then plans again with their configurations.
pub fn plan_with_bases(
    dockerfile: &str,
    build_args: &BTreeMap<String, String>,
    target: Option<&str>,
    bases: &BTreeMap<String, StageConfig>,
) -> Result<BuildPlan, DockerfileError> {
    if dockerfile.len() > MAX_DOCKERFILE_BYTES {
        return Err(DockerfileError::TooLarge {
            what: format!("{} bytes", dockerfile.len()),
            limit: MAX_DOCKERFILE_BYTES,
        });
    }
    let mut source = SourceText::new(dockerfile);
    let parsed = parse_dockerfile::parse(dockerfile).map_err(|e| parse_error(&source, &e))?;
    if let Some(escape) = &parsed.parser_directives.escape {
        source.escape = escape.value.value;
    }
    let mut warnings = Vec::new();
    if let Some(syntax) = &parsed.parser_directives.syntax {
        warnings.push(format!(
            "the syntax directive `{}` is ignored: Hutch reads Dockerfiles itself",
            syntax.value.value
        ));
    }

    if parsed.instructions.len() > MAX_INSTRUCTIONS {
        return Err(DockerfileError::TooLarge {
            what: format!("{} instructions", parsed.instructions.len()),
            limit: MAX_INSTRUCTIONS,
        });
    }
    // Split into the global ARGs and the stages, refusing ONBUILD anywhere.
    let mut global: Vec<(&Parsed<'_>, Located)> = Vec::new();
    let mut raw_stages: Vec<RawStage<'_, '_>> = Vec::new();
    for instruction in &parsed.instructions {
        let at = source.locate(instruction);
        if let Parsed::Onbuild(_) = instruction {
            return Err(onbuild_unsupported(&at));
        }
        match instruction {
            Parsed::From(from) => raw_stages.push(RawStage {
                from,
                at,
                body: Vec::new(),
            }),
            other => match raw_stages.last_mut() {
                Some(stage) => stage.body.push((other, at)),
                None => global.push((other, at)),
            },
        }
    }
    if raw_stages.is_empty() {
        return Err(DockerfileError::NoStage);
    }

    let mut evaluator = Evaluator {
        source: &source,
        build_args,
        global_args: Vec::new(),
        stage_names: Vec::new(),
        consumed: BTreeSet::new(),
        warnings,
    };
    for (instruction, at) in &global {
        if let Parsed::Arg(arg) = instruction {
            evaluator.global_arg(&arg.arguments.value, at)?;
        }
    }

    // Stage headers: names, then bases (a FROM may name an earlier stage).
    let mut headers = Vec::with_capacity(raw_stages.len());
    for raw in &raw_stages {
        let name = match &raw.from.as_ {
            Some((_, name)) => Some(stage_name(&name.value, &raw.at)?),
            None => None,
        };
        evaluator.stage_names.push(name);
    }
    for (index, raw) in raw_stages.iter().enumerate() {
        headers.push(stage_header(&evaluator, index, raw)?);
    }

    let target_index = match target {
        None => raw_stages.len() - 1,
        Some(wanted) => {
            let lower = wanted.to_ascii_lowercase();
            evaluator
                .stage_names
                .iter()
                .position(|n| n.as_deref() == Some(lower.as_str()))
                .ok_or_else(|| DockerfileError::UnknownTarget {
                    target: wanted.to_owned(),
                    known: known_names(&evaluator.stage_names),
                })?
        }
    };

    // Evaluate the target and, recursively, what it reads.
    let mut planned: Vec<Option<Stage>> = vec![None; raw_stages.len()];
    let mut pending = vec![target_index];
    while let Some(index) = pending.pop() {
        if planned[index].is_some() {
            continue;
        }
        let header = &headers[index];
        let base_config = match &header.base {
            Base::Scratch => StageConfig::scratch(),
            Base::Image { reference } => bases
                .get(reference)
                .map(normalized_base)
                .unwrap_or_default(),
            Base::Stage { index: from } => match &planned[*from] {
                Some(done) => done.config().clone(),
                None => {
                    // Plan the base stage first, then come back.
                    pending.push(index);
                    pending.push(*from);
                    continue;
                }
            },
        };
        let stage = evaluate_stage(
            &mut evaluator,
            index,
            &raw_stages[index],
            header,
            base_config,
        )?;
        for dep in &stage.depends_on {
            if planned[*dep].is_none() {
                pending.push(*dep);
            }
        }
        planned[index] = Some(stage);
    }

    let stage_count = raw_stages.len();
    let mut stages = Vec::new();
    let mut skipped_stages = Vec::new();
    for (index, stage) in planned.into_iter().enumerate() {
        match stage {
            Some(stage) if index <= target_index => stages.push(stage),
            Some(_) => unreachable!("only stages up to the target are planned"),
            None => skipped_stages.push(index),
        }
    }

    let mut warnings = std::mem::take(&mut evaluator.warnings);
    let unused_build_args: Vec<String> = build_args
        .keys()
        .filter(|k| !evaluator.consumed.contains(*k) && !PROXY_ARGS.contains(&k.as_str()))
        .cloned()
        .collect();
    if !unused_build_args.is_empty() {
        warnings.insert(
            0,
            format!(
                "build args not declared by any ARG of the stages built: {}",
                unused_build_args.join(", ")
            ),
        );
    }
    Ok(BuildPlan {
        stages,
        stage_count,
        skipped_stages,
        unused_build_args,
        warnings,
    })
}

struct RawStage<'p, 'a> {
    from: &'p parse_dockerfile::FromInstruction<'a>,
    at: Located,
    body: Vec<(&'p Parsed<'a>, Located)>,
}

struct Header {
    base: Base,
}

/// Evaluates a stage's `FROM`: the base image (with the global ARGs), the platform.
fn stage_header(
    evaluator: &Evaluator<'_>,
    index: usize,
    raw: &RawStage<'_, '_>,
) -> Result<Header, DockerfileError> {
    let at = &raw.at;
    let scope = evaluator.global_scope();
    let lookup = |n: &str| scope.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let escape = evaluator.source.escape;
    for flag in &raw.from.options {
        let name = flag.name.value.as_ref();
        if name != "platform" {
            return Err(at.invalid(format!("unknown option --{name} (FROM takes --platform)")));
        }
        let raw_value = flag
            .value
            .as_ref()
            .map(|v| v.value.to_string())
            .unwrap_or_default();
        let platform =
            substitute::expand(&raw_value, escape, &lookup).map_err(|e| at.invalid(e))?;
        if !matches!(platform.as_str(), "linux/amd64" | "linux/amd64/v1") {
            return Err(at.unsupported(
                &format!("FROM --platform={platform}"),
                "Hutch builds linux/amd64 only",
            ));
        }
    }
    let image =
        substitute::expand(&raw.from.image.value, escape, &lookup).map_err(|e| at.invalid(e))?;
    if image.is_empty() {
        return Err(at.invalid(format!(
            "the base image `{}` is empty after substitution (is the ARG declared before the first FROM?)",
            raw.from.image.value
        )));
    }
    let lower = image.to_ascii_lowercase();
    let base = if image == "scratch" {
        Base::Scratch
    } else if let Some(from) = evaluator.stage_names[..index]
        .iter()
        .position(|n| n.as_deref() == Some(lower.as_str()))
    {
        Base::Stage { index: from }
    } else {
        Base::Image { reference: image }
    };
    Ok(Header { base })
}

fn evaluate_stage(
    evaluator: &mut Evaluator<'_>,
    index: usize,
    raw: &RawStage<'_, '_>,
    header: &Header,
    base_config: StageConfig,
) -> Result<Stage, DockerfileError> {
    let mut state = StageState::new(base_config.clone());
    let proxies: Vec<(String, String)> = PROXY_ARGS
        .iter()
        .filter_map(|name| {
            evaluator
                .build_args
                .get(*name)
                .map(|v| ((*name).to_owned(), v.clone()))
        })
        .collect();
    let mut depends_on = BTreeSet::new();
    if let Base::Stage { index: from } = header.base {
        depends_on.insert(from);
    }
    let mut steps = Vec::with_capacity(raw.body.len());
    for (parsed, at) in &raw.body {
        let instruction = evaluator.step(index, &mut state, parsed, at)?;
        for from in instruction.reads_from() {
            if let CopyFrom::Stage { index: from } = from {
                depends_on.insert(*from);
            }
        }
        if config_bytes(&state) > MAX_CONFIG_BYTES {
            return Err(at.invalid(format!(
                "the stage's configuration (ENV, ARG, LABEL, EXPOSE, …) grows past \
                 {MAX_CONFIG_BYTES} bytes"
            )));
        }
        let mut args = proxies.clone();
        for (name, value) in &state.args {
            args.retain(|(n, _)| n != name);
            args.push((name.clone(), value.clone()));
        }
        steps.push(Step {
            line: at.line,
            text: at.text.clone(),
            instruction,
            config: state.config.clone(),
            args,
        });
    }
    Ok(Stage {
        index,
        name: evaluator.stage_names[index].clone(),
        line: raw.at.line,
        text: raw.at.text.clone(),
        base: header.base.clone(),
        base_config,
        steps,
        depends_on: depends_on.into_iter().collect(),
    })
}

/// Roughly how many bytes a stage's configuration and ARGs hold.
fn config_bytes(state: &StageState) -> usize {
    let c = &state.config;
    let pairs = |p: &[(String, String)]| p.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    let list = |l: &[String]| l.iter().map(String::len).sum::<usize>();
    pairs(&c.env)
        + pairs(&state.args)
        + c.labels
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
        + c.exposed_ports.iter().map(String::len).sum::<usize>()
        + c.volumes.iter().map(String::len).sum::<usize>()
        + list(&c.entrypoint)
        + list(&c.cmd)
        + list(&c.shell)
        + c.workdir.len()
        + c.user.as_ref().map_or(0, String::len)
}

/// A base image's configuration as a stage starts from it: an empty working directory is
/// `/` (relative `WORKDIR`s join to it) and an empty shell is `/bin/sh -c`.
fn normalized_base(config: &StageConfig) -> StageConfig {
    let mut config = config.clone();
    if config.workdir.is_empty() {
        config.workdir = "/".to_owned();
    }
    if config.shell.is_empty() {
        config.shell = crate::config::default_shell();
    }
    config
}

/// `AS name`: lowercase; letters, digits, `-`, `_` and `.`, starting with a letter.
fn stage_name(name: &str, at: &Located) -> Result<String, DockerfileError> {
    let lower = name.to_ascii_lowercase();
    let valid = lower.starts_with(|c: char| c.is_ascii_lowercase())
        && lower
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'));
    if valid {
        Ok(lower)
    } else {
        Err(at.invalid(format!(
            "stage name `{name}` must start with a letter and hold only letters, digits, -, _ and ."
        )))
    }
}

fn known_names(names: &[Option<String>]) -> String {
    let named: Vec<&str> = names.iter().flatten().map(String::as_str).collect();
    if named.is_empty() {
        "none named".to_owned()
    } else {
        named.join(", ")
    }
}

/// The parser's error, with the line it gives.
fn parse_error(source: &SourceText<'_>, error: &parse_dockerfile::Error) -> DockerfileError {
    let message = format!("{error:#}");
    let line = error.line();
    if message.starts_with("unknown instruction") {
        let word = source
            .text
            .lines()
            .nth(line.saturating_sub(1))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_default()
            .to_owned();
        return DockerfileError::UnknownInstruction {
            line,
            word,
            hint: heredoc_hint(source, line),
        };
    }
    if message == "expected at least one FROM instruction" {
        return DockerfileError::NoStage;
    }
    DockerfileError::Syntax { line, message }
}

/// When the line before an unknown instruction opened a here-document that is not the
/// first word of its `RUN` (`RUN cat <<EOF > file`), the parser read the document's body
/// as instructions: say so.
fn heredoc_hint(source: &SourceText<'_>, line: usize) -> String {
    let before: Vec<&str> = source.text.lines().take(line.saturating_sub(1)).collect();
    let Some((index, opener)) = before
        .iter()
        .enumerate()
        .rev()
        .find(|(_, l)| !l.trim().is_empty())
    else {
        return String::new();
    };
    let opens_heredoc = opener.match_indices("<<").any(|(i, _)| {
        opener[i + 2..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || matches!(c, '-' | '"' | '\'' | '_'))
    });
    if !opens_heredoc {
        return String::new();
    }
    format!(
        " (line {} opens a here-document after other words, which is not supported: start \
         the RUN with it, as in `RUN <<EOF` followed by the whole script, or use `COPY <<EOF \
         /file`)",
        index + 1
    )
}
