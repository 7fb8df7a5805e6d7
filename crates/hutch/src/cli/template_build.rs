//! `hutch template build NAME -f Dockerfile [CONTEXT]`: a Dockerfile build through the
//! server's API (`POST /v1/templates`), its log followed and printed like `docker build`.
//!
//! The context directory is sent as a tar stream made here as it is uploaded
//! (`hutch_proto::archive::ArchiveWriter`: symlinks are sent as links, never followed; FIFOs,
//! sockets and devices are left out). What the context's `.dockerignore` excludes is not
//! sent, except the Dockerfile and the `.dockerignore` itself (the server reads them); the
//! server applies the same rules again. A Dockerfile outside the context is sent as an
//! extra entry, [`OUTSIDE_DOCKERFILE`]. Ctrl-C cancels the build.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use futures_util::StreamExt;
use hutch_dockerfile::DockerIgnore;
use hutch_proto::archive::{ArchiveWriter, WalkChoice};
use reqwest::Method;
use serde_json::Value;

use super::output::print_json;
use super::progress::{TransferBars, UploadProgress};
use super::stream::SseParser;
use crate::client::{encode, Api};

/// The context entry a Dockerfile from outside the context is sent as.
pub const OUTSIDE_DOCKERFILE: &str = ".hutch-dockerfile";
/// Bytes of the tar stream made at once.
const UPLOAD_CHUNK: usize = 256 << 10;
/// Largest Dockerfile sent from outside the context (the server reads no more).
const MAX_DOCKERFILE: u64 = 1 << 20;

/// A Dockerfile build as asked on the command line.
#[derive(Debug, Clone)]
pub struct DockerfileBuild {
    /// The template to build.
    pub name: String,
    /// `-f` (default `CONTEXT/Dockerfile`).
    pub dockerfile: Option<PathBuf>,
    /// The context directory.
    pub context: PathBuf,
    /// `--build-arg K=V` (or `K`: its value from this environment, left out when unset).
    pub build_args: Vec<String>,
    /// `--target`.
    pub target: Option<String>,
    /// `--no-cache`.
    pub no_cache: bool,
    /// `--cpus`, `--memory-mib`, `--disk-mib`: the template's sandboxes' defaults.
    pub cpus: Option<f64>,
    pub memory_mib: Option<u64>,
    pub disk_mib: Option<u64>,
    /// `--secret id=ID[,src=FILE|,env=VAR]`, as `docker build` takes them.
    pub secrets: Vec<String>,
}

/// What is sent: the context, where its Dockerfile is, and what is left out.
struct ContextPlan {
    root: PathBuf,
    /// The Dockerfile's path in the context, as sent in `dockerfile=`.
    dockerfile: String,
    /// The Dockerfile's bytes when it is outside the context.
    outside: Option<Vec<u8>>,
    ignore: DockerIgnore,
}

fn plan_context(build: &DockerfileBuild) -> anyhow::Result<ContextPlan> {
    let root = std::fs::canonicalize(&build.context)
        .with_context(|| format!("the build context {}", build.context.display()))?;
    if !root.is_dir() {
        bail!(
            "the build context {} is not a directory",
            build.context.display()
        );
    }
    let given = build
        .dockerfile
        .clone()
        .unwrap_or_else(|| build.context.join("Dockerfile"));
    let file = std::fs::canonicalize(&given).map_err(|_| {
        anyhow::anyhow!(
            "no Dockerfile at {}: name one with -f, build from an image with --from-image, or build a built-in template ({})",
            given.display(),
            hutch_template::builtin_names().join(", ")
        )
    })?;
    if !file.is_file() {
        bail!("the Dockerfile {} is not a file", given.display());
    }
    let (dockerfile, outside) = match file.strip_prefix(&root) {
        Ok(rel) => (slash_path(rel)?, None),
        Err(_) => {
            let size = std::fs::metadata(&file)?.len();
            if size > MAX_DOCKERFILE {
                bail!(
                    "the Dockerfile {} is larger than {MAX_DOCKERFILE} bytes",
                    given.display()
                );
            }
            let bytes = std::fs::read(&file)
                .with_context(|| format!("reading the Dockerfile {}", given.display()))?;
            (OUTSIDE_DOCKERFILE.to_string(), Some(bytes))
        }
    };
    let ignore = match std::fs::read_to_string(root.join(".dockerignore")) {
        Ok(text) => DockerIgnore::parse(&text)
            .with_context(|| format!("{}", root.join(".dockerignore").display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => DockerIgnore::none(),
        Err(e) => return Err(e).context("reading the context's .dockerignore"),
    };
    Ok(ContextPlan {
        root,
        dockerfile,
        outside,
        ignore,
    })
}

/// `a/b/Dockerfile` from a relative path (UTF-8 only: it is sent in a query).
fn slash_path(rel: &Path) -> anyhow::Result<String> {
    let parts: Option<Vec<&str>> = rel.components().map(|c| c.as_os_str().to_str()).collect();
    match parts {
        Some(parts) if !parts.is_empty() => Ok(parts.join("/")),
        _ => bail!("the Dockerfile's path {} is not UTF-8", rel.display()),
    }
}

/// What the walk of the context does with `path` (relative, `/`-separated).
fn choose(plan: &ContextPlanRules, path: &str, is_dir: bool) -> WalkChoice {
    if plan.outside && path == OUTSIDE_DOCKERFILE {
        // The Dockerfile from outside goes by this name; the context's own would replace it.
        return WalkChoice::Skip;
    }
    if path == plan.dockerfile || path == ".dockerignore" {
        return WalkChoice::Include;
    }
    if !plan.ignore.excludes(path) {
        return WalkChoice::Include;
    }
    let holds_dockerfile = plan
        .dockerfile
        .strip_prefix(path)
        .is_some_and(|rest| rest.starts_with('/'));
    if is_dir && (holds_dockerfile || plan.ignore.may_include_below(path)) {
        WalkChoice::EnterOnly
    } else {
        WalkChoice::Skip
    }
}

/// The parts of a [`ContextPlan`] the walk's filter needs (moved to its thread).
struct ContextPlanRules {
    dockerfile: String,
    outside: bool,
    ignore: DockerIgnore,
}

/// The tar entry of a Dockerfile from outside the context (no end-of-archive marker: the
/// context's stream follows).
fn outside_entry(bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_cksum();
    builder.append_data(&mut header, OUTSIDE_DOCKERFILE, bytes)?;
    // Taken before the builder's drop writes the end marker (into the emptied buffer).
    Ok(std::mem::take(builder.get_mut()))
}

/// The chunks of a tar stream being made.
type ArchiveChunks = tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>;
/// The thread making it: (entries, file bytes), or why it failed.
type ArchiveMaker = std::thread::JoinHandle<Result<(u64, u64), String>>;

/// Make the context's tar stream on a thread of its own as the upload reads it.
fn spawn_archive(plan: ContextPlan) -> anyhow::Result<(ArchiveChunks, ArchiveMaker)> {
    let first = plan.outside.as_deref().map(outside_entry).transpose()?;
    let rules = ContextPlanRules {
        dockerfile: plan.dockerfile.clone(),
        outside: plan.outside.is_some(),
        ignore: plan.ignore.clone(),
    };
    let writer = ArchiveWriter::open(&plan.root)
        .with_context(|| format!("reading {}", plan.root.display()))?
        .with_filter(move |path, is_dir| choose(&rules, &String::from_utf8_lossy(path), is_dir));
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(4);
    let maker = std::thread::spawn(move || {
        let mut writer = writer;
        if let Some(first) = first {
            if tx.blocking_send(Ok(bytes::Bytes::from(first))).is_err() {
                return Ok((0, 0));
            }
        }
        loop {
            let chunk = match writer.next_chunk(UPLOAD_CHUNK) {
                Ok(Some(chunk)) => chunk,
                Ok(None) => return Ok((writer.entries(), writer.file_bytes())),
                Err(e) => {
                    let message = e.to_string();
                    let _ = tx.blocking_send(Err(std::io::Error::other(message.clone())));
                    return Err(message);
                }
            };
            if tx.blocking_send(Ok(bytes::Bytes::from(chunk))).is_err() {
                // The upload ended; its error says why.
                return Ok((writer.entries(), writer.file_bytes()));
            }
        }
    });
    Ok((rx, maker))
}

/// The query of `POST /v1/templates`.
fn build_query(build: &DockerfileBuild, dockerfile: &str) -> anyhow::Result<String> {
    let mut query = format!(
        "name={}&dockerfile={}",
        encode(&build.name),
        encode(dockerfile)
    );
    if let Some(target) = &build.target {
        query.push_str(&format!("&target={}", encode(target)));
    }
    if build.no_cache {
        query.push_str("&no_cache=true");
    }
    if let Some(cpus) = build.cpus {
        query.push_str(&format!("&cpus={cpus}"));
    }
    if let Some(memory_mib) = build.memory_mib {
        query.push_str(&format!("&memory_mib={memory_mib}"));
    }
    if let Some(disk_mib) = build.disk_mib {
        query.push_str(&format!("&disk_mib={disk_mib}"));
    }
    for arg in &build.build_args {
        let pair = match arg.split_once('=') {
            Some(("", _)) => bail!("--build-arg {arg:?} has no name"),
            Some(_) => arg.clone(),
            // `--build-arg NAME` passes this environment's value, as docker does.
            None => match std::env::var(arg) {
                Ok(v) => format!("{arg}={v}"),
                Err(_) => continue,
            },
        };
        query.push_str(&format!("&build_arg={}", encode(&pair)));
    }
    Ok(query)
}

/// Upload the context and start the build; the build as the server shows it.
async fn start(api: &Api, build: &DockerfileBuild) -> anyhow::Result<Value> {
    let plan = plan_context(build)?;
    let query = build_query(build, &plan.dockerfile)?;
    let mut headers = Vec::new();
    for spec in &build.secrets {
        let (id, value) = read_secret(spec)?;
        use base64::Engine as _;
        let encoded = base64::engine::general_purpose::STANDARD.encode(value);
        headers.push((BUILD_SECRET_HEADER, format!("{id}={encoded}")));
    }
    send_archive(api, plan, &query, "the build context", &headers).await
}

/// The header that carries one build secret (`hutch_server`'s `BUILD_SECRET_HEADER`).
const BUILD_SECRET_HEADER: &str = "x-hutch-build-secret";

/// `id=ID[,src=FILE|,source=FILE|,env=VAR]` (`docker build --secret`): the id and the
/// value, read from the file (by default the environment variable named like the id,
/// else a file named like it), as docker reads it.
fn read_secret(spec: &str) -> anyhow::Result<(String, Vec<u8>)> {
    let (mut id, mut src, mut env) = (None, None, None);
    for field in spec.split(',') {
        match field.split_once('=') {
            Some(("id", v)) => id = Some(v.to_string()),
            Some(("src" | "source", v)) => src = Some(PathBuf::from(v)),
            Some(("env", v)) => env = Some(v.to_string()),
            Some(("type", "file" | "env")) => {}
            _ => bail!("--secret {spec:?}: expected id=ID[,src=FILE|,env=VAR], found {field:?}"),
        }
    }
    let Some(id) = id.filter(|i| !i.is_empty()) else {
        bail!("--secret {spec:?} needs id=ID");
    };
    let value = match (src, env) {
        (Some(_), Some(_)) => bail!("--secret {spec:?}: give src= or env=, not both"),
        (Some(path), None) => std::fs::read(&path)
            .with_context(|| format!("--secret {id}: reading {}", path.display()))?,
        (None, Some(var)) => std::env::var(&var)
            .with_context(|| format!("--secret {id}: the variable {var} is not set"))?
            .into_bytes(),
        (None, None) => match std::env::var(&id) {
            Ok(v) => v.into_bytes(),
            Err(_) => std::fs::read(&id).with_context(|| {
                format!("--secret {id}: no variable {id} and no file {id}; give src= or env=")
            })?,
        },
    };
    Ok((id, value))
}

/// Send all of directory `dir` (an OCI image layout, say) as the body of
/// `POST /v1/templates?{query}`; the build as the server shows it.
pub async fn send_directory(
    api: &Api,
    dir: &Path,
    query: &str,
    what: &'static str,
) -> anyhow::Result<Value> {
    let root = std::fs::canonicalize(dir).with_context(|| format!("reading {}", dir.display()))?;
    let plan = ContextPlan {
        root,
        dockerfile: String::new(),
        outside: None,
        ignore: DockerIgnore::none(),
    };
    send_archive(api, plan, query, what, &[]).await
}

/// Stream `plan`'s tar as the body of `POST /v1/templates?{query}`, with `headers`.
async fn send_archive(
    api: &Api,
    plan: ContextPlan,
    query: &str,
    what: &'static str,
    headers: &[(&str, String)],
) -> anyhow::Result<Value> {
    let (rx, maker) = spawn_archive(plan)?;
    let progress = Arc::new(UploadProgress::new(what));
    let counted = progress.clone();
    let stream = futures_util::stream::unfold(rx, |mut rx| async {
        rx.recv().await.map(|item| (item, rx))
    })
    .map(move |item| {
        if let Ok(chunk) = &item {
            counted.sent(chunk.len() as u64);
        }
        item
    });
    let answer = api
        .send_body(
            Method::POST,
            &format!("/v1/templates?{query}"),
            "application/x-tar",
            reqwest::Body::wrap_stream(stream),
            headers,
        )
        .await;
    // An archive that could not be made explains a refused upload better than the answer.
    let made = maker
        .join()
        .map_err(|_| anyhow::anyhow!("the archive of {what} could not be made"))
        .and_then(|r| r.map_err(|e| anyhow::anyhow!("archiving {what}: {e}")));
    let (entries, resp) = match made.and_then(|(entries, _)| answer.map(|resp| (entries, resp))) {
        Ok(done) => done,
        Err(e) => {
            progress.finish(None);
            return Err(e);
        }
    };
    progress.finish(Some(&format!(" in {entries} entries")));
    resp.json().await.context("reading the server's answer")
}

/// How one log line (`{"seq","step","stream","text"}`) is printed: `#3 [3/5] RUN make`
/// for a step's start, `#3 …` for what the step printed, the builder's own lines as
/// they are.
fn render(line: &Value) -> String {
    let text = line["text"].as_str().unwrap_or("");
    let Some(step) = line["step"].as_u64() else {
        return text.to_string();
    };
    if line["stream"] == "status" {
        if let Some((count, instruction)) = text
            .strip_prefix("step ")
            .and_then(|rest| rest.split_once(" : "))
        {
            return format!("#{step} [{count}] {instruction}");
        }
        return format!("#{step} {}", text.trim_start().trim_start_matches("---> "));
    }
    format!("#{step} {text}")
}

/// How a build ended.
#[derive(Debug, PartialEq)]
struct Ended {
    status: String,
    error: Option<String>,
}

/// Print the build's log as it comes until its `end` event.
async fn follow(api: &Api, name: &str, id: &str) -> anyhow::Result<Ended> {
    let path = format!(
        "/v1/templates/{}/builds/{}/logs?follow=true",
        encode(name),
        encode(id)
    );
    let resp = api.get_streamed(&path, "text/event-stream").await?;
    let mut parser = SseParser::default();
    let mut body = resp.bytes_stream();
    let mut bars = TransferBars::default();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.context("reading the build's log")?;
        for event in parser.push(&chunk) {
            let data: Value = serde_json::from_str(&event.data).unwrap_or(Value::Null);
            match event.event.as_str() {
                "log" if data["stream"] == "progress" => {
                    bars.update(data["text"].as_str().unwrap_or(""), &data["progress"])
                }
                "log" => bars.println(&render(&data)),
                "end" => {
                    return Ok(Ended {
                        status: data["status"].as_str().unwrap_or("").to_string(),
                        error: data["error"].as_str().map(String::from),
                    })
                }
                _ => {}
            }
        }
    }
    // The stream ended early (the server went away?): ask how the build is.
    let v = api.call(Method::GET, &build_path(name, id), None).await?;
    Ok(Ended {
        status: v["status"].as_str().unwrap_or("").to_string(),
        error: v["error"].as_str().map(String::from),
    })
}

fn build_path(name: &str, id: &str) -> String {
    format!("/v1/templates/{}/builds/{}", encode(name), encode(id))
}

/// Run a Dockerfile build through the API at HUTCH_URL.
pub async fn run(api: &Api, build: DockerfileBuild, json_out: bool) -> anyhow::Result<()> {
    let started = start(api, &build).await?;
    watch(api, &build.name, &started, json_out).await
}

/// Follow a started build (the server's answer to `POST /v1/templates`) to its end,
/// printing its log; Ctrl-C cancels it. Fails unless it succeeded.
pub async fn watch(api: &Api, name: &str, started: &Value, json_out: bool) -> anyhow::Result<()> {
    let id = started["id"]
        .as_str()
        .context("the server's answer to POST /v1/templates has no build id")?
        .to_string();
    // `web:v2` builds template `web` (and tags the revision).
    let name = started["template"].as_str().unwrap_or(name);
    eprintln!("build {id} of template {name}");
    let ended = tokio::select! {
        ended = follow(api, name, &id) => ended?,
        _ = tokio::signal::ctrl_c() => {
            api.call(Method::DELETE, &build_path(name, &id), None).await?;
            bail!("interrupted: build {id} of template {name} cancelled");
        }
    };
    if json_out {
        print_json(&api.call(Method::GET, &build_path(name, &id), None).await?);
    }
    match ended.status.as_str() {
        "succeeded" => Ok(()),
        "" => bail!(
            "the build log of {id} ended before the build did (GET {})",
            build_path(name, &id)
        ),
        status => bail!(
            "build {id} of template {name} {status}: {}",
            ended.error.as_deref().unwrap_or("no reason given")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(dockerfile: &str, ignore: &str) -> ContextPlanRules {
        ContextPlanRules {
            dockerfile: dockerfile.into(),
            outside: false,
            ignore: DockerIgnore::parse(ignore).expect("rules"),
        }
    }

    #[test]
    fn the_walk_leaves_out_what_dockerignore_excludes_but_keeps_the_dockerfile() {
        let r = rules(
            "docker/Dockerfile",
            "*.log\nnode_modules\ndocker\n!node_modules/keep\n.dockerignore\n",
        );
        assert_eq!(choose(&r, "src", true), WalkChoice::Include);
        assert_eq!(choose(&r, "build.log", false), WalkChoice::Skip);
        // Excluded, but an exception may bring something back: walked, not sent itself.
        assert_eq!(choose(&r, "node_modules", true), WalkChoice::EnterOnly);
        assert_eq!(choose(&r, "node_modules/x", false), WalkChoice::Skip);
        assert_eq!(choose(&r, "node_modules/keep", false), WalkChoice::Include);
        // Excluded, but the Dockerfile is inside: walked for it.
        assert_eq!(choose(&r, "docker", true), WalkChoice::EnterOnly);
        assert_eq!(choose(&r, "docker/other", false), WalkChoice::Skip);
        assert_eq!(choose(&r, "docker/Dockerfile", false), WalkChoice::Include);
        assert_eq!(choose(&r, ".dockerignore", false), WalkChoice::Include);
        let plain = rules("Dockerfile", "");
        assert_eq!(
            choose(&plain, OUTSIDE_DOCKERFILE, false),
            WalkChoice::Include
        );
        let outside = ContextPlanRules {
            outside: true,
            ..rules(OUTSIDE_DOCKERFILE, "")
        };
        assert_eq!(
            choose(&outside, OUTSIDE_DOCKERFILE, false),
            WalkChoice::Skip
        );
    }

    #[test]
    fn log_lines_print_like_docker_build() {
        let line = |step: Option<u64>, stream: &str, text: &str| {
            let mut v = serde_json::json!({"seq": 1, "stream": stream, "text": text});
            if let Some(s) = step {
                v["step"] = s.into();
            }
            render(&v)
        };
        assert_eq!(
            line(Some(3), "status", "step 3/5 : RUN make"),
            "#3 [3/5] RUN make"
        );
        assert_eq!(line(Some(3), "stdout", "cc -o app"), "#3 cc -o app");
        assert_eq!(line(Some(3), "status", " ---> CACHED"), "#3 CACHED");
        assert_eq!(
            line(None, "status", "template web is ready (1.0 s)"),
            "template web is ready (1.0 s)"
        );
    }

    #[test]
    fn secrets_are_read_as_docker_reads_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("token");
        std::fs::write(&file, b"from-file").expect("write");
        let (id, value) = read_secret(&format!("id=tok,src={}", file.display())).expect("src");
        assert_eq!((id.as_str(), value.as_slice()), ("tok", &b"from-file"[..]));
        std::env::set_var("HUTCH_TEST_SECRET_VALUE", "from-env");
        let (_, value) = read_secret("id=tok,env=HUTCH_TEST_SECRET_VALUE").expect("env");
        assert_eq!(value, b"from-env");
        let (_, value) = read_secret("id=HUTCH_TEST_SECRET_VALUE").expect("default env");
        assert_eq!(value, b"from-env");
        assert!(read_secret("src=x").is_err(), "an id is needed");
        assert!(read_secret("id=a,src=/nonexistent/hutch").is_err());
        assert!(read_secret("id=a,src=x,env=Y").is_err());
    }

    #[test]
    fn the_query_carries_the_options_and_build_args() {
        let build = DockerfileBuild {
            name: "web".into(),
            dockerfile: None,
            context: ".".into(),
            build_args: vec!["A=1 2".into(), "HUTCH_TEST_SURELY_UNSET_VAR".into()],
            target: Some("run".into()),
            no_cache: true,
            cpus: Some(1.5),
            memory_mib: Some(384),
            disk_mib: None,
            secrets: Vec::new(),
        };
        assert_eq!(
            build_query(&build, "docker/Dockerfile").expect("query"),
            "name=web&dockerfile=docker/Dockerfile&target=run&no_cache=true&cpus=1.5&memory_mib=384&build_arg=A%3D1%202"
        );
    }

    #[test]
    fn a_dockerfile_outside_the_context_is_one_entry_without_an_end_marker() {
        let entry = outside_entry(b"FROM minimal\n").expect("entry");
        assert_eq!(entry.len(), 1024, "a header and one block of data");
        let mut parser = hutch_proto::archive::TarParser::new();
        let events = parser.push(&entry).expect("parses");
        assert!(matches!(
            &events[0],
            hutch_proto::archive::TarEvent::Entry(h) if h.path == OUTSIDE_DOCKERFILE.as_bytes()
        ));
        assert!(!events
            .iter()
            .any(|e| matches!(e, hutch_proto::archive::TarEvent::End)));
    }
}
