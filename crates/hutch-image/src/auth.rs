//! Registry credentials: given explicitly (`--registry-auth USER:PASS`) or found in a
//! Docker-style `config.json` (`{"auths": {"host:port": {"auth": base64("user:pass")}}}`,
//! or `username` and `password` fields), at `$DOCKER_CONFIG/config.json` or
//! `~/.docker/config.json` unless a path is given. Credential helpers (`credsStore`,
//! `credHelpers`) are not run.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use crate::error::{ImageError, Result};

/// A user name and password for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    /// The password or token; never printed.
    pub(crate) password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<hidden>")
            .finish()
    }
}

impl Credentials {
    /// Credentials from a user name and password.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            password: password.into(),
        }
    }

    /// The password or token (to hash it, say; never print it).
    pub fn secret(&self) -> &str {
        &self.password
    }

    /// Parses `USER:PASSWORD` (the password may contain `:`).
    pub fn parse(text: &str) -> Result<Self> {
        let (user, password) = text.split_once(':').ok_or(ImageError::InvalidCredentials)?;
        Ok(Self::new(user, password))
    }
}

/// One `auths` entry.
#[derive(Debug, Deserialize)]
struct AuthEntry {
    /// base64 of `user:password`.
    #[serde(default)]
    auth: Option<String>,
    /// Or the two fields apart.
    #[serde(default)]
    username: Option<String>,
    /// The password.
    #[serde(default)]
    password: Option<String>,
}

/// The part of `config.json` read here.
#[derive(Debug, Deserialize)]
struct DockerConfig {
    /// Credentials by registry.
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
}

/// The default `config.json`: `$DOCKER_CONFIG/config.json`, else `$HOME/.docker/config.json`.
fn default_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".docker/config.json"))
}

/// The registry host an `auths` key names (`https://host:port/v1/` → `host:port`).
fn key_host(key: &str) -> &str {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    rest.split('/').next().unwrap_or(rest)
}

/// Whether an `auths` key is for `registry` (Docker Hub answers to several names).
fn key_matches(key: &str, registry: &str) -> bool {
    const HUB: [&str; 4] = [
        "docker.io",
        "index.docker.io",
        "registry-1.docker.io",
        "registry.hub.docker.com",
    ];
    let host = key_host(key);
    host == registry || (HUB.contains(&host) && HUB.contains(&registry))
}

/// Credentials for `registry` from the `config.json` at `path` (or the default place);
/// `None` when the file or an entry for the registry is missing.
pub(crate) fn from_docker_config(
    path: Option<&Path>,
    registry: &str,
) -> Result<Option<Credentials>> {
    let Some(path) = path.map(Path::to_path_buf).or_else(default_path) else {
        return Ok(None);
    };
    let text = match fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ImageError::DockerConfig {
                path,
                reason: e.to_string(),
            })
        }
    };
    let bad = |reason: String| ImageError::DockerConfig {
        path: path.clone(),
        reason,
    };
    let config: DockerConfig = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
    let Some((key, entry)) = config.auths.iter().find(|(k, _)| key_matches(k, registry)) else {
        return Ok(None);
    };
    if let (Some(user), Some(password)) = (&entry.username, &entry.password) {
        return Ok(Some(Credentials::new(user, password)));
    }
    let Some(encoded) = &entry.auth else {
        return Ok(None);
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|e| bad(format!("`auth` of `{key}` is not base64: {e}")))?;
    let decoded =
        String::from_utf8(decoded).map_err(|_| bad(format!("`auth` of `{key}` is not UTF-8")))?;
    Credentials::parse(&decoded)
        .map(Some)
        .map_err(|_| bad(format!("`auth` of `{key}` is not base64 of USER:PASSWORD")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_user_and_password() {
        let c = Credentials::parse("alice:pa:ss").expect("ok");
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("alice", "pa:ss")
        );
        assert!(matches!(
            Credentials::parse("alice"),
            Err(ImageError::InvalidCredentials)
        ));
        assert!(
            !format!("{c:?}").contains("pa:ss"),
            "Debug hides the password"
        );
    }

    #[test]
    fn reads_docker_config_auths() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("bob:secret");
        fs::write(
            &path,
            format!(
                r#"{{"auths": {{"https://127.0.0.1:5000/v1/": {{"auth": "{auth}"}},
                   "https://index.docker.io/v1/": {{"username": "hub", "password": "pw"}}}},
                   "credsStore": "desktop"}}"#
            ),
        )
        .expect("write");
        let found = from_docker_config(Some(&path), "127.0.0.1:5000").expect("read");
        assert_eq!(found, Some(Credentials::new("bob", "secret")));
        let hub = from_docker_config(Some(&path), "docker.io").expect("read");
        assert_eq!(hub, Some(Credentials::new("hub", "pw")));
        assert_eq!(
            from_docker_config(Some(&path), "127.0.0.1:5001").expect("read"),
            None
        );
        assert_eq!(
            from_docker_config(Some(&dir.path().join("none.json")), "x").expect("missing"),
            None
        );
        fs::write(&path, b"{").expect("write");
        let err = from_docker_config(Some(&path), "x").expect_err("bad json");
        assert!(err.to_string().contains("config.json"), "{err}");
    }
}
