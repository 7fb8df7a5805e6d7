//! The patterns of `${NAME#pattern}`, `${NAME%pattern}` and `${NAME/pattern/replacement}`
//! (and their doubled forms), as Docker's Dockerfile frontend reads them: shell patterns, not
//! path globs — `*` matches any run of characters (`/` included), `?` any one character,
//! `[…]` one character of a class (`!` or `^` first negates it, `-` makes ranges), and
//! `\` makes the next character literal (the substitution keeps escapes in a pattern for
//! this). Anything else matches itself.
//!
//! A pattern is read into tokens, then turned into an anchored regular expression: for a
//! prefix, as it is; for a suffix, the value and the tokens are both reversed and the
//! prefix is trimmed (how BuildKit trims suffixes too). `#` and `%` take the shortest match
//! (lazy `*`), `##` and `%%` the longest. Not `glob.rs`'s `Glob`: a path glob's `*` and `?`
//! stop at `/`, its classes negate with `^` only, and an open `[` is an error; the regex
//! escaping of literals and class members is shared with it.

use regex::Regex;

use crate::glob::{push_class_member, push_literal};

/// One piece of a pattern.
#[derive(Debug, Clone, PartialEq)]
enum Token {
    /// A character matched as itself.
    Literal(char),
    /// `?`.
    AnyChar,
    /// `*`.
    AnyRun,
    /// `[…]`: the ranges (a single character is a range of one), negated or not.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// A pattern read from its text (`escape` is the Dockerfile's escape character).
#[derive(Debug, Clone)]
pub(crate) struct ShellPattern {
    tokens: Vec<Token>,
}

impl ShellPattern {
    /// Read `text`.
    pub(crate) fn parse(text: &str, escape: char) -> Result<Self, String> {
        let chars: Vec<char> = text.chars().collect();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            i += 1;
            match c {
                '*' => tokens.push(Token::AnyRun),
                '?' => tokens.push(Token::AnyChar),
                '[' => match class(&chars[i..], escape) {
                    Some((token, used)) => {
                        tokens.push(token);
                        i += used;
                    }
                    // No closing `]`: the `[` is itself, as in the shell.
                    None => tokens.push(Token::Literal('[')),
                },
                c if c == escape => match chars.get(i) {
                    Some(&next) => {
                        tokens.push(Token::Literal(next));
                        i += 1;
                    }
                    None => return Err(format!("`{escape}` at the end of a pattern")),
                },
                c => tokens.push(Token::Literal(c)),
            }
        }
        Ok(Self { tokens })
    }

    /// The same pattern read backwards (for matching a reversed value).
    fn reversed(&self) -> Self {
        let mut tokens = self.tokens.clone();
        tokens.reverse();
        Self { tokens }
    }

    /// An unanchored regular expression; `*` lazy unless `longest`.
    fn regex_text(&self, longest: bool) -> String {
        let mut out = String::from("(?s:");
        for token in &self.tokens {
            match token {
                Token::Literal(c) => push_literal(&mut out, *c),
                Token::AnyChar => out.push('.'),
                Token::AnyRun => out.push_str(if longest { ".*" } else { ".*?" }),
                Token::Class { negated, ranges } => {
                    out.push('[');
                    if *negated {
                        out.push('^');
                    }
                    for (lo, hi) in ranges {
                        push_class_member(&mut out, *lo);
                        if lo != hi {
                            out.push('-');
                            push_class_member(&mut out, *hi);
                        }
                    }
                    out.push(']');
                }
            }
        }
        out.push(')');
        out
    }

    fn compile(&self, anchored: bool, longest: bool) -> Result<Regex, String> {
        let text = format!(
            "{}{}",
            if anchored { "^" } else { "" },
            self.regex_text(longest)
        );
        regex::RegexBuilder::new(&text)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| format!("the pattern cannot be used: {e}"))
    }

    /// `value` without its shortest (or `longest`) prefix this pattern matches.
    pub(crate) fn trim_prefix(&self, value: &str, longest: bool) -> Result<String, String> {
        let re = self.compile(true, longest)?;
        Ok(match re.find(value) {
            Some(m) => value[m.end()..].to_owned(),
            None => value.to_owned(),
        })
    }

    /// `value` without its shortest (or `longest`) suffix this pattern matches.
    pub(crate) fn trim_suffix(&self, value: &str, longest: bool) -> Result<String, String> {
        let backwards: String = value.chars().rev().collect();
        let trimmed = self.reversed().trim_prefix(&backwards, longest)?;
        Ok(trimmed.chars().rev().collect())
    }

    /// `value` with the first (or `all`) longest matches of this pattern replaced by
    /// `replacement` (an empty pattern matches nothing, as in the shell).
    pub(crate) fn replace(
        &self,
        value: &str,
        replacement: &str,
        all: bool,
    ) -> Result<String, String> {
        if self.tokens.is_empty() {
            return Ok(value.to_owned());
        }
        let re = self.compile(false, true)?;
        let with = regex::NoExpand(replacement);
        Ok(if all {
            re.replace_all(value, with).into_owned()
        } else {
            re.replace(value, with).into_owned()
        })
    }
}

/// A class after its `[`: the token and how many characters it took (with the `]`);
/// `None` when it never closes.
fn class(chars: &[char], escape: char) -> Option<(Token, usize)> {
    let mut i = 0;
    let negated = matches!(chars.first(), Some('!' | '^'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let mut first = true;
    loop {
        let mut c = *chars.get(i)?;
        i += 1;
        // A `]` first is a member, as in the shell.
        if c == ']' && !first {
            return Some((Token::Class { negated, ranges }, i));
        }
        first = false;
        if c == escape {
            c = *chars.get(i)?;
            i += 1;
        }
        let mut hi = c;
        if chars.get(i) == Some(&'-') && chars.get(i + 1).is_some_and(|n| *n != ']') {
            hi = chars[i + 1];
            i += 2;
            if hi == escape {
                hi = *chars.get(i)?;
                i += 1;
            }
        }
        if hi < c {
            // A range that runs backwards matches nothing; keep its start.
            hi = c;
        }
        ranges.push((c, hi));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> ShellPattern {
        ShellPattern::parse(text, '\\').expect("pattern")
    }

    #[test]
    fn prefixes_shortest_and_longest() {
        let v = "abcd12345abc6789";
        assert_eq!(p("a*c").trim_prefix(v, false).expect("ok"), "d12345abc6789");
        assert_eq!(p("a*c").trim_prefix(v, true).expect("ok"), "6789");
        assert_eq!(p("x*").trim_prefix(v, true).expect("ok"), v, "no match");
        assert_eq!(
            p("*/").trim_prefix("/usr/local/bin", true).expect("ok"),
            "bin"
        );
        assert_eq!(
            p("*/").trim_prefix("/usr/local/bin", false).expect("ok"),
            "usr/local/bin"
        );
    }

    #[test]
    fn suffixes_shortest_and_longest() {
        assert_eq!(
            p(".*").trim_suffix("app.tar.gz", false).expect("ok"),
            "app.tar"
        );
        assert_eq!(p(".*").trim_suffix("app.tar.gz", true).expect("ok"), "app");
        assert_eq!(
            p("/*").trim_suffix("/usr/local/bin", false).expect("ok"),
            "/usr/local"
        );
        assert_eq!(p("[0-9]").trim_suffix("v12", false).expect("ok"), "v1");
        assert_eq!(
            p("-[!0-9]*").trim_suffix("1.2-rc", true).expect("ok"),
            "1.2"
        );
    }

    #[test]
    fn replacements_first_and_all() {
        assert_eq!(
            p("o").replace("foo boo", "0", false).expect("ok"),
            "f0o boo"
        );
        assert_eq!(p("o").replace("foo boo", "0", true).expect("ok"), "f00 b00");
        assert_eq!(
            p("b*o").replace("foo boo", "X", false).expect("ok"),
            "foo X",
            "longest"
        );
        assert_eq!(p("").replace("abc", "X", true).expect("ok"), "abc");
        assert_eq!(
            p(".").replace("1.2.3", "$1", true).expect("ok"),
            "1$12$13",
            "no $-groups"
        );
    }

    #[test]
    fn escapes_and_classes_match_literally() {
        assert_eq!(p("\\*").trim_prefix("*star", false).expect("ok"), "star");
        assert_eq!(p("\\*").trim_prefix("nostar", false).expect("ok"), "nostar");
        assert_eq!(p("[]]").trim_prefix("]x", false).expect("ok"), "x");
        assert_eq!(
            p("[a-").trim_prefix("[a-b", false).expect("ok"),
            "b",
            "an open class is literal"
        );
        assert_eq!(
            p("(.+)").trim_prefix("(.+)x", false).expect("ok"),
            "x",
            "regex syntax is literal"
        );
        assert!(ShellPattern::parse("ab\\", '\\').is_err());
    }
}
