//! The sandbox manager: the one place that changes sandbox state.
//!
//! Each operation follows the same shape: load the record, check the state allows it
//! (`SandboxState::can_*`, else `Conflict`), act through the backend or the agent, save.
//! Records live in SQLite, so a restarted server re-adopts running sandboxes
//! ([`Manager::readopt`]); the in-memory map only caches agent connections.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hutch_proto::client::{AgentClient, ClientError, ExecSession};
use hutch_template::TemplateStore;

use crate::backend::ns::NsBackend;
use crate::backend::{Backend, Usage};
use crate::config::Config;
use crate::error::{CoreError, CoreResult};
use crate::events::EventBus;
use crate::exec::{ExecCommand, ExecOutcome};
use crate::ids;
use crate::metrics::Metrics;
use crate::model::{
    CreateSandbox, Isolation, IsolationRequest, ListFilter, SandboxRecord, SandboxState,
    SandboxView, UpdateSandbox,
};
use crate::store::{KeyOwner, Store};
use crate::time::now_ms;

/// First uid slot handed out (slot × 65536 = uid base): keeps clear of host users.
const MIN_UID_SLOT: u32 = 16;
/// Slot count: 16..60000 keeps every uid below 2^32.
const UID_SLOTS: u32 = 60_000 - MIN_UID_SLOT;

/// The manager. Cheap to share behind an `Arc`.
pub struct Manager {
    cfg: Config,
    store: Store,
    templates: TemplateStore,
    ns: Arc<NsBackend>,
    agents: Mutex<HashMap<String, AgentClient>>,
    events: EventBus,
    metrics: Metrics,
}

fn client_error(e: ClientError) -> CoreError {
    match e {
        ClientError::Agent(a) => CoreError::Agent {
            code: serde_json::to_value(a.code)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_else(|| "internal".into()),
            message: a.message,
        },
        other => CoreError::SandboxFailed(format!("agent connection: {other}")),
    }
}

impl Manager {
    /// Open the state directory, re-adopt surviving sandboxes and start the reaper.
    pub async fn start(cfg: Config) -> CoreResult<Arc<Self>> {
        std::fs::create_dir_all(cfg.state_dir.join("sandboxes"))
            .map_err(|e| CoreError::Internal(format!("create {}: {e}", cfg.state_dir.display())))?;
        std::fs::create_dir_all(&cfg.templates_dir).map_err(|e| {
            CoreError::Internal(format!("create {}: {e}", cfg.templates_dir.display()))
        })?;
        let store = Store::open(&cfg.state_dir.join("state.db"))?;
        let templates = TemplateStore::open(&cfg.templates_dir)
            .map_err(|e| CoreError::Internal(format!("templates: {e}")))?;
        let mgr = Arc::new(Self {
            ns: Arc::new(NsBackend::new(cfg.clone())),
            cfg,
            store,
            templates,
            agents: Mutex::new(HashMap::new()),
            events: EventBus::new(),
            metrics: Metrics::default(),
        });
        mgr.readopt().await?;
        let weak = Arc::downgrade(&mgr);
        let interval = mgr.cfg.reaper_interval;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(m) = weak.upgrade() else { break };
                m.reap_expired().await;
            }
        });
        Ok(mgr)
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Lifecycle events.
    pub fn events(&self) -> &EventBus {
        &self.events
    }

    /// The template store.
    pub fn templates(&self) -> &TemplateStore {
        &self.templates
    }

    /// Make sure an admin key exists; returns it when it was just created.
    pub fn ensure_admin_key(&self) -> CoreResult<String> {
        let path = self.cfg.state_dir.join("admin.key");
        if let Ok(existing) = std::fs::read_to_string(&path) {
            let key = existing.trim().to_string();
            if self.store.key_owner(&key)?.is_some() {
                return Ok(key);
            }
        }
        let key = ids::new_api_key();
        self.store.add_api_key(
            &key,
            &KeyOwner {
                tenant: "admin".into(),
                admin: true,
            },
        )?;
        write_secret(&path, &key)?;
        Ok(key)
    }

    /// Who owns an API key.
    pub fn authenticate(&self, key: &str) -> CoreResult<Option<KeyOwner>> {
        self.store.key_owner(key)
    }

    fn backend(&self, isolation: Isolation) -> CoreResult<Arc<dyn Backend>> {
        match isolation {
            Isolation::Ns => Ok(self.ns.clone()),
            Isolation::Vm => Err(CoreError::InvalidArgument(
                "isolation \"vm\" is not available on this server yet; use \"ns\" or \"auto\""
                    .into(),
            )),
        }
    }

    fn resolve_isolation(&self, req: IsolationRequest) -> CoreResult<Isolation> {
        match req {
            // `auto` picks vm only where hardware virtualization works; the vm backend is not
            // built yet, so every host gets ns.
            IsolationRequest::Auto | IsolationRequest::Ns => Ok(Isolation::Ns),
            IsolationRequest::Vm => self.backend(Isolation::Vm).map(|_| Isolation::Vm),
        }
    }

    /// Create and start a sandbox; returns once its agent answers.
    pub async fn create(self: &Arc<Self>, cmd: CreateSandbox) -> CoreResult<SandboxView> {
        let t0 = Instant::now();
        let template = cmd
            .template
            .clone()
            .unwrap_or_else(|| self.cfg.default_template.clone());
        let info = self.templates.get(&template).ok_or_else(|| {
            CoreError::NotFound(format!(
                "template {template:?} does not exist or is not built (build it with `hutch template build {template}`)"
            ))
        })?;
        if !info.ready {
            return Err(CoreError::Conflict(format!(
                "template {template:?} is not ready"
            )));
        }
        let isolation = self.resolve_isolation(cmd.isolation)?;
        let backend = self.backend(isolation)?;
        let defaults = &info.defaults;
        let cpus = cmd.cpus.unwrap_or(defaults.cpus);
        if !(0.05..=self.cfg.max_cpus).contains(&cpus) {
            return Err(CoreError::InvalidArgument(format!(
                "cpus must be between 0.05 and {} on this host, got {cpus}",
                self.cfg.max_cpus
            )));
        }
        let memory_mib = cmd.memory_mib.unwrap_or(defaults.memory_mib);
        if !(16..=self.cfg.max_memory_mib).contains(&memory_mib) {
            return Err(CoreError::InvalidArgument(format!(
                "memory_mib must be between 16 and {} on this host, got {memory_mib}",
                self.cfg.max_memory_mib
            )));
        }
        let pids_max = cmd.pids_max.unwrap_or(defaults.pids_max);
        if !(8..=self.cfg.max_pids).contains(&pids_max) {
            return Err(CoreError::InvalidArgument(format!(
                "pids_max must be between 8 and {}, got {pids_max}",
                self.cfg.max_pids
            )));
        }
        let ttl_seconds = cmd.ttl_seconds.unwrap_or(self.cfg.default_ttl_seconds);
        if ttl_seconds == 0 || ttl_seconds > self.cfg.max_ttl_seconds {
            return Err(CoreError::InvalidArgument(format!(
                "ttl_seconds must be between 1 and {}, got {ttl_seconds}",
                self.cfg.max_ttl_seconds
            )));
        }
        let mut env = defaults.env.clone();
        env.extend(cmd.env.clone());
        let now = now_ms();
        let mut record = SandboxRecord {
            id: ids::new_sandbox_id(),
            template: template.clone(),
            isolation,
            state: SandboxState::Starting,
            metadata: cmd.metadata.clone(),
            env,
            cpus,
            memory_mib,
            disk_mib: cmd.disk_mib.unwrap_or(defaults.disk_mib),
            pids_max,
            ttl_seconds,
            persistent: cmd.persistent,
            created_at_ms: now,
            expires_at_ms: now + (ttl_seconds as i64) * 1000,
            uid_slot: 0,
            init_pid: None,
            init_start_time: None,
            cgroups: vec![],
            error: None,
            network: cmd.network.clone(),
        };
        self.insert_with_free_slot(&mut record)?;
        let rootfs = self.templates.rootfs(&template);
        let started = {
            let backend = backend.clone();
            let rec = record.clone();
            tokio::task::spawn_blocking(move || backend.create(&rec, &rootfs))
                .await
                .map_err(|e| CoreError::Internal(e.to_string()))?
        };
        let started = match started {
            Ok(s) => s,
            Err(e) => {
                self.metrics.create_failures.fetch_add(1, Ordering::Relaxed);
                let _ = self.store.delete(&record.id);
                return Err(e);
            }
        };
        record.init_pid = Some(started.init_pid);
        record.init_start_time = Some(started.init_start_time);
        record.cgroups = started
            .cgroups
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        self.store.update(&record)?;
        // The listening socket exists before the agent runs, so connecting cannot race it;
        // `info` returns once the agent serves.
        let ready = async {
            let client = AgentClient::connect_unix(&backend.agent_socket(&record.id))
                .await
                .map_err(client_error)?;
            let info = client.info().await.map_err(client_error)?;
            if info.protocol_version != hutch_proto::PROTOCOL_VERSION {
                return Err(CoreError::SandboxFailed(format!(
                    "agent speaks protocol {} but the server speaks {}",
                    info.protocol_version,
                    hutch_proto::PROTOCOL_VERSION
                )));
            }
            Ok(client)
        };
        let client = match tokio::time::timeout(Duration::from_secs(30), ready).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(self.fail_create(record, e).await),
            Err(_) => {
                let e = CoreError::SandboxFailed("the agent did not answer within 30 s".into());
                return Err(self.fail_create(record, e).await);
            }
        };
        self.lock_agents().insert(record.id.clone(), client);
        record.state = SandboxState::Running;
        self.store.update(&record)?;
        self.watch_init(&record);
        self.metrics.observe_create(t0.elapsed().as_secs_f64());
        self.events.publish(
            "sandbox.created",
            &record.id,
            record.metadata.get("tenant_id").cloned(),
            None,
        );
        tracing::info!(id = %record.id, template = %record.template, ms = t0.elapsed().as_millis() as u64, "sandbox created");
        Ok(record.view())
    }

    async fn fail_create(&self, record: SandboxRecord, e: CoreError) -> CoreError {
        self.metrics.create_failures.fetch_add(1, Ordering::Relaxed);
        let _ = self.destroy_resources(&record).await;
        let _ = self.store.delete(&record.id);
        e
    }

    fn insert_with_free_slot(&self, record: &mut SandboxRecord) -> CoreResult<()> {
        for _ in 0..64 {
            record.uid_slot = MIN_UID_SLOT + ids::random_u32() % UID_SLOTS;
            match self.store.insert(record) {
                Ok(()) => return Ok(()),
                Err(CoreError::Conflict(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(CoreError::Quota(
            "no free uid range for a new sandbox".into(),
        ))
    }

    fn lock_agents(&self) -> std::sync::MutexGuard<'_, HashMap<String, AgentClient>> {
        self.agents.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Load a record or fail with `NotFound`.
    fn load(&self, id: &str) -> CoreResult<SandboxRecord> {
        if !ids::is_sandbox_id(id) {
            return Err(CoreError::NotFound(format!("sandbox {id} does not exist")));
        }
        self.store
            .get(id)?
            .ok_or_else(|| CoreError::NotFound(format!("sandbox {id} does not exist")))
    }

    /// Load a record and refresh its TTL (every call on a sandbox does).
    fn touch(&self, id: &str) -> CoreResult<SandboxRecord> {
        let mut r = self.load(id)?;
        let now = now_ms();
        let new_expiry = now + (r.ttl_seconds as i64) * 1000;
        // Skip the write when the expiry would move by less than a second, and never revive
        // a sandbox whose TTL already ran out: the reaper owns it now.
        if !r.persistent && r.expires_at_ms > now && new_expiry - r.expires_at_ms >= 1000 {
            r.expires_at_ms = new_expiry;
            self.store.update(&r)?;
        }
        Ok(r)
    }

    /// One sandbox (refreshes its TTL).
    pub fn get(&self, id: &str) -> CoreResult<SandboxView> {
        Ok(self.touch(id)?.view())
    }

    /// Sandboxes matching `filter`.
    pub fn list(&self, filter: &ListFilter) -> CoreResult<Vec<SandboxView>> {
        Ok(self
            .store
            .all()?
            .iter()
            .filter(|r| filter.matches(r))
            .map(SandboxRecord::view)
            .collect())
    }

    /// Change TTL, persistence or metadata.
    pub fn update(&self, id: &str, u: UpdateSandbox) -> CoreResult<SandboxView> {
        let mut r = self.load(id)?;
        if let Some(ttl) = u.ttl_seconds {
            if ttl == 0 || ttl > self.cfg.max_ttl_seconds {
                return Err(CoreError::InvalidArgument(format!(
                    "ttl_seconds must be between 1 and {}, got {ttl}",
                    self.cfg.max_ttl_seconds
                )));
            }
            r.ttl_seconds = ttl;
        }
        if let Some(p) = u.persistent {
            r.persistent = p;
        }
        if let Some(m) = u.metadata {
            r.metadata = m;
        }
        r.expires_at_ms = now_ms() + (r.ttl_seconds as i64) * 1000;
        self.store.update(&r)?;
        Ok(r.view())
    }

    /// Destroy a sandbox and forget it.
    pub async fn kill(&self, id: &str) -> CoreResult<()> {
        let r = self.load(id)?;
        self.remove(r, "sandbox.killed").await
    }

    async fn remove(&self, r: SandboxRecord, event: &str) -> CoreResult<()> {
        // Forget it first so the death watcher treats the exit as intended.
        self.store.delete(&r.id)?;
        self.lock_agents().remove(&r.id);
        self.destroy_resources(&r).await?;
        self.events
            .publish(event, &r.id, r.metadata.get("tenant_id").cloned(), None);
        Ok(())
    }

    async fn destroy_resources(&self, r: &SandboxRecord) -> CoreResult<()> {
        let backend = self.backend(r.isolation)?;
        let rec = r.clone();
        tokio::task::spawn_blocking(move || backend.destroy(&rec))
            .await
            .map_err(|e| CoreError::Internal(e.to_string()))?
    }

    /// A connected agent client for a running sandbox (refreshes its TTL).
    pub async fn agent(&self, id: &str) -> CoreResult<AgentClient> {
        let r = self.touch(id)?;
        if !r.state.can_use() {
            return Err(CoreError::Conflict(format!(
                "sandbox {id} is {}{}",
                r.state.as_str(),
                r.error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            )));
        }
        if let Some(c) = self.lock_agents().get(id) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let backend = self.backend(r.isolation)?;
        let client = AgentClient::connect_unix(&backend.agent_socket(id))
            .await
            .map_err(|e| self.on_transport_error(&r, e))?;
        self.lock_agents().insert(id.to_string(), client.clone());
        Ok(client)
    }

    /// Map an agent error, noticing a dead sandbox.
    pub fn on_transport_error(&self, r: &SandboxRecord, e: ClientError) -> CoreError {
        if matches!(e, ClientError::Agent(_)) {
            return client_error(e);
        }
        if let Ok(backend) = self.backend(r.isolation) {
            if !backend.alive(r) {
                return CoreError::SandboxFailed(format!("sandbox {} is no longer running", r.id));
            }
        }
        client_error(e)
    }

    /// Map an error from an agent call on sandbox `id`.
    pub fn agent_error(&self, id: &str, e: ClientError) -> CoreError {
        match self.load(id) {
            Ok(r) => self.on_transport_error(&r, e),
            Err(_) => CoreError::NotFound(format!("sandbox {id} does not exist")),
        }
    }

    /// Run a command and collect its output.
    pub async fn exec(&self, id: &str, cmd: ExecCommand) -> CoreResult<ExecOutcome> {
        let client = self.agent(id).await?;
        let r = self.load(id)?;
        let backend = self.backend(r.isolation)?;
        let oom_before = backend.usage(&r).map(|u| u.oom_kills).unwrap_or(0);
        self.metrics.execs.fetch_add(1, Ordering::Relaxed);
        let req = cmd.to_agent_request(None);
        let collected = client
            .exec_collect(req, cmd.stdin.clone(), self.cfg.output_cap_bytes)
            .await
            .map_err(|e| self.on_transport_error(&r, e))?;
        let exit = collected.exit;
        if exit.timed_out {
            self.metrics.exec_timeouts.fetch_add(1, Ordering::Relaxed);
        }
        let oom_killed = exit.signal == Some(libc::SIGKILL)
            && !exit.timed_out
            && backend.usage(&r).map(|u| u.oom_kills).unwrap_or(0) > oom_before;
        if oom_killed {
            self.metrics.oom_kills.fetch_add(1, Ordering::Relaxed);
            self.events.publish(
                "sandbox.oom",
                id,
                r.metadata.get("tenant_id").cloned(),
                Some(format!(
                    "a process exceeded the memory limit of {} MiB",
                    r.memory_mib
                )),
            );
        }
        Ok(ExecOutcome {
            stdout: collected.stdout,
            stderr: collected.stderr,
            exit_code: exit.exit_code,
            timed_out: exit.timed_out,
            duration_ms: exit.duration_ms,
            stdout_truncated: collected.stdout_truncated,
            stderr_truncated: collected.stderr_truncated,
            oom_killed,
        })
    }

    /// Start a streaming (or PTY) exec; the caller drives the session.
    pub async fn exec_session(
        &self,
        id: &str,
        cmd: &ExecCommand,
        pty: Option<hutch_proto::PtySize>,
    ) -> CoreResult<ExecSession> {
        let client = self.agent(id).await?;
        self.metrics.execs.fetch_add(1, Ordering::Relaxed);
        client
            .exec(cmd.to_agent_request(pty))
            .await
            .map_err(|e| self.agent_error(id, e))
    }

    /// Current resource usage of a sandbox.
    pub fn usage(&self, id: &str) -> CoreResult<Option<Usage>> {
        let r = self.touch(id)?;
        Ok(self.backend(r.isolation)?.usage(&r))
    }

    /// Prometheus text.
    pub fn metrics_text(&self) -> CoreResult<String> {
        let counts = self.store.count_by_state()?;
        let states: Vec<(&str, u64)> = SandboxState::ALL
            .iter()
            .map(|s| {
                (
                    s.as_str(),
                    counts
                        .iter()
                        .find(|(c, _)| c == s)
                        .map(|(_, n)| *n)
                        .unwrap_or(0),
                )
            })
            .collect();
        Ok(self.metrics.render(&states))
    }

    /// Re-adopt sandboxes that survived a server restart; mark the dead ones failed.
    pub async fn readopt(self: &Arc<Self>) -> CoreResult<()> {
        for r in self.store.all()? {
            if !r.state.holds_resources() {
                continue;
            }
            let backend = self.backend(r.isolation)?;
            if r.state != SandboxState::Starting && backend.alive(&r) {
                tracing::info!(id = %r.id, "re-adopted running sandbox");
                self.watch_init(&r);
            } else {
                self.mark_failed(r, "the sandbox stopped while the server was down".into())
                    .await;
            }
        }
        Ok(())
    }

    /// Record a death: state `failed` with a reason, host resources released.
    async fn mark_failed(&self, mut r: SandboxRecord, reason: String) {
        tracing::warn!(id = %r.id, %reason, "sandbox failed");
        self.lock_agents().remove(&r.id);
        if let Err(e) = self.destroy_resources(&r).await {
            tracing::error!(id = %r.id, error = %e, "teardown of a failed sandbox");
        }
        r.state = SandboxState::Failed;
        r.error = Some(reason.clone());
        r.init_pid = None;
        r.init_start_time = None;
        self.metrics.failures.fetch_add(1, Ordering::Relaxed);
        if self.store.update(&r).is_ok() {
            self.events.publish(
                "sandbox.failed",
                &r.id,
                r.metadata.get("tenant_id").cloned(),
                Some(reason),
            );
        }
    }

    /// Watch the sandbox's init; when it dies unexpectedly, mark the sandbox failed.
    fn watch_init(self: &Arc<Self>, r: &SandboxRecord) {
        let Some(pid) = r.init_pid else { return };
        let weak = Arc::downgrade(self);
        let id = r.id.clone();
        tokio::spawn(async move {
            let status = crate::pidwatch::wait_exit(pid).await;
            let Some(m) = weak.upgrade() else { return };
            let Ok(Some(rec)) = m.store.get(&id) else {
                return;
            };
            if !rec.state.holds_resources() || rec.init_pid != Some(pid) {
                return;
            }
            let backend = match m.backend(rec.isolation) {
                Ok(b) => b,
                Err(_) => return,
            };
            let oom = backend.usage(&rec).map(|u| u.oom_kills).unwrap_or(0) > 0;
            let reason = if oom {
                m.metrics.oom_kills.fetch_add(1, Ordering::Relaxed);
                m.events.publish(
                    "sandbox.oom",
                    &id,
                    rec.metadata.get("tenant_id").cloned(),
                    Some(format!("memory limit of {} MiB exceeded", rec.memory_mib)),
                );
                format!(
                    "the sandbox's init (agent) was killed: out of memory (limit {} MiB)",
                    rec.memory_mib
                )
            } else {
                format!("the sandbox's init (agent) exited unexpectedly ({status})")
            };
            m.mark_failed(rec, reason).await;
        });
    }

    /// Destroy sandboxes whose TTL ran out (never persistent ones).
    pub async fn reap_expired(&self) {
        let now = now_ms();
        let Ok(all) = self.store.all() else { return };
        for r in all {
            if !r.persistent && r.expires_at_ms <= now {
                let id = r.id.clone();
                match self.remove(r, "sandbox.expired").await {
                    Ok(()) => {
                        self.metrics.expired.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(%id, "sandbox expired");
                    }
                    Err(e) => tracing::error!(%id, error = %e, "reaping an expired sandbox"),
                }
            }
        }
    }

    /// Path of the admin key file.
    pub fn admin_key_path(&self) -> PathBuf {
        self.cfg.state_dir.join("admin.key")
    }
}

fn write_secret(path: &std::path::Path, secret: &str) -> CoreResult<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| CoreError::Internal(format!("write {}: {e}", path.display())))?;
    std::io::Write::write_all(&mut f, format!("{secret}\n").as_bytes())
        .map_err(|e| CoreError::Internal(format!("write {}: {e}", path.display())))
}
