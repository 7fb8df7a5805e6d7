//! `RUN --mount=…`: BuildKit's build mounts, parsed from their comma-separated
//! `key=value` form.
//!
//! - `type=cache`: a directory kept between builds (the tenant's, by `id`, default the
//!   target), never part of the image or the step's cache key;
//! - `type=bind` (the default type): files of the context, or of a stage or image
//!   (`from=`), at the target for the step only; their content is part of the cache key;
//! - `type=secret`: a secret the build request carries, as a file (default
//!   `/run/secrets/<id>`) and/or an environment variable (`env=`), for the step only and
//!   never part of the cache key;
//! - `type=tmpfs`: an empty directory for the step whose contents are thrown away.
//!
//! `type=ssh` is refused (Hutch has no SSH agent to forward).

use serde::{Deserialize, Serialize};

use crate::error::DockerfileError;
use crate::source::Located;
use crate::step::CopyFrom;
use crate::values;

/// One `--mount` of a `RUN`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum RunMount {
    /// `type=cache`.
    Cache(CacheMount),
    /// `type=bind`.
    Bind(BindMount),
    /// `type=secret`.
    Secret(SecretMount),
    /// `type=tmpfs`.
    Tmpfs {
        /// Absolute path in the step's root.
        target: String,
    },
}

impl RunMount {
    /// The path the mount appears at, if it has one (a secret given only as `env=` has
    /// none).
    pub fn target(&self) -> Option<&str> {
        match self {
            Self::Cache(c) => Some(&c.target),
            Self::Bind(b) => Some(&b.target),
            Self::Secret(s) => s.target.as_deref(),
            Self::Tmpfs { target } => Some(target),
        }
    }
}

/// `type=cache`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheMount {
    /// Absolute path in the step's root.
    pub target: String,
    /// Which cache (default: the target).
    pub id: String,
    /// `sharing=`: how builds running at once share it.
    pub sharing: CacheSharing,
    /// `ro`: mounted read-only.
    pub read_only: bool,
    /// Owner and mode of a new cache's top directory (default 0:0, 0755).
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// See `uid`.
    pub mode: u32,
}

/// `sharing=` of a cache mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheSharing {
    /// `shared` (the default).
    Shared,
    /// `private`.
    Private,
    /// `locked`.
    Locked,
}

/// `type=bind`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindMount {
    /// Absolute path in the step's root.
    pub target: String,
    /// The path in `from` (default: its root), as written after substitution.
    pub source: String,
    /// `None`: the build context.
    pub from: Option<CopyFrom>,
    /// `rw`: the step may write there (what it writes is thrown away).
    pub read_write: bool,
}

/// `type=secret`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretMount {
    /// The secret's id in the build request.
    pub id: String,
    /// Where its file goes; `None` when only `env=` is given.
    pub target: Option<String>,
    /// `env=`: the environment variable that carries it.
    pub env: Option<String>,
    /// `required`: a build without the secret fails (otherwise the step runs without it).
    pub required: bool,
    /// The file's owner and mode (default 0:0, 0400).
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// See `uid`.
    pub mode: u32,
}

/// The longest secret or cache id.
pub const MAX_MOUNT_ID_CHARS: usize = 255;

/// One `--mount` value, its variables already substituted. A relative target is in
/// `workdir`; `from` resolves a `from=` (stage name, index or image).
pub(crate) fn parse_mount(
    raw: &str,
    workdir: &str,
    at: &Located,
    mut from: impl FnMut(&str) -> Result<CopyFrom, DockerfileError>,
) -> Result<RunMount, DockerfileError> {
    let mut fields: Vec<(String, Option<String>)> = Vec::new();
    for part in split_fields(raw).map_err(|e| at.invalid(format!("--mount={raw}: {e}")))? {
        let (key, value) = match part.split_once('=') {
            Some((k, v)) => (k.trim().to_ascii_lowercase(), Some(v.to_owned())),
            None => (part.trim().to_ascii_lowercase(), None),
        };
        let key = match key.as_str() {
            "dst" | "destination" => "target".to_owned(),
            "src" => "source".to_owned(),
            "readonly" => "ro".to_owned(),
            "readwrite" => "rw".to_owned(),
            _ => key,
        };
        if fields.iter().any(|(k, _)| *k == key) {
            return Err(at.invalid(format!("--mount={raw}: `{key}` is given twice")));
        }
        fields.push((key, value));
    }
    let get = |name: &str| -> Option<Option<&str>> {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_deref())
    };
    let bad = |why: String| at.invalid(format!("--mount={raw}: {why}"));
    let value = |name: &str| -> Result<Option<&str>, DockerfileError> {
        match get(name) {
            None => Ok(None),
            Some(Some(v)) if !v.is_empty() => Ok(Some(v)),
            Some(_) => Err(bad(format!("`{name}` needs a value ({name}=…)"))),
        }
    };
    let flag = |name: &str| -> Result<bool, DockerfileError> {
        match get(name) {
            None => Ok(false),
            Some(v) => values::boolean(name, v).map_err(&bad),
        }
    };
    let number = |name: &str, default: u32| -> Result<u32, DockerfileError> {
        match value(name)? {
            None => Ok(default),
            Some(v) => v
                .parse::<u32>()
                .map_err(|_| bad(format!("`{name}={v}` must be a number"))),
        }
    };
    let mode = |default: u32| -> Result<u32, DockerfileError> {
        match value("mode")? {
            None => Ok(default),
            Some(v) => values::octal_mode(v).map_err(|e| bad(format!("mode: {e}"))),
        }
    };
    let target = |required: bool| -> Result<Option<String>, DockerfileError> {
        match value("target")? {
            None if required => Err(bad("a target=/path is needed".into())),
            None => Ok(None),
            Some(t) if t.starts_with('/') => Ok(Some(absolute_target(t, &bad)?)),
            Some(t) => Ok(Some(absolute_target(&format!("{workdir}/{t}"), &bad)?)),
        }
    };
    let kind = value("type")?.unwrap_or("bind").to_ascii_lowercase();
    let allowed: &[&str] = match kind.as_str() {
        "cache" => &[
            "type", "target", "id", "sharing", "ro", "rw", "uid", "gid", "mode", "from", "source",
        ],
        "bind" => &["type", "target", "source", "from", "ro", "rw"],
        "secret" => &["type", "target", "id", "env", "required", "uid", "gid", "mode"],
        "tmpfs" => &["type", "target", "size"],
        "ssh" => {
            return Err(at.unsupported(
                "RUN --mount=type=ssh",
                "Hutch has no SSH agent to forward into a build; pass a deploy key as a secret (--mount=type=secret)",
            ))
        }
        other => {
            return Err(bad(format!(
                "type={other} is not a mount type (cache, bind, secret or tmpfs)"
            )))
        }
    };
    if let Some((k, _)) = fields.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        return Err(bad(format!(
            "`{k}` is not an option of type={kind} (it takes {})",
            allowed[1..].join(", ")
        )));
    }
    let id = |default: Option<&str>| -> Result<Option<String>, DockerfileError> {
        let id = value("id")?.or(default);
        if let Some(id) = id {
            if id.chars().count() > MAX_MOUNT_ID_CHARS || id.contains('\0') {
                return Err(bad(format!(
                    "id must be at most {MAX_MOUNT_ID_CHARS} characters"
                )));
            }
        }
        Ok(id.map(str::to_owned))
    };
    match kind.as_str() {
        "cache" => {
            if get("from").is_some() || get("source").is_some() {
                return Err(at.unsupported(
                    "RUN --mount=type=cache with from= or source=",
                    "a cache starts empty; seed it in the step itself",
                ));
            }
            let target = target(true)?.expect("required");
            let sharing = match value("sharing")? {
                None | Some("shared") => CacheSharing::Shared,
                Some("private") => CacheSharing::Private,
                Some("locked") => CacheSharing::Locked,
                Some(other) => {
                    return Err(bad(format!(
                        "sharing={other} must be shared, private or locked"
                    )))
                }
            };
            Ok(RunMount::Cache(CacheMount {
                id: id(Some(&target))?.expect("defaulted"),
                target,
                sharing,
                read_only: flag("ro")? && !flag("rw")?,
                uid: number("uid", 0)?,
                gid: number("gid", 0)?,
                mode: mode(0o755)?,
            }))
        }
        "bind" => {
            let target = target(true)?.expect("required");
            let from = match value("from")? {
                None => None,
                Some(f) => Some(from(f)?),
            };
            let raw_source = value("source")?.unwrap_or("/");
            let source = match from {
                // A context path: relative to the context's root.
                None => match raw_source.trim_start_matches('/') {
                    "" => ".".to_owned(),
                    rel => rel.to_owned(),
                },
                // A path in the stage or image: absolute.
                Some(_) => {
                    let path = absolute_target(&format!("/{raw_source}"), &|_| {
                        at.unsupported(
                            "RUN --mount=type=bind,from=… of a whole root",
                            "name the directory to bind (source=/app)",
                        )
                    })?;
                    path
                }
            };
            Ok(RunMount::Bind(BindMount {
                target,
                source,
                from,
                read_write: flag("rw")? && !flag("ro")?,
            }))
        }
        "secret" => {
            let id = match id(None)? {
                Some(id) => id,
                None => match value("target")? {
                    // BuildKit: the id defaults to the target's last element.
                    Some(t) => t
                        .trim_end_matches('/')
                        .rsplit('/')
                        .next()
                        .unwrap_or("")
                        .to_owned(),
                    None => return Err(bad("a secret needs id=NAME".into())),
                },
            };
            if id.is_empty() || id.contains('/') {
                return Err(bad(format!("secret id {id:?} must be a name without `/`")));
            }
            let env = match value("env")? {
                None => None,
                Some(name) => {
                    let ok = name.bytes().enumerate().all(|(i, b)| {
                        b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit())
                    });
                    if !ok {
                        return Err(bad(format!(
                            "env={name} is not an environment variable name"
                        )));
                    }
                    Some(name.to_owned())
                }
            };
            let target = match target(false)? {
                Some(t) => Some(t),
                None if env.is_some() => None,
                None => Some(format!("/run/secrets/{id}")),
            };
            Ok(RunMount::Secret(SecretMount {
                id,
                target,
                env,
                required: flag("required")?,
                uid: number("uid", 0)?,
                gid: number("gid", 0)?,
                mode: mode(0o400)?,
            }))
        }
        _ => {
            // tmpfs: `size=` is accepted and the step's disk limit applies instead.
            Ok(RunMount::Tmpfs {
                target: target(true)?.expect("required"),
            })
        }
    }
}

/// An absolute, normalized target; `/` itself is refused.
fn absolute_target(
    raw: &str,
    bad: &impl Fn(String) -> DockerfileError,
) -> Result<String, DockerfileError> {
    if !raw.starts_with('/') {
        return Err(bad(format!("{raw:?} must be an absolute path")));
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in raw.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err(bad("a mount cannot cover `/`".into()));
    }
    Ok(format!("/{}", parts.join("/")))
}

/// Splits `key=value,key=value` as a CSV record (a field may be quoted to hold commas).
fn split_fields(raw: &str) -> Result<Vec<String>, &'static str> {
    let mut out = Vec::new();
    let mut field = String::new();
    let mut chars = raw.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    if quoted {
        return Err("a quote is not closed");
    }
    out.push(field);
    if out.iter().any(|f| f.trim().is_empty()) {
        return Err("an empty field");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_split_on_unquoted_commas() {
        assert_eq!(
            split_fields("type=bind,\"source=a,b\",target=/x").expect("splits"),
            vec!["type=bind", "source=a,b", "target=/x"]
        );
        assert!(split_fields("type=cache,,target=/x").is_err());
        assert!(split_fields("\"type=cache").is_err());
    }

    #[test]
    fn targets_are_normalized_and_never_the_root() {
        let bad = |why: String| DockerfileError::Invalid {
            line: 1,
            instruction: "RUN".into(),
            reason: why,
        };
        assert_eq!(absolute_target("/a/./b/../c/", &bad).expect("ok"), "/a/c");
        assert!(absolute_target("/..", &bad).is_err());
        assert!(absolute_target("rel", &bad).is_err());
    }
}
