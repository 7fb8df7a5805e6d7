//! Creating a sandbox: from a template, or from a snapshot (its files stacked under the new
//! sandbox's upper layer), or as a fork child.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hutch_proto::client::AgentClient;

use super::quota::TenantRecordNeeded;
use super::{blocking, Manager};
use crate::backend::Backend;
use crate::config::MIN_UID_SLOT;
use crate::error::{CoreError, CoreResult};
use crate::ids;
use crate::model::{CreateSandbox, IsolationRequest, SandboxRecord, SandboxState, SandboxView};
use crate::snapshot::{SnapshotDefaults, SnapshotRecord};
use crate::uid_slots::Claim;

/// Largest `disk_mib` (1 TiB): a vm root disk grows online to at most 1024 times its
/// template image's size (ext4's reserved descriptor blocks).
const MAX_DISK_MIB: u64 = 1 << 20;
use crate::tenant::quota::Footprint;
use crate::tenant::settings::TenantRecord;
use crate::tenant::{Tenant, TenantScope};
use crate::time::now_ms;

/// How long a new (or woken) sandbox's agent may take to answer.
const AGENT_READY_TIMEOUT: Duration = Duration::from_secs(30);

impl Manager {
    /// Create and start a sandbox; returns once its agent answers.
    pub async fn create(self: &Arc<Self>, cmd: CreateSandbox) -> CoreResult<SandboxView> {
        self.create_sandbox(cmd, None).await
    }

    /// Create a sandbox, recording `forked_from` for fork children.
    pub(super) async fn create_sandbox(
        self: &Arc<Self>,
        cmd: CreateSandbox,
        forked_from: Option<String>,
    ) -> CoreResult<SandboxView> {
        // A fork's hidden snapshot is only usable by the fork itself.
        let hidden_ok = forked_from.is_some();
        self.create_sandbox_as(cmd, forked_from, hidden_ok).await
    }

    /// Create a sandbox; `hidden_ok`: `cmd.snapshot` may name a hidden snapshot (a fork's,
    /// a build step's).
    pub(super) async fn create_sandbox_as(
        self: &Arc<Self>,
        cmd: CreateSandbox,
        forked_from: Option<String>,
        hidden_ok: bool,
    ) -> CoreResult<SandboxView> {
        let t0 = Instant::now();
        self.check_state_disk("create a sandbox")?;
        let tenant = match &cmd.tenant {
            Some(t) => Some(self.tenant(t).await?),
            None => None,
        };
        let cmd = match &tenant {
            Some(t) => Self::apply_tenant_defaults(&cmd, t),
            None => cmd,
        };
        let source = match &cmd.snapshot {
            Some(sid) => Some(
                self.snapshot_record(&sid.parse()?, &TenantScope::All, hidden_ok)
                    .await?,
            ),
            None => None,
        };
        let mut record = self
            .new_record(&cmd, source.as_ref(), tenant.as_ref())
            .await?;
        record.forked_from = forked_from;
        let backend = self.backend(record.isolation)?;
        backend.admit(&record).await?;
        // A tenant or key over its spending cap makes nothing.
        self.check_budgets(&super::budget::Spender {
            sandbox: None,
            ..super::budget::Spender::of(&record)
        })
        .await?;
        let footprint = Footprint {
            sandboxes: 1,
            cpus: record.cpus,
            memory_mib: record.memory_mib,
            creates: 1,
        };
        let reservation = self
            .admit(
                record.tenant.as_ref(),
                &record.id,
                footprint,
                TenantRecordNeeded::Yes,
            )
            .await?;
        if let Some(key) = self.warm_key(&record) {
            let claimed = self.claim_warm(&key, &record).await;
            self.fill_warm(key);
            if let Some(record) = claimed {
                self.commit(reservation).await;
                self.metrics.observe_create(t0.elapsed().as_secs_f64());
                self.events
                    .publish("sandbox.created", &record.id, record.tenant(), None);
                tracing::info!(id = %record.id, template = %record.template, warm = true, ms = t0.elapsed().as_millis() as u64, "sandbox created");
                return Ok(record.view());
            }
        }
        {
            // A snapshot in use cannot be deleted: check it still exists and insert the
            // sandbox that uses it under one lock.
            let _snapshots = self.lock_snapshots().await;
            if let Some(s) = &source {
                if self.store.get_snapshot(&s.id).await?.is_none() {
                    return Err(CoreError::NotFound(format!(
                        "snapshot {} does not exist",
                        s.id
                    )));
                }
            }
            self.check_volume_exclusive(&record).await?;
            self.insert_with_free_slot(&mut record).await?;
        }
        let rootfs = self.template_rootfs(&record);
        let started = match self.attach_and_mount(record.clone()).await {
            Ok(rec) => match backend.create(&rec, &rootfs).await {
                Ok(s) => Ok((s, rec)),
                Err(e) => {
                    self.detach_network_blocking(&rec).await;
                    Err(e)
                }
            },
            Err(e) => Err(e),
        };
        let started = started.map(|(s, rec)| {
            record.net_slot = rec.net_slot;
            record.network = rec.network;
            s
        });
        let started = match started {
            Ok(s) => s,
            Err(e) => {
                self.metrics.create_failures.fetch_add(1, Ordering::Relaxed);
                let _ = self.store.delete_sandbox(&record.id).await;
                self.release_uid_slot(record.uid_slot);
                self.release_layer(record.layer.as_deref()).await;
                return Err(e);
            }
        };
        crate::crash_points::crash_point(if record.forked_from.is_some() {
            "fork.child_started"
        } else {
            "create.backend_started"
        });
        record.init_pid = Some(started.init_pid);
        record.init_start_time = Some(started.init_start_time);
        if let Some(disk_mib) = started.disk_mib {
            record.disk_mib = disk_mib;
        }
        record.cgroups = started
            .cgroups
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        self.store.update_sandbox(&record).await?;
        let connected = match started.agent {
            Some(client) => Ok(client),
            None => self.connect_agent(backend.as_ref(), &record.id).await,
        };
        let client = match connected {
            Ok(c) => c,
            Err(e) => return Err(self.fail_create(record, e).await),
        };
        if let Err(e) = self.ensure_service(&record, &client).await {
            return Err(self.fail_create(record, e).await);
        }
        self.lock_agents().insert(record.id.clone(), client);
        record.state = SandboxState::Running;
        self.store.update_sandbox(&record).await?;
        self.watch_init(&record);
        self.commit(reservation).await;
        self.metrics.observe_create(t0.elapsed().as_secs_f64());
        self.events
            .publish("sandbox.created", &record.id, record.tenant(), None);
        tracing::info!(id = %record.id, template = %record.template, snapshot = ?record.layer, ms = t0.elapsed().as_millis() as u64, "sandbox created");
        Ok(record.view())
    }

    /// Validate `cmd` (against the template's or the snapshot's defaults, and its tenant's
    /// templates and per-sandbox limits) into a new record in state `starting`.
    async fn new_record(
        &self,
        cmd: &CreateSandbox,
        source: Option<&SnapshotRecord>,
        tenant: Option<&TenantRecord>,
    ) -> CoreResult<SandboxRecord> {
        let (template, rev) = match (source, &cmd.template) {
            (Some(s), Some(t)) if *t != s.template => {
                return Err(CoreError::InvalidArgument(format!(
                    "snapshot {} was taken over template {:?}, not {t:?}: leave template out",
                    s.id, s.template
                )))
            }
            (Some(s), _) => (s.template.clone(), s.template_rev),
            (None, Some(t)) => {
                let reference =
                    hutch_template::TemplateRef::parse(t).map_err(CoreError::InvalidArgument)?;
                let rev = self.templates.resolve(&reference).ok_or_else(|| {
                    CoreError::NotFound(format!(
                        "template {:?} has no tag {:?} (GET /v1/templates/{} lists its tags)",
                        reference.name(),
                        t.split_once(':').map_or("", |(_, tag)| tag),
                        reference.name()
                    ))
                })?;
                (reference.name().to_string(), rev)
            }
            (None, None) => (self.cfg.default_template.clone(), None),
        };
        self.check_template_for(tenant, &template).await?;
        let found = match rev {
            None => self.templates.get(&template),
            Some(rev) => self.templates.get_at(&template, Some(rev)),
        };
        let info = match (found, rev) {
            (Some(info), _) => info,
            (None, Some(rev)) => return Err(CoreError::NotFound(format!(
                "template {template:?} has no revision {rev} (old revisions are kept only while something uses them)"
            ))),
            (None, None) => {
                return Err(CoreError::NotFound(
                    self.unknown_template_message(&template, cmd.tenant.as_ref())
                        .await,
                ))
            }
        };
        if !info.ready {
            return Err(CoreError::Conflict(format!(
                "template {template:?} is not ready"
            )));
        }
        let isolation = match source {
            Some(s) => {
                let explicit = match cmd.isolation {
                    IsolationRequest::Auto => None,
                    IsolationRequest::Ns => Some(crate::model::Isolation::Ns),
                    IsolationRequest::Vm => Some(crate::model::Isolation::Vm),
                };
                if explicit.is_some_and(|i| i != s.isolation) {
                    return Err(CoreError::InvalidArgument(format!(
                        "snapshot {} is a {} snapshot: sandboxes created from it are {} too",
                        s.id,
                        s.isolation.as_str(),
                        s.isolation.as_str()
                    )));
                }
                s.isolation
            }
            // A template's default isolation applies when the request leaves it to us.
            None => {
                self.resolve_isolation(match (cmd.isolation, info.defaults.isolation.as_deref()) {
                    (IsolationRequest::Auto, Some("ns")) => IsolationRequest::Ns,
                    (IsolationRequest::Auto, Some("vm")) => IsolationRequest::Vm,
                    (requested, _) => requested,
                })?
            }
        };
        let defaults = match source {
            Some(s) => s.defaults.clone(),
            None => SnapshotDefaults {
                cpus: info.defaults.cpus,
                memory_mib: info.defaults.memory_mib,
                disk_mib: info.defaults.disk_mib,
                pids_max: info.defaults.pids_max,
                env: info.defaults.env.clone(),
                exec: info.defaults.exec.clone(),
            },
        };
        if let (Some(s), crate::model::Isolation::Vm) = (source, isolation) {
            // A memory snapshot restores into a machine of the same shape.
            let memory = cmd.memory_mib.unwrap_or(defaults.memory_mib);
            let vcpus = crate::model::vcpus;
            if memory != defaults.memory_mib
                || vcpus(cmd.cpus.unwrap_or(defaults.cpus)) != vcpus(defaults.cpus)
            {
                return Err(CoreError::InvalidArgument(format!(
                    "snapshot {} is a vm memory snapshot of a {} MiB, {} vCPU guest: sandboxes created from it have the same memory_mib and the same whole number of cpus",
                    s.id,
                    defaults.memory_mib,
                    vcpus(defaults.cpus)
                )));
            }
        }
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
        let disk_mib = cmd.disk_mib.unwrap_or(defaults.disk_mib);
        if !(1..=MAX_DISK_MIB).contains(&disk_mib) {
            return Err(CoreError::InvalidArgument(format!(
                "disk_mib must be between 1 and {MAX_DISK_MIB} (1 TiB), got {disk_mib}"
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
        if let Some(t) = tenant {
            let quotas = &t.settings.quotas;
            quotas.check_size(&t.name, cpus, memory_mib, disk_mib)?;
            quotas.check_ttl(&t.name, ttl_seconds, cmd.persistent)?;
        }
        let idle_hibernate_seconds = self.check_idle_seconds(cmd.idle_hibernate_seconds)?;
        if cmd.max_cost_micros.is_some() && self.cfg.rate_card.is_none() {
            return Err(CoreError::InvalidArgument(
                "max_cost_micros needs a rate card, and this server has none (hutch serve --rate-card FILE)".into(),
            ));
        }
        let exec_defaults = defaults.exec;
        let mut env = defaults.env;
        env.extend(cmd.env.clone());
        let now = now_ms();
        // An admin's create without a tenant may name any tenant's volumes.
        let volume_scope = cmd
            .tenant
            .as_ref()
            .map_or(TenantScope::All, |t| TenantScope::Only(t.clone()));
        Ok(SandboxRecord {
            id: cmd.id.clone().unwrap_or_else(ids::new_sandbox_id),
            template,
            isolation,
            state: SandboxState::Starting,
            tenant: cmd.tenant.clone(),
            metadata: cmd.metadata.clone(),
            env,
            cpus,
            memory_mib,
            disk_mib,
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
            network: Some(self.requested_policy(cmd.network.as_ref())?),
            layer: source.map(|s| s.id.to_string()),
            snapshot: source.filter(|s| !s.hidden).map(|s| s.id.to_string()),
            forked_from: None,
            idle_hibernate_seconds,
            last_used_ms: now,
            net_slot: None,
            volumes: self
                .resolve_volume_mounts(&cmd.volumes, &volume_scope, isolation)
                .await?,
            start: super::service::start_spec(&info),
            // Old records (and templates built before revisions, rev 0) follow the current one.
            template_rev: (info.rev > 0).then_some(info.rev),
            exec_defaults,
            created_by: cmd.created_by.clone(),
            max_cost_micros: cmd.max_cost_micros,
            saved_state: None,
            saving: None,
            arrival: None,
        })
    }

    /// Give `rec` its network slot and make its volumes ready (blocking host work, on the
    /// blocking pool); returns it with its slot. Nothing is left held on failure.
    pub(super) async fn attach_and_mount(
        self: &Arc<Self>,
        mut rec: SandboxRecord,
    ) -> CoreResult<SandboxRecord> {
        let mgr = self.clone();
        blocking(move || {
            mgr.attach_network(&mut rec)?;
            if let Err(e) = mgr.mount_volumes(&rec) {
                mgr.detach_network(&rec);
                return Err(e);
            }
            Ok(rec)
        })
        .await
    }

    /// [`Manager::detach_network`] on the blocking pool.
    pub(super) async fn detach_network_blocking(self: &Arc<Self>, rec: &SandboxRecord) {
        let (mgr, rec) = (self.clone(), rec.clone());
        let _ = blocking(move || {
            mgr.detach_network(&rec);
            Ok(())
        })
        .await;
    }

    /// `Some(n)` for a positive idle-hibernation delay, `None` for 0 or none; bounded by the
    /// longest TTL.
    pub(super) fn check_idle_seconds(&self, secs: Option<u64>) -> CoreResult<Option<u64>> {
        match secs {
            None | Some(0) => Ok(None),
            Some(s) if s <= self.cfg.max_ttl_seconds => Ok(Some(s)),
            Some(s) => Err(CoreError::InvalidArgument(format!(
                "idle_hibernate_seconds must be between 0 (never) and {}, got {s}",
                self.cfg.max_ttl_seconds
            ))),
        }
    }

    /// Connect to a freshly started agent and check its protocol version. The listening
    /// socket exists before the agent runs, so connecting cannot race it; `info` returns once
    /// the agent serves.
    pub(super) async fn connect_agent(
        &self,
        backend: &dyn Backend,
        id: &str,
    ) -> CoreResult<AgentClient> {
        let ready = async {
            let client = AgentClient::connect_unix(&backend.agent_socket(id))
                .await
                .map_err(CoreError::from)?;
            let info = client.info().await.map_err(CoreError::from)?;
            if info.protocol_version != hutch_proto::PROTOCOL_VERSION {
                return Err(CoreError::SandboxFailed(format!(
                    "agent speaks protocol {} but the server speaks {}",
                    info.protocol_version,
                    hutch_proto::PROTOCOL_VERSION
                )));
            }
            Ok(client)
        };
        match tokio::time::timeout(AGENT_READY_TIMEOUT, ready).await {
            Ok(r) => r,
            Err(_) => Err(CoreError::SandboxFailed(format!(
                "the agent did not answer within {} s",
                AGENT_READY_TIMEOUT.as_secs()
            ))),
        }
    }

    async fn fail_create(&self, record: SandboxRecord, e: CoreError) -> CoreError {
        self.metrics.create_failures.fetch_add(1, Ordering::Relaxed);
        let destroyed = self.destroy_resources(&record).await;
        let _ = self.store.delete_sandbox(&record.id).await;
        if destroyed.is_ok() {
            self.release_uid_slot(record.uid_slot);
        }
        self.release_layer(record.layer.as_deref()).await;
        e
    }

    /// Give `record` a uid slot free on the whole host and insert it: the slot is claimed
    /// host-wide (`uid_slots.rs`) and the record inserted under one host-wide lock, so no
    /// other server sees the claim without the record. Small slot spaces are tried in full
    /// (from a random start); the full one at 64 random slots.
    pub(super) async fn insert_with_free_slot(&self, record: &mut SandboxRecord) -> CoreResult<()> {
        let claims = self.uid_slots.lock()?;
        for slot in self.uid_slot_candidates() {
            if claims.claim(slot)? == Claim::Taken {
                continue;
            }
            record.uid_slot = slot;
            match self.store.insert_sandbox(record).await {
                Ok(()) => return Ok(()),
                // A record of this server holds it: the claim just made is right as it is.
                Err(CoreError::Conflict(_)) => continue,
                Err(e) => {
                    claims.release(slot)?;
                    return Err(e);
                }
            }
        }
        Err(self.no_free_uid_slot())
    }

    /// The uid slots to try for a new sandbox, in order: small slot spaces in full (from a
    /// random start), the full one at 64 random slots.
    pub(super) fn uid_slot_candidates(&self) -> Vec<u32> {
        let slots = self.cfg.uid_slots;
        let start = ids::random_u32() % slots;
        let offsets: Vec<u32> = if slots <= 256 {
            (0..slots).map(|i| (start + i) % slots).collect()
        } else {
            (0..64).map(|_| ids::random_u32() % slots).collect()
        };
        offsets.into_iter().map(|o| MIN_UID_SLOT + o).collect()
    }

    /// The error when no candidate slot was free.
    pub(super) fn no_free_uid_slot(&self) -> CoreError {
        CoreError::Quota(format!(
            "no free uid range for a new sandbox (this host's {} uid slots are in use)",
            self.cfg.uid_slots
        ))
    }
}

impl Manager {
    /// What a create naming a template this server does not have is told: the templates it
    /// has, and how to get one (a built-in recipe is built on the server's host; anything
    /// else is made by setting up a sandbox and snapshotting it).
    /// Only the templates `viewer` sees are named (`None`: an admin's create, every one).
    pub(super) async fn unknown_template_message(
        &self,
        name: &str,
        viewer: Option<&Tenant>,
    ) -> String {
        let scope = viewer.map_or(TenantScope::All, |t| TenantScope::Only(t.clone()));
        let templates = self.visible_templates(&scope).await.unwrap_or_default();
        let ready: Vec<&str> = templates
            .iter()
            .filter(|t| t.info.ready)
            .map(|t| t.info.name.as_str())
            .collect();
        let have = if ready.is_empty() {
            "this server has no ready template".to_string()
        } else {
            format!("templates on this server: {}", ready.join(", "))
        };
        let builtins = hutch_template::builtin_names();
        let how = if builtins.contains(&name) {
            format!("{name} is a built-in recipe: build it on the server's host with `hutch template build {name}`")
        } else {
            format!(
                "built-in recipes ({}) are built on the server's host with `hutch template build NAME`; for an environment of your own, set up a sandbox, snapshot it (`hutch snapshot ID --name NAME`) and create from it with `--snapshot NAME`",
                builtins.join(", ")
            )
        };
        format!("template {name:?} does not exist ({have}); {how}")
    }
}
