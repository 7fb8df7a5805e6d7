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
//! (connections to TCP ports inside a sandbox, through its agent). State
//! transitions of one sandbox (pause, resume, hibernate, wake, snapshot, kill) are serialised
//! by a per-sandbox lock; exec and file calls take no lock.

mod create;
mod exec;
mod fork;
mod lifecycle;
mod network;
mod ports;
mod snapshots;
mod volumes;
mod warm;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use hutch_proto::client::{AgentClient, ClientError};
use hutch_template::TemplateStore;

use crate::backend::ns::NsBackend;
use crate::backend::vm::VmBackend;
use crate::backend::{Backend, Usage};
use crate::config::{Config, MAX_UID_SLOTS};
use crate::error::{CoreError, CoreResult};
use crate::events::EventBus;
use crate::ids;
use crate::metrics::Metrics;
use crate::model::{
    Isolation, IsolationRequest, ListFilter, SandboxRecord, SandboxState, SandboxView,
    UpdateSandbox,
};
use crate::sandbox_token::TokenSigner;
use crate::store::{KeyOwner, Page, PageRequest, SandboxQuery, SqliteStore, Store};
use crate::tenant::{Tenant, TenantScope};
use crate::time::now_ms;
use crate::uid_slots::UidSlots;

pub use self::exec::{ExecSlot, ExitRecorder};
pub use self::ports::{parse_port, PortConnection};

/// The manager. Cheap to share behind an `Arc`.
pub struct Manager {
    cfg: Config,
    store: Arc<dyn Store>,
    templates: TemplateStore,
    ns: Arc<NsBackend>,
    /// Sandbox networking (`None`: loopback only).
    network: Option<hutch_net::Network>,
    vm: Arc<VmBackend>,
    /// Warm `vm` guests waiting to become sandboxes.
    warm: warm::WarmPool,
    agents: Mutex<HashMap<String, AgentClient>>,
    events: Arc<EventBus>,
    metrics: Metrics,
    /// One lock per sandbox, held across a state transition.
    ops: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Held while checking who uses a snapshot and deleting it, and while inserting a
    /// sandbox that uses one (across store calls, so an async lock).
    snapshots_lock: Arc<tokio::sync::Mutex<()>>,
    /// Per sandbox: CPU time at the last idle check, when that was, and when the sandbox was
    /// last busy (ms since epoch).
    cpu_seen: Mutex<HashMap<String, (u64, i64, i64)>>,
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
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CoreError::Internal(e.to_string()))?
}

/// Why a call is refused in the sandbox's current state (409), and what to do instead.
pub(crate) fn wrong_state(r: &SandboxRecord, op: Option<&str>) -> CoreError {
    let reason = r
        .error
        .as_deref()
        .map(|e| format!(" ({e})"))
        .unwrap_or_default();
    let hint = r.state.hint(&r.id);
    let hint = if hint.is_empty() {
        String::new()
    } else {
        format!(": {hint}")
    };
    CoreError::Conflict(match op {
        Some(op) => format!(
            "cannot {op} sandbox {}: it is {}{reason}{hint}",
            r.id,
            r.state.as_str()
        ),
        None => format!("sandbox {} is {}{reason}{hint}", r.id, r.state.as_str()),
    })
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
    /// Open the state directory and its SQLite store, re-adopt surviving sandboxes and start
    /// the reaper.
    pub async fn start(cfg: Config) -> CoreResult<Arc<Self>> {
        std::fs::create_dir_all(&cfg.state_dir)
            .map_err(|e| CoreError::Internal(format!("create {}: {e}", cfg.state_dir.display())))?;
        let store = Arc::new(SqliteStore::open(&cfg.state_dir.join("state.db"))?);
        Self::start_with_store(cfg, store).await
    }

    /// [`Manager::start`] over another store (one shared by many hosts, say).
    pub async fn start_with_store(cfg: Config, store: Arc<dyn Store>) -> CoreResult<Arc<Self>> {
        let cfg_output_budget = cfg.exec_output_budget_bytes;
        std::fs::create_dir_all(cfg.state_dir.join("sandboxes"))
            .map_err(|e| CoreError::Internal(format!("create {}: {e}", cfg.state_dir.display())))?;
        std::fs::create_dir_all(&cfg.templates_dir).map_err(|e| {
            CoreError::Internal(format!("create {}: {e}", cfg.templates_dir.display()))
        })?;
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
        let tokens = TokenSigner::load_or_create(&cfg.state_dir.join("token.secret"))
            .map_err(|e| CoreError::Internal(e.to_string()))?;
        let templates = TemplateStore::open(&cfg.templates_dir)
            .map_err(|e| CoreError::Internal(format!("templates: {e}")))?;
        let network = match &cfg.network {
            Some(nc) => Some(
                hutch_net::Network::start(nc.clone())
                    .await
                    .map_err(|e| CoreError::Internal(format!("sandbox networking: {e}")))?,
            ),
            None => None,
        };
        let events = Arc::new(EventBus::new());
        let progress = {
            let events = events.clone();
            Arc::new(move |r: &SandboxRecord, what: String| {
                events.publish("sandbox.preparing", &r.id, r.tenant(), Some(what));
            })
        };
        let mgr = Arc::new(Self {
            ns: Arc::new(NsBackend::new(cfg.clone(), network.clone())),
            vm: Arc::new(
                VmBackend::new(cfg.clone())
                    .with_network(network.clone())
                    .with_progress(progress),
            ),
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
        });
        {
            // Decide KVM or TCG in the background (a probe guest may boot); until then
            // `auto` means ns.
            let vm = mgr.vm.clone();
            tokio::task::spawn_blocking(move || {
                if vm.check().is_ok() {
                    let choice = vm.accel();
                    tracing::info!(accel = ?choice.accel, why = %choice.why, "vm acceleration");
                }
                vm.collect_garbage();
            });
        }
        mgr.readopt().await?;
        mgr.release_volumes().await;
        if let Some(net) = &mgr.network {
            let net = net.clone();
            match blocking(move || net.prune().map_err(network::net_error)).await {
                Ok(n) if n > 0 => {
                    tracing::info!(links = n, "removed sandbox links left by an earlier server")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "pruning stale sandbox links"),
            }
            mgr.network.as_ref().map(hutch_net::Network::refill);
        }
        mgr.sweep_snapshots().await;
        let weak = Arc::downgrade(&mgr);
        let interval = mgr.cfg.reaper_interval;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(m) = weak.upgrade() else { break };
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

    /// Make sure an admin key exists; returns it when it was just created.
    pub async fn ensure_admin_key(&self) -> CoreResult<String> {
        let path = self.cfg.state_dir.join("admin.key");
        if let Ok(existing) = std::fs::read_to_string(&path) {
            let key = existing.trim().to_string();
            if self.store.key_owner(&key).await?.is_some() {
                return Ok(key);
            }
        }
        let key = ids::new_api_key();
        self.store
            .add_api_key(
                &key,
                &KeyOwner {
                    tenant: Tenant::new("admin"),
                    admin: true,
                },
            )
            .await?;
        write_secret(&path, &key)?;
        Ok(key)
    }

    /// Who owns an API key.
    pub async fn authenticate(&self, key: &str) -> CoreResult<Option<KeyOwner>> {
        self.store.key_owner(key).await
    }

    /// Register an API key for `owner` (stored hashed).
    pub async fn add_api_key(&self, key: &str, owner: &KeyOwner) -> CoreResult<()> {
        self.store.add_api_key(key, owner).await
    }

    /// The state store (for tools that fill it directly, such as `hutch bench api_scale`).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// `NotFound` unless sandbox `id` exists and `scope` may see it: one indexed lookup by id
    /// (and tenant), with the same answer for another tenant's sandbox as for an unknown one.
    pub async fn authorize(&self, id: &str, scope: &TenantScope) -> CoreResult<()> {
        let missing = || CoreError::NotFound(format!("sandbox {id} does not exist"));
        if !ids::is_sandbox_id(id) {
            return Err(missing());
        }
        match self.store.get_sandbox_for(id, scope).await? {
            Some(_) => Ok(()),
            None => Err(missing()),
        }
    }

    fn backend(&self, isolation: Isolation) -> CoreResult<Arc<dyn Backend>> {
        match isolation {
            Isolation::Ns => Ok(self.ns.clone()),
            Isolation::Vm => Ok(self.vm.clone()),
        }
    }

    /// The `vm` backend (for `hutch doctor` and the bench).
    pub fn vm_backend(&self) -> &VmBackend {
        &self.vm
    }

    fn resolve_isolation(&self, req: IsolationRequest) -> CoreResult<Isolation> {
        match req {
            // `auto` picks vm only where KVM works (a probe guest booted); under TCG guest
            // code runs ~15x slower, so those hosts get ns.
            IsolationRequest::Auto => Ok(match self.vm.accel_if_known().map(|c| c.accel) {
                Some(hutch_vm::qemu::Accel::Kvm) if self.vm.check().is_ok() => Isolation::Vm,
                _ => Isolation::Ns,
            }),
            IsolationRequest::Ns => Ok(Isolation::Ns),
            IsolationRequest::Vm => self.vm.check().map(|_| Isolation::Vm),
        }
    }

    fn lock_agents(&self) -> std::sync::MutexGuard<'_, HashMap<String, AgentClient>> {
        self.agents.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn lock_snapshots(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.snapshots_lock.clone().lock_owned().await
    }

    /// Keep sandbox `id` from idle hibernation until the guard is dropped (handlers hold one
    /// for the life of a stream or terminal).
    pub fn session_guard(&self, id: &str) -> ActiveGuard {
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
    fn has_sessions(&self, id: &str) -> bool {
        self.active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(id)
    }

    /// Wait for, then hold, the transition lock of sandbox `id`.
    async fn op_lock(&self, id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = self
            .ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_string())
            .or_default()
            .clone();
        lock.lock_owned().await
    }

    /// Load a record or fail with `NotFound`.
    async fn load(&self, id: &str) -> CoreResult<SandboxRecord> {
        if !ids::is_sandbox_id(id) {
            return Err(CoreError::NotFound(format!("sandbox {id} does not exist")));
        }
        // A warm guest of the pool is not a sandbox (yet).
        self.store
            .get_sandbox(id)
            .await?
            .filter(|r| r.state != SandboxState::Pooled)
            .ok_or_else(|| CoreError::NotFound(format!("sandbox {id} does not exist")))
    }

    /// Load a record and refresh its TTL (every call on a sandbox does).
    async fn touch(&self, id: &str) -> CoreResult<SandboxRecord> {
        self.refresh(id, false).await
    }

    /// [`Manager::touch`], and note the sandbox was used (exec, file and PTY calls): the clock
    /// of idle hibernation restarts. Reading its state does not count as using it.
    async fn touch_used(&self, id: &str) -> CoreResult<SandboxRecord> {
        self.refresh(id, true).await
    }

    async fn refresh(&self, id: &str, used: bool) -> CoreResult<SandboxRecord> {
        let r = self.load(id).await?;
        let now = now_ms();
        let new_expiry = now + (r.ttl_seconds as i64) * 1000;
        // Skip the write when nothing would move by a second or more, and never revive a
        // sandbox whose TTL already ran out: the reaper owns it now.
        let expiry_moves =
            !r.persistent && r.expires_at_ms > now && new_expiry - r.expires_at_ms >= 1000;
        let use_moves = used && now - r.last_used() >= 1000;
        if !expiry_moves && !use_moves {
            return Ok(r);
        }
        self.store
            .modify(id, |r| {
                if !r.persistent && r.expires_at_ms > now {
                    r.expires_at_ms = r.expires_at_ms.max(now + (r.ttl_seconds as i64) * 1000);
                }
                if used {
                    r.last_used_ms = r.last_used_ms.max(now);
                }
                Ok(())
            })
            .await
    }

    /// One sandbox (refreshes its TTL). A networked sandbox's traffic counters are read with
    /// `nft` on the blocking pool.
    pub async fn get(self: &Arc<Self>, id: &str) -> CoreResult<SandboxView> {
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
        Ok(self
            .store
            .list_sandboxes(&query, page)
            .await?
            .map(|r| r.view()))
    }

    /// Change TTL, persistence, metadata or the idle-hibernation delay.
    pub async fn update(&self, id: &str, u: UpdateSandbox) -> CoreResult<SandboxView> {
        self.load(id).await?;
        if let Some(ttl) = u.ttl_seconds {
            if ttl == 0 || ttl > self.cfg.max_ttl_seconds {
                return Err(CoreError::InvalidArgument(format!(
                    "ttl_seconds must be between 1 and {}, got {ttl}",
                    self.cfg.max_ttl_seconds
                )));
            }
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
        Ok(r.view())
    }

    /// Destroy a sandbox and forget it (whatever its state: paused and hibernated too).
    pub async fn kill(&self, id: &str) -> CoreResult<()> {
        self.load(id).await?;
        let _op = self.op_lock(id).await;
        let r = self.load(id).await?;
        self.remove(r, "sandbox.killed").await
    }

    async fn remove(&self, r: SandboxRecord, event: &str) -> CoreResult<()> {
        // Forget it first so the death watcher treats the exit as intended.
        self.store.delete_sandbox(&r.id).await?;
        let client = self.lock_agents().remove(&r.id);
        if let Some(client) = client {
            self.sync_volumes(&r, &client).await;
        }
        self.ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&r.id);
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
        self.events.publish(event, &r.id, r.tenant(), None);
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
        let (ns, vm) = (self.ns.clone(), self.vm.clone());
        let _ = tokio::task::spawn_blocking(move || {
            ns.release_pool();
            vm.release_fork_memory();
        })
        .await;
    }

    async fn destroy_resources(&self, r: &SandboxRecord) -> CoreResult<()> {
        let backend = self.backend(r.isolation)?;
        let rec = r.clone();
        let net = self.network.clone();
        tokio::task::spawn_blocking(move || {
            let destroyed = backend.destroy(&rec);
            if let (Some(net), Some(i)) = (net, rec.net_slot) {
                net.release(i);
            }
            destroyed
        })
        .await
        .map_err(|e| CoreError::Internal(e.to_string()))??;
        self.unmount_unused_volumes().await;
        Ok(())
    }

    /// A connected agent client for a running sandbox (refreshes its TTL). A hibernated
    /// sandbox is woken first.
    pub async fn agent(self: &Arc<Self>, id: &str) -> CoreResult<AgentClient> {
        let mut r = self.touch_used(id).await?;
        if r.state == SandboxState::Hibernated {
            self.wake_if_hibernated(id).await?;
            r = self.load(id).await?;
        }
        if !r.state.can_use() {
            return Err(wrong_state(&r, None));
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
    pub async fn agent_error(&self, id: &str, e: ClientError) -> CoreError {
        match self.load(id).await {
            Ok(r) => self.on_transport_error(&r, e),
            Err(_) => CoreError::NotFound(format!("sandbox {id} does not exist")),
        }
    }

    /// The result of an agent call on sandbox `id`, its error mapped by
    /// [`Manager::agent_error`].
    pub async fn agent_call<T>(&self, id: &str, result: Result<T, ClientError>) -> CoreResult<T> {
        match result {
            Ok(v) => Ok(v),
            Err(e) => Err(self.agent_error(id, e).await),
        }
    }

    /// Current resource usage of a sandbox.
    pub async fn usage(&self, id: &str) -> CoreResult<Option<Usage>> {
        let r = self.touch(id).await?;
        Ok(self.backend(r.isolation)?.usage(&r))
    }

    /// Prometheus text.
    ///
    /// `per_sandbox`: include the series labelled with sandbox ids (for authenticated
    /// scrapes); without it, their server-wide sums (safe to serve without a key: no ids,
    /// bounded cardinality).
    pub async fn metrics_text(&self, per_sandbox: bool) -> CoreResult<String> {
        let counts = self.store.count_by_state().await?;
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
        let mut text = self.metrics.render(&states);
        {
            use std::fmt::Write as _;
            let _ = writeln!(
                text,
                "# HELP hutch_vm_warm_guests Warm vm guests ready to become sandboxes.\n# TYPE hutch_vm_warm_guests gauge\nhutch_vm_warm_guests {}",
                self.warm.len()
            );
            let budget = &self.output_budget;
            let _ = writeln!(
                text,
                "# HELP hutch_exec_output_budget_bytes Memory collected exec output may hold (hutch serve --exec-output-budget-mib).\n# TYPE hutch_exec_output_budget_bytes gauge\nhutch_exec_output_budget_bytes {}\n# HELP hutch_exec_output_buffered_bytes Collected exec output held now.\n# TYPE hutch_exec_output_buffered_bytes gauge\nhutch_exec_output_buffered_bytes {}\n# HELP hutch_exec_output_buffered_peak_bytes Most collected exec output held at once since start.\n# TYPE hutch_exec_output_buffered_peak_bytes gauge\nhutch_exec_output_buffered_peak_bytes {}\n# HELP hutch_exec_output_waits_total Execs whose output reading waited for the budget.\n# TYPE hutch_exec_output_waits_total counter\nhutch_exec_output_waits_total {}",
                budget.limit(),
                budget.used(),
                budget.peak(),
                budget.waits()
            );
            let (captured, streamed) = self.vm.memory_snapshot_counts();
            let _ = writeln!(
                text,
                "# HELP hutch_vm_memory_snapshots_total Memory snapshots of running vm guests (named snapshots and live forks), by how they were taken: captured (RAM copied out of QEMU) or stream (the fallback: a full migration stream).\n# TYPE hutch_vm_memory_snapshots_total counter\nhutch_vm_memory_snapshots_total{{method=\"captured\"}} {captured}\nhutch_vm_memory_snapshots_total{{method=\"stream\"}} {streamed}"
            );
        }
        if let Some(quota) = self.ns.disk_quota_known() {
            use std::fmt::Write as _;
            let (on, mib) = match quota {
                crate::backend::ns::DiskQuota::Enforced { pool_mib } => (1, pool_mib),
                crate::backend::ns::DiskQuota::Off { .. } => (0, 0),
            };
            let _ = writeln!(
                text,
                "# HELP hutch_ns_disk_quota_enforced Whether disk_mib is enforced on ns sandboxes (btrfs disk pool; known after the first ns create).\n# TYPE hutch_ns_disk_quota_enforced gauge\nhutch_ns_disk_quota_enforced {on}\n# HELP hutch_ns_disk_pool_bytes Size of the ns disk pool (0 without one).\n# TYPE hutch_ns_disk_pool_bytes gauge\nhutch_ns_disk_pool_bytes {}",
                mib << 20
            );
        }
        let traffic = self.traffic_all();
        if self.network.is_some() && !per_sandbox {
            use std::fmt::Write as _;
            let (bytes, conns) = traffic.values().fold((0u64, 0u64), |(b, c), t| {
                (b + t.bytes_out, c + t.connections_out)
            });
            let _ = writeln!(text, "# HELP hutch_network_bytes_out Bytes all live sandboxes sent out (per sandbox: GET /v1/metrics with a key).\n# TYPE hutch_network_bytes_out gauge\nhutch_network_bytes_out {bytes}\n# HELP hutch_network_connections_out Connections (and UDP flows) all live sandboxes opened out.\n# TYPE hutch_network_connections_out gauge\nhutch_network_connections_out {conns}");
        }
        if self.network.is_some() && per_sandbox {
            use std::fmt::Write as _;
            let mut ids: Vec<_> = traffic.keys().collect();
            ids.sort();
            let _ = writeln!(text, "# HELP hutch_sandbox_network_bytes_out Bytes a sandbox sent out (IP packets leaving its interface).\n# TYPE hutch_sandbox_network_bytes_out counter");
            for id in &ids {
                let _ = writeln!(
                    text,
                    "hutch_sandbox_network_bytes_out{{sandbox=\"{id}\"}} {}",
                    traffic[*id].bytes_out
                );
            }
            let _ = writeln!(text, "# HELP hutch_sandbox_network_connections_out Connections (and UDP flows) a sandbox opened out.\n# TYPE hutch_sandbox_network_connections_out counter");
            for id in &ids {
                let _ = writeln!(
                    text,
                    "hutch_sandbox_network_connections_out{{sandbox=\"{id}\"}} {}",
                    traffic[*id].connections_out
                );
            }
        }
        Ok(text)
    }

    /// Re-adopt sandboxes that survived a server restart; mark the dead ones failed. Paused
    /// sandboxes stay paused; hibernated ones stay hibernated (after removing whatever a wake
    /// interrupted by the restart left running).
    pub async fn readopt(self: &Arc<Self>) -> CoreResult<()> {
        self.drain_warm().await;
        for r in self.store.all_sandboxes().await? {
            if r.state == SandboxState::Hibernated {
                let backend = self.backend(r.isolation)?;
                let rec = r.clone();
                let cleaned = tokio::task::spawn_blocking(move || backend.hibernate(&rec))
                    .await
                    .map_err(|e| CoreError::Internal(e.to_string()))?;
                if let Err(e) = cleaned {
                    tracing::error!(id = %r.id, error = %e, "cleaning up a hibernated sandbox");
                }
                continue;
            }
            if !r.state.holds_resources() {
                continue;
            }
            let backend = self.backend(r.isolation)?;
            if r.state != SandboxState::Starting && backend.alive(&r) {
                if r.net_slot.is_some() && self.readopt_network(&r, true).is_none() {
                    let _ = self
                        .store
                        .modify(&r.id, |rec| {
                            rec.net_slot = None;
                            Ok(())
                        })
                        .await;
                }
                tracing::info!(id = %r.id, "re-adopted running sandbox");
                backend.adopt(&r);
                self.watch_init(&r);
            } else {
                self.mark_failed(r, "the sandbox stopped while the server was down".into())
                    .await;
            }
        }
        Ok(())
    }

    /// Record a death: state `failed` with a reason, host resources released.
    async fn mark_failed(&self, r: SandboxRecord, reason: String) {
        tracing::warn!(id = %r.id, %reason, "sandbox failed");
        self.lock_agents().remove(&r.id);
        if let Err(e) = self.destroy_resources(&r).await {
            tracing::error!(id = %r.id, error = %e, "teardown of a failed sandbox");
        }
        self.metrics.failures.fetch_add(1, Ordering::Relaxed);
        let saved = self
            .store
            .modify(&r.id, |rec| {
                rec.state = SandboxState::Failed;
                rec.error = Some(reason.clone());
                rec.init_pid = None;
                rec.init_start_time = None;
                Ok(())
            })
            .await;
        if saved.is_ok() {
            self.events
                .publish("sandbox.failed", &r.id, r.tenant(), Some(reason));
        }
        self.release_layer(r.layer.as_deref()).await;
    }

    /// Watch the sandbox's init; when it dies unexpectedly, mark the sandbox failed.
    fn watch_init(self: &Arc<Self>, r: &SandboxRecord) {
        let Some(pid) = r.init_pid else { return };
        let weak = Arc::downgrade(self);
        let id = r.id.clone();
        tokio::spawn(async move {
            let status = crate::pidwatch::wait_exit(pid).await;
            let Some(m) = weak.upgrade() else { return };
            let Ok(Some(rec)) = m.store.get_sandbox(&id).await else {
                return;
            };
            if rec.state == SandboxState::Pooled && rec.init_pid == Some(pid) {
                tracing::warn!(%id, %status, "a warm vm guest stopped");
                m.replace_warm(&rec).await;
                return;
            }
            if !rec.state.holds_resources() || rec.init_pid != Some(pid) {
                return;
            }
            let backend = match m.backend(rec.isolation) {
                Ok(b) => b,
                Err(_) => return,
            };
            let oom = rec.isolation == Isolation::Ns
                && backend.usage(&rec).map(|u| u.oom_kills).unwrap_or(0) > 0;
            let reason = if oom {
                m.metrics.oom_kills.fetch_add(1, Ordering::Relaxed);
                m.events.publish(
                    "sandbox.oom",
                    &id,
                    rec.tenant(),
                    Some(format!("memory limit of {} MiB exceeded", rec.memory_mib)),
                );
                format!(
                    "the sandbox's init (agent) was killed: out of memory (limit {} MiB)",
                    rec.memory_mib
                )
            } else {
                backend.exit_reason(&rec, &status)
            };
            m.mark_failed(rec, reason).await;
        });
    }

    /// Destroy sandboxes whose TTL ran out (never persistent ones): the store answers with
    /// the rows due (an index on the expiry), not every row.
    pub async fn reap_expired(&self) {
        let now = now_ms();
        let Ok(due) = self.store.expired_sandboxes(now).await else {
            return;
        };
        for r in due {
            if !r.persistent && r.expires_at_ms <= now {
                let id = r.id.clone();
                // Not in the middle of a transition (a wake, a snapshot being read).
                let _op = self.op_lock(&id).await;
                let Ok(r) = self.load(&id).await else {
                    continue;
                };
                if r.persistent || r.expires_at_ms > now {
                    continue;
                }
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
        .map_err(|e| CoreError::Internal(format!("write {}: {e}", path.display())))?;
    std::io::Write::write_all(&mut f, format!("{secret}\n").as_bytes())
        .map_err(|e| CoreError::Internal(format!("write {}: {e}", path.display())))
}
