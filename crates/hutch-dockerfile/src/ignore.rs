//! [`DockerIgnore`]: the rules of a `.dockerignore` file, applied as Docker applies them.
//!
//! Reading the file (moby's `ignorefile`): a UTF-8 byte-order mark on the first line is
//! dropped; a line that starts with `#` is a comment (only there: `  #x` is a pattern);
//! each line is trimmed and blank lines are skipped; a leading `!` makes an exception (the
//! rest trimmed again; a bare `!` is refused). The pattern is cleaned as `path.Clean` cleans
//! it and a leading `/` is dropped, so `/foo`, `./foo` and `foo/` all mean `foo`.
//!
//! Matching (moby's `patternmatcher`): a path relative to the context root, cleaned, is
//! excluded when the **last** rule that matches it is not an exception. A rule matches a
//! path when its glob ([`crate::glob`], with `**`) matches the path itself or any of its
//! parent directories, so `node_modules` excludes everything under it and `!node_modules/x`
//! after it brings one entry back.

use crate::glob::{Glob, GlobError};
use crate::paths;

/// A `.dockerignore` line that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum IgnoreError {
    /// A line that is just `!`.
    #[error(".dockerignore line {line}: `!` needs a pattern after it")]
    BareExclamation {
        /// 1-based line number.
        line: usize,
    },
    /// A pattern Go's `filepath.Match` would refuse.
    #[error(".dockerignore line {line}: bad pattern `{pattern}`: {reason}")]
    BadPattern {
        /// 1-based line number.
        line: usize,
        /// The pattern as cleaned.
        pattern: String,
        /// What is wrong with it.
        reason: GlobError,
    },
}

/// One `.dockerignore` rule.
#[derive(Debug, Clone)]
struct Rule {
    /// The cleaned pattern, without `!`.
    pattern: String,
    /// `!pattern`: matching paths are included again.
    exception: bool,
    glob: Glob,
}

/// The rules of one `.dockerignore` file (empty: nothing is excluded).
#[derive(Debug, Clone, Default)]
pub struct DockerIgnore {
    rules: Vec<Rule>,
}

impl DockerIgnore {
    /// No rules: every path is part of the context.
    pub fn none() -> Self {
        Self::default()
    }

    /// Parses the text of a `.dockerignore` file.
    pub fn parse(text: &str) -> Result<Self, IgnoreError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut rules = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            if raw.starts_with('#') {
                continue;
            }
            let mut pattern = raw.trim();
            if pattern.is_empty() {
                continue;
            }
            let exception = pattern.starts_with('!');
            if exception {
                pattern = pattern[1..].trim();
                if pattern.is_empty() {
                    return Err(IgnoreError::BareExclamation { line });
                }
            }
            let mut cleaned = paths::clean(pattern);
            if cleaned.len() > 1 && cleaned.starts_with('/') {
                cleaned.remove(0);
            }
            let glob = Glob::new(&cleaned, true).map_err(|reason| IgnoreError::BadPattern {
                line,
                pattern: cleaned.clone(),
                reason,
            })?;
            rules.push(Rule {
                pattern: cleaned,
                exception,
                glob,
            });
        }
        Ok(Self { rules })
    }

    /// Whether `path` (relative to the context root, `/`-separated) is left out of the
    /// context.
    pub fn excludes(&self, path: &str) -> bool {
        if self.rules.is_empty() {
            return false;
        }
        let path = paths::clean(path);
        if path == "." {
            return false;
        }
        let parents: Vec<usize> = path.match_indices('/').map(|(i, _)| i).collect();
        let mut excluded = false;
        for rule in &self.rules {
            // A rule can only change the verdict when it goes the other way.
            if rule.exception != excluded {
                continue;
            }
            let matched = rule.glob.matches(&path)
                || parents.iter().any(|end| rule.glob.matches(&path[..*end]));
            if matched {
                excluded = !rule.exception;
            }
        }
        excluded
    }

    /// Whether any rule is an exception (`!pattern`).
    pub fn has_exceptions(&self) -> bool {
        self.rules.iter().any(|r| r.exception)
    }

    /// Whether an exception could bring back something below the excluded directory `dir`,
    /// so that a walk must look inside it (as Docker's context walk does). Errs on the side
    /// of looking: a pattern whose literal start is compatible with `dir` counts.
    pub fn may_include_below(&self, dir: &str) -> bool {
        let dir_slash = format!("{}/", paths::clean(dir));
        self.rules.iter().filter(|r| r.exception).any(|rule| {
            let literal_end = rule
                .pattern
                .find(['*', '?', '[', '\\'])
                .unwrap_or(rule.pattern.len());
            let literal = &rule.pattern[..literal_end];
            literal.starts_with(&dir_slash) || dir_slash.starts_with(literal)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &str) -> DockerIgnore {
        DockerIgnore::parse(text).expect("valid .dockerignore")
    }

    #[test]
    fn a_pattern_excludes_the_path_and_everything_below_it() {
        let ignore = rules("node_modules\n*.log\n");
        assert!(ignore.excludes("node_modules"));
        assert!(ignore.excludes("node_modules/left-pad/index.js"));
        assert!(ignore.excludes("debug.log"));
        assert!(!ignore.excludes("logs/debug.log"), "`*` does not cross `/`");
        assert!(!ignore.excludes("src/main.rs"));
        assert!(!ignore.excludes("."), "the root itself is never excluded");
    }

    #[test]
    fn exceptions_bring_paths_back_and_later_lines_win() {
        let ignore = rules("*.md\n!README.md\n");
        assert!(ignore.excludes("CHANGELOG.md"));
        assert!(!ignore.excludes("README.md"));

        let later_wins = rules("!README.md\n*.md\n");
        assert!(later_wins.excludes("README.md"));

        let nested = rules("docs\n!docs/keep\ndocs/keep/secret\n");
        assert!(nested.excludes("docs/other"));
        assert!(!nested.excludes("docs/keep/file"));
        assert!(nested.excludes("docs/keep/secret"));
        assert!(nested.has_exceptions());
        assert!(nested.may_include_below("docs"));
        assert!(!nested.may_include_below("src"));
    }

    #[test]
    fn double_star_matches_at_any_depth() {
        let ignore = rules("**/*.pyc\n**/__pycache__\n");
        assert!(ignore.excludes("a.pyc"));
        assert!(ignore.excludes("pkg/sub/a.pyc"));
        assert!(ignore.excludes("pkg/__pycache__/x.cpython"));
        assert!(!ignore.excludes("pkg/a.py"));

        let under = rules("build/**\n!build/**/*.keep\n");
        assert!(ignore_all(&under, &["build/a", "build/x/y.o"]));
        assert!(!under.excludes("build/x/y.keep"));
    }

    fn ignore_all(ignore: &DockerIgnore, paths: &[&str]) -> bool {
        paths.iter().all(|p| ignore.excludes(p))
    }

    #[test]
    fn comments_blank_lines_and_leading_slashes() {
        let ignore = rules("\u{feff}# a comment\n\n  /secret.txt  \n./tmp/\n  #not-a-comment\n");
        assert!(ignore.excludes("secret.txt"));
        assert!(ignore.excludes("tmp/x"));
        assert!(ignore.excludes("#not-a-comment"));
        assert!(!ignore.excludes("# a comment"));
        assert!(ignore.excludes("./secret.txt"), "paths are cleaned too");
    }

    #[test]
    fn the_dockerfile_and_dockerignore_follow_the_rules_like_any_file() {
        let ignore = rules("Dockerfile\n.dockerignore\n");
        assert!(ignore.excludes("Dockerfile"));
        assert!(ignore.excludes(".dockerignore"));
    }

    #[test]
    fn bad_lines_are_refused_with_their_line_number() {
        let err = DockerIgnore::parse("ok\n!\n").expect_err("bare !");
        assert_eq!(
            err.to_string(),
            ".dockerignore line 2: `!` needs a pattern after it"
        );
        let err = DockerIgnore::parse("a\nb\n[x").expect_err("bad class");
        assert_eq!(
            err.to_string(),
            ".dockerignore line 3: bad pattern `[x`: unterminated character class"
        );
    }
}
