//! Pause, resume, hibernate, wake, and hibernation of idle sandboxes.
//!
//! Each operation takes the sandbox's transition lock, refreshes its record, checks the state
//! allows it (`SandboxState::can_*`, else 409 with what to do instead), acts through the
//! backend, and saves the new state.
//!
//! Hibernation saves the new state *before* stopping the processes, so the death watcher sees
//! an intended stop; wake saves `running` only once the agent answers, so a server that
//! crashes mid-wake finds the sandbox still hibernated (and cleans up what the wake started).

use std::sync::Arc;
use std::time::Instant;

use super::quota::TenantRecordNeeded;
use super::{wrong_state, Manager};
use crate::backend::{Backend, Hibernation};
use crate::error::{CoreError, CoreResult};
use crate::handoff::Arrival;
use crate::ids::SandboxId;
use crate::model::{SandboxRecord, SandboxState, SandboxView};
use crate::tenant::quota::Footprint;
use crate::time::now_ms;

/// CPU time per second of wall time above which a sandbox counts as busy for idle
/// hibernation, beyond what its backend uses while idle ([`Backend::idle_cpu_ns_per_sec`]):
/// 1 % (an idle agent uses far less).
const BUSY_NS_PER_SEC: u64 = 10_000_000;

/// The result of an explicit wake.
#[derive(Debug, Clone)]
pub struct Woken {
    /// The sandbox, running again.
    pub sandbox: SandboxView,
    /// Milliseconds from the start of the wake until its agent answered.
    pub woke_in_ms: u64,
}

/// What `r` counts for under its tenant's quotas once it runs (a resume or a wake).
fn running_footprint(r: &SandboxRecord) -> Footprint {
    Footprint {
        sandboxes: 1,
        cpus: r.cpus,
        memory_mib: r.memory_mib,
        creates: 0,
    }
}

impl Manager {
    /// Freeze every process of a running sandbox: it uses no CPU until resumed.
    pub async fn pause(self: &Arc<Self>, id: &SandboxId) -> CoreResult<SandboxView> {
        self.load(id).await?;
        let _op = self.op_lock(id).await;
        let r = self.touch(id).await?;
        if !r.state.can_pause() {
            return Err(wrong_state(&r, Some("pause")));
        }
        self.pause_locked(r, None).await?;
        Ok(self.load(id).await?.view())
    }

    /// Pause `r` (its transition lock held and its state checked).
    pub(super) async fn pause_locked(
        &self,
        r: SandboxRecord,
        why: Option<String>,
    ) -> CoreResult<()> {
        self.backend(r.isolation)?.pause(&r).await?;
        crate::crash_points::crash_point("pause.stopped");
        let r = self
            .store
            .modify(&r.id, |r| {
                r.state = SandboxState::Paused;
                Ok(())
            })
            .await?;
        self.events
            .publish("sandbox.paused", &r.id, r.tenant(), why);
        Ok(())
    }

    /// Let a paused sandbox run again.
    pub async fn resume(self: &Arc<Self>, id: &SandboxId) -> CoreResult<SandboxView> {
        self.load(id).await?;
        let _op = self.op_lock(id).await;
        let r = self.touch(id).await?;
        if !r.state.can_resume() {
            return Err(wrong_state(&r, Some("resume")));
        }
        // Not while its tenant, key or own cap is spent: it stays paused.
        self.check_budgets(&super::budget::Spender::of(&r)).await?;
        // Its CPUs and memory count again once it runs.
        let _admitted = self
            .admit(
                r.tenant.as_ref(),
                id,
                running_footprint(&r),
                TenantRecordNeeded::No,
            )
            .await?;
        self.backend(r.isolation)?.resume(&r).await?;
        crate::crash_points::crash_point("resume.continued");
        let r = self
            .store
            .modify(id, |r| {
                r.state = SandboxState::Running;
                // The idle clock starts again: a paused sandbox was not idle by choice.
                r.last_used_ms = now_ms();
                Ok(())
            })
            .await?;
        self.events.publish("sandbox.resumed", id, r.tenant(), None);
        Ok(r.view())
    }

    /// Stop a running sandbox and keep its state on disk (on `ns`: its files; its processes
    /// end). The next exec or file call, or [`Manager::wake`], starts it again.
    pub async fn hibernate(self: &Arc<Self>, id: &SandboxId) -> CoreResult<SandboxView> {
        self.load(id).await?;
        let _op = self.op_lock(id).await;
        let r = self.touch(id).await?;
        if !r.state.can_hibernate() {
            return Err(wrong_state(&r, Some("hibernate")));
        }
        Ok(self.hibernate_locked(r, None).await?.view())
    }

    /// Drop the server's connection to the sandbox's agent, letting the backend wait until
    /// the agent has ended that session ([`Backend::quiesce`]).
    pub(super) async fn hang_up_agent(&self, backend: Arc<dyn Backend>, r: &SandboxRecord) {
        let Some(client) = self.lock_agents().remove(&r.id) else {
            return;
        };
        if client.is_closed() {
            return;
        }
        self.sync_volumes(r, &client).await;
        // Shut the socket down rather than only drop the client: a clone held by a call
        // still in flight would keep the session open.
        backend.quiesce(r, Box::new(move || client.hang_up())).await;
    }

    /// Hibernate `r` (its transition lock held and its state checked).
    pub(super) async fn hibernate_locked(
        &self,
        r: SandboxRecord,
        why: Option<String>,
    ) -> CoreResult<SandboxRecord> {
        let t0 = Instant::now();
        let r = self
            .store
            .modify(&r.id, |r| {
                r.state = SandboxState::Hibernated;
                Ok(())
            })
            .await?;
        crate::crash_points::crash_point("hibernate.recorded");
        let backend = self.backend(r.isolation)?;
        // Its last interval of usage, before its cgroups go.
        self.meter_final(&r).await;
        self.hang_up_agent(backend.clone(), &r).await;
        let hibernated = backend.hibernate(&r).await;
        crate::crash_points::crash_point("hibernate.stopped");
        if let Err(e) = hibernated {
            tracing::error!(id = %r.id, error = %e, "hibernating");
            // Never a hibernated sandbox without its state: what the failed step left is
            // hibernated with its state (the next wake cleans up and retries), still running
            // (nothing was saved: `vm`), or lost.
            match backend.recover_hibernated(&r).await {
                Hibernation::Kept => {}
                Hibernation::StillRunning => {
                    self.store
                        .modify(&r.id, |r| {
                            r.state = SandboxState::Running;
                            Ok(())
                        })
                        .await?;
                }
                Hibernation::Lost(reason) => self.mark_failed(r, reason).await,
            }
            return Err(self.blame_full_disk(e, "hibernate the sandbox"));
        }
        // Its network slot (veth, namespace, /30) goes back to the pool: its open
        // connections are reset; its address is kept as the one its wake asks for.
        if let (Some(net), Some(index)) = (self.network.clone(), r.net_slot) {
            let id = r.id.clone();
            let _ = super::blocking(move || {
                net.release_held(index, &id);
                Ok(())
            })
            .await;
        }
        let r = self
            .store
            .modify(&r.id, |r| {
                r.init_pid = None;
                r.init_start_time = None;
                r.cgroups.clear();
                r.net_slot = None;
                Ok(())
            })
            .await?;
        self.unmount_unused_volumes().await;
        // For other nodes to wake it (cluster mode with an object store).
        self.save_hibernated(&r).await;
        let ms = t0.elapsed().as_millis() as u64;
        tracing::info!(id = %r.id, ms, reason = why.as_deref().unwrap_or("requested"), "sandbox hibernated");
        self.events
            .publish("sandbox.hibernated", &r.id, r.tenant(), why);
        Ok(r)
    }

    /// Start a hibernated sandbox again; reports how long it took.
    pub async fn wake(self: &Arc<Self>, id: &SandboxId) -> CoreResult<Woken> {
        self.load(id).await?;
        let _op = self.op_lock(id).await;
        let r = self.touch(id).await?;
        if !r.state.can_wake() {
            return Err(wrong_state(&r, Some("wake")));
        }
        let (r, woke_in_ms) = self.wake_locked(r).await?;
        Ok(Woken {
            sandbox: r.view(),
            woke_in_ms,
        })
    }

    /// Wake `id` if it is (still) hibernated: the transparent wake of exec and file calls.
    pub(super) async fn wake_if_hibernated(self: &Arc<Self>, id: &SandboxId) -> CoreResult<()> {
        let _op = self.op_lock(id).await;
        let r = self.load(id).await?;
        if r.state == SandboxState::Hibernated {
            self.wake_locked(r).await?;
        }
        Ok(())
    }

    /// Wake `r` (its transition lock held and its state checked).
    async fn wake_locked(self: &Arc<Self>, r: SandboxRecord) -> CoreResult<(SandboxRecord, u64)> {
        let t0 = Instant::now();
        // Refused by a quota or a spending cap, it stays hibernated with everything it kept.
        self.check_budgets(&super::budget::Spender::of(&r)).await?;
        let _admitted = self
            .admit(
                r.tenant.as_ref(),
                &r.id,
                running_footprint(&r),
                TenantRecordNeeded::No,
            )
            .await?;
        // Only its owner wakes it: the write fails once another node took it over.
        let r = self.store.modify(&r.id, |_| Ok(())).await?;
        // It moved here from another node: its files come first.
        let r = match r.arrival {
            Some(Arrival::Fetch) => self.fetch_arrival(r).await?,
            _ => r,
        };
        // After a reboot another server may have claimed this sandbox's uid range first.
        if !self.uid_slots.lock()?.hold(r.uid_slot)? {
            return Err(CoreError::Conflict(format!(
                "sandbox {} cannot wake: its uid range (slot {}) is in use by another hutch server on this host",
                r.id, r.uid_slot
            )));
        }
        let backend = self.backend(r.isolation)?;
        let rootfs = self.template_rootfs(&r);
        let (started, net_slot, network) = {
            let rec = self.attach_and_mount(r.clone()).await?;
            // Its first start on this node is a create over the layer it brought.
            let started = match rec.arrival {
                Some(Arrival::Start) => backend.create(&rec, &rootfs).await,
                _ => backend.wake(&rec, &rootfs).await,
            };
            let s = match started {
                Ok(s) => s,
                Err(e) => {
                    self.detach_network_blocking(&rec).await;
                    if let CoreError::FilesLost(reason) = &e {
                        // Never woken empty: what it kept is gone, so it can never run.
                        self.mark_failed(r, reason.clone()).await;
                        return Err(e);
                    }
                    return Err(self.blame_full_disk(e, "wake the sandbox"));
                }
            };
            (s, rec.net_slot, rec.network)
        };
        crate::crash_points::crash_point("wake.started");
        let r = self
            .store
            .modify(&r.id, |r| {
                r.net_slot = net_slot;
                r.network = network.clone();
                r.init_pid = Some(started.init_pid);
                r.init_start_time = Some(started.init_start_time);
                r.cgroups = started
                    .cgroups
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect();
                Ok(())
            })
            .await?;
        let connected = match started.agent {
            Some(client) => Ok(client),
            None => self.connect_agent(backend.as_ref(), &r.id).await,
        };
        let client = match connected {
            Ok(c) => c,
            Err(e) => {
                // Back to hibernated, files kept.
                if let Err(s) = backend.hibernate(&r).await {
                    tracing::error!(id = %r.id, error = %s, "stopping after a failed wake");
                }
                let _ = self
                    .store
                    .modify(&r.id, |r| {
                        r.init_pid = None;
                        r.init_start_time = None;
                        r.cgroups.clear();
                        Ok(())
                    })
                    .await;
                return Err(e);
            }
        };
        if let Err(e) = self.ensure_service(&r, &client).await {
            // The sandbox and its files are fine; only its service is not up.
            tracing::warn!(id = %r.id, error = %e, "woke, but the start command is not ready");
        }
        self.lock_agents().insert(r.id.clone(), client);
        // Metered again from zero, on its new cgroup.
        self.restart_meter(&r);
        let (saved, saving) = (r.saved_state.clone(), r.saving.is_some());
        let r = self
            .store
            .modify(&r.id, |r| {
                r.state = SandboxState::Running;
                r.last_used_ms = now_ms();
                // What a hibernation saved is not its state any more.
                r.saved_state = None;
                r.saving = None;
                r.arrival = None;
                Ok(())
            })
            .await?;
        backend.forget_hibernation(&r).await;
        self.forget_saved(&r.id, saved, saving).await;
        self.watch_init(&r);
        let ms = t0.elapsed().as_millis() as u64;
        tracing::info!(id = %r.id, ms, "sandbox woke");
        self.events.publish(
            "sandbox.woken",
            &r.id,
            r.tenant(),
            Some(format!("woke in {ms} ms")),
        );
        Ok((r, ms))
    }

    /// Hibernate running sandboxes that have `idle_hibernate_seconds` and have been idle that
    /// long: no exec, file or PTY call, no client connected (running exec, stream or
    /// terminal) and less than 1 % CPU since then. Only running sandboxes with a policy are
    /// read (an index on the state), not every record.
    pub(super) async fn hibernate_idle(self: &Arc<Self>) {
        let Ok(all) = self.store.idle_candidates().await else {
            return;
        };
        let now = now_ms();
        for mut r in all {
            // Its last use may not be written yet.
            self.refreshes.apply(&mut r);
            let Some(idle) = r.idle_hibernate_seconds else {
                continue;
            };
            if r.state != SandboxState::Running {
                continue;
            }
            let backend = self.backend(r.isolation).ok();
            let cpu = backend
                .as_ref()
                .and_then(|b| b.usage(&r))
                .map(|u| u.cpu_usage_ns)
                .unwrap_or(0);
            let busy_ns_per_sec =
                BUSY_NS_PER_SEC + backend.as_ref().map_or(0, |b| b.idle_cpu_ns_per_sec());
            let busy_at = {
                let mut seen = self.cpu_seen.lock().unwrap_or_else(|p| p.into_inner());
                let (last_cpu, checked_at, busy_at) =
                    seen.entry(r.id.clone()).or_insert((cpu, now, 0));
                let elapsed_ms = u64::try_from(now - *checked_at).unwrap_or(0).max(1);
                let used_ns = cpu.saturating_sub(*last_cpu);
                if self.has_sessions(&r.id)
                    || used_ns.saturating_mul(1000) > busy_ns_per_sec.saturating_mul(elapsed_ms)
                {
                    *busy_at = now;
                }
                (*last_cpu, *checked_at) = (cpu, now);
                *busy_at
            };
            let idle_since = r.last_used().max(busy_at);
            if now - idle_since < (idle as i64) * 1000 {
                continue;
            }
            let _op = self.op_lock(&r.id).await;
            let Ok(fresh) = self.load(&r.id).await else {
                continue;
            };
            if fresh.state != SandboxState::Running || fresh.last_used() > idle_since {
                continue;
            }
            let why = format!("idle for {idle} s");
            if let Err(e) = self.hibernate_locked(fresh, Some(why)).await {
                tracing::error!(id = %r.id, error = %e, "idle hibernation");
            }
        }
    }
}
