//! Reading the host's apt configuration to find the Debian mirror it already uses, so that
//! `base` downloads from the same place (which may be the only reachable one).
//!
//! Looked at in order: `/etc/apt/sources.list.d/*.sources` (deb822), `/etc/apt/sources.list`,
//! `/etc/apt/sources.list.d/*.list` (one-line format). The first enabled `deb` entry whose
//! suites include the wanted suite exactly (so `bookworm`, not `bookworm-security`) wins.

use std::fs;
use std::path::{Path, PathBuf};

/// URI schemes debootstrap can download from.
const SCHEMES: &[&str] = &["http://", "https://", "ftp://", "file:/"];

/// The host's mirror for `suite`, reading apt's files under `root` (`/` on a real host).
pub(crate) fn host_mirror(root: &Path, suite: &str) -> Option<String> {
    let list_dir = root.join("etc/apt/sources.list.d");
    let in_dir = |ext: &str| -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = fs::read_dir(&list_dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .filter(|p| p.extension().is_some_and(|e| e == ext))
            .collect();
        files.sort();
        files
    };
    let read = |path: &Path| fs::read_to_string(path).ok();
    in_dir("sources")
        .iter()
        .find_map(|p| read(p).and_then(|text| mirror_from_deb822(&text, suite)))
        .or_else(|| {
            read(&root.join("etc/apt/sources.list")).and_then(|t| mirror_from_one_line(&t, suite))
        })
        .or_else(|| {
            in_dir("list")
                .iter()
                .find_map(|p| read(p).and_then(|text| mirror_from_one_line(&text, suite)))
        })
}

/// The first matching `URIs:` entry of a deb822 `.sources` file.
fn mirror_from_deb822(text: &str, suite: &str) -> Option<String> {
    let mut stanzas: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for line in text.lines() {
        if line.trim().is_empty() {
            stanzas.push(Vec::new());
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let stanza = stanzas
            .last_mut()
            .expect("starts with one stanza and only grows");
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = stanza.last_mut() {
                value.push(' ');
                value.push_str(line.trim());
            }
        } else if let Some((key, value)) = line.split_once(':') {
            stanza.push((key.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    stanzas
        .iter()
        .find_map(|stanza| match_stanza(stanza, suite))
}

/// The mirror of one deb822 stanza if it is an enabled `deb` source for `suite`.
fn match_stanza(stanza: &[(String, String)], suite: &str) -> Option<String> {
    let field = |name: &str| {
        stanza
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let has_word = |name: &str, word: &str| {
        field(name).is_some_and(|v| v.split_whitespace().any(|w| w == word))
    };
    if field("enabled").is_some_and(|v| v.eq_ignore_ascii_case("no"))
        || !has_word("types", "deb")
        || !has_word("suites", suite)
    {
        return None;
    }
    field("uris")?.split_whitespace().find_map(usable_uri)
}

/// The first matching entry of a one-line `sources.list` file
/// (`deb [options] URI SUITE COMPONENT…`).
fn mirror_from_one_line(text: &str, suite: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or("");
        let mut words = line.split_whitespace();
        if words.next() != Some("deb") {
            return None;
        }
        let mut uri = words.next()?;
        if uri.starts_with('[') {
            while !uri.ends_with(']') {
                uri = words.next()?;
            }
            uri = words.next()?;
        }
        if words.next() != Some(suite) {
            return None;
        }
        usable_uri(uri)
    })
}

/// `uri` without a trailing slash if debootstrap can use its scheme.
fn usable_uri(uri: &str) -> Option<String> {
    SCHEMES
        .iter()
        .any(|s| uri.starts_with(s))
        .then(|| uri.trim_end_matches('/').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEB822: &str = "\
Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main

Types: deb-src deb
URIs: http://mirror.example/debian/
Suites: bookworm
 bookworm-updates
Components: main
";

    #[test]
    fn parses_deb822_sources() {
        assert_eq!(
            mirror_from_deb822(DEB822, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(
            mirror_from_deb822(DEB822, "bookworm-updates").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(mirror_from_deb822(DEB822, "trixie"), None);
        let disabled = "Enabled: no\nTypes: deb\nURIs: http://x/debian\nSuites: bookworm\n";
        assert_eq!(mirror_from_deb822(disabled, "bookworm"), None);
    }

    #[test]
    fn parses_one_line_sources() {
        let text = "\
deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main
# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://ftp.example/debian/ bookworm main
";
        assert_eq!(
            mirror_from_one_line(text, "bookworm").as_deref(),
            Some("http://ftp.example/debian")
        );
        assert_eq!(
            mirror_from_one_line("deb cdrom:[x]/ bookworm main", "bookworm"),
            None
        );
    }

    #[test]
    fn prefers_deb822_then_sources_list() {
        let root = tempfile::tempdir().expect("tempdir");
        let apt = root.path().join("etc/apt");
        fs::create_dir_all(apt.join("sources.list.d")).expect("mkdir");
        assert_eq!(host_mirror(root.path(), "bookworm"), None);
        fs::write(
            apt.join("sources.list"),
            "deb http://one-line.example/debian bookworm main\n",
        )
        .expect("write");
        assert_eq!(
            host_mirror(root.path(), "bookworm").as_deref(),
            Some("http://one-line.example/debian")
        );
        fs::write(apt.join("sources.list.d/debian.sources"), DEB822).expect("write");
        assert_eq!(
            host_mirror(root.path(), "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
    }
}
