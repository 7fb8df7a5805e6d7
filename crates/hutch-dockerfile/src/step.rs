//! [`Step`]: one evaluated Dockerfile instruction of a stage, with the configuration it
//! leaves behind, and the typed [`Instruction`]s the build engine acts on.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::{Healthcheck, StageConfig, DEFAULT_PATH};
use crate::context::ContextEntry;

/// One instruction of a stage (every instruction after its `FROM`), evaluated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// 1-based line of the instruction's first line in the Dockerfile.
    pub line: usize,
    /// The instruction as written (continuation lines and here-documents included), for
    /// logs.
    pub text: String,
    /// The instruction with its variables substituted and its forms resolved.
    pub instruction: Instruction,
    /// The stage's configuration after this step.
    pub config: StageConfig,
    /// The `ARG`s in scope for this step with their values (build arg, else default), in
    /// declaration order. They are part of a `RUN`'s environment but not of the image.
    pub args: Vec<(String, String)>,
}

impl Step {
    /// The instruction's keyword (`RUN`, `COPY`…), as in logs.
    pub fn keyword(&self) -> &'static str {
        self.instruction.keyword()
    }

    /// The environment a `RUN` here sees: the ARGs in scope, then `ENV` (which overrides an
    /// ARG of the same name), and `PATH` set to [`DEFAULT_PATH`] when neither sets it.
    pub fn environment(&self) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self
            .args
            .iter()
            .filter(|(name, _)| self.config.env_var(name).is_none())
            .cloned()
            .collect();
        env.extend(self.config.env.iter().cloned());
        if !env.iter().any(|(k, _)| k == "PATH") {
            env.push(("PATH".to_owned(), DEFAULT_PATH.to_owned()));
        }
        env
    }

    /// Whether the step changes the filesystem (and so has a snapshot): `RUN`, `COPY`,
    /// `ADD` and `WORKDIR` (which creates its directory). The others change only the
    /// configuration.
    pub fn changes_filesystem(&self) -> bool {
        matches!(
            self.instruction,
            Instruction::Run(_) | Instruction::Copy(_) | Instruction::Workdir { .. }
        )
    }
}

/// An evaluated instruction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Instruction {
    /// `RUN`.
    Run(RunStep),
    /// `COPY` or `ADD`.
    Copy(CopyStep),
    /// `ENV`: the variables set, in order.
    Env(Vec<(String, String)>),
    /// `ARG`: the names declared and the value each has here (`None`: declared, unset).
    Arg(Vec<(String, Option<String>)>),
    /// `WORKDIR`: the new working directory, absolute and cleaned (created if missing).
    Workdir {
        /// The directory.
        path: String,
    },
    /// `USER`.
    User {
        /// `name`, `uid`, `uid:gid`…
        user: String,
    },
    /// `LABEL` (and `MAINTAINER`, as the label `maintainer`).
    Label(BTreeMap<String, String>),
    /// `EXPOSE`: ports as `port/protocol`.
    Expose(Vec<String>),
    /// `SHELL`.
    Shell(Vec<String>),
    /// `CMD`: the argument vector (shell form wrapped in the shell).
    Cmd(Vec<String>),
    /// `ENTRYPOINT`: the argument vector (shell form wrapped in the shell). It also clears
    /// a `CMD` inherited from the base, as Docker does.
    Entrypoint(Vec<String>),
    /// `HEALTHCHECK`; `None` for `HEALTHCHECK NONE`.
    Healthcheck(Option<Healthcheck>),
    /// `VOLUME`: recorded; it has no effect on Hutch templates.
    Volume(Vec<String>),
    /// `STOPSIGNAL`: recorded.
    StopSignal(String),
}

impl Instruction {
    /// The stages and images the instruction reads files of (`COPY --from`, `RUN
    /// --mount=type=bind,from=…`).
    pub fn reads_from(&self) -> Vec<&CopyFrom> {
        match self {
            Self::Copy(copy) => copy.from.iter().collect(),
            Self::Run(run) => run
                .mounts
                .iter()
                .filter_map(|m| match m {
                    crate::mounts::RunMount::Bind(b) => b.from.as_ref(),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The keyword, as in logs.
    pub fn keyword(&self) -> &'static str {
        match self {
            Self::Run(_) => "RUN",
            Self::Copy(c) => match c.kind {
                CopyKind::Copy => "COPY",
                CopyKind::Add => "ADD",
            },
            Self::Env(_) => "ENV",
            Self::Arg(_) => "ARG",
            Self::Workdir { .. } => "WORKDIR",
            Self::User { .. } => "USER",
            Self::Label(_) => "LABEL",
            Self::Expose(_) => "EXPOSE",
            Self::Shell(_) => "SHELL",
            Self::Cmd(_) => "CMD",
            Self::Entrypoint(_) => "ENTRYPOINT",
            Self::Healthcheck(_) => "HEALTHCHECK",
            Self::Volume(_) => "VOLUME",
            Self::StopSignal(_) => "STOPSIGNAL",
        }
    }
}

/// A `RUN`: what to execute in the build sandbox, as the stage's user in its working
/// directory with [`Step::environment`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunStep {
    /// The argument vector: exec form as written; shell form (and a here-document script)
    /// wrapped in the stage's shell.
    pub argv: Vec<String>,
    /// A here-document that starts with `#!`: the engine writes `content` to `path`
    /// (mode 0755) for the duration of the step, and `argv` is `[path]`.
    pub script: Option<HeredocScript>,
    /// `--network`: `None` when not given (the build's policy applies).
    pub network: Option<RunNetwork>,
    /// `--mount`s, in order (left out of the cache key's JSON when there are none, so
    /// keys made before mounts existed still match).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<crate::mounts::RunMount>,
}

/// A `RUN <<EOF` here-document run as its own executable (it starts with `#!`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeredocScript {
    /// Where the engine puts it (`/dev/pipes/<delimiter>`, as BuildKit does).
    pub path: String,
    /// The script.
    pub content: String,
}

/// `RUN --network=…`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunNetwork {
    /// `--network=default`: the build's network policy.
    Default,
    /// `--network=none`: no network at all.
    None,
}

/// `COPY` or `ADD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyKind {
    /// `COPY`: files as they are.
    Copy,
    /// `ADD`: also URLs, and local tar archives (gzip, bzip2, xz or plain) are unpacked
    /// into the destination.
    Add,
}

/// A `COPY` or `ADD`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyStep {
    /// `COPY` or `ADD`.
    pub kind: CopyKind,
    /// `--from`: `None` reads the build context.
    pub from: Option<CopyFrom>,
    /// The sources, in order.
    pub sources: Vec<CopySource>,
    /// The destination, absolute (a relative one is joined to the working directory),
    /// with its trailing `/` kept when it had one (or was `.`).
    pub dest: String,
    /// The destination is a directory: it ends with `/` or there are several sources. A
    /// wildcard that matches several entries makes it a directory too (see
    /// [`CopyStep::target_path`]).
    pub dest_is_dir: bool,
    /// `--chown` as written after substitution (`user`, `uid:gid`…), resolved by the
    /// engine against the stage's `/etc/passwd` and `/etc/group`.
    pub chown: Option<String>,
    /// `--chmod`, octal.
    pub chmod: Option<u32>,
    /// `--link`: accepted; Hutch copies the same way with or without it.
    pub link: bool,
    /// `ADD --checksum=sha256:…` for a URL source: the engine verifies the download.
    pub checksum: Option<String>,
}

impl CopyStep {
    /// The path sources (what [`crate::Context::resolve`] takes when `from` is `None`), in
    /// order; URLs and here-documents are left out.
    pub fn path_sources(&self) -> Vec<String> {
        self.sources
            .iter()
            .filter_map(|s| match s {
                CopySource::Path(p) => Some(p.clone()),
                _ => None,
            })
            .collect()
    }

    /// The URL sources (`ADD <url>`), in order.
    pub fn url_sources(&self) -> Vec<String> {
        self.sources
            .iter()
            .filter_map(|s| match s {
                CopySource::Url(u) => Some(u.clone()),
                _ => None,
            })
            .collect()
    }

    /// Where `entry` lands in the stage's root, given how many source roots (named
    /// sources or wildcard matches) the step copies in all.
    ///
    /// A directory source lands its contents in `dest`; a file source lands at `dest`
    /// itself unless the destination is a directory (it ends with `/`, or several roots
    /// are copied), in which case it lands at `dest/<name>`. (When `dest` names an
    /// existing directory in the stage, Docker also copies a file into it: the engine
    /// checks that.)
    pub fn target_path(&self, entry: &ContextEntry, roots: usize) -> String {
        let dir = self.dest.trim_end_matches('/');
        let dir = if dir.is_empty() { "/" } else { dir };
        let as_dir = self.dest_is_dir || roots > 1;
        if entry.is_source_root && !as_dir && entry.kind != crate::context::EntryKind::Directory {
            return dir.to_owned();
        }
        if entry.dest_relative.is_empty() {
            dir.to_owned()
        } else if dir == "/" {
            format!("/{}", entry.dest_relative)
        } else {
            format!("{dir}/{}", entry.dest_relative)
        }
    }
}

/// Where a `COPY --from` reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyFrom {
    /// An earlier stage of this Dockerfile (by name or index).
    Stage {
        /// The stage's index among the Dockerfile's `FROM`s, 0-based.
        index: usize,
    },
    /// An image (pulled like a base image).
    Image {
        /// The reference as written after substitution.
        reference: String,
    },
}

/// One source of a `COPY`/`ADD`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopySource {
    /// A path (possibly with wildcards) in the context or in the `--from` stage or image,
    /// after substitution, as written.
    Path(String),
    /// `ADD https://…`: a file to download.
    Url(String),
    /// `COPY <<NAME`: a here-document; `name` is its file name in a directory
    /// destination.
    Inline {
        /// The delimiter, which is the file's name.
        name: String,
        /// The content (variables substituted when the delimiter is not quoted).
        content: String,
    },
}
