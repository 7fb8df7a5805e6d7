//! Fork (N children of a sandbox) and explore (one child per candidate command, keep the
//! best).
//!
//! A disk fork takes one hidden snapshot of the parent (frozen meanwhile when it runs) and
//! creates every child from it in parallel: each child stacks the snapshot's files under its
//! own empty upper layer, so children share unchanged files and never see each other's
//! writes. The hidden snapshot goes when its last child does.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use super::quota::TenantRecordNeeded;
use super::reconcile::ForkIntent;
use super::{wrong_state, Manager};
use crate::error::{CoreError, CoreResult};
use crate::exec::ExecCommand;
use crate::fork::{
    best, ExploreCommand, ExploreResult, ForkCommand, ForkMode, Outcome, EXPLORE_OUTPUT_CAP,
};
use crate::ids::SandboxId;
use crate::model::{CreateSandbox, IsolationRequest, SandboxRecord, SandboxView};
use crate::snapshot::SnapshotRecord;
use crate::tenant::quota::Footprint;

/// Extra time an explore waits for a command beyond its timeout before giving up on it.
const EXPLORE_GRACE: Duration = Duration::from_secs(10);

impl Manager {
    /// Create `cmd.count` children of sandbox `id`.
    pub async fn fork(
        self: &Arc<Self>,
        id: &SandboxId,
        cmd: ForkCommand,
    ) -> CoreResult<Vec<SandboxView>> {
        let (children, intent) = self.fork_recorded(id, cmd).await?;
        intent.finish();
        Ok(children)
    }

    /// [`Manager::fork`], with the record of its intent still held: until the caller
    /// finishes it, a crash destroys the children at the next start (`reconcile.rs`).
    async fn fork_recorded(
        self: &Arc<Self>,
        id: &SandboxId,
        cmd: ForkCommand,
    ) -> CoreResult<(Vec<SandboxView>, ForkIntent)> {
        let parent = self.touch(id).await?;
        let backend = self.backend(parent.isolation)?;
        if cmd.mode == ForkMode::Live && !backend.capabilities().live_fork {
            return Err(CoreError::InvalidArgument(format!(
                "live fork needs the vm backend; sandbox {id} runs on {}: use \"mode\": \"disk\" (files only, fresh processes)",
                parent.isolation.as_str()
            )));
        }
        let wanted = u64::from(cmd.count) * parent.memory_mib;
        if wanted > self.cfg.max_memory_mib {
            return Err(CoreError::Quota(format!(
                "{} children of {} MiB each need {wanted} MiB, more than this host's {} MiB",
                cmd.count, parent.memory_mib, self.cfg.max_memory_mib
            )));
        }
        // All the children must fit the tenant's quotas: refused before anything is made
        // (each child is admitted again as it is created, so concurrent forks never
        // overshoot together).
        let n = u64::from(cmd.count);
        drop(
            self.admit(
                parent.tenant.as_ref(),
                &SandboxId::random(),
                Footprint {
                    sandboxes: n,
                    cpus: parent.cpus * f64::from(cmd.count),
                    memory_mib: parent.memory_mib * n,
                    creates: n,
                },
                TenantRecordNeeded::Yes,
            )
            .await?,
        );
        let t0 = std::time::Instant::now();
        let snap = {
            let _op = self.op_lock(id).await;
            let parent = self.load(id).await?;
            if !parent.state.can_snapshot() {
                return Err(wrong_state(&parent, Some("fork")));
            }
            self.check_state_disk("fork a sandbox")?;
            self.take_snapshot(&parent, Some(&format!("fork-of-{id}")), true)
                .await?
        };
        let snapshot_ms = t0.elapsed().as_millis() as u64;
        crate::crash_points::crash_point("fork.snapshot_taken");
        let intent = match self.record_fork_intent(&snap.id) {
            Ok(i) => i,
            Err(e) => {
                self.release_layer(Some(&snap.id)).await;
                return Err(e);
            }
        };
        let created = join_all(
            (0..cmd.count)
                .map(|_| self.create_sandbox(child_command(&parent, &snap), Some(id.to_string()))),
        )
        .await;
        crate::crash_points::crash_point("fork.children_created");
        let mut children = Vec::new();
        let mut failure = None;
        for c in created {
            match c {
                Ok(v) => children.push(v),
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        if let Some(e) = failure {
            for c in &children {
                if let Err(k) = self.kill(&c.id).await {
                    tracing::error!(id = %c.id, error = %k, "removing a child of a failed fork");
                }
            }
            self.release_layer(Some(&snap.id)).await;
            intent.finish();
            return Err(e);
        }
        // No child: nothing holds the snapshot (a concurrent kill of every child).
        self.release_layer(Some(&snap.id)).await;
        tracing::info!(
            parent = %id,
            count = children.len(),
            snapshot = %snap.id,
            snapshot_ms,
            ms = t0.elapsed().as_millis() as u64,
            "forked"
        );
        Ok((children, intent))
    }

    /// Run each command in its own disk fork of sandbox `id`, score the outcomes, keep the
    /// best child and destroy the others.
    pub async fn explore(
        self: &Arc<Self>,
        id: &SandboxId,
        cmd: ExploreCommand,
    ) -> CoreResult<ExploreResult> {
        let count = u32::try_from(cmd.commands.len()).unwrap_or(u32::MAX);
        let (children, intent) = self
            .fork_recorded(id, ForkCommand::new(count, ForkMode::Disk)?)
            .await?;
        let runs = children.iter().zip(&cmd.commands).map(|(child, command)| {
            let exec = ExecCommand {
                cmd: command.clone(),
                env: BTreeMap::new(),
                cwd: None,
                user: None,
                stdin: None,
                timeout: Some(cmd.timeout),
                background: false,
            };
            let limit = cmd.timeout + EXPLORE_GRACE;
            async move {
                tokio::time::timeout(limit, self.exec_capped(&child.id, exec, EXPLORE_OUTPUT_CAP))
                    .await
            }
        });
        let results = join_all(runs).await;
        crate::crash_points::crash_point("explore.commands_run");
        let mut outcomes: Vec<Outcome> = results
            .into_iter()
            .zip(&children)
            .enumerate()
            .map(|(index, (result, child))| {
                let mut o = Outcome {
                    index,
                    sandbox_id: child.id.clone(),
                    exit_code: None,
                    timed_out: false,
                    stdout: String::new(),
                    stderr: String::new(),
                    stdout_truncated: false,
                    stderr_truncated: false,
                    duration_ms: 0,
                    score: 0.0,
                    kept: false,
                    error: None,
                };
                match result {
                    Ok(Ok(out)) => {
                        o.exit_code = Some(out.exit_code);
                        o.timed_out = out.timed_out;
                        o.stdout = String::from_utf8_lossy(&out.stdout.to_vec()).into_owned();
                        o.stderr = String::from_utf8_lossy(&out.stderr.to_vec()).into_owned();
                        o.stdout_truncated = out.stdout_truncated;
                        o.stderr_truncated = out.stderr_truncated;
                        o.duration_ms = out.duration_ms;
                    }
                    Ok(Err(e)) => o.error = Some(e.to_string()),
                    Err(_) => {
                        o.timed_out = true;
                        o.error = Some("the command did not finish in time".into());
                    }
                }
                o.score = cmd.score(o.exit_code, &o.stdout);
                o
            })
            .collect();
        let scores: Vec<f64> = outcomes.iter().map(|o| o.score).collect();
        let Some(winner) = best(&scores) else {
            intent.finish();
            return Err(CoreError::Internal("explore ran no command".into()));
        };
        let losers = outcomes
            .iter()
            .filter(|o| o.index != winner)
            .map(|o| self.kill(&o.sandbox_id));
        for (o, killed) in outcomes
            .iter()
            .filter(|o| o.index != winner)
            .zip(join_all(losers).await)
        {
            if let Err(e) = killed {
                tracing::error!(id = %o.sandbox_id, error = %e, "removing a losing explore child");
            }
        }
        // The winner is the client's from here on.
        intent.finish();
        outcomes[winner].kept = true;
        tracing::info!(parent = %id, winner, score = outcomes[winner].score, "explored");
        Ok(ExploreResult {
            winner: outcomes[winner].clone(),
            outcomes,
        })
    }
}

/// The create command of one child: the parent's settings over the fork's snapshot.
fn child_command(parent: &SandboxRecord, snap: &SnapshotRecord) -> CreateSandbox {
    CreateSandbox {
        template: None,
        isolation: IsolationRequest::Auto,
        ttl_seconds: Some(parent.ttl_seconds),
        persistent: parent.persistent,
        tenant: parent.tenant.clone(),
        metadata: parent.metadata.clone(),
        env: BTreeMap::new(),
        cpus: None,
        memory_mib: None,
        disk_mib: None,
        pids_max: None,
        network: parent.network.as_ref().map(|n| n.policy.to_spec()),
        snapshot: Some(snap.id.to_string()),
        idle_hibernate_seconds: parent.idle_hibernate_seconds,
        // Read-only volumes are shared with the children; a read-write one stays the
        // parent's alone.
        volumes: parent
            .volumes
            .iter()
            .filter(|m| m.read_only)
            .cloned()
            .collect(),
        // Children spend for the parent's key, each with the parent's own cap.
        created_by: parent.created_by.clone(),
        max_cost_micros: parent.max_cost_micros,
        id: None,
    }
}
