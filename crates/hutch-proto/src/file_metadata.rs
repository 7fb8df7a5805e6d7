//! File metadata: short key/value pairs kept with a file as its `user.*` extended
//! attributes, set on upload and reported by stat and list ([`crate::FileEntry::metadata`]).
//!
//! A key `k` is the extended attribute `user.k` inside the sandbox, so a program there
//! sees (and may change) the same pairs with `getfattr`/`setfattr`. Keys are HTTP token
//! characters, lowercased (they travel as header names); values are printable ASCII (they
//! travel as header values). The host checks both before a write reaches the agent, and the
//! agent checks again; what a stat reports is only what fits these rules (an attribute set
//! out-of-band with a binary value or an odd name is not reported).

use std::collections::BTreeMap;

/// Pairs of one file, sorted by key.
pub type FileMetadata = BTreeMap<String, String>;

/// Prefix of the extended attributes that hold metadata.
pub const XATTR_PREFIX: &str = "user.";
/// Longest key, in bytes (the attribute name is `user.` + the key, at most 255 bytes).
pub const MAX_KEY_BYTES: usize = 200;
/// Longest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 4096;
/// Most pairs one upload may set.
pub const MAX_PAIRS: usize = 32;

/// Why a pair was refused, for the caller's 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    /// A key outside the rules.
    #[error(
        "metadata key {0:?} must be 1 to {MAX_KEY_BYTES} lowercase HTTP token characters \
         (letters, digits and !#$%&'*+-.^_`|~)"
    )]
    Key(String),
    /// A value outside the rules.
    #[error("metadata value of {0:?} must be at most {MAX_VALUE_BYTES} bytes of printable ASCII")]
    Value(String),
    /// Too many pairs.
    #[error("at most {MAX_PAIRS} metadata pairs per upload, got {0}")]
    TooMany(usize),
}

/// Whether `key` may name a pair (already lowercased).
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY_BYTES
        && key.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b)
        })
}

/// Whether `value` may be a pair's value.
pub fn valid_value(value: &str) -> bool {
    value.len() <= MAX_VALUE_BYTES && value.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// Checks every pair of one upload.
pub fn check(metadata: &FileMetadata) -> Result<(), MetadataError> {
    if metadata.len() > MAX_PAIRS {
        return Err(MetadataError::TooMany(metadata.len()));
    }
    for (key, value) in metadata {
        if !valid_key(key) {
            return Err(MetadataError::Key(key.clone()));
        }
        if !valid_value(value) {
            return Err(MetadataError::Value(key.clone()));
        }
    }
    Ok(())
}

/// The pairs whose keys start with `namespace` (such as `e2b.`), with it removed: how a
/// caller that keeps its own pairs under a prefix reads them back.
pub fn within(metadata: &FileMetadata, namespace: &str) -> FileMetadata {
    metadata
        .iter()
        .filter_map(|(k, v)| {
            let key = k.strip_prefix(namespace)?;
            (!key.is_empty()).then(|| (key.to_owned(), v.clone()))
        })
        .collect()
}

/// The pairs an upload names in headers `<prefix><key>: <value>` (`prefix` lowercase, such
/// as `x-hutch-meta-`), each key put under `namespace` (empty for none), all checked.
#[cfg(feature = "client")]
pub fn from_headers(
    headers: &http::HeaderMap,
    prefix: &str,
    namespace: &str,
) -> Result<FileMetadata, MetadataError> {
    let mut metadata = FileMetadata::new();
    for (name, value) in headers {
        // Header names are lowercase already: a key's case never reaches the file.
        let Some(key) = name.as_str().strip_prefix(prefix) else {
            continue;
        };
        let value = value
            .to_str()
            .map_err(|_| MetadataError::Value(key.to_owned()))?;
        metadata.insert(format!("{namespace}{key}"), value.to_owned());
    }
    check(&metadata)?;
    Ok(metadata)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_lowercase_tokens_and_values_printable_ascii() {
        assert!(valid_key("owner"));
        assert!(valid_key("e2b.run-id_2"));
        assert!(!valid_key(""));
        assert!(!valid_key("Owner"));
        assert!(!valid_key("a b"));
        assert!(!valid_key("a/b"));
        assert!(!valid_key(&"k".repeat(MAX_KEY_BYTES + 1)));
        assert!(valid_value(""));
        assert!(valid_value("hello, world ~"));
        assert!(!valid_value("tab\there"));
        assert!(!valid_value("é"));
        assert!(!valid_value(&"v".repeat(MAX_VALUE_BYTES + 1)));
    }

    #[cfg(feature = "client")]
    #[test]
    fn headers_with_the_prefix_become_namespaced_pairs() {
        let mut headers = http::HeaderMap::new();
        headers.insert("x-metadata-Owner", "agent".parse().expect("value"));
        headers.insert("x-other", "ignored".parse().expect("value"));
        let pairs = from_headers(&headers, "x-metadata-", "e2b.").expect("pairs");
        assert_eq!(pairs.len(), 1);
        assert_eq!(pairs["e2b.owner"], "agent");
        headers.insert(
            "x-metadata-bin",
            http::HeaderValue::from_bytes(b"\xff").expect("value"),
        );
        assert_eq!(
            from_headers(&headers, "x-metadata-", ""),
            Err(MetadataError::Value("bin".into()))
        );
    }

    #[test]
    fn uploads_are_checked_whole_and_namespaces_read_back() {
        let mut pairs: FileMetadata = (0..MAX_PAIRS)
            .map(|i| (format!("k{i}"), "v".into()))
            .collect();
        assert_eq!(check(&pairs), Ok(()));
        pairs.insert("one-more".into(), "v".into());
        assert_eq!(check(&pairs), Err(MetadataError::TooMany(MAX_PAIRS + 1)));
        let pairs: FileMetadata = [("e2b.a", "1"), ("e2b.", "x"), ("b", "2")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(
            within(&pairs, "e2b."),
            [("a".to_owned(), "1".to_owned())].into_iter().collect()
        );
    }
}
