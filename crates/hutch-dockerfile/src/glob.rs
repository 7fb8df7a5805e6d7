//! Glob patterns as Docker reads them: Go's `filepath.Match` syntax, optionally with `**`.
//!
//! `*` matches any run of characters but `/`, `?` one character but `/`, `[…]` a character
//! class (negated by a leading `^`; `-` makes ranges; `\` escapes inside and outside a
//! class), anything else matches itself. With `**` enabled (`.dockerignore` patterns), `**`
//! matches any number of directories, none included: `**/x` matches `x` and `a/b/x`, and a
//! trailing `**` matches everything below. COPY sources use the plain syntax, where `**` is
//! just two `*`.
//!
//! Patterns are translated into an anchored regular expression, which is also how moby's
//! `patternmatcher` evaluates `.dockerignore` patterns. We do not use `globset`: it always
//! treats `{a,b}` as alternation, negates classes with `!` (Go's `!` is a member) and knows
//! `**` only as a whole path component, so patterns would match differently than in Docker.

use regex::Regex;

/// Why a pattern cannot be used (Go's `filepath.ErrBadPattern`, with the reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GlobError {
    /// `[` without its closing `]`.
    #[error("unterminated character class")]
    UnterminatedClass,
    /// A range such as `z-a`.
    #[error("character range `{0}-{1}` runs backwards")]
    BackwardsRange(char, char),
    /// A `\` at the very end.
    #[error("`\\` at the end of the pattern escapes nothing")]
    TrailingEscape,
    /// Longer than [`MAX_PATTERN_CHARS`], or too complex to compile.
    #[error("the pattern is too long (at most {MAX_PATTERN_CHARS} characters)")]
    TooLong,
}

/// The longest pattern accepted (Linux's `PATH_MAX`).
pub const MAX_PATTERN_CHARS: usize = 4096;

/// A compiled pattern.
#[derive(Debug, Clone)]
pub(crate) struct Glob {
    regex: Regex,
}

impl Glob {
    /// Compiles `pattern`; `double_star` turns on `**`.
    pub(crate) fn new(pattern: &str, double_star: bool) -> Result<Self, GlobError> {
        if pattern.chars().count() > MAX_PATTERN_CHARS {
            return Err(GlobError::TooLong);
        }
        let source = translate(pattern, double_star)?;
        // The translation only emits valid syntax; what can fail is the compiled size.
        let regex = Regex::new(&source).map_err(|_| GlobError::TooLong)?;
        Ok(Self { regex })
    }

    /// Whether the whole of `path` matches.
    pub(crate) fn matches(&self, path: &str) -> bool {
        self.regex.is_match(path)
    }
}

/// A `COPY --from` source with wildcards (`/app/*.so`, `/out/*/bin`), matched against
/// the paths of another stage's files: the engine lists [`PathPattern::base`] down
/// [`PathPattern::depth`] levels and keeps what [`PathPattern::matches`].
#[derive(Debug, Clone)]
pub struct PathPattern {
    base: String,
    depth: u32,
    glob: Glob,
}

impl PathPattern {
    /// The pattern of `source` (a path in the stage, `/` added in front when missing);
    /// `None` when it has no wildcard.
    pub fn parse(source: &str) -> Result<Option<Self>, GlobError> {
        if !has_wildcard(source) {
            return Ok(None);
        }
        let cleaned = crate::paths::clean(&format!("/{}", source.trim_start_matches('/')));
        let components: Vec<&str> = cleaned[1..].split('/').collect();
        let first = components
            .iter()
            .position(|c| has_wildcard(c))
            .unwrap_or(components.len());
        let fixed: Vec<String> = components[..first].iter().map(|c| unescape(c)).collect();
        Ok(Some(Self {
            base: format!("/{}", fixed.join("/")),
            depth: (components.len() - first) as u32,
            glob: Glob::new(&cleaned, false)?,
        }))
    }

    /// The deepest directory without wildcards (`/app` for `/app/*.so`).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// How many levels below [`PathPattern::base`] a match is.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Whether the absolute path `path` matches.
    pub fn matches(&self, path: &str) -> bool {
        let below = path
            .strip_prefix(self.base.trim_end_matches('/'))
            .map(|rest| rest.split('/').filter(|c| !c.is_empty()).count());
        below == Some(self.depth as usize) && self.glob.matches(path)
    }
}

/// Whether `text` has an unescaped wildcard (`*`, `?` or `[`).
pub(crate) fn has_wildcard(text: &str) -> bool {
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '*' | '?' | '[' => return true,
            _ => {}
        }
    }
    false
}

/// The pattern with its escapes removed, for patterns without wildcards.
pub(crate) fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn translate(pattern: &str, double_star: bool) -> Result<String, GlobError> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::from("^");
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '*' if double_star && chars.get(i + 1) == Some(&'*') => {
                i += 2;
                if chars.get(i) == Some(&'/') {
                    i += 1;
                }
                if i == chars.len() {
                    out.push_str(".*");
                } else {
                    out.push_str("(.*/)?");
                }
                continue;
            }
            '*' => out.push_str("[^/]*"),
            '?' => out.push_str("[^/]"),
            '[' => {
                let (class, next) = translate_class(&chars, i + 1)?;
                out.push_str(&class);
                i = next;
                continue;
            }
            '\\' => {
                let escaped = chars.get(i + 1).ok_or(GlobError::TrailingEscape)?;
                push_literal(&mut out, *escaped);
                i += 1;
            }
            other => push_literal(&mut out, other),
        }
        i += 1;
    }
    out.push('$');
    Ok(out)
}

/// Translates the class starting after its `[`; returns the regex class and the index after
/// its `]`.
fn translate_class(chars: &[char], mut i: usize) -> Result<(String, usize), GlobError> {
    let mut out = String::from("[");
    if chars.get(i) == Some(&'^') {
        out.push('^');
        i += 1;
    }
    let mut members = 0;
    loop {
        let c = *chars.get(i).ok_or(GlobError::UnterminatedClass)?;
        if c == ']' && members > 0 {
            out.push(']');
            return Ok((out, i + 1));
        }
        let (low, after) = class_char(chars, i)?;
        i = after;
        let mut high = low;
        if chars.get(i) == Some(&'-') && chars.get(i + 1).is_some_and(|c| *c != ']') {
            let (h, after) = class_char(chars, i + 1)?;
            if h < low {
                return Err(GlobError::BackwardsRange(low, h));
            }
            high = h;
            i = after;
        }
        push_class_member(&mut out, low);
        if high != low {
            out.push('-');
            push_class_member(&mut out, high);
        }
        members += 1;
    }
}

/// One (possibly escaped) character of a class.
fn class_char(chars: &[char], i: usize) -> Result<(char, usize), GlobError> {
    match chars.get(i) {
        Some('\\') => chars
            .get(i + 1)
            .map(|c| (*c, i + 2))
            .ok_or(GlobError::UnterminatedClass),
        Some(c) => Ok((*c, i + 1)),
        None => Err(GlobError::UnterminatedClass),
    }
}

/// `c` as a literal in a regular expression.
pub(crate) fn push_literal(out: &mut String, c: char) {
    let mut buf = [0u8; 4];
    out.push_str(&regex::escape(c.encode_utf8(&mut buf)));
}

/// `c` as a member of a regular-expression class.
pub(crate) fn push_class_member(out: &mut String, c: char) {
    if matches!(c, '\\' | ']' | '[' | '^' | '-' | '&' | '~') {
        out.push('\\');
    }
    out.push(c);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, path: &str) -> bool {
        Glob::new(pattern, false).expect("valid").matches(path)
    }

    fn d(pattern: &str, path: &str) -> bool {
        Glob::new(pattern, true).expect("valid").matches(path)
    }

    #[test]
    fn star_and_question_stop_at_slash() {
        assert!(m("*.txt", "a.txt"));
        assert!(m("*.txt", ".hidden.txt"));
        assert!(!m("*.txt", "dir/a.txt"));
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "a/c"));
        assert!(m("dir/*", "dir/x"));
        assert!(!m("dir/*", "dir/x/y"));
    }

    #[test]
    fn classes_negate_with_caret_and_escape() {
        assert!(m("[abc].go", "b.go"));
        assert!(!m("[abc].go", "d.go"));
        assert!(m("[^abc].go", "d.go"));
        assert!(!m("[^abc].go", "a.go"));
        assert!(m("[!x]", "!"), "`!` is a member, not a negation, in Go");
        assert!(!m("[!x]", "y"));
        assert!(m("[a-c]x", "bx"));
        assert!(m("[]a]", "]"));
        assert!(m("x\\*", "x*"));
        assert!(!m("x\\*", "xy"));
        assert!(m("{a,b}", "{a,b}"), "braces are literal");
        assert!(m("a.b", "a.b") && !m("a.b", "axb"));
    }

    #[test]
    fn double_star_spans_directories_only_when_enabled() {
        assert!(d("**/x", "x"));
        assert!(d("**/x", "a/b/x"));
        assert!(!d("**/x", "ax"));
        assert!(d("a/**", "a/b/c"));
        assert!(d("a/**/b", "a/b"));
        assert!(d("a/**/b", "a/x/y/b"));
        assert!(d("**", "anything/at/all"));
        assert!(!m("**/x", "a/b/x"), "without ** support, ** is two stars");
        assert!(m("**", "abc"));
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert_eq!(
            Glob::new("[abc", false).err(),
            Some(GlobError::UnterminatedClass)
        );
        assert_eq!(
            Glob::new("[z-a]", false).err(),
            Some(GlobError::BackwardsRange('z', 'a'))
        );
        assert_eq!(
            Glob::new("a\\", false).err(),
            Some(GlobError::TrailingEscape)
        );
        assert_eq!(
            Glob::new("[]", false).err(),
            Some(GlobError::UnterminatedClass)
        );
        let long = "*".repeat(MAX_PATTERN_CHARS + 1);
        assert_eq!(Glob::new(&long, false).err(), Some(GlobError::TooLong));
        assert!(Glob::new(&"a*".repeat(MAX_PATTERN_CHARS / 2), true).is_ok());
    }

    #[test]
    fn stage_path_patterns_list_from_their_fixed_prefix() {
        let p = PathPattern::parse("/app/*.so")
            .expect("ok")
            .expect("a pattern");
        assert_eq!((p.base(), p.depth()), ("/app", 1));
        assert!(p.matches("/app/libx.so"));
        assert!(!p.matches("/app/sub/liby.so"));
        assert!(!p.matches("/app/libx.so.1"));
        let p = PathPattern::parse("out/*/bin")
            .expect("ok")
            .expect("a pattern");
        assert_eq!((p.base(), p.depth()), ("/out", 2));
        assert!(p.matches("/out/linux/bin"));
        assert!(!p.matches("/out/linux"));
        let p = PathPattern::parse("/*").expect("ok").expect("a pattern");
        assert_eq!((p.base(), p.depth()), ("/", 1));
        assert!(p.matches("/etc"));
        assert!(PathPattern::parse("/app/lib.so").expect("ok").is_none());
        assert!(PathPattern::parse("/app/[").is_err());
    }

    #[test]
    fn wildcard_detection_respects_escapes() {
        assert!(has_wildcard("*.txt"));
        assert!(has_wildcard("a[bc]"));
        assert!(!has_wildcard("plain/file"));
        assert!(!has_wildcard("escaped\\*"));
        assert_eq!(unescape("escaped\\*"), "escaped*");
    }
}
