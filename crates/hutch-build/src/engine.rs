//! Running a build: plan, bases, then each stage's steps in build sandboxes, cached by key;
//! the target stage's last state becomes the template.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hutch_core::ids::{SandboxId, SnapshotId};
use hutch_core::model::{CreateSandbox, IsolationRequest};
use hutch_dockerfile::{
    base_key, plan_with_bases, step_key, Base, BuildPlan, Context, CopyFrom, DockerIgnore,
    HealthTest, Instruction, StageConfig, Step,
};
use hutch_proto::client::{AgentClient, ExecEvent};
use hutch_proto::{Command, ExecRequest, ReadyCheck, ReadyProbe, ServiceSpec};
use hutch_template::{BuildOptions, ImageSource, LayeredSource, Progress, ResourceDefaults};

use crate::builds::{Build, BuildRequest, Builder};
use crate::error::BuildError;
use crate::log::LogStream;
use crate::{BuildStatus, StepStatus, StepView};

/// Largest Dockerfile read from a context.
const MAX_DOCKERFILE: u64 = 1 << 20;
/// Largest `.dockerignore` read.
const MAX_IGNORE: u64 = 64 << 10;
/// TTL of a build sandbox (it is removed when its stage ends).
const SANDBOX_TTL: u64 = 24 * 3600;

/// Read and plan the Dockerfile without its bases (a bad instruction fails the request);
/// `None` for an image build, which has no Dockerfile.
pub(crate) async fn check(request: &BuildRequest) -> Result<Option<BuildPlan>, BuildError> {
    if hutch_template::builtin_names().contains(&request.template.as_str()) {
        return Err(BuildError::BadRequest(format!(
            "{} is a built-in template's name: build another",
            request.template
        )));
    }
    if request.image.is_some() {
        return Ok(None);
    }
    let r = request.clone();
    blocking(move || {
        let (text, _) = read_inputs(&r)?;
        Ok(Some(hutch_dockerfile::plan(
            &text,
            &r.build_args,
            r.target.as_deref(),
        )?))
    })
    .await
}

/// The Dockerfile and `.dockerignore` of `request`'s context.
fn read_inputs(request: &BuildRequest) -> Result<(String, DockerIgnore), BuildError> {
    let ctx = Context::open(&request.context_dir)?;
    let text = ctx
        .read_to_string(&request.dockerfile, MAX_DOCKERFILE)?
        .ok_or_else(|| {
            BuildError::BadRequest(format!(
                "the build context has no {} (give the Dockerfile's path in the context with `dockerfile`)",
                request.dockerfile
            ))
        })?;
    let ignore = match ctx.read_to_string(".dockerignore", MAX_IGNORE)? {
        Some(rules) => DockerIgnore::parse(&rules)?,
        None => DockerIgnore::none(),
    };
    Ok((text, ignore))
}

/// The steps a plan runs, as the API shows them before they run.
pub(crate) fn step_views(plan: &BuildPlan) -> Vec<StepView> {
    plan.stages
        .iter()
        .flat_map(|stage| {
            stage
                .steps
                .iter()
                .map(move |step| (stage.display_name(), step))
        })
        .enumerate()
        .map(|(i, (stage, step))| StepView {
            number: i + 1,
            stage,
            line: step.line,
            instruction: step.text.clone(),
            status: StepStatus::Pending,
            duration_ms: None,
        })
        .collect()
}

/// Delete a build's context directory.
pub(crate) async fn remove_context(dir: &Path) {
    let dir = dir.to_path_buf();
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&dir)).await;
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BuildError> + Send + 'static,
) -> Result<T, BuildError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BuildError::StepFailed(format!("a build task did not finish: {e}")))?
}

/// A stage's base: the template its sandboxes run and the identity its cache keys start from.
#[derive(Debug, Clone)]
struct BaseTemplate {
    template: String,
    identity: String,
}

/// Where a stage ended: its template, the snapshot of its last step, its last key.
#[derive(Debug, Clone)]
pub(crate) struct StageState {
    template: String,
    snapshot: Option<SnapshotId>,
    pub(crate) key: String,
}

/// Run `request` (see the crate docs).
pub(crate) async fn run(
    builder: &Arc<Builder>,
    build: &Arc<Build>,
    request: BuildRequest,
) -> Result<(), BuildError> {
    let lock = {
        let mut locks = builder
            .template_locks
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        locks.entry(request.template.clone()).or_default().clone()
    };
    let _one_at_a_time = lock.lock().await;
    // No prune of the step cache while this build may read it.
    let _cache_held = builder.prune_lock.read().await;
    build.lock().status = BuildStatus::Running;
    if let Some(image) = &request.image {
        return crate::image::run(builder, build, &request, image).await;
    }
    let r = request.clone();
    let (text, ignore) = blocking(move || read_inputs(&r)).await?;
    let plan0 = hutch_dockerfile::plan(&text, &request.build_args, request.target.as_deref())?;
    let mut bases = HashMap::new();
    let mut configs = BTreeMap::new();
    for reference in plan0.images() {
        let (base, config) = resolve_base(builder, build, &request, &reference).await?;
        configs.insert(reference.clone(), config);
        bases.insert(reference, base);
    }
    let plan = plan_with_bases(
        &text,
        &request.build_args,
        request.target.as_deref(),
        &configs,
    )?;
    {
        let mut st = build.lock();
        st.steps = step_views(&plan);
        st.warnings = plan.warnings.clone();
    }
    let total: usize = plan.stages.iter().map(|s| s.steps.len()).sum();
    let ctx = Arc::new(Context::open(&request.context_dir)?);
    let ignore = Arc::new(ignore);
    let mut states = Sources {
        stages: HashMap::new(),
        images: HashMap::new(),
        downloads: crate::fetch::Downloads::new(
            builder
                .manager
                .config()
                .state_dir
                .join("build-downloads")
                .join(&build.id),
        ),
    };
    // `COPY --from=<image>` reads an image's files as a stage's: from a sandbox of it.
    for (reference, base) in &bases {
        states.images.insert(
            reference.clone(),
            StageState {
                template: base.template.clone(),
                snapshot: None,
                key: tenant_base_key(&request, &base.identity),
            },
        );
    }
    let mut number = 0;
    for stage in &plan.stages {
        let mut state =
            match &stage.base {
                Base::Image { reference } => {
                    let base = bases.get(reference).ok_or_else(|| {
                        BuildError::StepFailed(format!("no base resolved for {reference}"))
                    })?;
                    StageState {
                        template: base.template.clone(),
                        snapshot: None,
                        key: tenant_base_key(&request, &base.identity),
                    }
                }
                Base::Stage { index } => states.stages.get(index).cloned().ok_or_else(|| {
                    BuildError::StepFailed(format!("stage {index} was not built"))
                })?,
                Base::Scratch => {
                    crate::scratch::ensure(builder, build).await?;
                    StageState {
                        template: crate::scratch::TEMPLATE.to_string(),
                        snapshot: None,
                        key: tenant_base_key(&request, "scratch"),
                    }
                }
            };
        build.log(
            None,
            LogStream::Status,
            &format!(
                "stage {} : {}",
                stage
                    .name
                    .clone()
                    .unwrap_or_else(|| stage.index.to_string()),
                stage.text
            ),
        );
        let mut sandbox: Option<(SandboxId, AgentClient)> = None;
        let ran = run_stage(
            builder,
            build,
            &request,
            stage,
            &mut state,
            &mut sandbox,
            &states,
            &ctx,
            &ignore,
            &mut number,
            total,
        )
        .await;
        if let Some((id, _)) = sandbox.take() {
            if let Err(e) = builder.manager.kill(&id).await {
                tracing::warn!(sandbox = %id, error = %e, "removing a build sandbox");
            }
        }
        ran?;
        states.stages.insert(stage.index, state);
    }
    let target = plan.target();
    let state = states
        .stages
        .get(&target.index)
        .cloned()
        .ok_or_else(|| BuildError::StepFailed("the target stage was not built".into()))?;
    commit(builder, build, &request, &state, target.config()).await
}

/// Run one stage's steps from `state`, updating it; `sandbox` holds the stage's build
/// sandbox once one was needed (the caller removes it).
#[allow(clippy::too_many_arguments)]
async fn run_stage(
    builder: &Arc<Builder>,
    build: &Arc<Build>,
    request: &BuildRequest,
    stage: &hutch_dockerfile::Stage,
    state: &mut StageState,
    sandbox: &mut Option<(SandboxId, AgentClient)>,
    states: &Sources,
    ctx: &Arc<Context>,
    ignore: &Arc<DockerIgnore>,
    number: &mut usize,
    total: usize,
) -> Result<(), BuildError> {
    for step in &stage.steps {
        *number += 1;
        let n = *number;
        if build.cancelled() {
            return Err(BuildError::Cancelled);
        }
        build.log(
            Some(n),
            LogStream::Status,
            &format!("step {n}/{total} : {}", step.text),
        );
        if !step.changes_filesystem() {
            state.key = step_key(&state.key, step, None);
            build.step(n, StepStatus::Done, Some(Duration::ZERO));
            continue;
        }
        let fetch = crate::fetch::FetchPolicy {
            egress: builder.settings.downloads,
            refuse_local: !request.registry.operator,
        };
        let inputs = step_inputs(step, ctx, ignore, states, fetch).await?;
        state.key = step_key(&state.key, step, inputs.as_deref());
        if !request.no_cache {
            if let Some(sid) = builder.cache.get(&state.key) {
                if builder.manager.build_snapshot(&sid).await?.is_some() {
                    build.log(Some(n), LogStream::Status, " ---> CACHED");
                    build.step(n, StepStatus::Cached, None);
                    state.snapshot = Some(sid);
                    drop_sandbox(builder, sandbox).await;
                    continue;
                }
            }
        }
        build.step(n, StepStatus::Running, None);
        let t0 = Instant::now();
        let ran = async {
            // A step with cache mounts gets a build sandbox of its own with the caches'
            // volumes, thrown away after it (the next step's sandbox has none).
            let caches = match &step.instruction {
                Instruction::Run(run) if crate::mounts::has_caches(run) => {
                    drop_sandbox(builder, sandbox).await;
                    let caches =
                        crate::mounts::take_caches(builder, build, n, run, request).await?;
                    *sandbox =
                        Some(build_sandbox(builder, request, state, caches.volumes.clone()).await?);
                    Some(caches)
                }
                _ => None,
            };
            if sandbox.is_none() {
                *sandbox = Some(build_sandbox(builder, request, state, Vec::new()).await?);
            }
            let (id, client) = sandbox.as_ref().expect("made above");
            let files = crate::mounts::StepFiles {
                builder,
                build,
                n,
                step,
                ctx,
                ignore,
                states,
                request,
            };
            let label = format!("build-{}-step-{n}", request.template);
            let snap = async {
                run_step(&files, client, caches.as_ref()).await?;
                Ok::<_, BuildError>(builder.manager.snapshot_for_build(id, &label).await?)
            }
            .await;
            if caches.is_some() {
                // Before the caches are let go: their volumes are free once it is gone.
                drop_sandbox(builder, sandbox).await;
            }
            drop(caches);
            let snap = snap?;
            builder
                .cache
                .put(&state.key, &snap.id)
                .map_err(BuildError::io("recording a build step in the cache"))?;
            Ok::<_, BuildError>(snap)
        }
        .await;
        let snap = match ran {
            Ok(snap) => snap,
            Err(e) => {
                build.step(n, StepStatus::Failed, Some(t0.elapsed()));
                return Err(e);
            }
        };
        state.snapshot = Some(snap.id);
        build.step(n, StepStatus::Done, Some(t0.elapsed()));
        build.log(
            Some(n),
            LogStream::Status,
            &format!(" ---> done in {:.1} s", t0.elapsed().as_secs_f64()),
        );
    }
    Ok(())
}

/// Kill the stage's build sandbox, if it has one (the next step makes another).
async fn drop_sandbox(builder: &Arc<Builder>, sandbox: &mut Option<(SandboxId, AgentClient)>) {
    if let Some((id, _)) = sandbox.take() {
        let _ = builder.manager.kill(&id).await;
    }
}

/// The hash of what a step reads besides its instruction (context files, another stage).
async fn step_inputs(
    step: &Step,
    ctx: &Arc<Context>,
    ignore: &Arc<DockerIgnore>,
    states: &Sources,
    fetch: crate::fetch::FetchPolicy,
) -> Result<Option<String>, BuildError> {
    let copy = match &step.instruction {
        Instruction::Copy(copy) => copy,
        Instruction::Run(run) => return crate::mounts::bind_inputs(run, ctx, ignore, states).await,
        _ => return Ok(None),
    };
    match &copy.from {
        None => {
            // `ADD <url>`: what was downloaded, by its sha256.
            let mut downloaded = String::new();
            for url in copy.url_sources() {
                let fetched = states.downloads.fetch(&url, fetch).await?;
                crate::copy::check_checksum(copy, &url, &fetched)?;
                downloaded.push_str(&format!("{url} {}\n", fetched.sha256));
            }
            let files = hash_context_sources(ctx, ignore, copy.path_sources()).await?;
            Ok(Some(if downloaded.is_empty() {
                files
            } else {
                format!("{files}\n{downloaded}")
            }))
        }
        Some(CopyFrom::Stage { index }) => Ok(states.stages.get(index).map(|s| s.key.clone())),
        Some(CopyFrom::Image { reference }) => {
            Ok(states.images.get(reference).map(|s| s.key.clone()))
        }
    }
}

/// What `COPY --from` reads from: the stages built so far (by index) and the images the
/// Dockerfile copies from (by reference); and what `ADD <url>` downloaded.
#[derive(Debug)]
pub(crate) struct Sources {
    pub stages: HashMap<usize, StageState>,
    pub images: HashMap<String, StageState>,
    pub downloads: crate::fetch::Downloads,
}

impl Sources {
    /// The stage or image `from` names (`COPY --from`, a bind mount's `from=`).
    pub(crate) fn of(&self, from: &CopyFrom) -> Result<&StageState, BuildError> {
        match from {
            CopyFrom::Stage { index } => self
                .stages
                .get(index)
                .ok_or_else(|| BuildError::StepFailed(format!("stage {index} was not built"))),
            CopyFrom::Image { reference } => self.images.get(reference).ok_or_else(|| {
                BuildError::StepFailed(format!("the image {reference} was not pulled"))
            }),
        }
    }
}

/// The hash of the context files `sources` name (part of a step's cache key).
pub(crate) async fn hash_context_sources(
    ctx: &Arc<Context>,
    ignore: &Arc<DockerIgnore>,
    sources: Vec<String>,
) -> Result<String, BuildError> {
    let (ctx, ignore) = (ctx.clone(), ignore.clone());
    blocking(move || {
        let entries = ctx.resolve(&sources, &ignore)?;
        Ok(ctx.hash_entries(&entries)?)
    })
    .await
}

/// A sandbox of a finished stage (to copy files out of).
pub(crate) async fn stage_sandbox(
    builder: &Arc<Builder>,
    request: &BuildRequest,
    state: &StageState,
) -> Result<(SandboxId, AgentClient), BuildError> {
    build_sandbox(builder, request, state, Vec::new()).await
}

/// A build sandbox over `state`.
async fn build_sandbox(
    builder: &Arc<Builder>,
    request: &BuildRequest,
    state: &StageState,
    volumes: Vec<hutch_core::volume::VolumeMount>,
) -> Result<(SandboxId, AgentClient), BuildError> {
    let s = &builder.settings;
    let mut metadata = BTreeMap::new();
    metadata.insert("hutch.build".to_string(), request.template.clone());
    let view = builder
        .manager
        .create_build_sandbox(CreateSandbox {
            template: Some(state.template.clone()),
            isolation: IsolationRequest::Ns,
            ttl_seconds: Some(SANDBOX_TTL),
            tenant: request.tenant.clone(),
            metadata,
            cpus: Some(s.cpus),
            memory_mib: Some(s.memory_mib),
            disk_mib: Some(s.disk_mib),
            pids_max: Some(s.pids_max),
            network: Some(s.network.clone()),
            snapshot: state.snapshot.as_ref().map(|s| s.to_string()),
            volumes,
            ..CreateSandbox::default()
        })
        .await?;
    let id: SandboxId = view
        .id
        .parse()
        .map_err(|_| BuildError::StepFailed("a build sandbox got a bad id".into()))?;
    let client = builder.manager.agent(&id).await?;
    Ok((id, client))
}

/// Run one step that changes files in the build sandbox (`caches`: the volumes of its
/// cache mounts, which the sandbox has).
async fn run_step(
    files: &crate::mounts::StepFiles<'_>,
    client: &AgentClient,
    caches: Option<&crate::mounts::StepCaches>,
) -> Result<(), BuildError> {
    let crate::mounts::StepFiles {
        builder,
        build,
        n,
        step,
        ..
    } = *files;
    let fail = |why: String| {
        BuildError::StepFailed(format!(
            "step {n} (Dockerfile line {}) `{}` failed: {why}",
            step.line, step.text
        ))
    };
    match &step.instruction {
        Instruction::Run(run) => {
            if let Some(script) = &run.script {
                client
                    .write_file_bytes(&script.path, Some(0o755), script.content.clone().into())
                    .await?;
            }
            let staged = crate::mounts::stage(files, run, client, caches).await?;
            let mut env: BTreeMap<String, String> = step.environment().into_iter().collect();
            env.extend(staged.env.iter().cloned());
            let request = ExecRequest {
                cmd: Command::Argv(run.argv.clone()),
                env,
                cwd: Some(step.config.workdir.clone()),
                user: step.config.user.clone(),
                timeout_ms: Some(builder.settings.step_timeout.as_millis() as u64),
                pty: None,
                stdin: false,
                background: false,
                handle: None,
            };
            let exit = stream_exec(build, n, client, request).await?;
            if exit.timed_out {
                return Err(fail(format!(
                    "killed after {} s (the build's step timeout)",
                    builder.settings.step_timeout.as_secs()
                )));
            }
            if exit.exit_code != 0 {
                return Err(fail(format!("exit code {}", exit.exit_code)));
            }
            crate::mounts::unstage(client, staged).await
        }
        Instruction::Workdir { path } => {
            let request = tool_exec(
                vec!["mkdir".into(), "-p".into(), path.clone()],
                step.environment().into_iter().collect(),
                60_000,
            );
            let exit = stream_exec(build, n, client, request).await?;
            if exit.exit_code != 0 {
                return Err(fail(format!("mkdir -p exited {}", exit.exit_code)));
            }
            Ok(())
        }
        Instruction::Copy(copy) => {
            crate::copy::copy(files, copy, client)
                .await
                .map_err(|e| match e {
                    BuildError::StepFailed(why) => fail(why),
                    other => other,
                })
        }
        _ => Ok(()),
    }
}

/// Run `request` in the build sandbox, its output into the build log line by line.
pub(crate) async fn stream_exec(
    build: &Arc<Build>,
    n: usize,
    client: &AgentClient,
    request: ExecRequest,
) -> Result<hutch_proto::ExecExit, BuildError> {
    let mut session = client.exec(request).await?;
    let mut partial = [Vec::new(), Vec::new()];
    let mut cancel = build.cancel.subscribe();
    // A cancel sent before this exec subscribed (while its sandbox was made) counts too.
    if *cancel.borrow_and_update() {
        let _ = session.input.signal(SIGKILL).await;
        return Err(BuildError::Cancelled);
    }
    loop {
        let event = tokio::select! {
            e = session.events.next() => e,
            _ = cancel.changed() => {
                let _ = session.input.signal(SIGKILL).await;
                return Err(BuildError::Cancelled);
            }
        };
        let Some(event) = event else {
            return Err(BuildError::StepFailed(
                "the build sandbox's exec ended without an exit".into(),
            ));
        };
        match event? {
            ExecEvent::Started { .. } | ExecEvent::Missed(_) => {}
            ExecEvent::Stdout(b) => push_lines(build, n, LogStream::Stdout, &mut partial[0], &b),
            ExecEvent::Stderr(b) => push_lines(build, n, LogStream::Stderr, &mut partial[1], &b),
            ExecEvent::Exit(exit) => {
                for (i, stream) in [LogStream::Stdout, LogStream::Stderr]
                    .into_iter()
                    .enumerate()
                {
                    if !partial[i].is_empty() {
                        build.log(Some(n), stream, &String::from_utf8_lossy(&partial[i]));
                    }
                }
                return Ok(exit);
            }
            ExecEvent::Error(e) => return Err(BuildError::StepFailed(e.message)),
        }
    }
}

/// SIGKILL, sent to a cancelled step's process group.
const SIGKILL: i32 = 9;

/// Run `argv`, a command of the build's own ([`tool_exec`]), within `timeout_ms`; an exit
/// other than 0 fails the step, naming the command.
pub(crate) async fn run_tool(
    build: &Arc<Build>,
    n: usize,
    client: &AgentClient,
    argv: &[&str],
    timeout_ms: u64,
) -> Result<(), BuildError> {
    let argv: Vec<String> = argv.iter().map(|a| (*a).to_owned()).collect();
    let request = tool_exec(argv.clone(), BTreeMap::new(), timeout_ms);
    let exit = stream_exec(build, n, client, request).await?;
    if exit.exit_code != 0 {
        return Err(BuildError::StepFailed(format!(
            "`{}` exited {}",
            argv.join(" "),
            exit.exit_code
        )));
    }
    Ok(())
}

/// A command the build runs for itself (not one of the Dockerfile's): as root in `/`.
pub(crate) fn tool_exec(
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    timeout_ms: u64,
) -> ExecRequest {
    ExecRequest {
        cmd: Command::Argv(argv),
        env,
        cwd: Some("/".into()),
        user: None,
        timeout_ms: Some(timeout_ms),
        pty: None,
        stdin: false,
        background: false,
        handle: None,
    }
}

fn push_lines(build: &Build, n: usize, stream: LogStream, partial: &mut Vec<u8>, bytes: &[u8]) {
    partial.extend_from_slice(bytes);
    let mut start = 0;
    while let Some(end) = partial[start..].iter().position(|&b| b == b'\n') {
        let line = &partial[start..start + end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        build.log(Some(n), stream, &String::from_utf8_lossy(line));
        start += end + 1;
    }
    partial.drain(..start);
    if partial.len() > crate::log::MAX_LINE {
        build.log(Some(n), stream, &String::from_utf8_lossy(partial));
        partial.clear();
    }
}

/// The template (and config) a `FROM` reference names: a ready Hutch template of that name,
/// else an image pulled into a template of its own (`image-<hash>`).
async fn resolve_base(
    builder: &Arc<Builder>,
    build: &Arc<Build>,
    request: &BuildRequest,
    reference: &str,
) -> Result<(BaseTemplate, StageConfig), BuildError> {
    let templates = builder.manager.templates();
    if let Some(info) = templates.get(reference).filter(|i| i.ready) {
        build.log(
            None,
            LogStream::Status,
            &format!("FROM {reference}: the Hutch template {reference}"),
        );
        let mut config = StageConfig::default();
        for (k, v) in &info.defaults.env {
            config.set_env(k, v);
        }
        // As an image's config carries over to the images built on it.
        if let Some(dir) = &info.defaults.exec.cwd {
            config.workdir = dir.clone();
        }
        config.user = info.defaults.exec.user.clone();
        let identity = format!(
            "template:{}:{}:{}",
            info.name,
            info.created_at.clone().unwrap_or_default(),
            info.build_key.clone().unwrap_or_default()
        );
        return Ok((
            BaseTemplate {
                template: info.name,
                identity,
            },
            config,
        ));
    }
    let name = image_base_name(request, reference);
    build.log(
        None,
        LogStream::Status,
        &format!("FROM {reference}: pulling the image into template {name}"),
    );
    // A tenant's pull is its own template: no other tenant creates from it, nor builds on
    // it without pulling (and so passing the registry's access check) itself.
    builder
        .manager
        .claim_template_for_build(&name, request.tenant.as_ref())
        .await?;
    let manager = builder.manager.clone();
    let source = ImageSource {
        reference: reference.to_string(),
        pull: request.registry.pull_options(&builder.settings),
        local: None,
        resources: Default::default(),
    };
    let (b, n) = (build.clone(), name.clone());
    // A cancel of the build stops the pull at once.
    let (cancel, _following) = build.cancel_flag();
    let options = BuildOptions {
        cancel: Some(cancel),
        ..BuildOptions::default()
    };
    let info = blocking(move || {
        let mut progress = |p: Progress| log_progress(&b, p);
        Ok(manager
            .templates()
            .build_image(&n, &source, &options, &mut progress)?)
    })
    .await
    .map_err(|e| {
        if build.cancelled() {
            BuildError::Cancelled
        } else {
            e
        }
    })?;
    let mut config = StageConfig::default();
    if let Some(image) = &info.image {
        for pair in &image.env {
            if let Some((k, v)) = pair.split_once('=') {
                config.set_env(k, v);
            }
        }
        if let Some(dir) = &image.working_dir {
            config.workdir = dir.clone();
        }
        config.user = image.user.clone();
        config.entrypoint = image.entrypoint.clone();
        config.cmd = image.cmd.clone();
        config.exposed_ports = image.exposed_ports.iter().cloned().collect();
    }
    let identity = format!(
        "image:{}",
        info.image
            .as_ref()
            .map(|i| i.digest.clone())
            .unwrap_or_default()
    );
    Ok((
        BaseTemplate {
            template: name,
            identity,
        },
        config,
    ))
}

/// The cache key a stage starts from: its base's identity, within the build's tenant, so
/// one tenant's step results (what its `RUN`s fetched with its secrets and network) are
/// never another tenant's cache hits. Builds without a tenant keep the unscoped keys.
fn tenant_base_key(request: &BuildRequest, identity: &str) -> String {
    match &request.tenant {
        None => base_key(identity),
        Some(t) => base_key(&format!("tenant:{}\0{identity}", t.as_str())),
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The template a `FROM` image is pulled into: one per reference, tenant and credentials
/// (`image-<hash>`).
fn image_base_name(request: &BuildRequest, reference: &str) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    hasher.update(reference.as_bytes());
    // The anonymous pull of a shared build hashes as the reference alone, as before.
    let identity = request.registry.identity();
    if request.tenant.is_some() || identity != "anonymous" {
        let tenant = request.tenant.as_ref().map(|t| t.as_str()).unwrap_or("");
        hasher.update(format!("\0{tenant}\0{identity}").as_bytes());
    }
    format!("image-{}", &hex(&hasher.finalize())[..16])
}

/// A template store's progress into the build's log.
pub(crate) fn log_progress(build: &Build, p: Progress) {
    match p {
        Progress::Step(s) => build.log(None, LogStream::Status, &s),
        Progress::Output(line) => build.log(None, LogStream::Stdout, &line),
        Progress::Transfer(t) => build.transfer(None, t),
        Progress::Done { .. } => {}
    }
}

/// Make the template from the target stage's last state.
async fn commit(
    builder: &Arc<Builder>,
    build: &Arc<Build>,
    request: &BuildRequest,
    state: &StageState,
    config: &StageConfig,
) -> Result<(), BuildError> {
    let manager = &builder.manager;
    let layer = match &state.snapshot {
        Some(sid) => {
            let snap = manager.build_snapshot(sid).await?.ok_or_else(|| {
                BuildError::StepFailed(format!("the last step's snapshot {sid} is gone"))
            })?;
            Some(manager.snapshot_files(&snap)?)
        }
        None => None,
    };
    let base = manager.templates().rootfs(&state.template);
    let base_defaults = manager
        .templates()
        .get(&state.template)
        .map(|i| i.defaults)
        .unwrap_or_default();
    let mut env: BTreeMap<String, String> = config.env.iter().cloned().collect();
    env.entry("PATH".into())
        .or_insert_with(|| hutch_dockerfile::DEFAULT_PATH.to_string());
    let mut defaults = ResourceDefaults {
        env,
        isolation: None,
        // The last `WORKDIR` and `USER` (inherited from `FROM`) are where and as whom the
        // template's sandboxes run commands by default; a workdir never set stays Hutch's.
        exec: hutch_proto::ExecDefaults {
            cwd: (config.workdir != "/").then(|| config.workdir.clone()),
            user: config.user.clone(),
        },
        ..base_defaults
    };
    request.sandbox_resources.apply(&mut defaults);
    let source = LayeredSource {
        base,
        layer,
        recipe: "dockerfile".into(),
        description: format!("built from a Dockerfile (over {})", state.template),
        defaults,
        build_key: state.key.clone(),
    };
    // No CMD or ENTRYPOINT of its own: the FROM template's start command carries over, as
    // an image's CMD does in Docker (with this Dockerfile's HEALTHCHECK, if any).
    let start = start_spec(config).or_else(|| {
        let mut inherited = manager.templates().get(&state.template)?.start?;
        if config.healthcheck.is_some() {
            inherited.ready = ready_check(config);
        }
        Some(inherited)
    });
    let options = BuildOptions {
        force: request.no_cache,
        start,
        ..BuildOptions::default()
    };
    let manager = builder.manager.clone();
    let (b, name, tag) = (build.clone(), request.template.clone(), request.tag.clone());
    blocking(move || {
        let mut progress = |p: Progress| log_progress(&b, p);
        let info = manager
            .templates()
            .build_layered(&name, &source, &options, &mut progress)?;
        if let Some(tag) = &tag {
            manager.templates().set_tag(&name, tag, info.rev)?;
            b.log(
                None,
                LogStream::Status,
                &format!("tagged {name}:{tag} (revision {})", info.rev),
            );
        }
        Ok(())
    })
    .await?;
    // The replaced revision goes unless sandboxes or snapshots still use it.
    if let Err(e) = builder.manager.collect_template_revisions().await {
        tracing::warn!(error = %e, "collecting unused template revisions");
    }
    Ok(())
}

/// The start command a stage's config gives: `ENTRYPOINT` + `CMD` run as `USER` in
/// `WORKDIR`, ready when `HEALTHCHECK` passes.
pub(crate) fn start_spec(config: &StageConfig) -> Option<ServiceSpec> {
    let argv = config.start_command();
    if argv.is_empty() {
        return None;
    }
    Some(ServiceSpec {
        cmd: Command::Argv(argv),
        env: BTreeMap::new(),
        cwd: Some(config.workdir.clone()),
        user: config.user.clone(),
        ready: ready_check(config),
    })
}

/// The ready check a stage's `HEALTHCHECK` gives.
fn ready_check(config: &StageConfig) -> Option<ReadyCheck> {
    config.healthcheck.as_ref().map(|h| {
        let cmd = match &h.test {
            HealthTest::Exec(argv) => Command::Argv(argv.clone()),
            HealthTest::Shell(_) => Command::Argv(h.argv(&config.shell)),
        };
        let attempts = u64::from(h.retries.max(1));
        let interval = h.interval.min(Duration::from_secs(1));
        ReadyCheck {
            probe: ReadyProbe::Cmd(cmd),
            interval_ms: interval.as_millis() as u64,
            attempt_timeout_ms: h.timeout.as_millis().max(1) as u64,
            timeout_ms: (h.start_period + h.timeout * attempts as u32 + Duration::from_secs(60))
                .as_millis() as u64,
        }
    })
}
