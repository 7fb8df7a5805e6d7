//! The `ns` backend: the namespace jail of `hutch-jail`, built by the `hutch __jail-spawn`
//! helper (the jail forks, and the server is multi-threaded, so the fork happens in a fresh
//! single-threaded process).
//!
//! Lifecycle on `ns`: pause is the cgroup freezer; hibernate stops every process and keeps the
//! upper layer (`hutch_jail::stop`), wake spawns the jail again over it; a snapshot is the
//! upper layer exported as a 0-based read-only layer (`hutch_jail::export_layer`, the sandbox
//! frozen meanwhile), which sandboxes created from it stack under their own upper layer.
//!
//! Disk quota: the upper layer (and the overlay's work directory) of a sandbox lives in its own
//! subvolume of one loop-mounted btrfs image (`<state>/layers.btrfs` at `<state>/layers/`),
//! limited to the sandbox's `disk_mib` with a qgroup ([`hutch_jail::btrfs`]). Without btrfs or
//! `mkfs.btrfs` (logged once), uppers stay in `<sandbox_dir>/upper` with no limit; so do the
//! uppers of sandboxes created before the image existed.
//!
//! Every operation blocks (mounts, the helper's fork, waiting for cgroups to empty): the
//! [`Backend`] methods run the synchronous [`NsJails`] on the blocking pool.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use hutch_jail::{JailSpec, LayerExport, Limits, SpawnedJail, Teardown};

use super::{
    blocking, Backend, Capabilities, Hibernation, SnapshotTaken, Started, Usage, VolumeAccess,
};
use crate::config::Config;
use crate::error::{CoreError, CoreResult};
use crate::model::{Isolation, SandboxRecord, SandboxState};
use crate::snapshot::SnapshotKind;

/// Size of every sandbox's uid/gid range.
pub const UID_RANGE: u32 = 65_536;
/// Longest unix socket path the kernel accepts (sun_path minus the NUL).
const MAX_SOCKET_PATH: usize = 107;
/// Where a snapshot's files are, inside its directory.
const SNAPSHOT_LAYER: &str = "upper";

/// The files (a 0-based layer) of the `ns` snapshot stored in `dir`.
pub fn snapshot_layer(dir: &Path) -> PathBuf {
    dir.join(SNAPSHOT_LAYER)
}

/// Whether `disk_mib` is enforced on `ns` sandboxes (the btrfs disk pool), once known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskQuota {
    /// Every `ns` sandbox's writable layer is a subvolume limited to its `disk_mib`.
    Enforced {
        /// Size of the pool's filesystem, in MiB: no sandbox can use more; the sum of
        /// `disk_mib` over sandboxes may be larger (thin provisioning).
        pool_mib: u64,
    },
    /// No limit on `ns` sandboxes' disk use, and why.
    Off {
        /// The reason (logged once at setup).
        why: String,
    },
}

/// The namespace backend: a cheap handle on [`NsJails`].
#[derive(Clone)]
pub struct NsBackend {
    jails: Arc<NsJails>,
}

/// The synchronous side of the namespace backend: every method blocks.
pub struct NsJails {
    cfg: Config,
    network: Option<hutch_net::Network>,
    /// The disk pool: `None` until first needed, then whether (and how big) it is.
    pool: Mutex<Option<DiskQuota>>,
}

impl NsBackend {
    /// A backend using `cfg`'s paths. A disk pool an earlier server made is mounted again
    /// now, before sandboxes are re-adopted (blocking).
    pub fn new(cfg: Config, network: Option<hutch_net::Network>) -> Self {
        let jails = NsJails {
            cfg,
            network,
            pool: Mutex::new(None),
        };
        if jails.cfg.disk_pool_image().exists() {
            jails.pool();
        }
        Self {
            jails: Arc::new(jails),
        }
    }

    /// Run `f` on the jails on the blocking pool, with its own copy of `record`.
    async fn run<T: Send + 'static>(
        &self,
        record: &SandboxRecord,
        f: impl FnOnce(&NsJails, &SandboxRecord) -> CoreResult<T> + Send + 'static,
    ) -> CoreResult<T> {
        let (jails, record) = (self.jails.clone(), record.clone());
        blocking(move || f(&jails, &record)).await
    }
}

/// How many times shutdown tries to unmount a busy ns disk pool, 100 ms apart.
const POOL_UNMOUNT_TRIES: u32 = 20;

impl NsJails {
    /// The mounted disk pool, set up on first use (`None`: not available, no disk limit).
    fn pool(&self) -> Option<PathBuf> {
        matches!(self.disk_quota(), DiskQuota::Enforced { .. }).then(|| self.cfg.disk_pool_dir())
    }

    /// Whether `disk_mib` is enforced on `ns`, setting the disk pool up on first use
    /// (blocking: may run `mkfs.btrfs` once).
    pub fn disk_quota(&self) -> DiskQuota {
        let mut state = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        state.get_or_insert_with(|| self.setup_pool()).clone()
    }

    /// What [`NsBackend::disk_quota`] found, if the pool was set up already.
    pub fn disk_quota_known(&self) -> Option<DiskQuota> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn setup_pool(&self) -> DiskQuota {
        let image = self.cfg.disk_pool_image();
        let off = |why: String| {
            tracing::warn!(%why, "no ns disk pool: disk_mib is not enforced on ns sandboxes");
            DiskQuota::Off { why }
        };
        let size = match self.cfg.ns_disk_pool_bytes {
            Some(0) => {
                let why = "the ns disk pool is disabled (--ns-disk-pool-gib 0)".to_string();
                tracing::info!("{why}: disk_mib is not enforced on ns");
                return DiskQuota::Off { why };
            }
            asked => {
                // A new pool is allocated on the state disk: it must leave the reserve.
                let Some((free, total)) = crate::state_disk::space(&self.cfg.state_dir) else {
                    return off(format!(
                        "cannot read the free space of {}",
                        self.cfg.state_dir.display()
                    ));
                };
                let size =
                    asked.unwrap_or_else(|| crate::state_disk::default_pool_bytes(free, total));
                if !image.exists() {
                    if let Some(why) = crate::state_disk::pool_does_not_fit(size, free, total) {
                        return off(why);
                    }
                }
                size
            }
        };
        let dir = self.cfg.disk_pool_dir();
        match hutch_jail::btrfs::setup_pool(&image, &dir, size) {
            Ok(not_allocated) => {
                if let Some(e) = not_allocated {
                    tracing::error!(image = %image.display(), error = %e, "the ns disk pool (made sparse by an earlier version) could not be allocated: if the state disk fills, sandboxes' writes can be lost; free disk space and restart the server");
                }
                // An image an earlier server made keeps its size: ask the filesystem.
                let bytes = hutch_jail::btrfs::fs_size(&dir).unwrap_or(size);
                tracing::info!(image = %image.display(), size = bytes, "ns disk pool ready (btrfs qgroups, allocated)");
                DiskQuota::Enforced {
                    pool_mib: bytes >> 20,
                }
            }
            Err(e) => off(e.to_string()),
        }
    }

    /// Unmount the disk pool if no sandbox has files in it (nothing to re-adopt).
    pub fn release_pool(&self) {
        let state = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if !matches!(*state, Some(DiskQuota::Enforced { .. })) {
            return;
        }
        let dir = self.cfg.disk_pool_dir();
        let empty = std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_none());
        if !empty {
            return;
        }
        // The last sandboxes destroyed just before a shutdown can keep the pool busy for a
        // moment after their processes are gone (the kernel drops their mount namespaces
        // asynchronously): try again for up to two seconds before leaving it mounted.
        let mut tries = 0;
        while let Err(e) = hutch_jail::volume::unmount_image(&dir) {
            tries += 1;
            if tries >= POOL_UNMOUNT_TRIES {
                tracing::warn!(error = %e, "unmounting the ns disk pool");
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// The directory holding `r`'s upper and work directories when not its sandbox directory.
    fn upper_dir(&self, r: &SandboxRecord) -> Option<PathBuf> {
        if self.cfg.sandbox_dir(&r.id).join("upper").exists() {
            return None;
        }
        let dir = self.pool()?.join(r.id.as_str());
        dir.exists().then_some(dir)
    }

    /// `r`'s upper layer.
    fn upper(&self, r: &SandboxRecord) -> PathBuf {
        match self.upper_dir(r) {
            Some(d) => d.join("upper"),
            None => self.cfg.sandbox_dir(&r.id).join("upper"),
        }
    }

    /// Make `r`'s subvolume (kept if it exists) with its limit; whether it was made now.
    fn prepare_upper(&self, r: &SandboxRecord) -> CoreResult<bool> {
        if self.cfg.sandbox_dir(&r.id).join("upper").exists() {
            return Ok(false);
        }
        let Some(pool) = self.pool() else {
            return Ok(false);
        };
        let fresh = !pool.join(r.id.as_str()).exists();
        hutch_jail::btrfs::create_subvolume(&pool, &r.id, r.disk_mib.saturating_mul(1 << 20))
            .map_err(CoreError::from)?;
        Ok(fresh)
    }

    /// Delete sandbox `id`'s subvolume of the disk pool, when there is a pool.
    fn delete_upper(&self, id: &str) -> CoreResult<()> {
        let enforced = matches!(self.disk_quota_known(), Some(DiskQuota::Enforced { .. }));
        if enforced {
            hutch_jail::btrfs::delete_subvolume(&self.cfg.disk_pool_dir(), id)
                .map_err(CoreError::from)?;
        }
        Ok(())
    }

    /// The volumes to bind (their filesystems are mounted by the manager first).
    fn volume_binds(&self, r: &SandboxRecord) -> Vec<hutch_jail::VolumeBind> {
        r.volumes
            .iter()
            .map(|m| hutch_jail::VolumeBind {
                source: self.cfg.volume_dir(&m.volume).join("mnt"),
                target: m.path.clone(),
                read_only: m.read_only,
            })
            .collect()
    }

    /// The namespace to join and the `resolv.conf` to bind, for a sandbox holding a slot.
    fn network_files(&self, r: &SandboxRecord) -> (Option<PathBuf>, Option<PathBuf>) {
        let (Some(net), Some(index)) = (&self.network, r.net_slot) else {
            return (None, None);
        };
        let Some(netns) = net.netns_path(index, &r.id) else {
            return (None, None);
        };
        let dir = self.cfg.state_dir.join("net");
        let file = dir.join(format!("resolv-{index}.conf"));
        let written = std::fs::create_dir_all(&dir).and_then(|()| {
            let text = net.resolv_conf(index).unwrap_or_default();
            if std::fs::read_to_string(&file).ok().as_deref() != Some(text.as_str()) {
                std::fs::write(&file, text)?;
            }
            Ok(())
        });
        match written {
            Ok(()) => (Some(netns), Some(file)),
            Err(e) => {
                tracing::warn!(id = %r.id, error = %e, "writing resolv.conf");
                (Some(netns), None)
            }
        }
    }

    fn spec(&self, r: &SandboxRecord, rootfs: &Path) -> JailSpec {
        let mut env: Vec<(String, String)> = vec![
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("HUTCH_SANDBOX_ID".into(), r.id.to_string()),
            ("LANG".into(), "C.UTF-8".into()),
        ];
        env.extend(r.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let memory_bytes = r.memory_mib << 20;
        let (netns, resolv_conf) = self.network_files(r);
        JailSpec {
            id: r.id.to_string(),
            template_rootfs: rootfs.to_path_buf(),
            sandbox_dir: self.cfg.sandbox_dir(&r.id),
            uid_base: r.uid_slot * UID_RANGE,
            uid_count: UID_RANGE,
            agent_binary: self.cfg.agent_binary.clone(),
            agent_args: vec![
                "serve".into(),
                "--listen-fd".into(),
                hutch_proto::AGENT_LISTEN_FD.to_string(),
            ],
            agent_socket: self.agent_socket(&r.id),
            layers: r.layer.iter().map(|s| self.layer_dir(s)).collect(),
            hostname: r.id.replace('_', "-"),
            env,
            limits: Limits {
                memory_bytes,
                cpu_millis: (r.cpus * 1000.0).round() as u32,
                pids_max: r.pids_max,
                tmp_bytes: memory_bytes,
            },
            cgroup_parent: self.cfg.cgroup_parent.clone(),
            netns,
            resolv_conf,
            volumes: self.volume_binds(r),
            upper_dir: self.upper_dir(r),
        }
    }

    /// The read-only layer of snapshot `id`.
    fn layer_dir(&self, id: &str) -> PathBuf {
        self.cfg.snapshot_dir(id).join(SNAPSHOT_LAYER)
    }

    fn teardown(&self, r: &SandboxRecord) -> Teardown {
        Teardown {
            id: r.id.to_string(),
            sandbox_dir: self.cfg.sandbox_dir(&r.id),
            init_pid: r.init_pid,
            init_start_time: r.init_start_time,
            cgroups: r.cgroups.iter().map(PathBuf::from).collect(),
            cgroup_parent: self.cfg.cgroup_parent.clone(),
        }
    }

    /// Run the jail helper for `record`.
    fn spawn(&self, record: &SandboxRecord, rootfs: &Path) -> CoreResult<Started> {
        let spec = self.spec(record, rootfs);
        if spec.agent_socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(CoreError::Internal(format!(
                "agent socket path {} is longer than {MAX_SOCKET_PATH} bytes: use a shorter --state-dir",
                spec.agent_socket.display()
            )));
        }
        let input = serde_json::to_vec(&spec).map_err(CoreError::Encode)?;
        let step = || format!("starting sandbox {} (the jail helper)", record.id);
        let out = hutch_host_command::run(
            Command::new(&self.cfg.hutch_exe).arg("__jail-spawn"),
            Some(&input),
        )
        .map_err(|source| match source {
            hutch_host_command::HostCommandError::TimedOut { .. } => CoreError::HostTimeout {
                step: step(),
                source,
            },
            other => CoreError::SandboxFailed(format!("{}: {other}", step())),
        })?;
        let parsed: Result<SpawnedJail, _> = serde_json::from_slice(&out.stdout);
        match parsed {
            Ok(s) if out.success() => Ok(Started {
                agent: None,
                init_pid: s.init_pid,
                init_start_time: s.init_start_time,
                cgroups: s.cgroups,
                disk_mib: None,
                service_ready: false,
            }),
            _ => Err(CoreError::SandboxFailed(helper_failure(&out))),
        }
    }
}

/// Why the jail helper gave no jail, in words: its own error when it wrote one, else how it
/// ended (a signal, an exit status) with whatever it wrote. Never empty.
fn helper_failure(out: &hutch_host_command::Finished) -> String {
    if let Some(msg) = serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(String::from))
        .filter(|m| !m.trim().is_empty())
    {
        return msg;
    }
    let said: Vec<String> = [&out.stdout, &out.stderr]
        .iter()
        .map(|b| String::from_utf8_lossy(b).trim().to_string())
        .filter(|t| !t.is_empty())
        .collect();
    let how = if out.success() {
        "exited without describing the jail it made".to_string()
    } else {
        out.how()
    };
    if said.is_empty() {
        format!("the jail helper {how} before the sandbox started")
    } else {
        format!(
            "the jail helper {how} before the sandbox started: {}",
            said.join(" ")
        )
    }
}

impl NsJails {
    fn create(&self, record: &SandboxRecord, rootfs: &Path) -> CoreResult<Started> {
        self.start(record, rootfs, false)
    }

    /// Run the jail helper over the sandbox's upper layer (`waking`: the one it kept). On
    /// failure whatever the helper made goes (an init, its cgroups and mounts, the sandbox
    /// directory; a woken sandbox keeps its upper layer), so nothing pins the disk pool.
    fn start(&self, record: &SandboxRecord, rootfs: &Path, waking: bool) -> CoreResult<Started> {
        let fresh = self.prepare_upper(record)?;
        let started = self.spawn(record, rootfs);
        if started.is_err() {
            let teardown = self.teardown(record);
            let cleaned = if waking {
                hutch_jail::stop(&teardown)
            } else {
                hutch_jail::destroy(&teardown)
            };
            if let Err(e) = cleaned {
                tracing::error!(id = %record.id, error = %e, "removing what a failed jail helper made");
            }
            if fresh {
                if let Err(e) = self.delete_upper(&record.id) {
                    tracing::warn!(id = %record.id, error = %e, "deleting the subvolume of a failed create");
                }
            }
        }
        started
    }

    fn destroy(&self, record: &SandboxRecord) -> CoreResult<()> {
        hutch_jail::destroy(&self.teardown(record)).map_err(CoreError::from)?;
        self.delete_upper(&record.id)
    }

    fn agent_socket(&self, id: &str) -> PathBuf {
        self.cfg.sandbox_dir(id).join("agent.sock")
    }

    fn hibernate(&self, r: &SandboxRecord) -> CoreResult<()> {
        hutch_jail::stop(&self.teardown(r)).map_err(CoreError::from)
    }

    fn wake(&self, r: &SandboxRecord, rootfs: &Path) -> CoreResult<Started> {
        // Whatever an interrupted wake left (a process, mounts) goes first; the upper stays.
        self.hibernate(r)?;
        // Never a wake onto an empty layer: its files must be where it left them.
        self.kept_files(r)?;
        self.start(r, rootfs, true)
    }

    /// `Ok` when the upper layer `r` ran with is there to run on again (its sandbox
    /// directory's, or its subvolume of the disk pool). `FilesLost` when it is gone; a
    /// `SandboxFailed` that keeps the sandbox hibernated when the pool holding it cannot be
    /// used now (its files may well be in the image).
    fn kept_files(&self, r: &SandboxRecord) -> CoreResult<()> {
        let own = self.cfg.sandbox_dir(&r.id).join("upper");
        if own.is_dir() {
            return Ok(());
        }
        let image = self.cfg.disk_pool_image();
        match self.disk_quota() {
            DiskQuota::Enforced { .. } => {
                let subvolume = self.cfg.disk_pool_dir().join(r.id.as_str());
                if subvolume.join("upper").is_dir() {
                    return Ok(());
                }
                Err(CoreError::FilesLost(format!(
                    "its files are gone: the ns disk pool holds no layer for it ({} is missing)",
                    subvolume.display()
                )))
            }
            DiskQuota::Off { why } if image.exists() => Err(CoreError::SandboxFailed(format!(
                "cannot wake sandbox {}: its files are in the ns disk pool {}, which cannot be used ({why}); it stays hibernated: fix the pool and restart the server",
                r.id,
                image.display()
            ))),
            DiskQuota::Off { .. } => Err(CoreError::FilesLost(format!(
                "its files are gone: there is neither {} nor an ns disk pool",
                own.display()
            ))),
        }
    }

    fn snapshot(&self, r: &SandboxRecord, dir: &Path) -> CoreResult<SnapshotTaken> {
        let cgroups = cgroup_paths(r);
        let freeze = r.state == SandboxState::Running && !cgroups.is_empty();
        if freeze {
            hutch_jail::freeze(&cgroups).map_err(CoreError::from)?;
            crate::crash_points::crash_point("snapshot.frozen");
        }
        let exported = hutch_jail::export_layer(&LayerExport {
            upper: self.upper(r),
            base: r.layer.as_deref().map(|s| self.layer_dir(s)),
            dst: dir.join(SNAPSHOT_LAYER),
            uid_base: r.uid_slot * UID_RANGE,
            uid_count: UID_RANGE,
        });
        let thawed = if freeze {
            hutch_jail::thaw(&cgroups).map_err(CoreError::from)
        } else {
            Ok(())
        };
        let stats = exported.map_err(CoreError::from)?;
        thawed?;
        Ok(SnapshotTaken {
            kind: SnapshotKind::Filesystem,
            size_bytes: stats.bytes,
            files: stats.files,
        })
    }
}

impl NsJails {
    /// Pack hibernated `r`'s files (its upper layer merged onto the layer it was created
    /// from, ids made 0-based) into the archive `archive`, through a layer written beside it
    /// and removed after.
    fn export_hibernated(&self, r: &SandboxRecord, archive: &Path) -> CoreResult<u64> {
        if r.state != SandboxState::Hibernated {
            return Err(CoreError::Internal(format!(
                "sandbox {} is {}, not hibernated: its files are not at rest",
                r.id,
                r.state.as_str()
            )));
        }
        self.kept_files(r)?;
        let staging = archive.with_extension("layer");
        if staging.symlink_metadata().is_ok() {
            hutch_jail::remove_layer(&staging).map_err(CoreError::from)?;
        }
        let packed = hutch_jail::export_layer(&LayerExport {
            upper: self.upper(r),
            base: r.layer.as_deref().map(|s| self.layer_dir(s)),
            dst: staging.clone(),
            uid_base: r.uid_slot * UID_RANGE,
            uid_count: UID_RANGE,
        })
        .and_then(|_| hutch_jail::pack_layer(&staging, archive));
        if let Err(e) = hutch_jail::remove_layer(&staging) {
            tracing::warn!(dir = %staging.display(), error = %e, "removing an exported layer");
        }
        packed.map_err(CoreError::from)
    }
}

#[async_trait::async_trait]
impl Backend for NsBackend {
    fn isolation(&self) -> Isolation {
        Isolation::Ns
    }

    fn host_sandbox_ids(&self) -> Vec<String> {
        let cfg = &self.jails.cfg;
        let mut ids: Vec<String> = sandbox_entries(&cfg.state_dir.join("sandboxes"))
            .into_iter()
            // A vm guest's directory holds its overlay; its records are elsewhere.
            .filter(|id| {
                !cfg.sandbox_dir(id).join("disk.qcow2").exists()
                    && !cfg.state_dir.join("vm-records").join(id).exists()
            })
            .collect();
        if matches!(
            self.jails.disk_quota_known(),
            Some(DiskQuota::Enforced { .. })
        ) {
            for id in sandbox_entries(&cfg.disk_pool_dir()) {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        ids
    }

    async fn remove_orphan(&self, id: &str) -> CoreResult<()> {
        let (jails, id) = (self.jails.clone(), id.to_string());
        blocking(move || {
            let teardown = Teardown {
                id: id.clone(),
                sandbox_dir: jails.cfg.sandbox_dir(&id),
                init_pid: None,
                init_start_time: None,
                cgroups: Vec::new(),
                cgroup_parent: jails.cfg.cgroup_parent.clone(),
            };
            hutch_jail::destroy(&teardown).map_err(CoreError::from)?;
            jails.delete_upper(&id)
        })
        .await
    }

    async fn remove_moved(&self, id: &str) -> CoreResult<()> {
        let (jails, id) = (self.jails.clone(), id.to_string());
        blocking(move || {
            // Refused if anything is still mounted there: nothing of it should be.
            hutch_jail::remove_layer(&jails.cfg.sandbox_dir(&id)).map_err(CoreError::from)?;
            jails.delete_upper(&id)
        })
        .await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            live_fork: false,
            memory_snapshots: false,
            volume_slots: hutch_jail::MAX_VOLUMES,
            volume_access: VolumeAccess::HostMount,
            warm_pool: false,
            portable_hibernation: true,
        }
    }

    async fn max_disk_mib(&self) -> CoreResult<Option<u64>> {
        let jails = self.jails.clone();
        let quota = blocking(move || Ok(jails.disk_quota())).await?;
        Ok(match quota {
            DiskQuota::Enforced { pool_mib } => Some(pool_mib),
            _ => None,
        })
    }

    async fn admit(&self, r: &SandboxRecord) -> CoreResult<()> {
        // Sets the pool up on the first ns create (may run mkfs.btrfs).
        let quota = self.run(r, |jails, _| Ok(jails.disk_quota())).await?;
        match quota {
            DiskQuota::Enforced { pool_mib } if r.disk_mib > pool_mib => {
                Err(CoreError::InvalidArgument(format!(
                    "disk_mib {} is larger than this server's ns disk pool ({pool_mib} MiB, hutch serve --ns-disk-pool-gib): an ns sandbox could never fill it; ask for at most {pool_mib} (sandboxes share the pool: their disk_mib together may exceed it)",
                    r.disk_mib
                )))
            }
            _ => Ok(()),
        }
    }

    async fn create(&self, record: &SandboxRecord, rootfs: &Path) -> CoreResult<Started> {
        let rootfs = rootfs.to_path_buf();
        self.run(record, move |jails, r| jails.create(r, &rootfs))
            .await
    }

    async fn destroy(&self, record: &SandboxRecord) -> CoreResult<()> {
        self.run(record, |jails, r| jails.destroy(r)).await
    }

    fn agent_socket(&self, id: &str) -> PathBuf {
        self.jails.agent_socket(id)
    }

    fn log_files(&self, r: &SandboxRecord) -> Vec<crate::logs::LogFile> {
        use crate::logs::{LineFilter, LogFile, LogSource};
        let agent_log = self.jails.cfg.sandbox_dir(&r.id).join("agent.log");
        let mut logs = vec![LogFile {
            source: LogSource::Agent,
            paths: vec![agent_log.clone()],
            timestamped: true,
            lines: LineFilter::NotService,
        }];
        if r.start.is_some() {
            logs.push(LogFile {
                source: LogSource::Start,
                paths: vec![agent_log],
                timestamped: true,
                lines: LineFilter::Service,
            });
        }
        logs
    }

    fn alive(&self, r: &SandboxRecord) -> bool {
        match (r.init_pid, r.init_start_time) {
            (Some(pid), Some(start)) => hutch_jail::init_alive(pid, start),
            _ => false,
        }
    }

    fn usage(&self, r: &SandboxRecord) -> Option<Usage> {
        if r.cgroups.is_empty() {
            return None;
        }
        let s = hutch_jail::cgroup_stats(&cgroup_paths(r));
        Some(Usage {
            memory_bytes: s.memory_bytes,
            memory_working_set_bytes: s.memory_working_set_bytes,
            memory_limit_bytes: s.memory_limit_bytes,
            oom_kills: s.oom_kills,
            cpu_usage_ns: s.cpu_usage_ns,
            pids: s.pids_current,
        })
    }

    fn init_oom_killed(&self, r: &SandboxRecord) -> bool {
        self.usage(r).map(|u| u.oom_kills).unwrap_or(0) > 0
    }

    async fn pause(&self, r: &SandboxRecord) -> CoreResult<()> {
        self.run(r, |_, r| {
            hutch_jail::freeze(&cgroup_paths(r)).map_err(CoreError::from)
        })
        .await
    }

    async fn resume(&self, r: &SandboxRecord) -> CoreResult<()> {
        self.run(r, |_, r| {
            hutch_jail::thaw(&cgroup_paths(r)).map_err(CoreError::from)
        })
        .await
    }

    async fn hibernate(&self, r: &SandboxRecord) -> CoreResult<()> {
        self.run(r, |jails, r| jails.hibernate(r)).await
    }

    async fn wake(&self, r: &SandboxRecord, rootfs: &Path) -> CoreResult<Started> {
        let rootfs = rootfs.to_path_buf();
        self.run(r, move |jails, r| jails.wake(r, &rootfs)).await
    }

    async fn recover_hibernated(&self, r: &SandboxRecord) -> Hibernation {
        let checked = self
            .run(r, |jails, r| {
                if let Err(e) = jails.hibernate(r) {
                    tracing::error!(id = %r.id, error = %e, "cleaning up a hibernated sandbox");
                }
                jails.kept_files(r)
            })
            .await;
        match checked {
            Err(CoreError::FilesLost(reason)) => Hibernation::Lost(reason),
            Err(e) => {
                tracing::warn!(id = %r.id, error = %e, "a hibernated sandbox cannot wake for now");
                Hibernation::Kept
            }
            Ok(()) => Hibernation::Kept,
        }
    }

    async fn adopt(&self, r: &SandboxRecord) -> CoreResult<()> {
        // A snapshot freezes a running sandbox while it reads its files, a pause freezes it
        // before its record says so: a crash in between leaves the cgroup out of step.
        let paused = r.state == SandboxState::Paused;
        self.run(r, move |_, r| {
            let cgroups = cgroup_paths(r);
            if cgroups.is_empty() {
                return Ok(());
            }
            let done = if paused {
                hutch_jail::freeze(&cgroups)
            } else {
                hutch_jail::thaw(&cgroups)
            };
            done.map_err(CoreError::from)
        })
        .await
    }

    async fn snapshot(&self, r: &SandboxRecord, dir: &Path) -> CoreResult<SnapshotTaken> {
        let dir = dir.to_path_buf();
        self.run(r, move |jails, r| jails.snapshot(r, &dir)).await
    }

    async fn export_hibernated(&self, r: &SandboxRecord, archive: &Path) -> CoreResult<u64> {
        let archive = archive.to_path_buf();
        self.run(r, move |jails, r| jails.export_hibernated(r, &archive))
            .await
    }

    async fn import_hibernated(&self, archive: &Path, dir: &Path) -> CoreResult<SnapshotTaken> {
        let (archive, layer) = (archive.to_path_buf(), dir.join(SNAPSHOT_LAYER));
        let stats =
            blocking(move || hutch_jail::unpack_layer(&archive, &layer).map_err(CoreError::from))
                .await?;
        Ok(SnapshotTaken {
            kind: SnapshotKind::Filesystem,
            size_bytes: stats.bytes,
            files: stats.files,
        })
    }

    async fn remove_snapshot(&self, dir: &Path) -> CoreResult<()> {
        let dir = dir.to_path_buf();
        blocking(move || hutch_jail::remove_layer(&dir).map_err(CoreError::from)).await
    }

    fn metrics_text(&self) -> String {
        let Some(quota) = self.jails.disk_quota_known() else {
            return String::new();
        };
        let (on, mib) = match quota {
            DiskQuota::Enforced { pool_mib } => (1, pool_mib),
            DiskQuota::Off { .. } => (0, 0),
        };
        format!(
            "# HELP hutch_ns_disk_quota_enforced Whether disk_mib is enforced on ns sandboxes (btrfs disk pool; known after the first ns create).\n# TYPE hutch_ns_disk_quota_enforced gauge\nhutch_ns_disk_quota_enforced {on}\n# HELP hutch_ns_disk_pool_bytes Size of the ns disk pool (0 without one).\n# TYPE hutch_ns_disk_pool_bytes gauge\nhutch_ns_disk_pool_bytes {}\n",
            mib << 20
        )
    }

    async fn release(&self) {
        let jails = self.jails.clone();
        let _ = blocking(move || {
            jails.release_pool();
            Ok(())
        })
        .await;
    }
}

fn cgroup_paths(r: &SandboxRecord) -> Vec<PathBuf> {
    r.cgroups.iter().map(PathBuf::from).collect()
}

/// The names of the sandbox entries (`sbx_…`) in `dir` (none when it does not exist).
pub(crate) fn sandbox_entries(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| crate::ids::is_sandbox_id(name))
        .collect()
}
