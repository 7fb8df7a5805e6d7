//! The sandbox manager: the one place that changes sandbox state.
//!
//! Each operation follows the same shape: load the record, check the state allows it
//! (`SandboxState::can_*`, else `Conflict`), act through the backend or the agent, save.
//! Records live in SQLite, so a restarted server re-adopts running sandboxes
//! ([`Manager::readopt`]); the in-memory map only caches agent connections.
//!
//! Operations live in submodules by concern: `create` (from a template, a snapshot, or as a
//! fork child), `lifecycle` (pause, resume, hibernate, wake, idle hibernation), `snapshots`
//! (named snapshots and their reference counting), `fork` (fork and explore), `ports`
//! (connections to TCP ports inside a sandbox, through its agent), `watch` and `watchers`
//! (file watches, streamed or polled), `interp` (code contexts
//! and runs, through the sandbox's kernel driver), `exec` (execs and the
//! agent connection), `reaper` (TTL expiry, deaths, re-adoption after a restart), `metrics`
//! (the Prometheus text), `templates` (deleting a template nothing uses). State
//! transitions of one sandbox (pause, resume, hibernate, wake, snapshot, kill) are serialised
//! by a per-sandbox lock; exec and file calls take no lock.

mod audit;
mod budget;
mod builds;
mod create;
mod exec;
mod fork;
mod handoff;
mod interp;
mod keys;
mod last_known;
mod lifecycle;
mod logs;
mod metrics;
mod network;
mod ports;
mod processes;
mod quota;
mod reaper;
mod reconcile;
mod refresh;
mod service;
mod snapshots;
mod template_delete;
mod templates;
mod tenants;
#[cfg(test)]
mod tests;
mod usage;
mod volumes;
mod warm;
mod watch;
mod watchers;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hutch_proto::client::AgentClient;
use hutch_template::TemplateStore;

use crate::backend::ns::NsBackend;
use crate::backend::vm::VmBackend;
use crate::backend::{Backend, Backends, Usage};
use crate::config::{Config, MAX_UID_SLOTS};
use crate::error::{CoreError, CoreResult};
use crate::events::EventBus;
use crate::ids::SandboxId;
use crate::metrics::Metrics;
use crate::model::{
    Isolation, IsolationRequest, ListFilter, SandboxRecord, SandboxState, SandboxView,
    UpdateSandbox,
};
use crate::sandbox_token::TokenSigner;
use crate::store::{Page, PageRequest, SandboxQuery, SqliteStore, Store};
use crate::tenant::TenantScope;
use crate::time::now_ms;
use crate::uid_slots::UidSlots;

pub use self::exec::{ExecSlot, ExitRecorder};
pub use self::keys::CreatedKey;
pub use self::logs::LogFollow;
pub use self::ports::{parse_port, PortConnection};
pub use self::templates::VisibleTemplate;
pub use self::watch::{FileWatch, WatchOptions};
pub use self::watchers::{
    WatcherEvents, WatcherInfo, MAX_BUFFERED_EVENTS, MAX_WATCHERS_PER_SANDBOX, WATCHER_IDLE,
};

/// The manager. Cheap to share behind an `Arc`.
pub struct Manager {
    cfg: Config,
    store: Arc<dyn Store>,
    templates: TemplateStore,
    /// One backend per isolation: the only way to a sandbox's container.
    backends: Backends,
    /// Sandbox networking (`None`: loopback only).
    network: Option<hutch_net::Network>,
    /// Warm `vm` guests waiting to become sandboxes.
    warm: warm::WarmPool,
    agents: Mutex<HashMap<SandboxId, AgentClient>>,
    events: Arc<EventBus>,
    metrics: Metrics,
    /// One lock per sandbox, held across a state transition.
    ops: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Held while checking who uses a snapshot and deleting it, and while inserting a
    /// sandbox that uses one (across store calls, so an async lock).
    snapshots_lock: Arc<tokio::sync::Mutex<()>>,
    /// Per sandbox: CPU time at the last idle check, when that was, and when the sandbox was
    /// last busy (ms since epoch).
    cpu_seen: Mutex<HashMap<SandboxId, (u64, i64, i64)>>,
    /// Per sandbox: clients connected right now (collected execs, streams, PTYs).
    active: Arc<Mutex<HashMap<String, usize>>>,
    /// Signs and verifies sandbox tokens (`<state>/token.secret`).
    tokens: TokenSigner,
    /// Per sandbox: execs running now (collected, streamed, PTY), against the cap.
    running_execs: Arc<Mutex<HashMap<String, usize>>>,
    /// Memory for collected exec output, shared by every exec.
    output_budget: crate::output::OutputBudget,
    /// Per sandbox: permits for collected execs reading output at once (`manager/exec.rs`).
    collecting: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    /// This server's host-wide claims on uid slots.
    uid_slots: UidSlots,
    /// TTL and idle-clock refreshes not written to the store yet (`refresh.rs`).
    refreshes: refresh::Refreshes,
    /// Per sandbox: held while its kernel driver starts.
    driver_starts: interp::DriverStarts,
    /// Operations admitted under tenants' quotas and not finished (`quota.rs`).
    quota: quota::QuotaLedger,
    /// Last uses of API keys not written yet (`keys.rs`).
    key_uses: keys::KeyUses,
    /// Audit entries not written yet (`audit.rs`).
    audit: audit::AuditLog,
    /// Polled file watchers (`watchers.rs`).
    watchers: watchers::Watchers,
    /// Usage meters of live sandboxes and the usage log (`usage.rs`).
    meters: usage::Meters,
    /// What budgeted tenants, keys and sandboxes spent (`budget.rs`).
    spend: budget::SpendCache,
    /// Where hibernated sandboxes' states go for other nodes (cluster mode with an object
    /// store; `handoff.rs`).
    saved_states: std::sync::OnceLock<Arc<dyn crate::handoff::SavedStates>>,
    /// The last record read of each sandbox, for when the store cannot be reached.
    last_known: last_known::LastKnown,
}

/// Held while a client is connected to a sandbox (a running exec, stream or terminal): the
/// sandbox is not hibernated for idleness meanwhile. Dropping it ends the connection's claim.
#[derive(Debug)]
pub struct ActiveGuard {
    active: Arc<Mutex<HashMap<String, usize>>>,
    id: String,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = active.get_mut(&self.id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                active.remove(&self.id);
            }
        }
    }
}

/// Run blocking backend work on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> CoreResult<T> + Send + 'static,
) -> CoreResult<T> {
    tokio::task::spawn_blocking(f).await?
}

/// Why a call is refused in the sandbox's current state (409), and what to do instead.
pub(crate) fn wrong_state(r: &SandboxRecord, op: Option<&'static str>) -> CoreError {
    CoreError::WrongState {
        op,
        id: r.id.to_string(),
        state: r.state,
        reason: r.error.clone(),
        hint: r.state.hint(&r.id),
    }
}

/// Makes a server's backends once its networking and event bus exist.
pub type MakeBackends =
    Box<dyn FnOnce(&Config, Option<&hutch_net::Network>, &Arc<EventBus>) -> Backends + Send>;

/// The backends of a real server: `ns` (also what `auto` falls back to) and `vm`.
fn host_backends(
    cfg: &Config,
    network: Option<&hutch_net::Network>,
    events: &Arc<EventBus>,
) -> Backends {
    let progress = {
        let events = events.clone();
        Arc::new(move |r: &SandboxRecord, what: String| {
            events.publish("sandbox.preparing", &r.id, r.tenant(), Some(what));
        })
    };
    let ns: Arc<dyn Backend> = Arc::new(NsBackend::new(cfg.clone(), network.cloned()));
    let vm: Arc<dyn Backend> = Arc::new(VmBackend::new(
        cfg.clone(),
        network.cloned(),
        Some(progress),
    ));
    Backends::new(vec![ns, vm], Isolation::Ns)
}

impl Manager {
    /// Open the state directory and its SQLite store, re-adopt surviving sandboxes and start
    /// the reaper.
    pub async fn start(cfg: Config) -> CoreResult<Arc<Self>> {
        Self::start_with(cfg, Box::new(host_backends)).await
    }

    /// [`Manager::start`] with the backends `make` builds (tests give a fake one), on the
    /// state directory's SQLite store.
    pub async fn start_with(cfg: Config, make: MakeBackends) -> CoreResult<Arc<Self>> {
        std::fs::create_dir_all(&cfg.state_dir).map_err(CoreError::io("create", &cfg.state_dir))?;
        let store = Arc::new(SqliteStore::open(&cfg.state_dir.join("state.db"))?);
        Self::start_on(cfg, make, store).await
    }

    /// [`Manager::start`] over another store (one shared by many hosts, say).
    pub async fn start_with_store(cfg: Config, store: Arc<dyn Store>) -> CoreResult<Arc<Self>> {
        Self::start_on(cfg, Box::new(host_backends), store).await
    }

    async fn start_on(
        cfg: Config,
        make: MakeBackends,
        store: Arc<dyn Store>,
    ) -> CoreResult<Arc<Self>> {
        let cfg_output_budget = cfg.exec_output_budget_bytes;
        std::fs::create_dir_all(cfg.state_dir.join("sandboxes"))
            .map_err(CoreError::io("create", &cfg.state_dir))?;
        std::fs::create_dir_all(&cfg.templates_dir)
            .map_err(CoreError::io("create", &cfg.templates_dir))?;
        // Snapshots and volumes hold tenants' files and raw disks: root only.
        snapshots::prepare_dir(&cfg.snapshots_dir())?;
        snapshots::prepare_dir(&cfg.state_dir.join("volumes"))?;
        if cfg.uid_slots == 0 || cfg.uid_slots > MAX_UID_SLOTS {
            return Err(CoreError::InvalidArgument(format!(
                "uid slots must be 1 to {MAX_UID_SLOTS}, got {}",
                cfg.uid_slots
            )));
        }
        let uid_slots = UidSlots::open(&cfg.uid_slots_dir, &cfg.state_dir)?;
        {
            let held: std::collections::BTreeSet<u32> = store
                .all_sandboxes()
                .await?
                .iter()
                .map(|r| r.uid_slot)
                .collect();
            uid_slots.lock()?.reconcile(&held)?;
        }
        let tokens = TokenSigner::load_or_create(&cfg.state_dir.join("token.secret"))?;
        let templates = TemplateStore::open(&cfg.templates_dir)?;
        let network = match &cfg.network {
            Some(nc) => Some(
                hutch_net::Network::start(nc.clone())
                    .await
                    .map_err(CoreError::net_host("sandbox networking"))?,
            ),
            None => None,
        };
        let events = Arc::new(EventBus::new());
        let backends = make(&cfg, network.as_ref(), &events);
        let last_known = last_known::LastKnown::new(store.may_be_unreachable());
        let mgr = Arc::new(Self {
            backends,
            warm: warm::WarmPool::default(),
            network,
            cfg,
            store,
            templates,
            agents: Mutex::new(HashMap::new()),
            events,
            metrics: Metrics::default(),
            ops: Mutex::new(HashMap::new()),
            snapshots_lock: Arc::new(tokio::sync::Mutex::new(())),
            cpu_seen: Mutex::new(HashMap::new()),
            active: Arc::new(Mutex::new(HashMap::new())),
            tokens,
            running_execs: Arc::new(Mutex::new(HashMap::new())),
            output_budget: crate::output::OutputBudget::new(cfg_output_budget),
            collecting: Mutex::new(HashMap::new()),
            uid_slots,
            refreshes: refresh::Refreshes::default(),
            driver_starts: interp::DriverStarts::default(),
            quota: quota::QuotaLedger::default(),
            key_uses: keys::KeyUses::default(),
            audit: audit::AuditLog::default(),
            watchers: watchers::Watchers::default(),
            meters: usage::Meters::default(),
            spend: budget::SpendCache::default(),
            saved_states: std::sync::OnceLock::new(),
            last_known,
        });
        for backend in mgr.backends.all() {
            // In the background (`vm` may boot a probe guest; until then `auto` means ns).
            let backend = backend.clone();
            tokio::spawn(async move { backend.prepare().await });
        }
        for backend in mgr.backends.all() {
            backend.recover().await;
        }
        mgr.load_meters().await;
        mgr.readopt().await?;
        mgr.undo_interrupted_forks().await;
        mgr.remove_orphans().await;
        mgr.release_volumes().await;
        mgr.remove_orphan_volumes().await;
        if let Some(net) = &mgr.network {
            let net = net.clone();
            match blocking(move || Ok(net.prune()?)).await {
                Ok(n) if n > 0 => {
                    tracing::info!(links = n, "removed sandbox links left by an earlier server")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "pruning stale sandbox links"),
            }
            mgr.network.as_ref().map(hutch_net::Network::refill);
        }
        mgr.sweep_snapshots().await;
        if let Err(e) = mgr.collect_template_revisions().await {
            tracing::warn!(error = %e, "collecting unused template revisions");
        }
        mgr.spawn_usage_sampler();
        let weak = Arc::downgrade(&mgr);
        let interval = mgr.cfg.reaper_interval;
        let reconcile_every = mgr.cfg.reconcile_interval;
        tokio::spawn(async move {
            let (mut flushed, mut reconciled) =
                (std::time::Instant::now(), std::time::Instant::now());
            let reconciling = Arc::new(std::sync::atomic::AtomicBool::new(false));
            loop {
                tokio::time::sleep(interval).await;
                let Some(m) = weak.upgrade() else { break };
                if flushed.elapsed() >= refresh::FLUSH_EVERY {
                    m.flush_refreshes().await;
                    flushed = std::time::Instant::now();
                }
                // In a task of its own (it may kill and unmount), one at a time.
                if reconciled.elapsed() >= reconcile_every
                    && !reconciling.swap(true, std::sync::atomic::Ordering::AcqRel)
                {
                    reconciled = std::time::Instant::now();
                    let (m, reconciling) = (m.clone(), reconciling.clone());
                    tokio::spawn(async move {
                        m.remove_orphans().await;
                        reconciling.store(false, std::sync::atomic::Ordering::Release);
                    });
                }
                m.reap_expired().await;
                m.hibernate_idle().await;
                m.retire_warm().await;
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

    /// The state store (for tools that fill it directly, such as `hutch bench api_scale`).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Sandbox `id`'s record if it exists and `scope` may see it, else `NotFound`: one
    /// indexed lookup by id (and tenant), with the same answer for another tenant's sandbox
    /// as for an unknown one.
    pub async fn authorize(
        &self,
        id: &SandboxId,
        scope: &TenantScope,
    ) -> CoreResult<SandboxRecord> {
        let found = match self.store.get_sandbox_for(id, scope).await {
            Ok(found) => found,
            Err(e) => return self.last_known.instead_of(e, id, scope),
        };
        // Only a sandbox it may see is remembered (or forgotten) for it.
        if found.is_some() {
            self.last_known.note(id, found.as_ref());
        }
        found.ok_or_else(|| CoreError::NotFound(format!("sandbox {id} does not exist")))
    }

    fn backend(&self, isolation: Isolation) -> CoreResult<Arc<dyn Backend>> {
        self.backends.get(isolation)
    }

    fn resolve_isolation(&self, req: IsolationRequest) -> CoreResult<Isolation> {
        let isolation = match req {
            IsolationRequest::Auto => self.backends.auto(),
            IsolationRequest::Ns => Isolation::Ns,
            IsolationRequest::Vm => Isolation::Vm,
        };
        self.backend(isolation)?.available()?;
        Ok(isolation)
    }

    fn lock_agents(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, AgentClient>> {
        self.agents.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn lock_snapshots(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.snapshots_lock.clone().lock_owned().await
    }

    /// Keep sandbox `id` from idle hibernation until the guard is dropped (handlers hold one
    /// for the life of a stream or terminal).
    pub fn session_guard(&self, id: &SandboxId) -> ActiveGuard {
        *self
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_string())
            .or_default() += 1;
        ActiveGuard {
            active: self.active.clone(),
            id: id.to_string(),
        }
    }

    /// Whether a client is connected to sandbox `id`.
    fn has_sessions(&self, id: &SandboxId) -> bool {
        self.active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(id.as_str())
    }

    /// Wait for, then hold, the transition lock of sandbox `id`.
    async fn op_lock(&self, id: &SandboxId) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = self
            .ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_string())
            .or_default()
            .clone();
        lock.lock_owned().await
    }

    /// Load a record (with its TTL refresh not written yet, `refresh.rs`) or fail with
    /// `NotFound`.
    async fn load(&self, id: &SandboxId) -> CoreResult<SandboxRecord> {
        // A warm guest of the pool is not a sandbox (yet).
        let found = match self.store.get_sandbox(id).await {
            Ok(found) => {
                self.last_known.note(id, found.as_ref());
                found
            }
            Err(e) => Some(self.last_known.instead_of(e, id, &TenantScope::All)?),
        };
        let mut r = found
            .filter(|r| r.state != SandboxState::Pooled)
            .ok_or_else(|| CoreError::NotFound(format!("sandbox {id} does not exist")))?;
        self.refreshes.apply(&mut r);
        Ok(r)
    }

    /// One sandbox (refreshes its TTL). A networked sandbox's traffic counters are read with
    /// `nft` on the blocking pool.
    pub async fn get(self: &Arc<Self>, id: &SandboxId) -> CoreResult<SandboxView> {
        let r = self.touch(id).await?;
        let mut view = r.view();
        if r.net_slot.is_none() {
            return Ok(view);
        }
        let mgr = self.clone();
        blocking(move || {
            mgr.add_traffic(&r, &mut view);
            Ok(view)
        })
        .await
    }

    /// One page of the sandboxes `scope` may see that match `filter`, oldest first: the
    /// filter and the page are one store query.
    pub async fn list(
        &self,
        filter: &ListFilter,
        scope: &TenantScope,
        page: &PageRequest,
    ) -> CoreResult<Page<SandboxView>> {
        let query = SandboxQuery {
            scope: scope.clone(),
            state: filter.state,
            metadata: filter.metadata.clone(),
        };
        Ok(self.store.list_sandboxes(&query, page).await?.map(|mut r| {
            self.refreshes.apply(&mut r);
            r.view()
        }))
    }

    /// Change TTL, persistence, metadata or the idle-hibernation delay.
    pub async fn update(&self, id: &SandboxId, u: UpdateSandbox) -> CoreResult<SandboxView> {
        let current = self.load(id).await?;
        if let Some(ttl) = u.ttl_seconds {
            if ttl == 0 || ttl > self.cfg.max_ttl_seconds {
                return Err(CoreError::InvalidArgument(format!(
                    "ttl_seconds must be between 1 and {}, got {ttl}",
                    self.cfg.max_ttl_seconds
                )));
            }
        }
        // The tenant it ends up with must exist, and its TTL limit holds.
        let owner = match &u.tenant {
            Some(Some(t)) => Some(self.tenant(t).await?),
            Some(None) => None,
            None => match &current.tenant {
                Some(t) => self.store.get_tenant(t).await?,
                None => None,
            },
        };
        if let Some(t) = owner {
            t.settings.quotas.check_ttl(
                &t.name,
                u.ttl_seconds.unwrap_or(current.ttl_seconds),
                u.persistent.unwrap_or(current.persistent),
            )?;
        }
        let idle = self.check_idle_seconds(u.idle_hibernate_seconds)?;
        let r = self
            .store
            .modify(id, |r| {
                if let Some(ttl) = u.ttl_seconds {
                    r.ttl_seconds = ttl;
                }
                if let Some(p) = u.persistent {
                    r.persistent = p;
                }
                if let Some(m) = u.metadata {
                    r.metadata = m;
                }
                if let Some(t) = u.tenant {
                    r.tenant = t;
                }
                if u.idle_hibernate_seconds.is_some() {
                    r.idle_hibernate_seconds = idle;
                }
                let now = now_ms();
                r.expires_at_ms = now + (r.ttl_seconds as i64) * 1000;
                r.last_used_ms = now;
                Ok(())
            })
            .await?;
        // Its TTL was set anew: a refresh noted before must not move it.
        self.refreshes.forget(id);
        Ok(r.view())
    }

    /// Destroy a sandbox and forget it (whatever its state: paused and hibernated too).
    pub async fn kill(&self, id: &SandboxId) -> CoreResult<()> {
        self.load(id).await?;
        let _op = self.op_lock(id).await;
        let r = self.load(id).await?;
        self.remove(r, Some("sandbox.killed")).await
    }

    /// Destroy `r` and delete its record, then publish `event` (none for a sandbox no client
    /// ever had).
    async fn remove(&self, r: SandboxRecord, event: Option<&str>) -> CoreResult<()> {
        // Forget it first so the death watcher treats the exit as intended.
        self.store.delete_sandbox(&r.id).await?;
        crate::crash_points::crash_point("delete.record_gone");
        self.last_known.forget(&r.id);
        self.forget_saved(&r.id, r.saved_state.clone(), r.saving.is_some())
            .await;
        self.refreshes.forget(&r.id);
        let client = self.lock_agents().remove(&r.id);
        if let Some(client) = client {
            self.sync_volumes(&r, &client).await;
        }
        self.driver_starts.forget(&r.id);
        self.ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(r.id.as_str());
        self.cpu_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&r.id);
        let destroyed = self.destroy_resources(&r).await;
        self.release_layer(r.layer.as_deref()).await;
        // Its processes are gone (or failed to go): only now may another server use the range.
        if destroyed.is_ok() {
            self.release_uid_slot(r.uid_slot);
        }
        destroyed?;
        if let Some(event) = event {
            self.events.publish(event, &r.id, r.tenant(), None);
        }
        Ok(())
    }

    /// Give a deleted record's uid slot back to the host (a failure leaves the claim, which
    /// this server drops at its next start).
    fn release_uid_slot(&self, slot: u32) {
        let released = self.uid_slots.lock().and_then(|lock| lock.release(slot));
        if let Err(e) = released {
            tracing::warn!(slot, error = %e, "releasing a uid slot claim");
        }
    }

    /// Unmount the `ns` disk pool when no sandbox has files in it, and the `vm` fork memory
    /// tmpfs when no fork's memory is in it (server shutdown).
    pub async fn release_disk_pool(&self) {
        for backend in self.backends.all() {
            backend.release().await;
        }
    }

    async fn destroy_resources(&self, r: &SandboxRecord) -> CoreResult<()> {
        let backend = self.backend(r.isolation)?;
        // Its last interval of usage, before its cgroups go.
        self.meter_final(r).await;
        let destroyed = backend.destroy(r).await;
        if let (Some(net), Some(i)) = (self.network.clone(), r.net_slot) {
            let id = r.id.clone();
            blocking(move || {
                net.release_held(i, &id);
                Ok(())
            })
            .await?;
        }
        destroyed?;
        self.unmount_unused_volumes().await;
        Ok(())
    }

    /// `NoSpace` unless the state disk has its reserve free: `what` (say "create a
    /// sandbox") would take host disk the server needs for itself (`state_disk.rs`).
    fn check_state_disk(&self, what: &str) -> CoreResult<()> {
        crate::state_disk::check_room(&self.cfg.state_dir, what)
    }

    /// `e` as `NoSpace` when the state disk is below its reserve (a step that failed there
    /// failed most likely for want of space, whatever it said), else `e` itself.
    fn blame_full_disk(&self, e: CoreError, what: &str) -> CoreError {
        if e.is_no_space() || !crate::state_disk::below_reserve(&self.cfg.state_dir) {
            return e;
        }
        CoreError::NoSpace {
            what: format!("cannot {what}: {e}; free disk space on the server's host"),
            source: Some(Box::new(e)),
        }
    }

    /// Current resource usage of a sandbox.
    pub async fn usage(&self, id: &SandboxId) -> CoreResult<Option<Usage>> {
        let r = self.touch(id).await?;
        Ok(self.backend(r.isolation)?.usage(&r))
    }

    /// The signer of sandbox tokens (see [`crate::sandbox_token`]).
    pub fn sandbox_tokens(&self) -> &TokenSigner {
        &self.tokens
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
        .map_err(CoreError::io("write", path))?;
    std::io::Write::write_all(&mut f, format!("{secret}\n").as_bytes())
        .map_err(CoreError::io("write", path))
}
