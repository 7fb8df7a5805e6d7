//! Typed commands and results of fork and explore.
//!
//! - **fork**: `count` children of a sandbox. `disk` children start from a copy-on-write view
//!   of the parent's files (a hidden snapshot stacked under each child's empty upper layer)
//!   and a fresh agent; `live` children would also carry memory and running processes, which
//!   needs the `vm` backend.
//! - **explore**: one disk fork per candidate command, all run in parallel under one
//!   timeout, each scored; the best is kept as an independent sandbox and the others are
//!   destroyed.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::CoreError;
use crate::exec::Command;

/// Most children of one fork.
pub const MAX_FORK: u32 = 16;
/// Most commands of one explore.
pub const MAX_EXPLORE: usize = 16;
/// Longest explore timeout.
pub const MAX_EXPLORE_TIMEOUT: Duration = Duration::from_secs(3600);
/// Per-stream output kept for each explore outcome.
pub const EXPLORE_OUTPUT_CAP: usize = 1 << 20;
/// Longest score regex.
const MAX_REGEX_LEN: usize = 1024;

/// What a fork carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForkMode {
    /// Files only; fresh processes (every backend).
    #[default]
    Disk,
    /// Memory and running processes too (`vm`).
    Live,
}

/// A validated fork.
#[derive(Debug, Clone)]
pub struct ForkCommand {
    /// Children to create, 1 to [`MAX_FORK`].
    pub count: u32,
    /// What they carry.
    pub mode: ForkMode,
}

impl ForkCommand {
    /// Check the count.
    pub fn new(count: u32, mode: ForkMode) -> Result<Self, CoreError> {
        if !(1..=MAX_FORK).contains(&count) {
            return Err(CoreError::InvalidArgument(format!(
                "count must be between 1 and {MAX_FORK}, got {count}"
            )));
        }
        Ok(Self { count, mode })
    }
}

/// The regex that scores an explore outcome: its first capture group, parsed as a number.
#[derive(Debug, Clone)]
pub struct ScoreRegex(regex::Regex);

impl ScoreRegex {
    /// Compile `pattern`; it must have a capture group.
    pub fn parse(pattern: &str) -> Result<Self, CoreError> {
        if pattern.len() > MAX_REGEX_LEN {
            return Err(CoreError::InvalidArgument(format!(
                "score_regex must be at most {MAX_REGEX_LEN} bytes"
            )));
        }
        let re = regex::RegexBuilder::new(pattern)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| CoreError::InvalidArgument(format!("score_regex is not valid: {e}")))?;
        if re.captures_len() < 2 {
            return Err(CoreError::InvalidArgument(
                "score_regex needs a capture group around the score, e.g. \"score=([0-9.]+)\""
                    .into(),
            ));
        }
        Ok(Self(re))
    }

    /// The first capture group of the first match, as a finite number; 0 otherwise.
    pub fn score(&self, stdout: &str) -> f64 {
        self.0
            .captures(stdout)
            .and_then(|c| c.get(1))
            .and_then(|m| m.as_str().trim().parse::<f64>().ok())
            .filter(|v| v.is_finite())
            .unwrap_or(0.0)
    }
}

/// What to keep of an explore.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// The best-scoring child (ties: the lowest index).
    #[default]
    Winner,
}

/// A validated explore.
#[derive(Debug, Clone)]
pub struct ExploreCommand {
    /// One command per child (a string runs under `/bin/sh -c`).
    pub commands: Vec<Command>,
    /// Each command is killed after this long.
    pub timeout: Duration,
    /// How outcomes are scored (default: 1.0 for exit status 0, else 0).
    pub score_regex: Option<ScoreRegex>,
    /// Which child survives.
    pub keep: Keep,
}

impl ExploreCommand {
    /// Check the counts and the timeout.
    pub fn new(
        commands: Vec<Command>,
        timeout: Duration,
        score_regex: Option<ScoreRegex>,
        keep: Keep,
    ) -> Result<Self, CoreError> {
        if commands.is_empty() || commands.len() > MAX_EXPLORE {
            return Err(CoreError::InvalidArgument(format!(
                "commands must hold between 1 and {MAX_EXPLORE} commands, got {}",
                commands.len()
            )));
        }
        for (i, c) in commands.iter().enumerate() {
            let empty = match c {
                Command::Shell(s) => s.trim().is_empty(),
                Command::Argv(a) => a.first().is_none_or(|p| p.is_empty()),
            };
            if empty {
                return Err(CoreError::InvalidArgument(format!(
                    "commands[{i}] is empty"
                )));
            }
        }
        if timeout.is_zero() || timeout > MAX_EXPLORE_TIMEOUT {
            return Err(CoreError::InvalidArgument(format!(
                "timeout_seconds must be more than 0 and at most {}",
                MAX_EXPLORE_TIMEOUT.as_secs()
            )));
        }
        Ok(Self {
            commands,
            timeout,
            score_regex,
            keep,
        })
    }

    /// The score of one outcome.
    pub fn score(&self, exit_code: Option<i32>, stdout: &str) -> f64 {
        match &self.score_regex {
            Some(re) => re.score(stdout),
            None if exit_code == Some(0) => 1.0,
            None => 0.0,
        }
    }
}

/// How one explore command went.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Position of the command in the request.
    pub index: usize,
    /// The child it ran in (destroyed unless it is the winner).
    pub sandbox_id: crate::ids::SandboxId,
    /// Exit status (124 after the timeout); null if the command could not run.
    pub exit_code: Option<i32>,
    /// Killed by the timeout.
    pub timed_out: bool,
    /// Its stdout (lossy UTF-8, at most 1 MiB).
    pub stdout: String,
    /// Its stderr (lossy UTF-8, at most 1 MiB).
    pub stderr: String,
    /// Stdout was cut.
    pub stdout_truncated: bool,
    /// Stderr was cut.
    pub stderr_truncated: bool,
    /// Wall time in the sandbox.
    pub duration_ms: u64,
    /// Its score.
    pub score: f64,
    /// Whether its sandbox was kept.
    pub kept: bool,
    /// Why it could not run, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The result of an explore.
#[derive(Debug, Clone, Serialize)]
pub struct ExploreResult {
    /// The kept outcome.
    pub winner: Outcome,
    /// Every outcome, in request order.
    pub outcomes: Vec<Outcome>,
}

/// The index of the best score, ties going to the lowest index.
pub fn best(scores: &[f64]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, s) in scores.iter().enumerate() {
        if best.is_none_or(|b| *s > scores[b]) {
            best = Some(i);
        }
    }
    best
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_timeouts_are_checked() {
        assert!(ForkCommand::new(0, ForkMode::Disk).is_err());
        assert!(ForkCommand::new(17, ForkMode::Disk)
            .unwrap_err()
            .to_string()
            .contains("between 1 and 16"));
        assert!(ForkCommand::new(16, ForkMode::Live).is_ok());
        let cmds = |n: usize| vec![Command::Shell("true".into()); n];
        let t = Duration::from_secs(10);
        assert!(ExploreCommand::new(cmds(17), t, None, Keep::Winner)
            .unwrap_err()
            .to_string()
            .contains("got 17"));
        assert!(ExploreCommand::new(cmds(0), t, None, Keep::Winner).is_err());
        assert!(ExploreCommand::new(cmds(1), Duration::ZERO, None, Keep::Winner).is_err());
        assert!(
            ExploreCommand::new(vec![Command::Shell(" ".into())], t, None, Keep::Winner)
                .unwrap_err()
                .to_string()
                .contains("commands[0] is empty")
        );
    }

    #[test]
    fn scores_by_exit_status_or_regex() {
        let t = Duration::from_secs(1);
        let plain =
            ExploreCommand::new(vec![Command::Shell("x".into())], t, None, Keep::Winner).unwrap();
        assert_eq!(plain.score(Some(0), ""), 1.0);
        assert_eq!(plain.score(Some(1), ""), 0.0);
        assert_eq!(plain.score(None, ""), 0.0);
        let re = ScoreRegex::parse(r"score=([-0-9.e]+)").unwrap();
        assert_eq!(re.score("x\nscore=0.75\n"), 0.75);
        assert_eq!(re.score("score=abc"), 0.0);
        assert_eq!(re.score("nothing"), 0.0);
        assert!(ScoreRegex::parse("score=[0-9]+")
            .unwrap_err()
            .to_string()
            .contains("capture group"));
        assert!(ScoreRegex::parse("(").is_err());
    }

    #[test]
    fn the_best_score_wins_and_ties_go_to_the_lowest_index() {
        assert_eq!(best(&[0.0, 1.0, 1.0, 0.5]), Some(1));
        assert_eq!(best(&[0.0, 0.0]), Some(0));
        assert_eq!(best(&[-1.0, -0.5]), Some(1));
        assert_eq!(best(&[]), None);
    }
}
