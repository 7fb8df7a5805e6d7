//! The warm pool of `vm` guests: for each template and guest shape that vm sandboxes were
//! created with, `Config::vm_warm` guests are restored ahead of time, warmed up and paused
//! (`backend/vm/warm.rs`). A create with the same template, memory, vCPUs, disk size and
//! network mode claims one — it becomes the sandbox: its id, uid range, cgroups and network
//! slot were the guest's from the start; the claim applies the request (metadata, TTL, CPU
//! limit, egress policy, identity) — and a refill starts in the background.
//!
//! A warm guest is a row of the sandboxes table in state `pooled` (so its uid range and
//! slot are reserved like any sandbox's) that the API never shows. Guests are dropped when
//! their template is rebuilt, when no create asked for their shape for [`KEY_IDLE`], when
//! QEMU dies, on shutdown and when a server starts (it has no connection to them).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hutch_net::policy::{Egress, Policy, PolicySpec};
use hutch_proto::client::AgentClient;

use super::network::{record_address, record_policy};
use super::{blocking, Manager};
use crate::error::{CoreError, CoreResult};
use crate::ids::{self, SandboxId};
use crate::model::{vcpus, Isolation, SandboxRecord, SandboxState};
use crate::sandbox_network::SandboxNetwork;
use crate::time::now_ms;

/// How long a shape stays warm after the last create that asked for it.
const KEY_IDLE: Duration = Duration::from_secs(600);
/// How long shutdown waits for warm guests being restored.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Most shapes kept warm at once (the least recently asked for goes first).
const MAX_KEYS: usize = 4;

/// What makes warm guests interchangeable.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct WarmKey {
    /// The backend whose pool it is.
    isolation: Isolation,
    template: String,
    /// The build of the template's root (a rebuild retires the guests of the old one).
    build: String,
    memory_mib: u64,
    vcpus: u32,
    disk_mib: u64,
    networked: bool,
    /// The start command its guests run (baked in), as JSON.
    start: Option<String>,
}

struct WarmGuest {
    id: SandboxId,
    agent: AgentClient,
    /// Its start command's ready check passed while it was warmed, so a claim only asks the
    /// agent that the command still runs ([`Manager::confirm_service`]).
    ready: bool,
}

#[derive(Default)]
struct PoolState {
    ready: HashMap<WarmKey, Vec<WarmGuest>>,
    /// Shapes with a refill running.
    filling: HashSet<WarmKey>,
    /// When a create last asked for each shape.
    asked: HashMap<WarmKey, Instant>,
}

/// Warm guests by shape.
#[derive(Default)]
pub(super) struct WarmPool {
    state: Mutex<PoolState>,
}

impl WarmPool {
    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self, key: &WarmKey) -> Option<WarmGuest> {
        self.lock().ready.get_mut(key)?.pop()
    }

    fn forget(&self, id: &str) {
        for guests in self.lock().ready.values_mut() {
            guests.retain(|g| g.id != id);
        }
    }

    /// Warm guests ready now.
    pub(super) fn len(&self) -> usize {
        self.lock().ready.values().map(Vec::len).sum()
    }
}

impl Manager {
    /// The shape of warm guest that could become `record`, if a pool serves it.
    pub(super) fn warm_key(&self, record: &SandboxRecord) -> Option<WarmKey> {
        if self.cfg.vm_warm == 0 || record.layer.is_some() || !record.volumes.is_empty() {
            return None;
        }
        let backend = self.backend(record.isolation).ok()?;
        if !backend.capabilities().warm_pool {
            return None;
        }
        let build = backend.template_build(&self.template_rootfs(record))?;
        Some(WarmKey {
            isolation: record.isolation,
            template: record.template.clone(),
            build,
            memory_mib: record.memory_mib,
            vcpus: vcpus(record.cpus),
            disk_mib: record.disk_mib,
            networked: self.network.is_some() && record_policy(record).networked(),
            start: record
                .start
                .as_ref()
                .and_then(|s| serde_json::to_string(s).ok()),
        })
    }

    /// Turn a warm guest of shape `key` into the sandbox `wanted` describes (keeping the
    /// guest's id, uid range, cgroups and slot); `None` when none is ready or claiming failed
    /// (the caller restores one then).
    pub(super) async fn claim_warm(
        self: &Arc<Self>,
        key: &WarmKey,
        wanted: &SandboxRecord,
    ) -> Option<SandboxRecord> {
        let guest = self.warm.take(key)?;
        let pooled = match self.store.get_sandbox(&guest.id).await {
            Ok(Some(r)) if r.state == SandboxState::Pooled => r,
            _ => return None,
        };
        let mut rec = wanted.clone();
        rec.id = pooled.id.clone();
        rec.uid_slot = pooled.uid_slot;
        rec.net_slot = pooled.net_slot;
        rec.init_pid = pooled.init_pid;
        rec.init_start_time = pooled.init_start_time;
        rec.cgroups = pooled.cgroups.clone();
        // The disk it got (the image's size when asked for less).
        rec.disk_mib = pooled.disk_mib;
        rec.state = SandboxState::Starting;
        // The requested policy, at the slot's address.
        rec.network = Some(SandboxNetwork {
            policy: record_policy(wanted),
            address: record_address(&pooled),
        });
        let claimed = match (
            self.store.update_sandbox(&rec).await,
            self.backend(rec.isolation),
        ) {
            (Ok(()), Ok(backend)) => {
                let (mgr, r) = (self.clone(), rec.clone());
                let policy_set = blocking(move || {
                    if let (Some(net), Some(i)) = (&mgr.network, r.net_slot) {
                        net.set_policy(i, &record_policy(&r))
                            .map_err(CoreError::from)?;
                    }
                    Ok(())
                })
                .await;
                match policy_set {
                    Ok(()) => match backend.claim_warm(&rec, &guest.agent).await {
                        Ok(()) if guest.ready => self.confirm_service(&rec, &guest.agent).await,
                        Ok(()) => self.ensure_service(&rec, &guest.agent).await,
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                }
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        rec.state = SandboxState::Running;
        let claimed = match claimed {
            Ok(()) => self.store.update_sandbox(&rec).await,
            Err(e) => Err(e),
        };
        match claimed {
            Ok(()) => {
                self.lock_agents().insert(rec.id.clone(), guest.agent);
                // Its warm-up was the pool's: it is metered from here.
                self.start_meter(&rec);
                Some(rec)
            }
            Err(e) => {
                tracing::warn!(id = %rec.id, error = %e, "claiming a warm vm guest failed; restoring one instead");
                self.discard_warm(&rec).await;
                None
            }
        }
    }

    /// Note that a create asked for `key` and bring its pool back to `Config::vm_warm` in
    /// the background.
    pub(super) fn fill_warm(self: &Arc<Self>, key: WarmKey) {
        self.warm.lock().asked.insert(key.clone(), Instant::now());
        self.refill_warm(key);
    }

    /// Bring the pool of `key` back to `Config::vm_warm` in the background, if a create
    /// asked for that shape lately.
    fn refill_warm(self: &Arc<Self>, key: WarmKey) {
        {
            let mut st = self.warm.lock();
            if !st.asked.contains_key(&key) || !st.filling.insert(key.clone()) {
                return;
            }
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(m) = weak.upgrade() else { return };
                {
                    let mut st = m.warm.lock();
                    let ready = st.ready.get(&key).map_or(0, Vec::len);
                    if ready >= m.cfg.vm_warm || !st.asked.contains_key(&key) {
                        st.filling.remove(&key);
                        return;
                    }
                }
                match m.start_warm(&key).await {
                    Ok(guest) => {
                        let retired = {
                            let mut st = m.warm.lock();
                            if st.asked.contains_key(&key) {
                                st.ready.entry(key.clone()).or_default().push(guest);
                                None
                            } else {
                                Some(guest)
                            }
                        };
                        let Some(guest) = retired else { continue };
                        // Retired while it was being restored.
                        if let Ok(Some(r)) = m.store.get_sandbox(&guest.id).await {
                            m.discard_warm(&r).await;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(template = %key.template, error = %e, "restoring a warm vm guest");
                    }
                }
                m.warm.lock().filling.remove(&key);
                return;
            }
        });
    }

    /// Restore one warm guest of shape `key`.
    async fn start_warm(self: &Arc<Self>, key: &WarmKey) -> CoreResult<WarmGuest> {
        let rootfs = self.templates.rootfs(&key.template);
        let backend = self.backend(key.isolation)?;
        if backend.template_build(&rootfs).as_ref() != Some(&key.build) {
            return Err(CoreError::Conflict(format!(
                "template {} was rebuilt",
                key.template
            )));
        }
        let info = self
            .templates
            .get(&key.template)
            .ok_or_else(|| CoreError::NotFound(format!("template {} is gone", key.template)))?;
        // No way out until a create claims it and sets the policy it asked for.
        let egress = if key.networked {
            Egress::Deny
        } else {
            Egress::None
        };
        let policy = Policy::from_spec(&PolicySpec {
            egress,
            ..PolicySpec::default()
        })
        .map_err(CoreError::from)?;
        let now = now_ms();
        let mut record = SandboxRecord {
            id: ids::new_sandbox_id(),
            template: key.template.clone(),
            isolation: key.isolation,
            state: SandboxState::Pooled,
            tenant: None,
            metadata: Default::default(),
            env: info.defaults.env.clone(),
            cpus: f64::from(key.vcpus),
            memory_mib: key.memory_mib,
            disk_mib: key.disk_mib,
            pids_max: info.defaults.pids_max,
            ttl_seconds: self.cfg.max_ttl_seconds,
            persistent: true,
            created_at_ms: now,
            expires_at_ms: now + (self.cfg.max_ttl_seconds as i64) * 1000,
            uid_slot: 0,
            init_pid: None,
            init_start_time: None,
            cgroups: vec![],
            error: None,
            network: Some(SandboxNetwork::new(policy)),
            layer: None,
            snapshot: None,
            forked_from: None,
            idle_hibernate_seconds: None,
            last_used_ms: now,
            net_slot: None,
            volumes: vec![],
            start: super::service::start_spec(&info),
            template_rev: (info.rev > 0).then_some(info.rev),
            exec_defaults: info.defaults.exec.clone(),
            created_by: None,
            max_cost_micros: None,
            saved_state: None,
            saving: None,
            arrival: None,
        };
        self.insert_with_free_slot(&mut record).await?;
        let (mgr, mut rec) = (self.clone(), record.clone());
        let attached = blocking(move || {
            mgr.attach_network(&mut rec)?;
            Ok(rec)
        })
        .await;
        let started = match attached {
            Ok(rec) => match backend.create_warm(&rec, &rootfs).await {
                Ok(s) => Ok((s, rec)),
                Err(e) => {
                    self.detach_network_blocking(&rec).await;
                    Err(e)
                }
            },
            Err(e) => Err(e),
        };
        let (started, rec) = match started {
            Ok(s) => s,
            Err(e) => {
                let _ = self.store.delete_sandbox(&record.id).await;
                self.release_uid_slot(record.uid_slot);
                return Err(e);
            }
        };
        record.net_slot = rec.net_slot;
        record.network = rec.network;
        if let Some(disk_mib) = started.disk_mib {
            record.disk_mib = disk_mib;
        }
        record.init_pid = Some(started.init_pid);
        record.init_start_time = Some(started.init_start_time);
        record.cgroups = started
            .cgroups
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let saved = self.store.update_sandbox(&record).await;
        let agent = match (saved, started.agent) {
            (Ok(()), Some(agent)) => agent,
            (saved, _) => {
                self.discard_warm(&record).await;
                return Err(saved.err().unwrap_or_else(|| {
                    CoreError::Internal("the warm guest came without its agent".into())
                }));
            }
        };
        self.watch_init(&record);
        Ok(WarmGuest {
            id: record.id,
            agent,
            ready: started.service_ready,
        })
    }

    /// A warm guest's QEMU died: destroy what is left and restore another.
    pub(super) async fn replace_warm(self: &Arc<Self>, r: &SandboxRecord) {
        let key = {
            let st = self.warm.lock();
            st.ready
                .iter()
                .find(|(_, guests)| guests.iter().any(|g| g.id == r.id))
                .map(|(k, _)| k.clone())
        };
        self.discard_warm(r).await;
        if let Some(key) = key {
            self.refill_warm(key);
        }
    }

    /// Destroy a warm guest (or one whose claim failed) and forget it.
    pub(super) async fn discard_warm(&self, r: &SandboxRecord) {
        self.warm.forget(&r.id);
        let _ = self.store.delete_sandbox(&r.id).await;
        match self.destroy_resources(r).await {
            Ok(()) => self.release_uid_slot(r.uid_slot),
            Err(e) => tracing::warn!(id = %r.id, error = %e, "destroying a warm vm guest"),
        }
    }

    /// Drop the warm guests of shapes not asked for lately (beyond the [`MAX_KEYS`] most
    /// recent) or whose template was rebuilt.
    pub(super) async fn retire_warm(&self) {
        let retired: Vec<WarmGuest> = {
            let mut st = self.warm.lock();
            let mut keys: Vec<(WarmKey, Instant)> =
                st.asked.iter().map(|(k, t)| (k.clone(), *t)).collect();
            keys.sort_by_key(|(_, t)| std::cmp::Reverse(*t));
            let stale: Vec<WarmKey> = keys
                .into_iter()
                .enumerate()
                .filter(|(i, (k, t))| {
                    *i >= MAX_KEYS
                        || t.elapsed() > KEY_IDLE
                        || self
                            .backend(k.isolation)
                            .ok()
                            .and_then(|b| b.template_build(&self.templates.rootfs(&k.template)))
                            .as_ref()
                            != Some(&k.build)
                })
                .map(|(_, (k, _))| k)
                .collect();
            stale
                .iter()
                .flat_map(|k| {
                    st.asked.remove(k);
                    st.ready.remove(k).unwrap_or_default()
                })
                .collect()
        };
        for guest in retired {
            if let Ok(Some(r)) = self.store.get_sandbox(&guest.id).await {
                self.discard_warm(&r).await;
            }
        }
    }

    /// Destroy every warm guest (at shutdown, and at start for those an earlier server left:
    /// this one has no connection to their agents).
    pub async fn drain_warm(&self) {
        {
            let mut st = self.warm.lock();
            st.asked.clear();
            st.ready.clear();
        }
        // A guest being restored is discarded by its refill when done (no shape asks for it
        // any more); wait for that rather than leave its QEMU behind.
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        while !self.warm.lock().filling.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for r in self.store.pooled_sandboxes().await.unwrap_or_default() {
            self.discard_warm(&r).await;
        }
    }
}
