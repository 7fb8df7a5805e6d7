//! Lexical path handling for `/`-separated paths, as Go's `path.Clean` and `path.Join` do
//! it (Docker cleans WORKDIR, COPY destinations and `.dockerignore` patterns this way).

/// The shortest path equivalent to `path` by lexical processing alone: repeated `/` become
/// one, `.` components go, `..` removes the component before it (a rooted path cannot climb
/// above `/`; a relative one keeps leading `..`). The empty path is `.`; a trailing `/` is
/// dropped (except for `/` itself).
pub(crate) fn clean(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|last| *last != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_owned(),
        (false, false) => joined,
    }
}

/// `base` and `path` joined and cleaned; an absolute `path` replaces `base`.
pub(crate) fn join(base: &str, path: &str) -> String {
    if path.starts_with('/') {
        clean(path)
    } else {
        clean(&format!("{base}/{path}"))
    }
}

/// The last component of a cleaned relative path (`a/b` → `b`; `.` → ``).
pub(crate) fn base_name(path: &str) -> &str {
    if path == "." {
        return "";
    }
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_follows_go_path_clean() {
        for (input, want) in [
            ("", "."),
            (".", "."),
            ("./foo", "foo"),
            ("foo/", "foo"),
            ("a//b/./c/", "a/b/c"),
            ("a/../b", "b"),
            ("../x", "../x"),
            ("a/../../x", "../x"),
            ("/", "/"),
            ("/..", "/"),
            ("/a/../..//b", "/b"),
        ] {
            assert_eq!(clean(input), want, "clean({input:?})");
        }
    }

    #[test]
    fn join_is_relative_to_base_unless_absolute() {
        assert_eq!(join("/app", "src"), "/app/src");
        assert_eq!(join("/app", "../etc"), "/etc");
        assert_eq!(join("/app", "/srv"), "/srv");
        assert_eq!(join("/", "."), "/");
    }

    #[test]
    fn base_name_of_relative_paths() {
        assert_eq!(base_name("a/b"), "b");
        assert_eq!(base_name("b"), "b");
        assert_eq!(base_name("."), "");
    }
}
