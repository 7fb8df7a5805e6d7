//! Query strings of the file routes (`?path=/a%20b&recursive=true`).
//!
//! Both sides use this one codec so a path with spaces, `%`, `&`, `#` or non-ASCII bytes
//! arrives exactly as sent. Encoding keeps the RFC 3986 unreserved characters and `/`, and
//! percent-encodes every other byte of the UTF-8 form. Decoding also accepts `+` as a space.

/// Percent-encode one query value.
pub fn encode_component(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for &b in value.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(hex_digit(b >> 4));
            out.push(hex_digit(b & 0x0f));
        }
    }
    out
}

/// Build a query string from pairs, encoding each value (keys are used as given).
pub fn build(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", encode_component(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Errors of [`parse`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// A `%` not followed by two hex digits.
    #[error("bad percent-encoding in query parameter {0:?}")]
    BadEscape(String),
    /// The decoded bytes are not UTF-8.
    #[error("query parameter {0:?} is not valid UTF-8")]
    NotUtf8(String),
}

/// Decode a query string into `(key, value)` pairs, in order.
pub fn parse(query: &str) -> Result<Vec<(String, String)>, QueryError> {
    query
        .split('&')
        .filter(|part| !part.is_empty())
        .map(|part| {
            let (k, v) = part.split_once('=').unwrap_or((part, ""));
            Ok((decode_component(k)?, decode_component(v)?))
        })
        .collect()
}

fn decode_component(s: &str) -> Result<String, QueryError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hi = bytes.get(i + 1).and_then(|&b| hex_value(b));
                let lo = bytes.get(i + 2).and_then(|&b| hex_value(b));
                match (hi, lo) {
                    (Some(hi), Some(lo)) => out.push(hi << 4 | lo),
                    _ => return Err(QueryError::BadEscape(s.to_string())),
                }
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| QueryError::NotUtf8(s.to_string()))
}

fn hex_digit(n: u8) -> char {
    char::from(b"0123456789ABCDEF"[usize::from(n & 0x0f)])
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_awkward_paths() {
        for path in [
            "/plain/path.txt",
            "/a b/c+d",
            "/100%/x&y=z#frag?q",
            "/ünï/cödé ✓",
            "/",
        ] {
            let q = build(&[("path", path), ("recursive", "true")]);
            let pairs = parse(&q).expect("decodes");
            assert_eq!(
                pairs,
                vec![
                    ("path".to_string(), path.to_string()),
                    ("recursive".into(), "true".into())
                ]
            );
        }
    }

    #[test]
    fn encodes_reserved_bytes() {
        assert_eq!(encode_component("/a b&c"), "/a%20b%26c");
    }

    #[test]
    fn rejects_bad_escapes_and_bad_utf8() {
        assert_eq!(parse("path=%zz"), Err(QueryError::BadEscape("%zz".into())));
        assert_eq!(parse("path=%4"), Err(QueryError::BadEscape("%4".into())));
        assert_eq!(parse("path=%ff"), Err(QueryError::NotUtf8("%ff".into())));
    }

    #[test]
    fn accepts_plus_and_bare_keys() {
        let pairs = parse("path=/a+b&recursive").expect("decodes");
        assert_eq!(pairs[0].1, "/a b");
        assert_eq!(pairs[1], ("recursive".into(), String::new()));
    }
}
