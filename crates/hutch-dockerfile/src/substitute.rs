//! Docker's variable substitution (the Dockerfile frontend's shell-word lexer).
//!
//! Applied by the planner to the arguments of `ADD`, `COPY`, `ENV`, `EXPOSE`, `FROM`,
//! `LABEL`, `STOPSIGNAL`, `USER`, `VOLUME`, `WORKDIR` (and `ARG` defaults), never to `RUN`,
//! `CMD` or `ENTRYPOINT`, whose shell does its own. In a word:
//!
//! - `$NAME` and `${NAME}` give the variable's value, or nothing when it is unset;
//! - `${NAME:-word}` gives `word` when `NAME` is unset or empty, `${NAME-word}` only when it
//!   is unset; `${NAME:+word}` gives `word` when `NAME` is set and not empty (else nothing),
//!   `${NAME+word}` when it is set; `${NAME:?message}` and `${NAME?message}` stop the build
//!   with `message` when it is unset (or empty, with `:`). `word` is itself substituted;
//! - `${NAME#pattern}` and `${NAME##pattern}` give the value without the shortest or longest
//!   prefix `pattern` matches, `${NAME%pattern}` and `${NAME%%pattern}` without such a
//!   suffix, `${NAME/pattern/word}` with the first longest match replaced by `word` and
//!   `${NAME//pattern/word}` with every one (`/word` may be left out: the match is
//!   deleted). Patterns are shell patterns (`*`, `?`, `[…]`, the escape character for a
//!   literal one: `shell_pattern.rs`), substituted first;
//! - the escape character (`\`, or `` ` `` by the `escape` directive) makes the next
//!   character literal, so `\$HOME` is `$HOME`;
//! - `'…'` is literal; in `"…"` variables are substituted and only `\"`, `\$` and `\\` are
//!   escapes. The quotes themselves are removed;
//! - a `$` not followed by a name or `{` is kept.

use crate::shell_pattern::ShellPattern;

/// The most bytes one substituted word may have (`ENV A=$B$B…` cannot blow up).
pub(crate) const MAX_WORD_BYTES: usize = 64 * 1024;
/// The most bytes a substituted here-document may have.
pub(crate) const MAX_HEREDOC_BYTES: usize = 1024 * 1024;

/// Expands one word; `lookup` gives a variable's value (`None`: unset).
pub(crate) fn expand(
    word: &str,
    escape: char,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut lexer = Lexer {
        chars: word.chars().collect(),
        at: 0,
        escape,
        lookup,
        raw: false,
        limit: MAX_WORD_BYTES,
        keep_escapes: false,
    };
    lexer.process(None)
}

/// Expands the variables of a here-document's content (`COPY <<EOF` with an unquoted
/// delimiter): only `$NAME` and `${…}` forms are processed; quotes and escapes are kept as
/// written, and an escaped `$` is not expanded.
pub(crate) fn expand_heredoc(
    text: &str,
    escape: char,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut lexer = Lexer {
        chars: text.chars().collect(),
        at: 0,
        escape,
        lookup,
        raw: true,
        limit: MAX_HEREDOC_BYTES,
        keep_escapes: false,
    };
    lexer.process(None)
}

struct Lexer<'a> {
    chars: Vec<char>,
    at: usize,
    escape: char,
    lookup: &'a dyn Fn(&str) -> Option<String>,
    /// Here-document mode: quotes and escapes are literal.
    raw: bool,
    /// The most bytes the result may have.
    limit: usize,
    /// Keep escapes (the escape character and what it escapes) in the result: a pattern
    /// being read, whose escapes make its wildcards literal.
    keep_escapes: bool,
}

impl Lexer<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.at += 1;
        Some(c)
    }

    /// Processes until the end, or until the unescaped `stop` character (consumed).
    fn process(&mut self, stop: Option<char>) -> Result<String, String> {
        let stops: &[char] = match &stop {
            Some(c) => std::slice::from_ref(c),
            None => &[],
        };
        self.process_until(stops).map(|(out, _)| out)
    }

    /// Processes until the end (`stops` empty), or until one of the unescaped `stops`
    /// (consumed, and returned).
    fn process_until(&mut self, stops: &[char]) -> Result<(String, Option<char>), String> {
        let mut out = String::new();
        loop {
            if out.len() > self.limit {
                return Err(format!(
                    "the value grows past {} bytes after substitution",
                    self.limit
                ));
            }
            let Some(c) = self.peek() else {
                return match stops.last() {
                    Some(s) => Err(format!("syntax error: missing `{s}`")),
                    None => Ok((out, None)),
                };
            };
            if stops.contains(&c) {
                self.at += 1;
                return Ok((out, Some(c)));
            }
            match c {
                '$' => {
                    self.at += 1;
                    out.push_str(&self.dollar()?);
                }
                c if self.raw => {
                    self.at += 1;
                    out.push(c);
                    if c == self.escape && self.peek() == Some('$') {
                        self.at += 1;
                        out.push('$');
                    }
                }
                '\'' => {
                    self.at += 1;
                    out.push_str(&self.single_quoted()?);
                }
                '"' => {
                    self.at += 1;
                    out.push_str(&self.double_quoted()?);
                }
                c if c == self.escape => {
                    self.at += 1;
                    if let Some(next) = self.next() {
                        if self.keep_escapes {
                            out.push(c);
                        }
                        out.push(next);
                    }
                }
                c => {
                    self.at += 1;
                    out.push(c);
                }
            }
        }
    }

    /// A pattern up to one of `stops`, its escapes kept for [`ShellPattern::parse`].
    fn pattern_until(&mut self, stops: &[char]) -> Result<(ShellPattern, Option<char>), String> {
        let keep = std::mem::replace(&mut self.keep_escapes, true);
        let read = self.process_until(stops);
        self.keep_escapes = keep;
        let (text, stop) = read?;
        Ok((ShellPattern::parse(&text, self.escape)?, stop))
    }

    /// After `${NAME` and one of `#`, `%`, `/`: the rest up to the `}`, applied to `value`.
    fn pattern_modifier(
        &mut self,
        modifier: char,
        value: Option<String>,
    ) -> Result<String, String> {
        let value = value.unwrap_or_default();
        let doubled = self.peek() == Some(modifier);
        if doubled {
            self.at += 1;
        }
        match modifier {
            '#' | '%' => {
                let (pattern, _) = self.pattern_until(&['}'])?;
                if modifier == '#' {
                    pattern.trim_prefix(&value, doubled)
                } else {
                    pattern.trim_suffix(&value, doubled)
                }
            }
            _ => {
                let (pattern, stop) = self.pattern_until(&['/', '}'])?;
                let replacement = match stop {
                    Some('/') => self.process(Some('}'))?,
                    _ => String::new(),
                };
                pattern.replace(&value, &replacement, doubled)
            }
        }
    }

    fn single_quoted(&mut self) -> Result<String, String> {
        let mut out = String::new();
        loop {
            match self.next() {
                Some('\'') => return Ok(out),
                Some(c) => out.push(c),
                None => {
                    return Err(
                        "unexpected end of statement while looking for matching single-quote"
                            .to_owned(),
                    )
                }
            }
        }
    }

    fn double_quoted(&mut self) -> Result<String, String> {
        let mut out = String::new();
        loop {
            match self.next() {
                Some('"') => return Ok(out),
                Some('$') => out.push_str(&self.dollar()?),
                Some(c) if c == self.escape => match self.peek() {
                    Some(next) if next == '"' || next == '$' || next == self.escape => {
                        self.at += 1;
                        out.push(next);
                    }
                    _ => out.push(c),
                },
                Some(c) => out.push(c),
                None => {
                    return Err(
                        "unexpected end of statement while looking for matching double-quote"
                            .to_owned(),
                    )
                }
            }
        }
    }

    /// After a `$`.
    fn dollar(&mut self) -> Result<String, String> {
        if self.peek() != Some('{') {
            let name = self.name();
            if name.is_empty() {
                return Ok("$".to_owned());
            }
            return Ok((self.lookup)(&name).unwrap_or_default());
        }
        self.at += 1;
        let name = self.name();
        if name.is_empty() {
            return Err("bad substitution: `${` must be followed by a variable name".to_owned());
        }
        let value = (self.lookup)(&name);
        let (colon, modifier) = match self.next() {
            Some('}') => return Ok(value.unwrap_or_default()),
            Some(':') => (true, self.next()),
            other => (false, other),
        };
        let Some(modifier) = modifier else {
            return Err(format!("syntax error: missing `}}` after `${{{name}`"));
        };
        if !colon && matches!(modifier, '#' | '%' | '/') {
            return self.pattern_modifier(modifier, value);
        }
        if !matches!(modifier, '-' | '+' | '?') {
            return Err(format!(
                "unsupported modifier `{}{modifier}` in `${{{name}…}}`",
                if colon { ":" } else { "" }
            ));
        }
        let word = self.process(Some('}'))?;
        // With `:`, an empty value counts as unset.
        let set = match &value {
            Some(v) => !(colon && v.is_empty()),
            None => false,
        };
        match modifier {
            '-' => Ok(if set { value.unwrap_or_default() } else { word }),
            '+' => Ok(if set { word } else { String::new() }),
            _ => {
                if set {
                    Ok(value.unwrap_or_default())
                } else if word.is_empty() {
                    Err(format!("{name}: is not allowed to be unset"))
                } else {
                    Err(format!("{name}: {word}"))
                }
            }
        }
    }

    /// A variable name: letters, digits and `_` (a name starting with a digit is a
    /// positional parameter, which is always unset here).
    fn name(&mut self) -> String {
        let mut name = String::new();
        if self.peek().is_some_and(|c| c.is_ascii_digit()) {
            while let Some(c) = self.peek().filter(char::is_ascii_digit) {
                self.at += 1;
                name.push(c);
            }
            return name;
        }
        while let Some(c) = self
            .peek()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        {
            self.at += 1;
            name.push(c);
        }
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(name: &str) -> Option<String> {
        match name {
            "NAME" => Some("world".to_owned()),
            "EMPTY" => Some(String::new()),
            "DIR" => Some("/srv/app".to_owned()),
            _ => None,
        }
    }

    fn x(word: &str) -> String {
        expand(word, '\\', &vars).expect("expands")
    }

    #[test]
    fn plain_and_braced_names() {
        assert_eq!(x("hello $NAME"), "hello world");
        assert_eq!(x("${NAME}s"), "worlds");
        assert_eq!(x("$DIR/bin"), "/srv/app/bin");
        assert_eq!(x("[$UNSET]"), "[]");
        assert_eq!(x("cost: $5"), "cost: ");
        assert_eq!(x("a$"), "a$");
        assert_eq!(x("$-x"), "$-x");
    }

    #[test]
    fn defaults_and_alternatives() {
        assert_eq!(x("${UNSET:-fallback}"), "fallback");
        assert_eq!(x("${EMPTY:-fallback}"), "fallback");
        assert_eq!(x("${EMPTY-fallback}"), "");
        assert_eq!(x("${UNSET-fallback}"), "fallback");
        assert_eq!(x("${NAME:-fallback}"), "world");
        assert_eq!(x("${NAME:+set}"), "set");
        assert_eq!(x("${EMPTY:+set}"), "");
        assert_eq!(x("${EMPTY+set}"), "set");
        assert_eq!(x("${UNSET:+set}"), "");
        assert_eq!(x("${UNSET:-$DIR/x}"), "/srv/app/x");
        assert_eq!(x("${UNSET:-${ALSO_UNSET:-deep}}"), "deep");
        assert_eq!(x("${UNSET:-a\\}b}"), "a}b");
    }

    #[test]
    fn prefixes_suffixes_and_replacements() {
        let vars = |name: &str| match name {
            "FILE" => Some("app-1.2.3.tar.gz".to_owned()),
            "PATHS" => Some("/usr/local/bin:/usr/bin".to_owned()),
            "STAR" => Some("a*b".to_owned()),
            _ => None,
        };
        let x = |word: &str| expand(word, '\\', &vars).expect("expands");
        assert_eq!(x("${FILE#*-}"), "1.2.3.tar.gz");
        assert_eq!(x("${FILE##*.}"), "gz");
        assert_eq!(x("${FILE%.*}"), "app-1.2.3.tar");
        assert_eq!(x("${FILE%%.*}"), "app-1");
        assert_eq!(x("${FILE/./_}"), "app-1_2.3.tar.gz");
        assert_eq!(x("${FILE//./_}"), "app-1_2_3_tar_gz");
        assert_eq!(
            x("${FILE/.tar.gz}"),
            "app-1.2.3",
            "no replacement: the match goes"
        );
        assert_eq!(x("${PATHS//:/ }"), "/usr/local/bin /usr/bin");
        assert_eq!(x("${PATHS%%:*}"), "/usr/local/bin");
        // The pattern is substituted first; an escaped `*` is a literal star.
        let y = |word: &str| {
            expand(word, '\\', &|n: &str| match n {
                "V" => Some("1.2.3".to_owned()),
                "SEP" => Some(".".to_owned()),
                other => vars(other),
            })
            .expect("expands")
        };
        assert_eq!(y("${V%$SEP*}"), "1.2");
        assert_eq!(x("${STAR/\\*/+}"), "a+b");
        assert_eq!(x("${STAR#a\\*}"), "b");
        assert_eq!(x("${UNSET#x}"), "", "unset is empty");
        assert_eq!(
            expand("`${STAR/`*/+}", '`', &vars).expect("backtick escape"),
            "${STAR/*/+}",
            "an escaped `$` is literal"
        );
        assert_eq!(
            expand("${STAR/`*/+}", '`', &vars).expect("backtick escape"),
            "a+b"
        );
        assert!(expand("${FILE#*", '\\', &vars).is_err(), "missing `}}`");
    }

    #[test]
    fn required_variables() {
        assert_eq!(
            expand("${UNSET:?set it}", '\\', &vars).expect_err("unset"),
            "UNSET: set it"
        );
        assert_eq!(expand("${EMPTY?}", '\\', &vars).expect("empty is set"), "");
        assert_eq!(
            expand("${EMPTY:?}", '\\', &vars).expect_err("empty"),
            "EMPTY: is not allowed to be unset"
        );
    }

    #[test]
    fn escapes_and_quotes() {
        assert_eq!(x("\\$NAME"), "$NAME");
        assert_eq!(x("\\${NAME}"), "${NAME}");
        assert_eq!(x("'$NAME'"), "$NAME");
        assert_eq!(x("\"$NAME and \\$NAME\""), "world and $NAME");
        assert_eq!(
            x("\"a\\b\""),
            "a\\b",
            "other escapes stay inside double quotes"
        );
        assert_eq!(x("a\\ b"), "a b");
        assert_eq!(
            expand("`$NAME", '`', &vars).expect("backtick escape"),
            "$NAME"
        );
    }

    #[test]
    fn malformed_substitutions_are_errors() {
        assert!(expand("${NAME", '\\', &vars).is_err());
        assert!(expand("${}", '\\', &vars).is_err());
        assert!(expand("${NAME:#x}", '\\', &vars)
            .expect_err("unsupported")
            .contains("unsupported modifier `:#`"));
        assert!(expand("'open", '\\', &vars).is_err());
        assert!(expand("\"open", '\\', &vars).is_err());
    }

    #[test]
    fn substitution_cannot_grow_without_bound() {
        let big = "x".repeat(40 * 1024);
        let lookup = |n: &str| (n == "BIG").then(|| big.clone());
        assert_eq!(
            expand("$BIG", '\\', &lookup).map(|v| v.len()),
            Ok(big.len())
        );
        let err = expand("$BIG$BIG", '\\', &lookup).expect_err("too large");
        assert_eq!(err, "the value grows past 65536 bytes after substitution");
    }

    #[test]
    fn heredocs_keep_quotes_and_escaped_dollars() {
        assert_eq!(
            expand_heredoc("say \"$NAME\" 'x' \\$NAME\n", '\\', &vars).expect("expands"),
            "say \"world\" 'x' \\$NAME\n"
        );
    }
}
