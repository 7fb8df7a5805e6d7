//! [`DockerfileError`]: why a Dockerfile cannot be planned. Every message a user reads
//! names the line (1-based) and, for an instruction, its text.

/// A Dockerfile that cannot be turned into a build plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DockerfileError {
    /// A word where an instruction should be (`FOO bar`).
    #[error("Dockerfile line {line}: unknown instruction \"{word}\"{hint}")]
    UnknownInstruction {
        /// 1-based line.
        line: usize,
        /// The word, as written.
        word: String,
        /// Empty, or a likely cause (a here-document the parser could not see).
        hint: String,
    },
    /// The parser refused the text (an unterminated quote or here-document, bad JSON…).
    #[error("Dockerfile line {line}: {message}")]
    Syntax {
        /// 1-based line (0 when the problem is the whole file, e.g. no `FROM`).
        line: usize,
        /// The parser's message.
        message: String,
    },
    /// An instruction that parses but cannot be used as written.
    #[error("Dockerfile line {line}: {reason}: {instruction}")]
    Invalid {
        /// 1-based line of the instruction's start.
        line: usize,
        /// The instruction's first line as written (shortened when long).
        instruction: String,
        /// What is wrong, and what to do instead when there is something.
        reason: String,
    },
    /// A Docker instruction or option that Hutch does not build.
    #[error("Dockerfile line {line}: {what} is not supported: {why}")]
    Unsupported {
        /// 1-based line.
        line: usize,
        /// The instruction or option (`ONBUILD`, `RUN --mount`).
        what: String,
        /// Why, and what to do instead.
        why: String,
    },
    /// The Dockerfile passes one of the planner's limits ([`crate::MAX_DOCKERFILE_BYTES`],
    /// [`crate::MAX_INSTRUCTIONS`]).
    #[error("the Dockerfile is too large: {what} (at most {limit})")]
    TooLarge {
        /// What is too large (`5000 instructions`).
        what: String,
        /// The limit.
        limit: usize,
    },
    /// The file has no `FROM`.
    #[error("the Dockerfile has no FROM instruction")]
    NoStage,
    /// `target` names no stage.
    #[error("target stage \"{target}\" is not in the Dockerfile (stages: {known})")]
    UnknownTarget {
        /// What was asked for.
        target: String,
        /// The stage names there are, comma-separated (or `none named`).
        known: String,
    },
}

impl DockerfileError {
    /// The 1-based line the error is about, when it is about one.
    pub fn line(&self) -> Option<usize> {
        match self {
            Self::UnknownInstruction { line, .. }
            | Self::Invalid { line, .. }
            | Self::Unsupported { line, .. } => Some(*line),
            Self::Syntax { line, .. } => (*line > 0).then_some(*line),
            Self::NoStage | Self::UnknownTarget { .. } | Self::TooLarge { .. } => None,
        }
    }
}

/// The first line of an instruction's text, cut at 120 characters, for messages.
pub(crate) fn short_text(text: &str) -> String {
    let first = text.lines().next().unwrap_or_default().trim_end();
    let first = first.strip_suffix('\\').unwrap_or(first).trim_end();
    let mut short: String = first.chars().take(120).collect();
    if short.len() < first.len() || text.lines().nth(1).is_some() {
        short.push_str(" …");
    }
    short
}
