//! The documentation matches the repository: every repository file a page or a crate's docs
//! names exists, and no page still says that a shipped feature is missing.

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Top-level directories whose files the docs name by repository path.
const ROOTS: &[&str] = &[
    "docs/",
    "shared/",
    "sdk/",
    "scripts/",
    "crates/",
    "examples/",
];

/// Pages and sources whose text names repository files.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs"), root.join("crates"), root.join("sdk")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "node_modules" | "build" | "target" | "dist") {
                    dirs.push(path);
                }
            } else if (name.ends_with(".md") || name.ends_with(".rs"))
                && !path.ends_with("crates/hutch/tests/docs.rs")
            {
                out.push(path);
            }
        }
    }
    out
}

/// Repository paths named in `text` (`docs/api.md`, `shared/API.md`, …): a root directory
/// not preceded by a path character, up to the end of the path, kept when its last part has an
/// extension.
fn named_paths(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let path_char = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'-');
    let mut out = Vec::new();
    for root in ROOTS {
        let mut from = 0;
        while let Some(at) = text[from..].find(root) {
            let start = from + at;
            from = start + root.len();
            if start > 0
                && (path_char(bytes[start - 1])
                    || matches!(bytes[start - 1], b'<' | b'>' | b'{' | b'}' | b'$'))
            {
                continue;
            }
            let end = text[start..]
                .bytes()
                .position(|b| !path_char(b))
                .map_or(text.len(), |n| start + n);
            let path = text[start..end].trim_end_matches('.');
            let last = path.rsplit('/').next().unwrap_or("");
            if last.contains('.') && !last.contains('*') && !path.contains("..") {
                out.push(path.to_string());
            }
        }
    }
    out
}

#[test]
fn every_repository_file_the_docs_name_exists() {
    let root = repo_root();
    let mut missing = Vec::new();
    for doc in documents(&root) {
        let Ok(text) = std::fs::read_to_string(&doc) else {
            continue;
        };
        for path in named_paths(&text) {
            // shared/ is the team's folder beside the repository, not in it: never name it.
            if !root.join(&path).exists() {
                missing.push(format!(
                    "{} names {path}",
                    doc.strip_prefix(&root).unwrap_or(&doc).display()
                ));
            }
        }
    }
    assert!(missing.is_empty(), "missing files:\n{}", missing.join("\n"));
}

/// Phrases that said a feature was missing after it shipped.
#[test]
fn no_page_says_a_shipped_feature_is_missing() {
    let root = repo_root();
    let stale = [
        "does not implement yet",
        "`vm` is not available yet",
        "is a later addition",
        "Features waiting on the server",
    ];
    let mut found = Vec::new();
    let mut pages = vec![
        root.join("README.md"),
        root.join("sdk/python/README.md"),
        root.join("sdk/typescript/README.md"),
        root.join("docs/openapi.json"),
    ];
    pages.extend(
        std::fs::read_dir(root.join("docs"))
            .expect("docs/")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "md")),
    );
    for page in pages {
        let text = std::fs::read_to_string(&page).expect("read page");
        for phrase in stale {
            if text.contains(phrase) {
                found.push(format!("{}: {phrase:?}", page.display()));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn named_paths_finds_repository_paths_only() {
    let text = "see `shared/API.md`, docs/api.md. and <vm-dir>/shared/x.json or crates/hutch/ \
                or foo/docs/x.md";
    assert_eq!(named_paths(text), ["docs/api.md", "shared/API.md"]);
}
