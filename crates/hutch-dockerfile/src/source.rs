//! The Dockerfile's text around the parser's spans: the line an instruction starts on,
//! its text as written, and the here-document delimiters the parser does not keep.

use parse_dockerfile::{
    Command, Flag, HealthcheckArguments, Instruction as Parsed, JsonOrStringArray, Source,
};

use crate::error::{short_text, DockerfileError};

/// The text the parser saw (a leading byte-order mark removed, as the parser does).
pub(crate) struct SourceText<'a> {
    pub(crate) text: &'a str,
    /// The `escape` directive's character (`\` by default).
    pub(crate) escape: char,
    /// Byte offset where each line starts.
    line_starts: Vec<usize>,
}

impl<'a> SourceText<'a> {
    pub(crate) fn new(dockerfile: &'a str) -> Self {
        let text = dockerfile.strip_prefix('\u{feff}').unwrap_or(dockerfile);
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Self {
            text,
            escape: '\\',
            line_starts,
        }
    }

    /// The 1-based line of a byte offset.
    pub(crate) fn line_of(&self, offset: usize) -> usize {
        self.line_starts.partition_point(|start| *start <= offset)
    }

    /// The instruction's first line and its text as written, from its keyword to the end of
    /// the last line it uses (continuations and here-documents included).
    pub(crate) fn locate(&self, instruction: &Parsed<'_>) -> Located {
        let start = keyword_start(instruction);
        let end = span_end(instruction).max(start);
        let line_end = self.text[end..]
            .find('\n')
            .map_or(self.text.len(), |i| end + i);
        let text = self.text[start..line_end].trim_end().to_owned();
        Located {
            line: self.line_of(start),
            text,
        }
    }
}

/// Where an instruction is.
#[derive(Debug, Clone)]
pub(crate) struct Located {
    /// 1-based first line.
    pub(crate) line: usize,
    /// As written.
    pub(crate) text: String,
}

impl Located {
    /// An [`DockerfileError::Invalid`] about this instruction.
    pub(crate) fn invalid(&self, reason: impl Into<String>) -> DockerfileError {
        DockerfileError::Invalid {
            line: self.line,
            instruction: short_text(&self.text),
            reason: reason.into(),
        }
    }

    /// An [`DockerfileError::Unsupported`] about this instruction.
    pub(crate) fn unsupported(&self, what: &str, why: &str) -> DockerfileError {
        DockerfileError::Unsupported {
            line: self.line,
            what: what.to_owned(),
            why: why.to_owned(),
        }
    }

    /// The delimiters of the here-documents opened on the instruction's first line
    /// (`<<EOF`, `<<-"END"` → `EOF`, `END`), in order.
    pub(crate) fn heredoc_names(&self) -> Vec<String> {
        let first = self.text.lines().next().unwrap_or_default();
        first
            .split_whitespace()
            .filter_map(|word| word.strip_prefix("<<"))
            .map(|rest| rest.strip_prefix('-').unwrap_or(rest))
            .map(|rest| rest.replace(['"', '\''], ""))
            .filter(|name| !name.is_empty())
            .collect()
    }
}

fn keyword_start(instruction: &Parsed<'_>) -> usize {
    match instruction {
        Parsed::Add(i) => i.add.span.start,
        Parsed::Arg(i) => i.arg.span.start,
        Parsed::Cmd(i) => i.cmd.span.start,
        Parsed::Copy(i) => i.copy.span.start,
        Parsed::Entrypoint(i) => i.entrypoint.span.start,
        Parsed::Env(i) => i.env.span.start,
        Parsed::Expose(i) => i.expose.span.start,
        Parsed::From(i) => i.from.span.start,
        Parsed::Healthcheck(i) => i.healthcheck.span.start,
        Parsed::Label(i) => i.label.span.start,
        Parsed::Maintainer(i) => i.maintainer.span.start,
        Parsed::Onbuild(i) => i.onbuild.span.start,
        Parsed::Run(i) => i.run.span.start,
        Parsed::Shell(i) => i.shell.span.start,
        Parsed::Stopsignal(i) => i.stopsignal.span.start,
        Parsed::User(i) => i.user.span.start,
        Parsed::Volume(i) => i.volume.span.start,
        Parsed::Workdir(i) => i.workdir.span.start,
        _ => 0,
    }
}

/// The largest end offset among the instruction's parts.
fn span_end(instruction: &Parsed<'_>) -> usize {
    let flags = |options: &[Flag<'_>]| options.iter().map(|f| f.span().end).max().unwrap_or(0);
    let command = |c: &Command<'_>| match c {
        Command::Exec(e) => e.span.end,
        Command::Shell(s) => s.span.end,
        _ => 0,
    };
    let sources = |src: &[Source<'_>]| {
        src.iter()
            .map(|s| match s {
                Source::Path(p) => p.span.end,
                Source::HereDoc(h) => h.span.end,
                _ => 0,
            })
            .max()
            .unwrap_or(0)
    };
    match instruction {
        Parsed::Add(i) => i.dest.span.end.max(sources(&i.src)).max(flags(&i.options)),
        Parsed::Copy(i) => i.dest.span.end.max(sources(&i.src)).max(flags(&i.options)),
        Parsed::Arg(i) => i.arguments.span.end,
        Parsed::Env(i) => i.arguments.span.end,
        Parsed::Label(i) => i.arguments.span.end,
        Parsed::Stopsignal(i) => i.arguments.span.end,
        Parsed::User(i) => i.arguments.span.end,
        Parsed::Workdir(i) => i.arguments.span.end,
        Parsed::Maintainer(i) => i.name.span.end,
        Parsed::Cmd(i) => command(&i.arguments),
        Parsed::Entrypoint(i) => command(&i.arguments),
        Parsed::Expose(i) => i.arguments.iter().map(|a| a.span.end).max().unwrap_or(0),
        Parsed::From(i) => i
            .as_
            .as_ref()
            .map_or(i.image.span.end, |(_, name)| name.span.end),
        Parsed::Healthcheck(i) => match &i.arguments {
            HealthcheckArguments::Cmd { arguments, .. } => command(arguments),
            HealthcheckArguments::None { none, .. } => none.span.end,
            _ => i.healthcheck.span.end,
        },
        Parsed::Onbuild(i) => span_end(&i.instruction),
        Parsed::Run(i) => i
            .here_docs
            .iter()
            .map(|h| h.span.end)
            .max()
            .unwrap_or(0)
            .max(command(&i.arguments))
            .max(flags(&i.options)),
        Parsed::Shell(i) => i.arguments.iter().map(|a| a.span.end).max().unwrap_or(0),
        Parsed::Volume(i) => match &i.arguments {
            JsonOrStringArray::Json(j) => j.span.end,
            JsonOrStringArray::String(s) => s.iter().map(|a| a.span.end).max().unwrap_or(0),
        },
        _ => 0,
    }
}
