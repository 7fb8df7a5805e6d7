//! Registry credentials: given explicitly (`--registry-auth USER:PASS`) or found in a
//! Docker-style `config.json` (`{"auths": {"host:port": {"auth": base64("user:pass")}}}`,
//! or `username` and `password` fields), at `$DOCKER_CONFIG/config.json` or
//! `~/.docker/config.json` unless a path is given — or from the credential helper that file
//! names for the registry (`credHelpers`, else `credsStore` when `auths` has no inline
//! credentials for it): `docker-credential-<name> get` on `PATH`, given the registry on its
//! standard input, answering `{"Username", "Secret"}`, as Docker runs it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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
    /// A credential helper by registry (`{"ghcr.io": "gh"}` runs `docker-credential-gh`).
    #[serde(default, rename = "credHelpers")]
    cred_helpers: BTreeMap<String, String>,
    /// The helper for every other registry (`desktop`, `pass`, `secretservice`, `ecr-login`).
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
}

/// How long a credential helper may take (one that asks a keychain or a cloud's metadata
/// service answers in well under a second).
const HELPER_TIMEOUT: Duration = Duration::from_secs(30);

/// What `docker-credential-<name> get` prints.
#[derive(Debug, Deserialize)]
struct HelperAnswer {
    #[serde(rename = "Username")]
    username: String,
    #[serde(rename = "Secret")]
    secret: String,
}

/// The name a registry is given to its helper: Docker Hub's as Docker gives it.
fn helper_server(registry: &str) -> String {
    if key_matches("docker.io", registry) {
        "https://index.docker.io/v1/".to_owned()
    } else {
        registry.to_owned()
    }
}

/// Where `docker-credential-<name>` is in `search` (a `PATH`; `None`: `$PATH`).
fn find_helper(name: &str, search: Option<OsString>) -> Option<PathBuf> {
    let program = format!("docker-credential-{name}");
    let search = search
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_default();
    std::env::split_paths(&search)
        .map(|dir| dir.join(&program))
        .find(|p| p.is_file())
}

/// Run credential helper `name` for `registry`, looking for `docker-credential-<name>` in
/// `search` (a `PATH`); `None` when it has no credentials for it.
fn from_helper(
    name: &str,
    registry: &str,
    search: Option<OsString>,
) -> Result<Option<Credentials>> {
    let failed = |reason: String| ImageError::CredentialHelper {
        helper: format!("docker-credential-{name}"),
        registry: registry.to_owned(),
        reason,
    };
    if name.is_empty() || name.contains('/') {
        return Err(failed("not a helper name".into()));
    }
    let Some(path) = find_helper(name, search) else {
        return Err(failed(format!("`docker-credential-{name}` is not on PATH")));
    };
    let input = helper_server(registry);
    let out = hutch_host_command::run_within(
        Command::new(&path).arg("get"),
        Some(input.as_bytes()),
        HELPER_TIMEOUT,
    )
    .map_err(|e| failed(e.to_string()))?;
    if !out.success() {
        let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        // Every helper says so, in these words, for a registry it holds nothing for.
        if said.contains("credentials not found") {
            return Ok(None);
        }
        let err = out.stderr_text();
        return Err(failed(format!(
            "{}: {}",
            out.how(),
            if said.is_empty() { err } else { said }
        )));
    }
    let answer: HelperAnswer = serde_json::from_slice(&out.stdout).map_err(|e| {
        failed(format!(
            "its answer is not {{\"Username\", \"Secret\"}}: {e}"
        ))
    })?;
    if answer.username == "<token>" {
        return Err(failed(
            "it gave an identity token (OAuth refresh token), which Hutch cannot use yet; \
             give the registry's user and password or token with --registry-auth"
                .into(),
        ));
    }
    Ok(Some(Credentials::new(answer.username, answer.secret)))
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

/// Credentials for `registry` from the `config.json` at `path` (or the default place), or
/// the credential helper it names; `None` when the file, an entry for the registry and a
/// helper's credentials for it are missing.
pub(crate) fn from_docker_config(
    path: Option<&Path>,
    registry: &str,
) -> Result<Option<Credentials>> {
    from_docker_config_searching(path, registry, None)
}

/// [`from_docker_config`], with helpers looked for in `search` (a `PATH`; `None`: `$PATH`).
fn from_docker_config_searching(
    path: Option<&Path>,
    registry: &str,
    search: Option<OsString>,
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
    // A helper named for this registry wins, as in Docker.
    if let Some((_, helper)) = config
        .cred_helpers
        .iter()
        .find(|(k, _)| key_matches(k, registry))
    {
        return from_helper(helper, registry, search);
    }
    let entry = config.auths.iter().find(|(k, _)| key_matches(k, registry));
    let inline = entry.filter(|(_, e)| {
        e.auth.as_deref().is_some_and(|a| !a.trim().is_empty())
            || (e.username.is_some() && e.password.is_some())
    });
    let Some((key, entry)) = inline else {
        // No inline credentials (an empty `auths` entry is the store's placeholder).
        return match &config.creds_store {
            // A `config.json` copied from a desktop names a store this host lacks: public
            // images still pull (Docker would fail every pull instead).
            Some(store) if find_helper(store, search.clone()).is_none() => {
                tracing::warn!(
                    store,
                    registry,
                    "config.json's credsStore helper is not on PATH; pulling anonymously"
                );
                Ok(None)
            }
            Some(store) => from_helper(store, registry, search),
            None => Ok(None),
        };
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

    /// A `docker-credential-<name>` in `dir` that answers `answer` for registry `holds` and
    /// "credentials not found" for any other, recording what it was asked in `dir/asked`.
    fn helper(dir: &Path, name: &str, holds: &str, answer: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(format!("docker-credential-{name}"));
        fs::write(
            &path,
            format!(
                "#!/bin/sh\nread server\necho \"$1 $server\" >> {asked}\n\
                 if [ \"$server\" = '{holds}' ]; then echo '{answer}'; exit 0; fi\n\
                 echo 'credentials not found in native keychain'; exit 1\n",
                asked = dir.join("asked").display()
            ),
        )
        .expect("write helper");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    #[test]
    fn runs_the_credential_helper_the_config_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        fs::create_dir(&bin).expect("mkdir");
        helper(
            &bin,
            "team",
            "10.0.0.5:5000",
            r#"{"ServerURL":"10.0.0.5:5000","Username":"ci","Secret":"s3cret"}"#,
        );
        helper(
            &bin,
            "store",
            "https://index.docker.io/v1/",
            r#"{"Username":"hubber","Secret":"tok"}"#,
        );
        helper(
            &bin,
            "odd",
            "odd.example",
            r#"{"Username":"<token>","Secret":"refresh"}"#,
        );
        let path = dir.path().join("config.json");
        let inline = base64::engine::general_purpose::STANDARD.encode("bob:inline");
        fs::write(
            &path,
            format!(
                r#"{{"auths": {{"docker.io": {{}}, "127.0.0.1:5000": {{"auth": "{inline}"}}}},
                   "credHelpers": {{"10.0.0.5:5000": "team", "odd.example": "odd",
                                    "gone.example": "missing"}},
                   "credsStore": "store"}}"#
            ),
        )
        .expect("write");
        let find = |registry: &str| {
            from_docker_config_searching(Some(&path), registry, Some(bin.clone().into()))
        };
        // credHelpers for its registry; credsStore where `auths` holds only a placeholder
        // (Docker Hub by Docker's name for it); inline credentials before the store.
        assert_eq!(
            find("10.0.0.5:5000").expect("helper"),
            Some(Credentials::new("ci", "s3cret"))
        );
        assert_eq!(
            find("registry-1.docker.io").expect("store"),
            Some(Credentials::new("hubber", "tok"))
        );
        assert_eq!(
            find("127.0.0.1:5000").expect("inline"),
            Some(Credentials::new("bob", "inline"))
        );
        // The store holds nothing for it: anonymous.
        assert_eq!(find("quay.io").expect("not found"), None);
        let asked = fs::read_to_string(bin.join("asked")).expect("asked");
        assert!(asked.contains("get 10.0.0.5:5000\n"), "{asked}");
        assert!(
            asked.contains("get https://index.docker.io/v1/\n"),
            "{asked}"
        );
        assert!(asked.contains("get quay.io\n"), "{asked}");
        assert!(
            !asked.contains("127.0.0.1"),
            "inline credentials run no helper: {asked}"
        );
        // A missing helper and an identity token are errors that name the helper.
        let err = find("gone.example").expect_err("missing helper");
        assert!(
            err.to_string().contains("docker-credential-missing"),
            "{err}"
        );
        let err = find("odd.example").expect_err("identity token");
        assert!(err.to_string().contains("identity token"), "{err}");
        // A store this host does not have (a desktop's config.json): anonymous, no error.
        fs::write(
            &path,
            r#"{"auths": {"quay.io": {}}, "credsStore": "desktop"}"#,
        )
        .expect("write");
        assert_eq!(find("quay.io").expect("no store helper"), None);
    }
}
