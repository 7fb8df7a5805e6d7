//! What happens to sandboxes without a request: re-adoption after a server restart, the
//! death watcher of every init, and the TTL reaper.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Manager;
use crate::backend::{Backend, Hibernation};
use crate::error::CoreResult;
use crate::model::{SandboxRecord, SandboxState};
use crate::time::now_ms;

impl Manager {
    /// Re-adopt sandboxes that survived a server restart; mark the dead ones failed. Paused
    /// sandboxes stay paused and running ones run (a snapshot or pause the restart
    /// interrupted may have left them frozen: [`Backend::adopt`]); hibernated ones stay
    /// hibernated after removing whatever a wake interrupted by the restart left running,
    /// unless what a wake needs is gone (`failed`, with the reason) or their hibernation
    /// never saved anything and they still run (`running` again).
    pub async fn readopt(self: &Arc<Self>) -> CoreResult<()> {
        self.drain_warm().await;
        for r in self.store.all_sandboxes().await? {
            if r.state == SandboxState::Lost {
                self.stop_lost(&r).await;
                continue;
            }
            if r.state != SandboxState::Hibernated && !r.state.holds_resources() {
                continue;
            }
            let backend = self.backend(r.isolation)?;
            let r = if r.state == SandboxState::Hibernated {
                match self.recover_hibernated(&backend, r).await {
                    Some(running) => running,
                    None => continue,
                }
            } else {
                r
            };
            if r.state == SandboxState::Starting {
                self.forget_interrupted_create(r).await;
                continue;
            }
            if backend.alive(&r) {
                if r.net_slot.is_some() && self.readopt_network(&r, true).is_none() {
                    let _ = self
                        .store
                        .modify(&r.id, |rec| {
                            rec.net_slot = None;
                            Ok(())
                        })
                        .await;
                }
                tracing::info!(id = %r.id, state = r.state.as_str(), "re-adopted sandbox");
                if let Err(e) = backend.adopt(&r).await {
                    tracing::error!(id = %r.id, error = %e, "bringing a re-adopted sandbox back to its recorded state");
                }
                self.watch_init(&r);
            } else {
                self.mark_failed(r, "the sandbox stopped while the server was down".into())
                    .await;
            }
        }
        Ok(())
    }

    /// Stop what this server still runs of the sandboxes the cluster declared lost: their
    /// node (this one) was declared dead while it ran on cut off from the cluster's
    /// database, and their state moved to `lost` (`docs/cluster.md`). Called when this node
    /// learns it was fenced, before it registers again, so that no sandbox runs twice. Their
    /// records stay, in state `lost`, until a client deletes them. Returns how many there were.
    pub async fn stop_lost_sandboxes(&self) -> CoreResult<usize> {
        let mut n = 0;
        for r in self.store.all_sandboxes().await? {
            if r.state == SandboxState::Lost {
                self.stop_lost(&r).await;
                n += 1;
            }
        }
        Ok(n)
    }

    /// Kill lost sandbox `r`'s processes and release what it held on this host (its record
    /// is the cluster's and is not written).
    async fn stop_lost(&self, r: &SandboxRecord) {
        self.lock_agents().remove(&r.id);
        self.refreshes.forget(&r.id);
        match self.destroy_resources(r).await {
            Ok(()) => tracing::warn!(id = %r.id, "stopped a sandbox the cluster declared lost"),
            Err(e) => {
                tracing::error!(id = %r.id, error = %e, "stopping a sandbox the cluster declared lost")
            }
        }
    }

    /// What to do with hibernated record `r` at start ([`Backend::recover_hibernated`]):
    /// `None` when it stays hibernated or is failed now, its record back in state `running`
    /// when it never stopped.
    async fn recover_hibernated(
        &self,
        backend: &Arc<dyn Backend>,
        r: SandboxRecord,
    ) -> Option<SandboxRecord> {
        match backend.recover_hibernated(&r).await {
            Hibernation::Kept => None,
            Hibernation::Lost(reason) => {
                self.mark_failed(r, reason).await;
                None
            }
            Hibernation::StillRunning => {
                tracing::warn!(id = %r.id, "its hibernation was interrupted before anything was saved: running again");
                self.store
                    .modify(&r.id, |rec| {
                        rec.state = SandboxState::Running;
                        Ok(())
                    })
                    .await
                    .map_err(|e| tracing::error!(id = %r.id, error = %e, "saving a sandbox running again"))
                    .ok()
            }
        }
    }

    /// A create the server never answered (its record still `starting` at start): no client
    /// has its id, so whatever it made goes and so does its record.
    async fn forget_interrupted_create(&self, r: SandboxRecord) {
        tracing::warn!(id = %r.id, isolation = r.isolation.as_str(), "removing a create no client got an answer from (interrupted by the restart)");
        match self.remove(r, None).await {
            Ok(()) => {
                self.metrics
                    .reconciled
                    .interrupted_creates
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::error!(error = %e, "removing an interrupted create"),
        }
    }

    /// Record a death: state `failed` with a reason, host resources released.
    pub(super) async fn mark_failed(&self, r: SandboxRecord, reason: String) {
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
    pub(super) fn watch_init(self: &Arc<Self>, r: &SandboxRecord) {
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
            let reason = if backend.init_oom_killed(&rec) {
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
                match self.remove(r, Some("sandbox.expired")).await {
                    Ok(()) => {
                        self.metrics.expired.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(%id, "sandbox expired");
                    }
                    Err(e) => tracing::error!(%id, error = %e, "reaping an expired sandbox"),
                }
            }
        }
    }
}
