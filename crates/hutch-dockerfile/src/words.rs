//! Splitting instruction arguments into words and `name=value` pairs, as Docker's parser
//! does before any variable is substituted.

/// Removes line continuations from a shell-form command as written (`RUN`, `CMD`,
/// `ENTRYPOINT`, `HEALTHCHECK CMD`): the escape character followed by optional spaces or
/// tabs and a newline is dropped, and so are the comment lines and blank lines that follow
/// inside the continuation. The rest is kept byte for byte (the shell reads it).
pub(crate) fn join_continuations(raw: &str, escape: char) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut lines = raw.split('\n').peekable();
    while let Some(line) = lines.next() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        match continuation_body(line, escape) {
            Some(body) if lines.peek().is_some() => {
                out.push_str(body);
                while let Some(next) = lines.peek() {
                    let trimmed = next.trim_start_matches([' ', '\t', '\r']);
                    if trimmed.is_empty() || trimmed.starts_with('#') {
                        lines.next();
                    } else {
                        break;
                    }
                }
            }
            _ => {
                out.push_str(line);
                if lines.peek().is_some() {
                    out.push('\n');
                }
            }
        }
    }
    out
}

/// The line without its continuation marker, if it ends with one.
fn continuation_body(line: &str, escape: char) -> Option<&str> {
    let trimmed = line.trim_end_matches([' ', '\t']);
    trimmed.strip_suffix(escape)
}

/// Splits on whitespace outside quotes, keeping quotes and escapes in the words (Docker's
/// `parseWords`): `a="b c" d` is `a="b c"` and `d`. The escape character keeps the next
/// character in the word whatever it is; inside `'…'` nothing is escaped.
pub(crate) fn split_words(text: &str, escape: char) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match quote {
            None if c.is_whitespace() => {
                if quoted || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                quoted = false;
            }
            None if c == escape => {
                // An escape at the very end is dropped.
                if let Some(next) = chars.next() {
                    word.push(c);
                    word.push(next);
                }
            }
            None => {
                if c == '\'' || c == '"' {
                    quote = Some(c);
                    quoted = true;
                }
                word.push(c);
            }
            Some(q) => {
                if c == q {
                    quote = None;
                    word.push(c);
                } else if c == escape && q != '\'' {
                    word.push(c);
                    if let Some(next) = chars.next() {
                        word.push(next);
                    }
                } else {
                    word.push(c);
                }
            }
        }
    }
    if quoted || !word.is_empty() {
        words.push(word);
    }
    words
}

/// `ENV` and `LABEL` arguments: `k=v k2="a b"` pairs, or the legacy `key value with
/// spaces` (when the first word has no `=`). Keys and values are returned unexpanded.
pub(crate) fn name_values(
    text: &str,
    escape: char,
    instruction: &str,
) -> Result<Vec<(String, String)>, String> {
    let words = split_words(text, escape);
    let Some(first) = words.first() else {
        return Err(format!("{instruction} needs at least one argument"));
    };
    if !first.contains('=') {
        let trimmed = text.trim_start();
        let split_at = trimmed.find(char::is_whitespace);
        let Some(split_at) = split_at else {
            return Err(format!(
                "{instruction} needs a value: `{instruction} {first}=value` or \
                 `{instruction} {first} value`"
            ));
        };
        let (key, value) = trimmed.split_at(split_at);
        return Ok(vec![(key.to_owned(), value.trim().to_owned())]);
    }
    let mut pairs = Vec::with_capacity(words.len());
    for word in words {
        let Some((key, value)) = word.split_once('=') else {
            return Err(format!(
                "`{word}` has no `=`; each argument must be of the form name=value"
            ));
        };
        if key.is_empty() {
            return Err(format!("`{word}` has an empty name"));
        }
        pairs.push((key.to_owned(), value.to_owned()));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuations_join_lines_and_drop_comment_lines() {
        let raw = "apt-get update && \\\n  # a comment\n\n  apt-get install -y \\  \n    curl";
        assert_eq!(
            join_continuations(raw, '\\'),
            "apt-get update &&   apt-get install -y     curl"
        );
        assert_eq!(join_continuations("echo a `\n b", '`'), "echo a  b");
        assert_eq!(
            join_continuations("no continuation", '\\'),
            "no continuation"
        );
    }

    #[test]
    fn words_keep_quotes_and_split_outside_them() {
        assert_eq!(
            split_words(r#"A="x y" B='p q' C=\"z"#, '\\'),
            vec![r#"A="x y""#, "B='p q'", r#"C=\"z"#]
        );
        assert_eq!(split_words("  a   b  ", '\\'), vec!["a", "b"]);
        assert_eq!(split_words(r#"E="""#, '\\'), vec![r#"E="""#]);
    }

    #[test]
    fn name_values_in_both_forms() {
        assert_eq!(
            name_values(r#"A=1 B="two words""#, '\\', "ENV").expect("pairs"),
            vec![
                ("A".to_owned(), "1".to_owned()),
                ("B".to_owned(), r#""two words""#.to_owned())
            ]
        );
        assert_eq!(
            name_values("GREETING hello  big world", '\\', "ENV").expect("legacy"),
            vec![("GREETING".to_owned(), "hello  big world".to_owned())]
        );
        assert!(name_values("A=1 B", '\\', "ENV")
            .expect_err("mixed")
            .contains("`B` has no `=`"));
        assert!(name_values("ALONE", '\\', "ENV")
            .expect_err("no value")
            .contains("needs a value"));
    }
}
