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
//! - the escape character (`\`, or `` ` `` by the `escape` directive) makes the next
//!   character literal, so `\$HOME` is `$HOME`;
//! - `'…'` is literal; in `"…"` variables are substituted and only `\"`, `\$` and `\\` are
//!   escapes. The quotes themselves are removed;
//! - a `$` not followed by a name or `{` is kept.

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
        let mut out = String::new();
        loop {
            if out.len() > self.limit {
                return Err(format!(
                    "the value grows past {} bytes after substitution",
                    self.limit
                ));
            }
            let Some(c) = self.peek() else {
                return match stop {
                    Some(s) => Err(format!("syntax error: missing `{s}`")),
                    None => Ok(out),
                };
            };
            if Some(c) == stop {
                self.at += 1;
                return Ok(out);
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
        assert!(expand("${NAME#x}", '\\', &vars)
            .expect_err("unsupported")
            .contains("unsupported modifier `#`"));
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
