//! Object keys: what Hutch accepts as a key before it reaches a store.
//!
//! A key is 1 to 1024 bytes of visible ASCII (`!` to `~`: no spaces, no control
//! characters), segments separated by `/`, none of them empty, `.` or `..`, and it neither
//! starts nor ends with `/`. The same key is then safe as an S3 key and as a relative path
//! under [`FsObjectStore`](crate::FsObjectStore)'s directory. A list prefix follows the same
//! rules, except that it may be empty and may end with `/`.

use crate::ObjectStoreError;

/// The longest key S3 accepts (bytes of UTF-8; ours are ASCII).
pub const MAX_KEY_LEN: usize = 1024;

/// Check `key` (see the module docs).
pub fn check_key(key: &str) -> Result<(), ObjectStoreError> {
    if key.is_empty() {
        return Err(bad(key, "it is empty"));
    }
    if key.ends_with('/') {
        return Err(bad(key, "it ends with /"));
    }
    check_path(key)
}

/// Check a list prefix: empty, or a key that may end with `/`.
pub fn check_prefix(prefix: &str) -> Result<(), ObjectStoreError> {
    match prefix.strip_suffix('/') {
        _ if prefix.is_empty() => Ok(()),
        Some("") => Err(bad(prefix, "it starts with /")),
        Some(rest) => check_path(rest).map_err(|e| match e {
            ObjectStoreError::BadKey { reason, .. } => bad(prefix, &reason),
            other => other,
        }),
        None => check_path(prefix),
    }
}

fn check_path(key: &str) -> Result<(), ObjectStoreError> {
    if key.len() > MAX_KEY_LEN {
        return Err(bad(key, "it is longer than 1024 bytes"));
    }
    if let Some(c) = key.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(bad(
            key,
            &format!("it has {c:?}, which is not visible ASCII (! to ~)"),
        ));
    }
    if key.starts_with('/') {
        return Err(bad(key, "it starts with /"));
    }
    for segment in key.split('/') {
        match segment {
            "" => return Err(bad(key, "it has an empty segment (//)")),
            "." | ".." => return Err(bad(key, "it has a . or .. segment")),
            _ => {}
        }
    }
    Ok(())
}

fn bad(key: &str, reason: &str) -> ObjectStoreError {
    ObjectStoreError::BadKey {
        key: key.to_string(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(r: Result<(), ObjectStoreError>) -> String {
        match r {
            Err(ObjectStoreError::BadKey { reason, .. }) => reason,
            other => panic!("not a bad key: {other:?}"),
        }
    }

    #[test]
    fn accepts_the_keys_hutch_writes() {
        for key in [
            "snapshots/sbx-1/2026-12-02T18:00:00Z/disk.img",
            "templates/python@sha256:abc/rootfs.ext4",
            "a",
            "x.y/z_w-1+2=3,~!",
        ] {
            check_key(key).expect(key);
        }
    }

    #[test]
    fn refuses_keys_with_exact_reasons() {
        let cases = [
            ("", "it is empty"),
            ("/abs", "it starts with /"),
            ("dir/", "it ends with /"),
            ("a//b", "it has an empty segment (//)"),
            ("a/../b", "it has a . or .. segment"),
            ("..", "it has a . or .. segment"),
            ("./a", "it has a . or .. segment"),
            ("a b", "it has ' ', which is not visible ASCII (! to ~)"),
            ("a\nb", "it has '\\n', which is not visible ASCII (! to ~)"),
            (
                "caf\u{e9}",
                "it has '\u{e9}', which is not visible ASCII (! to ~)",
            ),
        ];
        for (key, want) in cases {
            assert_eq!(reason(check_key(key)), want, "key {key:?}");
        }
        assert_eq!(
            reason(check_key(&"k".repeat(1025))),
            "it is longer than 1024 bytes"
        );
        check_key(&"k".repeat(1024)).expect("1024 bytes is the limit");
    }

    #[test]
    fn prefixes_may_be_empty_or_end_with_a_slash() {
        for p in ["", "snapshots/", "snapshots/sbx", "a/b/"] {
            check_prefix(p).expect(p);
        }
        assert_eq!(reason(check_prefix("/")), "it starts with /");
        assert_eq!(reason(check_prefix("a//")), "it has an empty segment (//)");
        assert_eq!(reason(check_prefix("../")), "it has a . or .. segment");
    }

    #[test]
    fn the_message_names_the_key_and_the_reason() {
        let e = check_key("a/../b").expect_err("refused");
        assert_eq!(
            e.to_string(),
            "bad object key \"a/../b\": it has a . or .. segment"
        );
    }
}
