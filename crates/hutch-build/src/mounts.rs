//! `RUN --mount` in a build step (the parsing is `hutch_dockerfile::RunMount`).
//!
//! - **cache**: a volume of the build's tenant (`build-cache-…`, made on first use with
//!   [`crate::BuildSettings::cache_mount_mib`] MiB), mounted at the target in a build
//!   sandbox made for the step. Its contents stay out of the step's snapshot and out of
//!   the cache key. A cache is used by one step at a time (volumes are attached
//!   read-write to one sandbox), so `sharing=shared`, `private` and `locked` all wait for
//!   it.
//! - **bind**: the files (of the context, a stage or an image) are copied to the target
//!   before the step and removed after it, so they are never in the step's snapshot; what
//!   was at the target is moved aside and put back. Their content is in the cache key.
//!   A read-only bind is not enforced: what the step writes there is thrown away too.
//! - **secret**: written (mode 0400 unless `mode=`) for the step and removed after it; or
//!   given as the environment variable `env=`. Never in the cache key or the build log.
//! - **tmpfs**: an empty directory for the step, removed after it (what was there is kept).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use hutch_core::ids::VolumeId;
use hutch_core::volume::VolumeMount;
use hutch_dockerfile::{
    BindMount, CacheMount, Context, CopyKind, CopySource, CopyStep, DockerIgnore, RunMount,
    RunStep, Step,
};
use hutch_proto::client::{AgentClient, ClientError};
use hutch_proto::AgentErrorCode;
use tokio::sync::OwnedMutexGuard;

use crate::builds::{Build, BuildRequest, Builder};
use crate::engine::{hash_context_sources, run_tool, Sources};
use crate::error::BuildError;
use crate::log::LogStream;

/// The secrets a build request carries, by id (`--mount=type=secret,id=…`). Their values
/// never appear in `Debug` output.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct BuildSecrets(BTreeMap<String, Vec<u8>>);

/// Longest a tool of the mounts may take (`chown`, `chmod`, `cp -a`).
const TOOL_TIMEOUT_MS: u64 = 60_000;

/// The most secrets one build may carry.
pub const MAX_SECRETS: usize = 64;
/// The largest secret.
pub const MAX_SECRET_BYTES: usize = 512 * 1024;

impl BuildSecrets {
    /// Add secret `id`; refused when the id is not a name, the value is too large or
    /// there are too many.
    pub fn insert(&mut self, id: &str, value: Vec<u8>) -> Result<(), String> {
        let ok_id = !id.is_empty()
            && id.len() <= hutch_dockerfile::MAX_MOUNT_ID_CHARS
            && !id.contains(['/', '\0', '=', ','])
            && !id.chars().any(char::is_control);
        if !ok_id {
            return Err(format!(
                "secret id {id:?} must be a name (no `/`, `=`, `,` or control characters)"
            ));
        }
        if value.len() > MAX_SECRET_BYTES {
            return Err(format!(
                "secret {id:?} is larger than {MAX_SECRET_BYTES} bytes"
            ));
        }
        if !self.0.contains_key(id) && self.0.len() >= MAX_SECRETS {
            return Err(format!("a build carries at most {MAX_SECRETS} secrets"));
        }
        self.0.insert(id.to_owned(), value);
        Ok(())
    }

    /// Secret `id`.
    pub fn get(&self, id: &str) -> Option<&[u8]> {
        self.0.get(id).map(Vec::as_slice)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for BuildSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// One lock per cache volume, across the server's builds.
#[derive(Debug, Default)]
pub(crate) struct CacheLocks(std::sync::Mutex<HashMap<VolumeId, Arc<tokio::sync::Mutex<()>>>>);

impl CacheLocks {
    fn of(&self, id: &VolumeId) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(id.clone()).or_default().clone()
    }
}

/// The cache volumes of one step, held until it is done.
pub(crate) struct StepCaches {
    /// What the step's build sandbox mounts.
    pub volumes: Vec<VolumeMount>,
    /// The caches made for this step (their top directory gets `uid`, `gid`, `mode`).
    fresh: Vec<CacheMount>,
    _held: Vec<OwnedMutexGuard<()>>,
}

/// The volume name of cache `id`: readable where the id allows it, unique by its hash.
pub(crate) fn cache_volume_name(id: &str) -> String {
    let slug: String = id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect::<String>()
        .split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-");
    let mut slug: String = slug.chars().take(32).collect();
    if slug.is_empty() {
        slug.push_str("cache");
    }
    let digest = crate::engine::hex(&<sha2::Sha256 as sha2::Digest>::digest(id.as_bytes()));
    format!("build-cache-{slug}-{}", &digest[..12])
}

/// Whether `run` mounts a cache (its step then gets a build sandbox of its own).
pub(crate) fn has_caches(run: &RunStep) -> bool {
    run.mounts.iter().any(|m| matches!(m, RunMount::Cache(_)))
}

/// Find or make the cache volumes of `run` and wait for each to be free.
pub(crate) async fn take_caches(
    builder: &Arc<Builder>,
    build: &Arc<Build>,
    n: usize,
    run: &RunStep,
    request: &BuildRequest,
) -> Result<StepCaches, BuildError> {
    let mut found: Vec<(VolumeId, CacheMount, bool)> = Vec::new();
    for mount in &run.mounts {
        let RunMount::Cache(cache) = mount else {
            continue;
        };
        let name = cache_volume_name(&cache.id);
        let (id, made) = builder
            .manager
            .build_cache_volume(
                &name,
                builder.settings.cache_mount_mib,
                request.tenant.clone(),
            )
            .await?;
        if found.iter().any(|(other, _, _)| *other == id) {
            return Err(BuildError::StepFailed(format!(
                "two cache mounts of the step use the cache {:?}",
                cache.id
            )));
        }
        if made {
            build.log(
                Some(n),
                LogStream::Status,
                &format!(" ---> new cache {:?} (volume {name})", cache.id),
            );
        }
        found.push((id, cache.clone(), made));
    }
    // Always in the same order, so two builds never wait for each other's caches.
    found.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    let mut held = Vec::with_capacity(found.len());
    for (id, _, _) in &found {
        held.push(builder.cache_locks.of(id).lock_owned().await);
    }
    Ok(StepCaches {
        volumes: found
            .iter()
            .map(|(id, cache, _)| VolumeMount {
                volume: id.to_string(),
                path: cache.target.clone(),
                read_only: cache.read_only,
            })
            .collect(),
        fresh: found
            .into_iter()
            .filter(|(_, _, made)| *made)
            .map(|(_, cache, _)| cache)
            .collect(),
        _held: held,
    })
}

/// What to undo once the step ran, last first.
#[derive(Debug)]
enum Undo {
    /// Remove this path (and all below it).
    Remove(String),
    /// Remove this directory if it is empty (one the build made for a mount).
    RemoveEmptyDir(String),
    /// Move `aside` back to `target`.
    PutBack { aside: String, target: String },
    /// Remove what is in this directory, keeping it.
    Empty(String),
}

/// What a step's mounts put in place, and how to take it away.
#[derive(Debug, Default)]
pub(crate) struct Staged {
    undo: Vec<Undo>,
    /// Secrets given as environment variables.
    pub env: Vec<(String, String)>,
}

/// Everything the build engine passes a step that copies files.
pub(crate) struct StepFiles<'a> {
    pub builder: &'a Arc<Builder>,
    pub build: &'a Arc<Build>,
    pub n: usize,
    pub step: &'a Step,
    pub ctx: &'a Arc<Context>,
    pub ignore: &'a Arc<DockerIgnore>,
    pub states: &'a Sources,
    pub request: &'a BuildRequest,
}

/// Put `run`'s binds, secrets and tmpfs directories in place in the step's sandbox, and
/// give new caches their owner and mode. On an error, what was done is left (the step's
/// sandbox is thrown away with the failed step).
pub(crate) async fn stage(
    files: &StepFiles<'_>,
    run: &RunStep,
    client: &AgentClient,
    caches: Option<&StepCaches>,
) -> Result<Staged, BuildError> {
    let mut staged = Staged::default();
    for cache in caches.map(|c| c.fresh.as_slice()).unwrap_or_default() {
        if (cache.uid, cache.gid, cache.mode) != (0, 0, 0o755) {
            let t = &cache.target;
            run_tool(
                files.build,
                files.n,
                client,
                &["chown", &format!("{}:{}", cache.uid, cache.gid), t],
                TOOL_TIMEOUT_MS,
            )
            .await?;
            run_tool(
                files.build,
                files.n,
                client,
                &["chmod", &format!("{:o}", cache.mode), t],
                TOOL_TIMEOUT_MS,
            )
            .await?;
        }
    }
    for mount in &run.mounts {
        match mount {
            RunMount::Cache(_) => {}
            RunMount::Tmpfs { target } => {
                clear_target(files.build, files.n, client, target, &mut staged.undo).await?;
                client.mkdir(target).await?;
            }
            RunMount::Bind(bind) => {
                clear_target(files.build, files.n, client, &bind.target, &mut staged.undo).await?;
                bind_files(files, client, bind).await?;
            }
            RunMount::Secret(secret) => {
                let Some(value) = files.request.secrets.get(&secret.id) else {
                    if secret.required {
                        return Err(BuildError::StepFailed(format!(
                            "the step needs the secret {:?}, and the build was given none of that id \
                             (hutch template build --secret id={},src=FILE)",
                            secret.id, secret.id
                        )));
                    }
                    continue;
                };
                if let Some(name) = &secret.env {
                    let text = String::from_utf8(value.to_vec()).map_err(|_| {
                        BuildError::StepFailed(format!(
                            "the secret {:?} is not UTF-8 text, so it cannot be the variable {name}",
                            secret.id
                        ))
                    })?;
                    staged.env.push((name.clone(), text));
                }
                if let Some(target) = &secret.target {
                    clear_target(files.build, files.n, client, target, &mut staged.undo).await?;
                    client
                        .write_file_bytes(target, Some(secret.mode), value.to_vec().into())
                        .await?;
                    if (secret.uid, secret.gid) != (0, 0) {
                        let owner = format!("{}:{}", secret.uid, secret.gid);
                        run_tool(
                            files.build,
                            files.n,
                            client,
                            &["chown", &owner, target],
                            TOOL_TIMEOUT_MS,
                        )
                        .await?;
                    }
                }
            }
        }
    }
    Ok(staged)
}

/// Take away what [`stage`] put in place, last first, so the step's snapshot holds none
/// of it.
pub(crate) async fn unstage(client: &AgentClient, staged: Staged) -> Result<(), BuildError> {
    for undo in staged.undo.into_iter().rev() {
        match undo {
            Undo::Remove(path) => match client.remove(&path, true).await {
                Ok(()) => {}
                Err(e) if is_code(&e, AgentErrorCode::NotFound) => {}
                Err(e) => return Err(e.into()),
            },
            Undo::RemoveEmptyDir(path) => {
                // Kept when the step put something there.
                let _ = client.remove(&path, false).await;
            }
            Undo::PutBack { aside, target } => client.rename(&aside, &target).await?,
            Undo::Empty(dir) => {
                for entry in client.list(&dir, Some(1)).await?.entries {
                    client.remove(&entry.path, true).await?;
                }
            }
        }
    }
    Ok(())
}

fn is_code(e: &ClientError, code: AgentErrorCode) -> bool {
    matches!(e, ClientError::Agent(a) if a.code == code)
}

/// Make room for a mount at `target`: what is there is moved aside (to be put back), and
/// the directories above it that do not exist are made (to be removed when still empty).
async fn clear_target(
    build: &Arc<Build>,
    n: usize,
    client: &AgentClient,
    target: &str,
    undo: &mut Vec<Undo>,
) -> Result<(), BuildError> {
    let (parent, base) = match target.rsplit_once('/') {
        Some(("", base)) => ("/".to_string(), base),
        Some((parent, base)) => (parent.to_string(), base),
        None => ("/".to_string(), target),
    };
    let mut missing = Vec::new();
    let mut dir = parent.clone();
    while dir != "/" {
        match client.stat(&dir).await {
            Ok(e) if e.file_type == hutch_proto::FileType::Dir => break,
            Ok(_) => {
                return Err(BuildError::StepFailed(format!(
                    "the mount target {target} is below {dir}, which is not a directory"
                )))
            }
            Err(e) if is_code(&e, AgentErrorCode::NotFound) => missing.push(dir.clone()),
            Err(e) => return Err(e.into()),
        }
        dir = match dir.rsplit_once('/') {
            Some(("", _)) | None => "/".into(),
            Some((up, _)) => up.into(),
        };
    }
    for dir in missing.iter().rev() {
        client.mkdir(dir).await?;
        undo.push(Undo::RemoveEmptyDir(dir.clone()));
    }
    let aside = format!("{}/.hutch-mount-{n}-{base}", parent.trim_end_matches('/'));
    match client.stat(target).await {
        Ok(e) if e.file_type == hutch_proto::FileType::Dir => {
            if client.list(target, Some(1)).await?.entries.is_empty() {
                // The usual case (`WORKDIR /src` then a bind at `.`): emptied after.
                undo.push(Undo::Empty(target.to_string()));
                return Ok(());
            }
            // A directory of a lower layer cannot be renamed (overlayfs answers EXDEV):
            // it is copied aside, and the copy is put back.
            run_tool(
                build,
                n,
                client,
                &["cp", "-a", "--", target, &aside],
                TOOL_TIMEOUT_MS,
            )
            .await?;
            client.remove(target, true).await?;
            undo.push(Undo::PutBack {
                aside,
                target: target.to_string(),
            });
        }
        Ok(_) => {
            client.rename(target, &aside).await?;
            undo.push(Undo::PutBack {
                aside,
                target: target.to_string(),
            });
        }
        Err(e) if is_code(&e, AgentErrorCode::NotFound) => {}
        Err(e) => return Err(e.into()),
    }
    undo.push(Undo::Remove(target.to_string()));
    Ok(())
}

/// Copy a bind mount's files to its target, as `COPY [--from] source target` would.
async fn bind_files(
    files: &StepFiles<'_>,
    client: &AgentClient,
    bind: &BindMount,
) -> Result<(), BuildError> {
    let copy = CopyStep {
        kind: CopyKind::Copy,
        from: bind.from.clone(),
        sources: vec![CopySource::Path(bind.source.clone())],
        dest: bind.target.clone(),
        dest_is_dir: false,
        chown: None,
        chmod: None,
        link: false,
        checksum: None,
    };
    files.build.log(
        Some(files.n),
        LogStream::Status,
        &format!(" ---> {} bound at {}", bind.source, bind.target),
    );
    crate::copy::copy(files, &copy, client).await
}

/// The hash of what a step's bind mounts read (their content is part of its cache key):
/// context files by their hashes, a stage or an image by its key.
pub(crate) async fn bind_inputs(
    run: &RunStep,
    ctx: &Arc<Context>,
    ignore: &Arc<DockerIgnore>,
    states: &Sources,
) -> Result<Option<String>, BuildError> {
    let mut out = String::new();
    for mount in &run.mounts {
        let RunMount::Bind(bind) = mount else {
            continue;
        };
        let read = match &bind.from {
            None => hash_context_sources(ctx, ignore, vec![bind.source.clone()]).await?,
            Some(from) => states.of(from)?.key.clone(),
        };
        out.push_str(&format!("bind {} {} {read}\n", bind.target, bind.source));
    }
    Ok((!out.is_empty()).then_some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_volume_names_are_valid_readable_and_distinct() {
        let a = cache_volume_name("/root/.cache/pip");
        assert!(a.starts_with("build-cache-root-cache-pip-"), "{a}");
        assert!(a.len() <= 64);
        assert_ne!(a, cache_volume_name("/root/.cache/pip/"));
        let odd = cache_volume_name("///");
        assert!(odd.starts_with("build-cache-cache-"), "{odd}");
        let long = cache_volume_name(&"x".repeat(255));
        assert!(long.len() <= 64, "{long}");
    }

    #[test]
    fn secrets_are_checked_and_never_printed() {
        let mut s = BuildSecrets::default();
        s.insert("token", b"hunter2".to_vec())
            .expect("a good secret");
        assert!(s.insert("a/b", vec![]).is_err());
        assert!(s.insert("", vec![]).is_err());
        assert!(s.insert("big", vec![0; MAX_SECRET_BYTES + 1]).is_err());
        let shown = format!("{s:?}");
        assert!(
            shown.contains("token") && !shown.contains("hunter2"),
            "{shown}"
        );
        assert_eq!(s.get("token"), Some(&b"hunter2"[..]));
    }
}
