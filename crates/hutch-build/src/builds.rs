//! [`Builder`]: the server's template builds — started, watched, followed and cancelled.
//! Builds live in memory (a restart forgets them; their cached steps stay). Builds of one
//! template run one at a time, in the order asked; builds of different templates run at
//! once.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hutch_core::net::policy::PolicySpec;
use hutch_core::tenant::Tenant;
use hutch_core::Manager;
use tokio::sync::{broadcast, watch};

use crate::cache::StepCache;
use crate::error::BuildError;
use crate::log::{BuildLog, BuildLogLine, LogStream};
use crate::{BuildStatus, BuildView, StepStatus, StepView};

/// Builds kept per template (the oldest finished ones are forgotten).
const KEPT_BUILDS: usize = 20;

/// Ends the task that sets a [`Build::cancel_flag`].
pub(crate) struct CancelFlagGuard(tokio::task::JoinHandle<()>);

impl Drop for CancelFlagGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What build sandboxes get.
#[derive(Debug, Clone)]
pub struct BuildSettings {
    /// CPUs of a build sandbox.
    pub cpus: f64,
    /// Memory of a build sandbox (MiB).
    pub memory_mib: u64,
    /// Writable disk of a build sandbox (MiB).
    pub disk_mib: u64,
    /// Tasks of a build sandbox.
    pub pids_max: u32,
    /// Network policy of `RUN` steps (`RUN --network=none` gets none).
    pub network: PolicySpec,
    /// Longest one `RUN` may take.
    pub step_timeout: Duration,
    /// PEM files of CA certificates trusted for registries besides the system's
    /// (`hutch serve --registry-ca`).
    pub registry_ca: Vec<PathBuf>,
    /// Registries spoken to over plain HTTP for every build (`hutch serve
    /// --insecure-registry`).
    pub insecure_registries: Vec<String>,
    /// `Some`: the only registries builds may pull from (`hutch serve --allowed-registry`).
    pub allowed_registries: Option<Vec<String>>,
    /// `ADD <url>` downloads are made (`hutch serve --build-egress allow`, the default):
    /// the server fetches them, so an operator who keeps builds off the network turns them
    /// off too.
    pub downloads: bool,
    /// Size of a new `RUN --mount=type=cache` volume (MiB; sparse, so only what is
    /// written uses disk).
    pub cache_mount_mib: u64,
    /// What the server's own prunes of the step cache remove (every
    /// [`crate::AUTO_PRUNE_EVERY`]); nothing set: none.
    pub auto_prune: crate::PrunePolicy,
    /// What an image (pulled, uploaded, or a Dockerfile's `FROM`) may unpack to: bytes of
    /// file data and entries, all layers together (`hutch serve --image-max-mib`,
    /// `--image-max-files`).
    pub image_limits: hutch_template::Limits,
    /// Most builds queued or running at once on the server.
    pub max_pending: usize,
    /// Most of them one tenant may have.
    pub max_pending_per_tenant: usize,
}

impl Default for BuildSettings {
    fn default() -> Self {
        Self {
            cpus: 2.0,
            memory_mib: 2048,
            disk_mib: 8192,
            pids_max: 4096,
            network: PolicySpec {
                egress: hutch_core::net::policy::Egress::Allow,
                ..PolicySpec::default()
            },
            step_timeout: Duration::from_secs(30 * 60),
            registry_ca: Vec::new(),
            insecure_registries: Vec::new(),
            allowed_registries: None,
            downloads: true,
            cache_mount_mib: 10 * 1024,
            auto_prune: crate::PrunePolicy::default(),
            image_limits: hutch_template::Limits::default(),
            max_pending: 32,
            max_pending_per_tenant: 8,
        }
    }
}

/// A build to start.
#[derive(Debug, Clone)]
pub struct BuildRequest {
    /// The template to make (or replace, once the build succeeds).
    pub template: String,
    /// The extracted build context; the build owns it and deletes it when it ends.
    pub context_dir: PathBuf,
    /// The Dockerfile's path inside the context (`Dockerfile`).
    pub dockerfile: String,
    /// `--build-arg`s.
    pub build_args: BTreeMap<String, String>,
    /// The stage to build (default: the last).
    pub target: Option<String>,
    /// Run every step, ignoring the cache.
    pub no_cache: bool,
    /// Whose build sandboxes these are.
    pub tenant: Option<Tenant>,
    /// Resources the template's sandboxes get by default, where the build sets them
    /// (otherwise the `FROM` template's).
    pub sandbox_resources: crate::SandboxResources,
    /// How images (`FROM` ones, or the image of an image build) are pulled.
    pub registry: RegistryAccess,
    /// `Some`: the template is this image (no Dockerfile is read).
    pub image: Option<ImageBuild>,
    /// Tag the revision the build makes (`web:v2`), once it succeeded.
    pub tag: Option<String>,
    /// What `RUN --mount=type=secret` steps read.
    pub secrets: crate::mounts::BuildSecrets,
}

/// A build whose template is an OCI image, pulled from a registry or read from files the
/// client uploaded.
#[derive(Debug, Clone)]
pub struct ImageBuild {
    /// What the template records as its image (`registry:5000/team/tools:1`).
    pub reference: String,
    /// The uploaded image's files, for an upload.
    pub local: Option<hutch_template::LocalImage>,
    /// The template's start command and ready check.
    pub start: Option<hutch_proto::ServiceSpec>,
    /// Pull and unpack again even when the template is from this reference already.
    pub force: bool,
}

/// Who a build pulls images as.
#[derive(Debug, Clone, Default)]
pub struct RegistryAccess {
    /// The request's own credentials.
    pub credentials: Option<hutch_template::Credentials>,
    /// Registries this request speaks plain HTTP to (besides the server's).
    pub insecure_registries: Vec<String>,
    /// The operator's own build (an admin key): it is lent the host's Docker
    /// `config.json` credentials and may pull from the host's own addresses (loopback,
    /// link-local). A tenant's build gets neither: it never pulls with the operator's
    /// credentials nor makes the host connect to its own services.
    pub operator: bool,
}

impl RegistryAccess {
    /// The pull options of a build under `settings`.
    pub(crate) fn pull_options(&self, settings: &BuildSettings) -> hutch_template::PullOptions {
        let mut insecure = settings.insecure_registries.clone();
        insecure.extend(self.insecure_registries.iter().cloned());
        hutch_template::PullOptions {
            credentials: self.credentials.clone(),
            ignore_docker_config: !self.operator,
            allowed_registries: settings.allowed_registries.clone(),
            refuse_local_addresses: !self.operator,
            insecure_registries: insecure,
            ca_certificates: settings.registry_ca.clone(),
            limits: settings.image_limits,
            ..hutch_template::PullOptions::default()
        }
    }

    /// What tells apart pulls of one reference as different callers: anonymous, the host's
    /// credentials, or a user and a hash of the password.
    pub(crate) fn identity(&self) -> String {
        use sha2::Digest;
        match &self.credentials {
            Some(c) => {
                let secret = sha2::Sha256::digest(c.secret().as_bytes());
                format!("user:{}:{}", c.username, crate::engine::hex(&secret[..8]))
            }
            None if self.operator => "host".into(),
            None => "anonymous".into(),
        }
    }
}

/// One build's state.
pub(crate) struct Build {
    pub id: String,
    pub template: String,
    /// Whose build it is (`None`: an admin key's).
    pub tenant: Option<Tenant>,
    pub state: Mutex<BuildState>,
    pub done: watch::Sender<BuildStatus>,
    pub cancel: watch::Sender<bool>,
    pub started: Instant,
}

pub(crate) struct BuildState {
    pub status: BuildStatus,
    pub steps: Vec<StepView>,
    pub warnings: Vec<String>,
    pub created_ms: i64,
    pub finished_ms: Option<i64>,
    pub error: Option<String>,
    pub log: BuildLog,
}

impl Build {
    pub fn lock(&self) -> MutexGuard<'_, BuildState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Append a line to its log.
    pub fn log(&self, step: Option<usize>, stream: LogStream, text: &str) {
        self.lock().log.push(step, stream, text);
    }

    /// Report how far a blob's download or extraction is.
    pub fn transfer(&self, step: Option<usize>, transfer: hutch_template::Transfer) {
        self.lock().log.push_transfer(step, transfer);
    }

    /// Set step `number`'s status (and duration).
    pub fn step(&self, number: usize, status: StepStatus, duration: Option<Duration>) {
        let mut st = self.lock();
        if let Some(step) = st.steps.get_mut(number.wrapping_sub(1)) {
            step.status = status;
            step.duration_ms = duration.map(|d| d.as_millis() as u64);
        }
    }

    /// Whether a client cancelled it.
    pub fn cancelled(&self) -> bool {
        *self.cancel.borrow()
    }

    /// A flag that is set once the build is cancelled, for blocking work that looks at it
    /// (an image pull between two chunks of a layer); it stops following the build when
    /// the guard is dropped.
    pub(crate) fn cancel_flag(&self) -> (Arc<std::sync::atomic::AtomicBool>, CancelFlagGuard) {
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(self.cancelled()));
        let mut rx = self.cancel.subscribe();
        let set = flag.clone();
        let task = tokio::spawn(async move {
            if rx.wait_for(|c| *c).await.is_ok() {
                set.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        });
        (flag, CancelFlagGuard(task))
    }

    fn view(&self) -> BuildView {
        let st = self.lock();
        BuildView {
            id: self.id.clone(),
            template: self.template.clone(),
            status: st.status,
            steps: st.steps.clone(),
            warnings: st.warnings.clone(),
            created_at: hutch_core::time::rfc3339(st.created_ms),
            finished_at: st.finished_ms.map(hutch_core::time::rfc3339),
            duration_ms: st.finished_ms.map(|f| (f - st.created_ms).max(0) as u64),
            error: st.error.clone(),
        }
    }

    /// End it with `result`.
    pub fn finish(&self, result: Result<(), BuildError>) {
        let status = {
            let mut st = self.lock();
            st.finished_ms = Some(hutch_core::time::now_ms());
            st.status = match &result {
                Ok(()) => BuildStatus::Succeeded,
                Err(BuildError::Cancelled) => BuildStatus::Cancelled,
                Err(_) => BuildStatus::Failed,
            };
            if let Err(e) = &result {
                st.error = Some(e.to_string());
            }
            let line = match &result {
                Ok(()) => format!(
                    "template {} is ready ({:.1} s)",
                    self.template,
                    self.started.elapsed().as_secs_f64()
                ),
                Err(e) => format!("build failed: {e}"),
            };
            st.log.push(None, LogStream::Status, &line);
            st.status
        };
        // Stored even when nobody follows yet (`send` would drop it without receivers).
        self.done.send_replace(status);
    }
}

/// A followed build log: what was written so far, what comes next, and when it ends.
pub struct LogFollow {
    /// The lines written so far (the last [`crate::log::MAX_LOG_LINES`]).
    pub backlog: Vec<BuildLogLine>,
    /// Lines as they are written.
    pub lines: broadcast::Receiver<BuildLogLine>,
    /// The build's status; changes once, when it ends.
    pub done: watch::Receiver<BuildStatus>,
}

/// The server's template builds.
pub struct Builder {
    pub(crate) manager: Arc<Manager>,
    pub(crate) settings: BuildSettings,
    pub(crate) cache: StepCache,
    builds: Mutex<HashMap<String, Vec<Arc<Build>>>>,
    /// One build per template at a time.
    pub(crate) template_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// One step at a time uses a cache volume.
    pub(crate) cache_locks: crate::mounts::CacheLocks,
    /// Held (shared) by every running build, (exclusive) by a prune of the step cache.
    pub(crate) prune_lock: tokio::sync::RwLock<()>,
}

impl Builder {
    /// A builder over `manager`'s templates and sandboxes; its step cache index lives in
    /// the state directory (`build-cache/`).
    pub fn new(manager: Arc<Manager>, settings: BuildSettings) -> Arc<Self> {
        let cache = StepCache::open(manager.config().state_dir.join("build-cache"));
        Arc::new(Self {
            manager,
            settings,
            cache,
            builds: Mutex::default(),
            template_locks: Mutex::default(),
            cache_locks: crate::mounts::CacheLocks::default(),
            prune_lock: tokio::sync::RwLock::new(()),
        })
    }

    fn builds(&self) -> MutexGuard<'_, HashMap<String, Vec<Arc<Build>>>> {
        self.builds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Check `request` (the name, the Dockerfile: a bad instruction is refused here, naming
    /// its line) and start it in the background.
    pub async fn start(self: &Arc<Self>, request: BuildRequest) -> Result<BuildView, BuildError> {
        let admitted = admit(&self.builds(), &self.settings, request.tenant.as_ref());
        if let Err(e) = admitted {
            crate::engine::remove_context(&request.context_dir).await;
            return Err(e);
        }
        let checked = crate::engine::check(&request).await;
        let steps = match checked {
            Ok(Some(plan)) => (crate::engine::step_views(&plan), plan.warnings),
            Ok(None) => (Vec::new(), Vec::new()),
            Err(e) => {
                crate::engine::remove_context(&request.context_dir).await;
                return Err(e);
            }
        };
        let id = format!("bld_{}", hutch_core::ids::random_token(16));
        let (done, _) = watch::channel(BuildStatus::Queued);
        let (cancel, _) = watch::channel(false);
        let build = Arc::new(Build {
            id: id.clone(),
            template: request.template.clone(),
            tenant: request.tenant.clone(),
            state: Mutex::new(BuildState {
                status: BuildStatus::Queued,
                steps: steps.0,
                warnings: steps.1,
                created_ms: hutch_core::time::now_ms(),
                finished_ms: None,
                error: None,
                log: BuildLog::default(),
            }),
            done,
            cancel,
            started: Instant::now(),
        });
        {
            let mut builds = self.builds();
            // Again under the lock: builds started meanwhile count.
            if let Err(e) = admit(&builds, &self.settings, request.tenant.as_ref()) {
                drop(builds);
                let _ = std::fs::remove_dir_all(&request.context_dir);
                return Err(e);
            }
            let list = builds.entry(request.template.clone()).or_default();
            if list.len() >= KEPT_BUILDS {
                if let Some(i) = list.iter().position(|b| b.lock().status.is_done()) {
                    list.remove(i);
                }
            }
            list.push(build.clone());
        }
        let view = build.view();
        let builder = self.clone();
        tokio::spawn(async move {
            let context = request.context_dir.clone();
            let result = crate::engine::run(&builder, &build, request).await;
            crate::engine::remove_context(&context).await;
            if let Err(e) = &result {
                tracing::warn!(build = %build.id, template = %build.template, error = %e, "template build failed");
            }
            build.finish(result);
        });
        Ok(view)
    }

    fn find(&self, template: &str, id: &str) -> Option<Arc<Build>> {
        self.builds()
            .get(template)?
            .iter()
            .find(|b| b.id == id)
            .cloned()
    }

    /// Build `id` of `template`.
    pub fn get(&self, template: &str, id: &str) -> Result<BuildView, BuildError> {
        self.find(template, id)
            .map(|b| b.view())
            .ok_or_else(|| not_found(template, id))
    }

    /// The builds of `template` this server remembers, oldest first.
    pub fn list(&self, template: &str) -> Vec<BuildView> {
        self.builds()
            .get(template)
            .map(|l| l.iter().map(|b| b.view()).collect())
            .unwrap_or_default()
    }

    /// Whether a build of `template` is queued or running.
    pub fn building(&self, template: &str) -> bool {
        self.builds()
            .get(template)
            .is_some_and(|l| l.iter().any(|b| !b.lock().status.is_done()))
    }

    /// Follow the log of build `id`.
    pub fn follow(&self, template: &str, id: &str) -> Result<LogFollow, BuildError> {
        let build = self
            .find(template, id)
            .ok_or_else(|| not_found(template, id))?;
        let (backlog, lines) = build.lock().log.follow();
        Ok(LogFollow {
            backlog,
            lines,
            done: build.done.subscribe(),
        })
    }

    /// Cancel build `id`: its running step is killed with its sandbox, and the template
    /// stays as it was. A finished build is left as it is.
    pub fn cancel(&self, template: &str, id: &str) -> Result<BuildView, BuildError> {
        let build = self
            .find(template, id)
            .ok_or_else(|| not_found(template, id))?;
        if !build.lock().status.is_done() {
            // Stored even between steps, when no exec is watching it.
            build.cancel.send_replace(true);
        }
        Ok(build.view())
    }
}

fn not_found(template: &str, id: &str) -> BuildError {
    BuildError::NotFound(format!("template {template:?} has no build {id}"))
}

/// Refuse a build past the server's or the tenant's bound on pending builds.
fn admit(
    builds: &HashMap<String, Vec<Arc<Build>>>,
    settings: &BuildSettings,
    tenant: Option<&Tenant>,
) -> Result<(), BuildError> {
    let pending: Vec<&Arc<Build>> = builds
        .values()
        .flatten()
        .filter(|b| !b.lock().status.is_done())
        .collect();
    if pending.len() >= settings.max_pending {
        return Err(BuildError::TooMany(format!(
            "{} template builds are queued or running, the server's limit: try again once one ends",
            pending.len()
        )));
    }
    if let Some(tenant) = tenant {
        let mine = pending
            .iter()
            .filter(|b| b.tenant.as_ref() == Some(tenant))
            .count();
        if mine >= settings.max_pending_per_tenant {
            return Err(BuildError::TooMany(format!(
                    "tenant {tenant} has {mine} template builds queued or running, the limit per tenant: try again once one ends"
                )));
        }
    }
    Ok(())
}
