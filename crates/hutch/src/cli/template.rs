//! `hutch template ls|inspect|rm`, Dockerfile builds (`build NAME -f Dockerfile
//! [CONTEXT]`, `template_build.rs`), image builds (`build NAME --from-image REF`,
//! `template_image.rs`) and `set-start`/`set-isolation` go through the server's API at
//! HUTCH_URL, like every command with an API. Built-in templates (`build minimal|base|…`)
//! are built on this host's templates directory, and `set-start`/`set-isolation` with
//! `--templates-dir` change that directory (the operator's tools for a stopped server).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use hutch_template::{BuildOptions, TemplateStore};
use reqwest::Method;
use serde_json::Value;

use super::output::{print_json, table};
use super::template_build::DockerfileBuild;
use super::template_image::ImageBuildArgs;
use super::template_start::{describe, StartArgs};
use crate::client::Api;

/// Template subcommands.
#[derive(Debug, clap::Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per process, never moved around
pub enum TemplateCommand {
    /// Build a template. From a Dockerfile (`-f`, default `CONTEXT/Dockerfile`) and a build
    /// context directory (default `.`), or from an OCI image (`--from-image`): through the
    /// server at HUTCH_URL, which runs each step in a build sandbox or pulls the image; its
    /// log is printed as it comes, layer downloads as progress bars (Ctrl-C cancels it). A
    /// built-in template (`minimal`, `base`, `code-interpreter`) is built here instead, into
    /// this host's templates directory: run that on the server's host, with its state dir.
    Build {
        /// Template name.
        name: String,
        /// The build context: a directory whose files `COPY` and `ADD` read (`.dockerignore`
        /// leaves files out); default `.`.
        #[arg(conflicts_with = "from_image")]
        context: Option<PathBuf>,
        /// The Dockerfile (default `CONTEXT/Dockerfile`); it may be outside the context.
        #[arg(
            short = 'f',
            long = "file",
            value_name = "DOCKERFILE",
            conflicts_with = "from_image"
        )]
        dockerfile: Option<PathBuf>,
        /// A Dockerfile `ARG`'s value, `NAME=VALUE` (or `NAME`: this environment's value);
        /// repeatable.
        #[arg(long, value_name = "NAME=VALUE", conflicts_with = "from_image")]
        build_arg: Vec<String>,
        /// A secret for `RUN --mount=type=secret,id=ID`: `id=ID,src=FILE` or
        /// `id=ID,env=VAR` (`id=ID` alone: the variable ID, else the file ID); repeatable.
        /// Secrets are never stored in the template or its cache.
        #[arg(long, value_name = "id=ID,src=FILE", conflicts_with = "from_image")]
        secret: Vec<String>,
        /// The stage to build (default: the last).
        #[arg(long, value_name = "STAGE", conflicts_with = "from_image")]
        target: Option<String>,
        /// Run every step of the Dockerfile, ignoring cached results.
        #[arg(long, conflicts_with = "from_image")]
        no_cache: bool,
        /// The template's sandboxes' default resources (Dockerfile builds).
        #[command(flatten)]
        resources: SandboxResourceArgs,
        /// Templates directory of a built-in template's build (default
        /// `<state-dir>/templates`).
        #[arg(long, conflicts_with = "from_image")]
        templates_dir: Option<PathBuf>,
        /// Build again even if it is ready (built-in templates), pull and unpack again
        /// (--from-image).
        #[arg(long)]
        force: bool,
        /// Build from this OCI image (`registry:5000/team/tools:1`, `debian:12`; its
        /// `linux/amd64` variant is pulled), or from local files: `oci:DIR[:TAG]` (an OCI
        /// image layout), `oci-archive:FILE[:TAG]`, `docker-archive:FILE[:TAG]` (`docker save`).
        #[arg(long, value_name = "REF")]
        from_image: Option<String>,
        /// Speak plain HTTP to this registry (`host` or `host:port`); repeatable.
        #[arg(long, value_name = "HOST", requires = "from_image")]
        insecure_registry: Vec<String>,
        /// Registry credentials `USER:PASS` (default: `auths` of ~/.docker/config.json);
        /// ignored without `--from-image`.
        #[arg(
            long,
            value_name = "USER:PASS",
            env = "HUTCH_REGISTRY_AUTH",
            hide_env_values = true
        )]
        registry_auth: Option<String>,
        /// The template's start command and ready check.
        #[command(flatten)]
        start: StartArgs,
    },
    /// Set (or `--clear`) the start command and ready check of a template: sandboxes
    /// created from it afterwards run the command, and a create returns once the check
    /// passes (`PATCH /v1/templates/{name}` at HUTCH_URL, or this host's templates
    /// directory with `--templates-dir`).
    SetStart {
        /// Template name.
        name: String,
        /// The start command and ready check.
        #[command(flatten)]
        start: StartArgs,
        /// Remove the start command.
        #[arg(long, conflicts_with = "start_cmd")]
        clear: bool,
        /// Change this templates directory instead of asking the server.
        #[arg(long)]
        templates_dir: Option<PathBuf>,
    },
    /// Set the isolation of sandboxes created from a template when the request says
    /// `auto` or nothing (`auto` removes the default): `PATCH /v1/templates/{name}` at
    /// HUTCH_URL, or this host's templates directory with `--templates-dir`.
    SetIsolation {
        /// Template name.
        name: String,
        /// `auto`, `ns` or `vm`.
        isolation: String,
        /// Change this templates directory instead of asking the server.
        #[arg(long)]
        templates_dir: Option<PathBuf>,
    },
    /// List the server's templates (`GET /v1/templates` at HUTCH_URL).
    Ls,
    /// Show one of the server's templates as JSON (`GET /v1/templates/{name}`).
    Inspect {
        /// Template name.
        name: String,
    },
    /// Delete one of the server's templates (`DELETE /v1/templates/{name}`; refused while
    /// sandboxes or snapshots use it, or a build of it runs; admin keys only).
    Rm {
        /// Template names.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// What the Dockerfile step cache holds (`GET /v1/build-cache`; admin keys only).
    CacheUsage,
    /// Remove step cache entries and their build snapshots, least recently used first
    /// (`POST /v1/build-cache/prune`; waits for running builds; admin keys only). With no
    /// option: entries unused for a day.
    PruneCache {
        /// Everything.
        #[arg(long, conflicts_with_all = ["unused_for_hours", "keep_mib"])]
        all: bool,
        /// Entries no build used for this many hours.
        #[arg(long, value_name = "HOURS")]
        unused_for_hours: Option<u64>,
        /// Keep at most this many MiB (the least recently used entries go first).
        #[arg(long, value_name = "MIB")]
        keep_mib: Option<u64>,
    },
}

/// `PATCH /v1/templates/{name}` with `body`; the template as the server shows it.
async fn patch(state_dir: &Path, name: &str, body: Value) -> anyhow::Result<Value> {
    let api = Api::from_env(state_dir)?;
    api.call(
        Method::PATCH,
        &format!("/v1/templates/{}", crate::client::encode(name)),
        Some(&body),
    )
    .await
    .with_context(|| format!("changing template {name}"))
}

/// The server's templates (`GET /v1/templates`).
async fn server_templates(state_dir: &Path) -> anyhow::Result<Vec<Value>> {
    let api = Api::from_env(state_dir)?;
    let v = api.call(Method::GET, "/v1/templates", None).await?;
    v["templates"]
        .as_array()
        .cloned()
        .context("the server's answer to GET /v1/templates has no templates list")
}

/// `--cpus`, `--memory-mib`, `--disk-mib` of a Dockerfile or image build.
#[derive(Debug, clap::Args)]
pub struct SandboxResourceArgs {
    /// CPUs the template's sandboxes get when a create names none (default: the `FROM`
    /// template's, or an image's 1).
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Memory (MiB) the template's sandboxes get by default.
    #[arg(long, value_name = "MIB")]
    pub memory_mib: Option<u64>,
    /// Writable disk (MiB) the template's sandboxes get by default.
    #[arg(long, value_name = "MIB")]
    pub disk_mib: Option<u64>,
}

/// Run a template subcommand.
pub async fn run(cmd: TemplateCommand, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    match cmd {
        TemplateCommand::Build {
            name,
            context,
            dockerfile,
            build_arg,
            secret,
            target,
            no_cache,
            resources,
            templates_dir,
            force,
            from_image,
            insecure_registry,
            registry_auth,
            start,
        } => {
            if let Some(reference) = from_image {
                let api = Api::from_env(state_dir)?;
                let args = ImageBuildArgs {
                    name,
                    reference,
                    insecure_registries: insecure_registry,
                    registry_auth,
                    start: start.spec()?,
                    force,
                    cpus: resources.cpus,
                    memory_mib: resources.memory_mib,
                    disk_mib: resources.disk_mib,
                };
                return super::template_image::run(&api, args, json_out).await;
            }
            let builtin = hutch_template::builtin_names().contains(&name.as_str());
            if dockerfile.is_some() || context.is_some() || target.is_some() || !builtin {
                if templates_dir.is_some() || force || start.start_cmd.is_some() {
                    bail!(
                        "a Dockerfile build runs on the server at HUTCH_URL: --templates-dir, \
                         --force and --start-cmd are for built-in templates and --from-image \
                         (use --no-cache to run every step; CMD, ENTRYPOINT and HEALTHCHECK \
                         give the start command)"
                    );
                }
                let api = Api::from_env(state_dir)?;
                let build = DockerfileBuild {
                    name,
                    dockerfile,
                    context: context.unwrap_or_else(|| PathBuf::from(".")),
                    build_args: build_arg,
                    target,
                    no_cache,
                    cpus: resources.cpus,
                    memory_mib: resources.memory_mib,
                    disk_mib: resources.disk_mib,
                    secrets: secret,
                };
                return super::template_build::run(&api, build, json_out).await;
            }
            if !build_arg.is_empty()
                || !secret.is_empty()
                || no_cache
                || resources.cpus.is_some()
                || resources.memory_mib.is_some()
                || resources.disk_mib.is_some()
            {
                bail!(
                    "--build-arg, --secret, --no-cache, --cpus, --memory-mib and --disk-mib are for \
                     Dockerfile and image builds"
                );
            }
            // Ctrl-C cancels the build: the running tool is killed with everything it
            // started (its own process group, which the terminal's SIGINT does not reach).
            let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let options = BuildOptions {
                force,
                start: start.spec()?,
                cancel: Some(cancel.clone()),
                ..BuildOptions::default()
            };
            let dir = templates_dir.unwrap_or_else(|| state_dir.join("templates"));
            std::fs::create_dir_all(&dir)?;
            let store = TemplateStore::open(&dir)?;
            let building = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
                crate::serve::build_template(&store, &name, false, &options)?;
                Ok(store.get(&name))
            });
            tokio::pin!(building);
            let info = tokio::select! {
                built = &mut building => built??,
                _ = tokio::signal::ctrl_c() => {
                    cancel.store(true, std::sync::atomic::Ordering::Relaxed);
                    // The build notices within a quarter of a second and cleans up.
                    let _ = building.await;
                    bail!("interrupted: the build was cancelled");
                }
            };
            if json_out {
                print_json(&serde_json::to_value(info)?);
            }
            Ok(())
        }
        TemplateCommand::SetIsolation {
            name,
            isolation,
            templates_dir,
        } => {
            let info = match templates_dir {
                Some(dir) => serde_json::to_value(
                    TemplateStore::open(&dir)?.set_isolation(&name, &isolation)?,
                )?,
                None => {
                    patch(
                        state_dir,
                        &name,
                        serde_json::json!({ "isolation": isolation }),
                    )
                    .await?
                }
            };
            if json_out {
                print_json(&info);
            } else {
                println!(
                    "template {name}: default isolation {}",
                    info["defaults"]["isolation"].as_str().unwrap_or("auto")
                );
            }
            Ok(())
        }
        TemplateCommand::SetStart {
            name,
            start,
            clear,
            templates_dir,
        } => {
            let spec = start.spec()?;
            if spec.is_none() && !clear {
                anyhow::bail!("say what to start (--start-cmd CMD) or --clear");
            }
            let start = match templates_dir {
                Some(dir) => TemplateStore::open(&dir)?.set_start(&name, spec)?.start,
                None => {
                    let info =
                        patch(state_dir, &name, serde_json::json!({ "start": spec })).await?;
                    serde_json::from_value(info["start"].clone()).unwrap_or(None)
                }
            };
            if json_out {
                print_json(&serde_json::json!({ "name": name, "start": start }));
            } else {
                println!("template {name}: {}", describe(start.as_ref()));
            }
            Ok(())
        }
        TemplateCommand::CacheUsage => {
            let api = Api::from_env(state_dir)?;
            let v = api.call(Method::GET, "/v1/build-cache", None).await?;
            if json_out {
                print_json(&v);
            } else {
                println!(
                    "{} entries, {}{}",
                    v["entries"].as_u64().unwrap_or(0),
                    super::progress::human_bytes(v["bytes"].as_u64().unwrap_or(0)),
                    v["oldest_used_at"]
                        .as_str()
                        .map(|t| format!(", least recently used at {t}"))
                        .unwrap_or_default()
                );
            }
            Ok(())
        }
        TemplateCommand::PruneCache {
            all,
            unused_for_hours,
            keep_mib,
        } => {
            let api = Api::from_env(state_dir)?;
            let mut body = serde_json::json!({});
            if all {
                body["all"] = true.into();
            }
            if let Some(h) = unused_for_hours {
                body["unused_for_seconds"] = h.saturating_mul(3600).into();
            }
            if let Some(m) = keep_mib {
                body["keep_mib"] = m.into();
            }
            let v = api
                .call(Method::POST, "/v1/build-cache/prune", Some(&body))
                .await?;
            if json_out {
                print_json(&v);
            } else {
                println!(
                    "removed {} entries and {} unnamed snapshots, {} freed; {} entries ({}) left",
                    v["removed_entries"].as_u64().unwrap_or(0),
                    v["removed_orphans"].as_u64().unwrap_or(0),
                    super::progress::human_bytes(v["freed_bytes"].as_u64().unwrap_or(0)),
                    v["usage"]["entries"].as_u64().unwrap_or(0),
                    super::progress::human_bytes(v["usage"]["bytes"].as_u64().unwrap_or(0)),
                );
            }
            Ok(())
        }
        TemplateCommand::Ls => {
            let list = server_templates(state_dir).await?;
            if json_out {
                print_json(&serde_json::json!({ "templates": list }));
                return Ok(());
            }
            let name_of = |t: &Value| t["name"].as_str().unwrap_or("").to_string();
            let mut rows: Vec<Vec<String>> = list
                .iter()
                .map(|t| {
                    let isolations: Vec<&str> = t["isolations"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_str)
                        .collect();
                    vec![
                        name_of(t),
                        if t["ready"].as_bool() == Some(true) {
                            "ready"
                        } else {
                            "not ready"
                        }
                        .to_string(),
                        format!(
                            "{:.1} MiB",
                            t["size_bytes"].as_f64().unwrap_or(0.0) / 1048576.0
                        ),
                        isolations.join(","),
                    ]
                })
                .collect();
            for k in hutch_template::builtin_names() {
                if !list.iter().any(|t| name_of(t) == *k) {
                    rows.push(vec![
                        k.to_string(),
                        "not built".into(),
                        "-".into(),
                        "-".into(),
                    ]);
                }
            }
            table(&["NAME", "STATUS", "SIZE", "ISOLATION"], &rows);
            Ok(())
        }
        TemplateCommand::Inspect { name } => {
            let api = Api::from_env(state_dir)?;
            let asked = api
                .call(
                    Method::GET,
                    &format!("/v1/templates/{}", crate::client::encode(&name)),
                    None,
                )
                .await;
            let t = match asked {
                Err(e)
                    if e.downcast_ref::<crate::client::ApiFailure>()
                        .is_some_and(|f| f.status == reqwest::StatusCode::NOT_FOUND) =>
                {
                    bail!(
                        "the server has no template {name:?} (`hutch template ls` lists its templates)"
                    )
                }
                other => other?,
            };
            print_json(&t);
            Ok(())
        }
        TemplateCommand::Rm { names } => {
            let api = Api::from_env(state_dir)?;
            for name in &names {
                api.call(
                    Method::DELETE,
                    &format!("/v1/templates/{}", crate::client::encode(name)),
                    None,
                )
                .await
                .with_context(|| format!("deleting template {name}"))?;
                if !json_out {
                    println!("{name}");
                }
            }
            if json_out {
                print_json(&serde_json::json!({ "deleted": names }));
            }
            Ok(())
        }
    }
}
