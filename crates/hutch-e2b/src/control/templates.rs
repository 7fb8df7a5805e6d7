//! E2B's template builds (the SDKs' `Template.build`) as Hutch Dockerfile builds.
//!
//! 1. `POST /v3/templates {name}` names the template and returns a build id.
//! 2. `GET /templates/{id}/files/{hash}` says whether the files of a `COPY` step (a tar the
//!    SDK makes, named by its hash) are here, and where to `PUT` them: a URL on this
//!    listener carrying a token for that template and hash (`/template-files/…`).
//! 3. `POST /v2/templates/{id}/builds/{build}` gives the base (`fromTemplate`, or
//!    `fromImage`: a registry image, `e2bdev/base` meaning Hutch's `base`) and the steps
//!    (`RUN`, `COPY`, `ENV`, `WORKDIR`, `USER`), `startCmd` and `readyCmd`. They become a
//!    Dockerfile and a context holding each uploaded tar under its hash, built by Hutch's
//!    builder (`crates/hutch-build`): every step in an `ns` build sandbox, cached.
//! 4. `GET /templates/{id}/builds/{build}/status?logsOffset=` reports `building`, `ready`
//!    or `error` with the build's log lines.

use std::collections::HashMap;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Mutex;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hutch_build::{BuildRequest, BuildStatus, SandboxResources};
use serde::Deserialize;
use serde_json::{json, Value};

use super::sandboxes::{body_json, form_pairs};
use crate::error::{E2bError, E2bResult};
use crate::E2bState;

/// E2B's base image, which Hutch's `base` template stands for.
const E2B_BASE_IMAGE: &str = "e2bdev/base";

/// Builds named by `POST /v3/templates`, by E2B build id.
#[derive(Default)]
pub struct E2bBuilds {
    by_id: Mutex<HashMap<String, Pending>>,
}

#[derive(Clone)]
struct Pending {
    template: String,
    /// `cpuCount` and `memoryMB`: the template's sandboxes' defaults.
    resources: SandboxResources,
    caller_tenant: Option<hutch_core::tenant::Tenant>,
    /// Hutch's build, once started.
    hutch_build: Option<String>,
}

impl E2bBuilds {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A template name Hutch accepts, from E2B's `name` or `name:tag`.
fn template_name(name: &str) -> E2bResult<String> {
    let name = name.split_once(':').map_or(name, |(n, _)| n);
    match hutch_server::validate_template_name(name) {
        Ok(()) if !name.contains('@') => Ok(name.to_string()),
        _ => Err(E2bError::bad_request(format!(
            "template name {name:?} must be 1-64 characters of [A-Za-z0-9._-]"
        ))),
    }
}

fn files_hash(hash: &str) -> E2bResult<&str> {
    if hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hash)
    } else {
        Err(E2bError::bad_request(
            "a files hash is 64 hex digits (SHA-256)",
        ))
    }
}

fn uploads_dir(state: &E2bState, template: &str, hash: &str) -> PathBuf {
    state
        .app
        .manager
        .config()
        .state_dir
        .join("e2b-uploads")
        .join(template)
        .join(hash.to_ascii_lowercase())
}

fn upload_token(state: &E2bState, template: &str, hash: &str) -> String {
    state
        .app
        .manager
        .sandbox_tokens()
        .derive("e2b-upload", &format!("{template}/{hash}"))
}

/// `{name, tags, cpuCount, memoryMB}`.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct BuildRequestV3 {
    name: Option<String>,
    alias: Option<String>,
    cpu_count: Option<u32>,
    #[serde(rename = "memoryMB")]
    memory_mb: Option<u64>,
}

impl BuildRequestV3 {
    /// The sandbox defaults asked for, checked as Hutch's own build query checks them.
    fn resources(&self) -> E2bResult<SandboxResources> {
        let cpus = SandboxResources::CPUS;
        if self
            .cpu_count
            .is_some_and(|n| n == 0 || !cpus.contains(&f64::from(n)))
        {
            return Err(E2bError::bad_request(format!(
                "cpuCount must be from 1 to {}",
                cpus.end()
            )));
        }
        let memory = SandboxResources::MEMORY_MIB;
        if self.memory_mb.is_some_and(|m| !memory.contains(&m)) {
            return Err(E2bError::bad_request(format!(
                "memoryMB must be from {} to {}",
                memory.start(),
                memory.end()
            )));
        }
        Ok(SandboxResources {
            cpus: self.cpu_count.map(f64::from),
            memory_mib: self.memory_mb,
            disk_mib: None,
        })
    }
}

/// `POST /v3/templates` → 202 `{templateID, buildID, names, tags, public}`.
pub async fn request_build(
    State(state): State<E2bState>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> E2bResult<Response> {
    let caller = state.caller(&headers).await?;
    let req: BuildRequestV3 = body_json(&body)?;
    let resources = req.resources()?;
    let name = req
        .name
        .or(req.alias)
        .ok_or_else(|| E2bError::bad_request("name is required"))?;
    let template = template_name(&name)?;
    let build_id = format!("bld_{}", hutch_core::ids::random_token(16));
    state.builds.lock().insert(
        build_id.clone(),
        Pending {
            template: template.clone(),
            resources,
            caller_tenant: caller.owner(),
            hutch_build: None,
        },
    );
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "templateID": template,
            "buildID": build_id,
            "names": [template],
            "aliases": [template],
            "tags": [],
            "public": false,
        })),
    )
        .into_response())
}

/// `GET /templates/{id}/files/{hash}` → 201 `{present, url}`.
pub async fn file_upload_link(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path((id, hash)): Path<(String, String)>,
) -> E2bResult<Response> {
    state.caller(&headers).await?;
    let template = template_name(&id)?;
    let hash = files_hash(&hash)?.to_ascii_lowercase();
    let present = uploads_dir(&state, &template, &hash).is_dir();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1");
    let url = format!(
        "{}://{host}/template-files/{template}/{hash}?token={}",
        state.app.scheme(),
        upload_token(&state, &template, &hash)
    );
    let mut answer = json!({ "present": present });
    if !present {
        answer["url"] = Value::String(url);
    }
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// `PUT /template-files/{id}/{hash}?token=` with the tar the SDK made → 200.
pub async fn upload_files(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path((id, hash)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    body: Body,
) -> E2bResult<StatusCode> {
    let template = template_name(&id)?;
    let hash = files_hash(&hash)?.to_ascii_lowercase();
    let token = form_pairs(q.as_deref().unwrap_or(""))
        .into_iter()
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v)
        .unwrap_or_default();
    if !crate::envd::same_secret(&token, &upload_token(&state, &template, &hash)) {
        return Err(E2bError::unauthorized(
            "this upload URL's token is not for these files",
        ));
    }
    let dest = uploads_dir(&state, &template, &hash);
    if dest.is_dir() {
        return Ok(StatusCode::OK);
    }
    let parent = dest
        .parent()
        .map(FsPath::to_path_buf)
        .ok_or_else(|| E2bError::bad_request("no upload directory"))?;
    let staging = parent.join(format!(".{hash}.{}", hutch_core::ids::random_token(8)));
    std::fs::create_dir_all(&parent)
        .map_err(|e| E2bError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let gzip = hutch_server::build_context::gzip_declared(&headers);
    let limits = hutch_server::build_context::ContextLimits::default();
    if let Err(e) = hutch_server::build_context::receive(body, staging.clone(), gzip, limits).await
    {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(E2bError::bad_request(format!("the uploaded files: {e}")));
    }
    if std::fs::rename(&staging, &dest).is_err() {
        // Another upload of the same files won.
        let _ = std::fs::remove_dir_all(&staging);
    }
    Ok(StatusCode::OK)
}

/// `TemplateBuildStartV2`.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct BuildStart {
    from_image: Option<String>,
    from_template: Option<String>,
    from_image_registry: Option<Value>,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    steps: Vec<Step>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

/// One step.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Step {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    args: Vec<String>,
    files_hash: Option<String>,
    #[serde(default)]
    force: Option<bool>,
}

/// A JSON string (Dockerfile exec-form arrays and quoted values take JSON's escapes).
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The credentials of `fromImageRegistry`: `{"type": "registry", "username", "password"}`
/// (the AWS and GCP kinds need their clouds' token exchanges, which Hutch does not do).
fn registry_credentials(start: &BuildStart) -> E2bResult<Option<hutch_build::Credentials>> {
    let Some(v) = start.from_image_registry.as_ref().filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match (
        v["type"].as_str(),
        v["username"].as_str(),
        v["password"].as_str(),
    ) {
        (Some("registry"), Some(user), Some(password)) => {
            Ok(Some(hutch_build::Credentials::new(user, password)))
        }
        (Some(kind @ ("aws" | "gcp")), _, _) => Err(E2bError::bad_request(format!(
            "fromImageRegistry of type {kind} is not supported by Hutch: give the registry's \
             user name and password as type registry"
        ))),
        _ => Err(E2bError::bad_request(
            "fromImageRegistry must be {\"type\": \"registry\", \"username\", \"password\"}",
        )),
    }
}

/// The Dockerfile of a build start, and the file hashes its `COPY` steps need.
fn dockerfile(start: &BuildStart) -> E2bResult<(String, Vec<String>)> {
    let base = match (&start.from_template, &start.from_image) {
        (Some(t), _) => template_name(t)?,
        (None, Some(image)) if image.split(':').next() == Some(E2B_BASE_IMAGE) => {
            "base".to_string()
        }
        (None, Some(image)) => image.clone(),
        (None, None) => "base".to_string(),
    };
    if base.contains(char::is_whitespace) {
        return Err(E2bError::bad_request(
            "the base image has white space in it",
        ));
    }
    let mut out = format!("FROM {base}\n");
    let mut user = "root".to_string();
    let mut hashes = Vec::new();
    for (i, step) in start.steps.iter().enumerate() {
        let arg = |n: usize| step.args.get(n).map(String::as_str).unwrap_or("");
        match step.kind.as_str() {
            "RUN" => {
                let run_as = arg(1);
                if !run_as.is_empty() && run_as != user {
                    out.push_str(&format!(
                        "USER {run_as}\nRUN {}\nUSER {user}\n",
                        line_of(arg(0))
                    ));
                } else {
                    out.push_str(&format!("RUN {}\n", line_of(arg(0))));
                }
            }
            "COPY" => {
                let hash = step.files_hash.as_deref().ok_or_else(|| {
                    E2bError::bad_request(format!("step {i}: COPY without filesHash"))
                })?;
                let hash = files_hash(hash)?.to_ascii_lowercase();
                let mut flags = String::new();
                if !arg(2).is_empty() {
                    flags.push_str(&format!("--chown={} ", arg(2)));
                }
                if !arg(3).is_empty() {
                    flags.push_str(&format!("--chmod={} ", arg(3)));
                }
                let src = format!("{hash}/{}", arg(0).trim_start_matches("./"));
                out.push_str(&format!(
                    "COPY {flags}[{}, {}]\n",
                    quoted(&src),
                    quoted(arg(1))
                ));
                hashes.push(hash);
            }
            "ENV" => {
                let pairs: Vec<String> = step
                    .args
                    .chunks(2)
                    .filter(|kv| kv.len() == 2)
                    .map(|kv| format!("{}={}", kv[0], quoted(&kv[1])))
                    .collect();
                if !pairs.is_empty() {
                    out.push_str(&format!("ENV {}\n", pairs.join(" ")));
                }
            }
            "WORKDIR" => out.push_str(&format!("WORKDIR {}\n", arg(0))),
            "USER" => {
                user = arg(0).to_string();
                out.push_str(&format!("USER {user}\n"));
            }
            other => {
                return Err(E2bError::bad_request(format!(
                    "step {i}: {other} is not a step Hutch's E2B API builds (RUN, COPY, ENV, \
                     WORKDIR, USER)"
                )))
            }
        }
    }
    if let Some(cmd) = &start.ready_cmd {
        out.push_str(&format!(
            "HEALTHCHECK --interval=1s --timeout=10s --start-period=120s CMD {}\n",
            line_of(cmd)
        ));
    }
    if let Some(cmd) = &start.start_cmd {
        out.push_str(&format!(
            "CMD [\"/bin/bash\", \"-l\", \"-c\", {}]\n",
            quoted(cmd)
        ));
    }
    Ok((out, hashes))
}

/// A Dockerfile instruction's text with its newlines continued (`\` at each line end).
fn line_of(s: &str) -> String {
    s.replace('\n', " \\\n")
}

/// Copy directory `from` into `to` (made), without following symlinks.
fn copy_tree(from: &FsPath, to: &FsPath) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// `POST /v2/templates/{id}/builds/{build}` → 202: the build starts.
pub async fn start_build(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path((id, build)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> E2bResult<StatusCode> {
    state.caller(&headers).await?;
    let pending = state
        .builds
        .lock()
        .get(&build)
        .cloned()
        .filter(|p| p.template == id)
        .ok_or_else(|| E2bError::not_found(format!("build {build} of template {id} not found")))?;
    if pending.hutch_build.is_some() {
        return Err(E2bError::conflict(format!(
            "build {build} was already started"
        )));
    }
    let start: BuildStart = body_json(&body)?;
    let credentials = registry_credentials(&start)?;
    let (text, hashes) = dockerfile(&start)?;
    let build_dir = state
        .app
        .manager
        .config()
        .state_dir
        .join("builds")
        .join(hutch_core::ids::random_token(16));
    let context = build_dir.join("context");
    let uploads: Vec<(PathBuf, PathBuf)> = hashes
        .iter()
        .map(|h| (uploads_dir(&state, &id, h), context.join(h)))
        .collect();
    for (from, _) in &uploads {
        if !from.is_dir() {
            return Err(E2bError::bad_request(format!(
                "the files of a COPY step ({}) were never uploaded",
                from.file_name().and_then(|n| n.to_str()).unwrap_or("?")
            )));
        }
    }
    let dockerfile_path = context.join("Dockerfile");
    let made = {
        let (context, text) = (context.clone(), text.clone());
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&context)?;
            for (from, to) in &uploads {
                copy_tree(from, to)?;
            }
            std::fs::write(&dockerfile_path, text)
        })
        .await
        .map_err(|e| E2bError::status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    };
    if let Err(e) = made {
        let _ = std::fs::remove_dir_all(&build_dir);
        return Err(E2bError::status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("making the build context: {e}"),
        ));
    }
    let request = BuildRequest {
        template: id.clone(),
        context_dir: context,
        dockerfile: "Dockerfile".into(),
        build_args: Default::default(),
        target: None,
        no_cache: start.force
            || start.steps.iter().all(|s| s.force == Some(true)) && !start.steps.is_empty(),
        tenant: pending.caller_tenant.clone(),
        sandbox_resources: pending.resources,
        registry: hutch_build::RegistryAccess {
            credentials,
            insecure_registries: Vec::new(),
            // Only an admin key's build may pull with the host's own credentials.
            operator: pending.caller_tenant.is_none(),
        },
        image: None,
        tag: None,
        secrets: Default::default(),
    };
    let view = match state.app.builder().start(request).await {
        Ok(v) => v,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&build_dir);
            return Err(E2bError::bad_request(e.to_string()));
        }
    };
    tracing::info!(build = %view.id, template = %id, "E2B template build started");
    if let Some(p) = state.builds.lock().get_mut(&build) {
        p.hutch_build = Some(view.id);
    }
    Ok(StatusCode::ACCEPTED)
}

/// `GET /templates/{id}/builds/{build}/status?logsOffset=&limit=` → `{status, logEntries, …}`.
pub async fn build_status(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path((id, build)): Path<(String, String)>,
    RawQuery(q): RawQuery,
) -> E2bResult<Json<Value>> {
    state.caller(&headers).await?;
    let (mut offset, mut limit) = (0usize, 100usize);
    for (k, v) in form_pairs(q.as_deref().unwrap_or("")) {
        match k.as_str() {
            "logsOffset" => offset = v.parse().unwrap_or(0),
            "limit" => limit = v.parse::<usize>().unwrap_or(100).clamp(1, 100),
            _ => {}
        }
    }
    let pending = state
        .builds
        .lock()
        .get(&build)
        .cloned()
        .filter(|p| p.template == id)
        .ok_or_else(|| E2bError::not_found(format!("build {build} of template {id} not found")))?;
    let Some(hutch_build) = pending.hutch_build else {
        return Ok(Json(json!({
            "templateID": id, "buildID": build, "status": "waiting", "logEntries": [], "logs": [],
        })));
    };
    let builder = state.app.builder();
    let view = builder
        .get(&id, &hutch_build)
        .map_err(|e| E2bError::not_found(e.to_string()))?;
    let lines = builder
        .follow(&id, &hutch_build)
        .map(|f| f.backlog)
        .unwrap_or_default();
    let page: Vec<&hutch_build::BuildLogLine> = lines.iter().skip(offset).take(limit).collect();
    let entries: Vec<Value> = page
        .iter()
        .map(|l| {
            json!({
                "timestamp": hutch_core::time::rfc3339(l.time_ms),
                "level": if l.stream == hutch_build::LogStream::Stderr { "warn" } else { "info" },
                "message": l.text,
            })
        })
        .collect();
    let status = match view.status {
        BuildStatus::Queued => "waiting",
        BuildStatus::Running => "building",
        BuildStatus::Succeeded => "ready",
        BuildStatus::Failed | BuildStatus::Cancelled => "error",
    };
    let mut answer = json!({
        "templateID": id,
        "buildID": build,
        "status": status,
        "logEntries": entries,
        "logs": page.iter().map(|l| l.text.clone()).collect::<Vec<_>>(),
    });
    if let Some(error) = &view.error {
        answer["reason"] = json!({ "message": error });
    }
    Ok(Json(answer))
}

/// `GET /templates/aliases/{alias}` → `{templateID, public}` when the template exists.
pub async fn alias(
    State(state): State<E2bState>,
    headers: HeaderMap,
    Path(alias): Path<String>,
) -> E2bResult<Json<Value>> {
    state.caller(&headers).await?;
    let name = template_name(&alias)?;
    if state.app.manager.templates().get(&name).is_none() {
        return Err(E2bError::not_found(format!("template {alias:?} not found")));
    }
    Ok(Json(json!({ "templateID": name, "public": false })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_credentials_come_from_from_image_registry() {
        let start = |v: Value| BuildStart {
            from_image_registry: Some(v),
            ..BuildStart::default()
        };
        let c = registry_credentials(&start(
            serde_json::json!({"type": "registry", "username": "u", "password": "p:w"}),
        ))
        .expect("registry credentials")
        .expect("some");
        assert_eq!((c.username.as_str(), c.secret()), ("u", "p:w"));
        assert!(registry_credentials(&start(Value::Null))
            .expect("null")
            .is_none());
        assert!(registry_credentials(&BuildStart::default())
            .expect("absent")
            .is_none());
        for bad in [
            serde_json::json!({"type": "aws", "awsAccessKeyId": "x"}),
            serde_json::json!({"type": "registry", "username": "u"}),
        ] {
            assert!(registry_credentials(&start(bad.clone())).is_err(), "{bad}");
        }
    }

    #[test]
    fn steps_become_a_dockerfile_with_the_uploads_under_their_hashes() {
        let hash = "a".repeat(64);
        let start: BuildStart = serde_json::from_value(json!({
            "fromTemplate": "base",
            "steps": [
                {"type": "RUN", "args": ["apt-get update && echo hi"]},
                {"type": "COPY", "args": ["app/req.txt", "/srv/", "alice", "0644"], "filesHash": hash},
                {"type": "ENV", "args": ["A", "1 2", "B", "x\"y"]},
                {"type": "WORKDIR", "args": ["/srv"]},
                {"type": "RUN", "args": ["whoami", "alice"]},
                {"type": "USER", "args": ["bob"]}
            ],
            "startCmd": "python3 -m http.server 8000",
            "readyCmd": "curl -sf localhost:8000"
        }))
        .expect("parses");
        let (text, hashes) = dockerfile(&start).expect("maps");
        assert_eq!(hashes, vec![hash.clone()]);
        let want = format!(
            "FROM base\nRUN apt-get update && echo hi\n\
             COPY --chown=alice --chmod=0644 [\"{hash}/app/req.txt\", \"/srv/\"]\n\
             ENV A=\"1 2\" B=\"x\\\"y\"\nWORKDIR /srv\nUSER alice\nRUN whoami\nUSER root\nUSER bob\n\
             HEALTHCHECK --interval=1s --timeout=10s --start-period=120s CMD curl -sf localhost:8000\n\
             CMD [\"/bin/bash\", \"-l\", \"-c\", \"python3 -m http.server 8000\"]\n"
        );
        assert_eq!(text, want);
    }

    #[test]
    fn e2bs_base_image_is_hutchs_base_and_unknown_steps_are_refused() {
        let start: BuildStart =
            serde_json::from_value(json!({"fromImage": "e2bdev/base:latest"})).expect("parses");
        assert!(dockerfile(&start)
            .expect("maps")
            .0
            .starts_with("FROM base\n"));
        let bad: BuildStart =
            serde_json::from_value(json!({"steps": [{"type": "ARG", "args": ["x"]}]}))
                .expect("parses");
        assert!(dockerfile(&bad)
            .expect_err("refused")
            .message()
            .contains("ARG"));
    }
}
