//! The bake a sandbox's guest comes from, and sharing a memory snapshot's RAM among the
//! sandboxes restored from it (`hutch_vm::share`): the snapshot's full migration stream is
//! loaded once into a memory file under `<vm-dir>/shared/<random>/` (root, 0755; the memory
//! file root:[`MEMORY_GID`] 0660 like a bake's, since the snapshot directory itself is
//! root-only), and children map it copy-on-write. The snapshot directory names that
//! directory in its `shared` file; deleting the snapshot deletes it.
//!
//! A shared memory directory is as large as the guest's RAM, and the cache it lives in may
//! be shared by several servers, so one left by a crash is never guessed at: before making
//! it, the server records its intent in its own state directory
//! (`<state>/vm-shared-intents/<name>`, holding the directory's path), and drops the record
//! once the directory is named by its snapshot or removed. At start, every directory an
//! intent names that no finished snapshot of this server names is removed
//! ([`VmBackend::sweep_interrupted_shared`]).

use std::path::{Path, PathBuf};

use hutch_vm::assets::Boot;
use hutch_vm::snapshot::Snapshot;
use hutch_vm::VmError;

use super::{give_to, template_stamp, VmBackend, BAKE_UID, MEMORY_GID, SNAPSHOT_STATE};
use crate::error::{CoreError, CoreResult};
use crate::model::{SandboxRecord, SandboxState};

/// How long a first-use step may take before it is announced.
const ANNOUNCE_AFTER: std::time::Duration = std::time::Duration::from_millis(300);

/// Run a blocking `hutch-vm` build step on the blocking pool.
async fn blocking_vm<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, VmError> + Send + 'static,
) -> CoreResult<T> {
    tokio::task::spawn_blocking(f)
        .await?
        .map_err(CoreError::from)
}

/// Where a loading QEMU puts a snapshot's shared memory ([`VmBackend::new_shared`]).
struct SharedTarget {
    /// The bake the snapshotted sandbox was restored from (its command line).
    bake: Snapshot,
    /// `<vm-dir>/shared/<random>`.
    dir: PathBuf,
    /// The loader's scratch disk in it.
    scratch: hutch_vm::disk::RootDisk,
    /// The loader's jail.
    jail: hutch_vm::qemu::QemuJail,
}

impl VmBackend {
    /// The kernel, template image and bake of sandbox `r` (built on first use).
    pub(super) async fn bake_of(
        &self,
        r: &SandboxRecord,
        rootfs: &Path,
    ) -> CoreResult<(Boot, PathBuf, Snapshot)> {
        let assets = self.assets().await;
        let (template, root) = (r.template.clone(), rootfs.to_path_buf());
        let stamp = template_stamp(rootfs)?;
        let building = assets.clone();
        let boot = self
            .announced(
                r,
                "preparing the guest kernel and initramfs (first vm use, or a new agent)",
                blocking_vm(move || building.boot()),
            )
            .await?;
        let building = assets.clone();
        let image = self
            .announced(
                r,
                &format!("building the vm disk image of template {template}"),
                blocking_vm(move || building.image(&template, &stamp, &root)),
            )
            .await?;
        let vcpus = crate::model::vcpus(r.cpus);
        let memory = u32::try_from(r.memory_mib)
            .map_err(|_| CoreError::InvalidArgument("memory_mib is too large".into()))?;
        let bake = self
            .announced(
                r,
                &format!(
                    "baking the snapshot of template {} for {memory} MiB, {vcpus} vCPU guests (a cold boot, once)",
                    r.template
                ),
                async {
                    match assets.snapshot(&boot, &image, memory, vcpus, r.start.as_ref()).await {
                        Ok(bake) => Ok(bake),
                        Err(hutch_vm::VmError::Service(source)) => Err(CoreError::NotReady {
                            template: r.template.clone(),
                            source,
                        }),
                        Err(e) => Err(CoreError::from(e)),
                    }
                },
            )
            .await?;
        Ok((boot, image, bake))
    }

    /// Run `step`; if it takes longer than [`ANNOUNCE_AFTER`] (it is building rather than
    /// finding something cached), say so through the progress hook, and say when it is done.
    async fn announced<T>(
        &self,
        r: &SandboxRecord,
        what: &str,
        step: impl std::future::Future<Output = CoreResult<T>>,
    ) -> CoreResult<T> {
        let Some(progress) = self
            .progress
            .as_ref()
            .filter(|_| r.state != SandboxState::Pooled)
        else {
            return step.await;
        };
        let t0 = std::time::Instant::now();
        tokio::pin!(step);
        tokio::select! {
            done = &mut step => return done,
            () = tokio::time::sleep(ANNOUNCE_AFTER) => {}
        }
        progress(r, format!("{what}…"));
        let done = step.await;
        let outcome = match &done {
            Ok(_) => "done",
            Err(_) => "failed",
        };
        progress(
            r,
            format!("{what}: {outcome} in {:.1} s", t0.elapsed().as_secs_f64()),
        );
        done
    }

    /// Load the snapshot in `dir` (its full stream) into a shared memory file; returns the
    /// bytes that added. The full stream is deleted once children can use the shared copy.
    pub(super) async fn share_memory(&self, r: &SandboxRecord, dir: &Path) -> CoreResult<u64> {
        let target = self.new_shared(r).await?;
        let loaded = hutch_vm::share::materialize(
            &target.bake.config,
            &dir.join(SNAPSHOT_STATE),
            &target.scratch,
            &target.dir,
            Some(target.jail.clone()),
        )
        .await
        .map_err(CoreError::from);
        let _ = std::fs::remove_file(&target.scratch.top);
        self.publish_shared(&target.dir, dir, loaded.map(drop))
    }

    /// A new, empty, root-only directory for a snapshot's shared memory:
    /// `<vm-dir>/shared/<random>`, or with `in_memory` (a fork's) in the fork memory tmpfs
    /// (`fork_memory.rs`).
    pub(super) fn new_shared_dir(&self, in_memory: bool) -> CoreResult<PathBuf> {
        let mut name = [0u8; 8];
        getrandom::fill(&mut name)?;
        let name: String = name.iter().map(|b| format!("{b:02x}")).collect();
        let shared = match in_memory {
            true => self.fork_memory_dir().join(&name),
            false => self.cfg.vm_dir.join("shared").join(&name),
        };
        let intents = self.shared_intents_dir();
        std::fs::create_dir_all(&intents).map_err(CoreError::io("create", &intents))?;
        let intent = intents.join(&name);
        std::fs::write(&intent, shared.display().to_string())
            .map_err(CoreError::io("write", &intent))?;
        let made = std::fs::create_dir_all(&shared)
            .map_err(CoreError::io("create", &shared))
            .and_then(|()| give_to(&shared, 0, 0o700));
        if let Err(e) = made {
            self.discard_shared(&shared);
            return Err(e);
        }
        Ok(shared)
    }

    /// Where the intents to make shared memory directories are recorded (see the module
    /// docs).
    fn shared_intents_dir(&self) -> PathBuf {
        self.cfg.state_dir.join("vm-shared-intents")
    }

    /// Drop the intent recorded for `shared` (it is named by its snapshot, or gone).
    fn forget_shared_intent(&self, shared: &Path) {
        if let Some(name) = shared.file_name() {
            let _ = std::fs::remove_file(self.shared_intents_dir().join(name));
        }
    }

    /// Remove the shared memory directory `shared` made for a snapshot that failed, and
    /// its intent.
    pub(super) fn discard_shared(&self, shared: &Path) {
        match std::fs::remove_dir_all(shared) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(dir = %shared.display(), error = %e, "removing the shared memory of a failed snapshot");
            }
            _ => self.forget_shared_intent(shared),
        }
    }

    /// Whether `shared` is a shared memory directory this backend makes (in the cache's
    /// `shared/` or a fork memory directory), the only kind it ever deletes.
    fn is_shared_memory_dir(&self, shared: &Path) -> bool {
        let [forks, fallback] = self.fork_memory_dirs();
        let ours = [self.cfg.vm_dir.join("shared"), forks, fallback];
        shared.parent().is_some_and(|p| ours.iter().any(|o| o == p))
    }

    /// At start: remove the shared memory directories of snapshots a crash interrupted
    /// (recorded intents that no finished snapshot of this server names).
    pub(super) fn sweep_interrupted_shared(&self) {
        let Ok(intents) = std::fs::read_dir(self.shared_intents_dir()) else {
            return;
        };
        let named: std::collections::HashSet<PathBuf> = std::fs::read_dir(self.cfg.snapshots_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| crate::ids::is_snapshot_id(&e.file_name().to_string_lossy()))
            .filter_map(|e| hutch_vm::share::shared_dir(&e.path()))
            .collect();
        for intent in intents.flatten() {
            let shared = std::fs::read_to_string(intent.path())
                .map(|t| PathBuf::from(t.trim()))
                .ok();
            match shared {
                Some(shared) if !named.contains(&shared) && self.is_shared_memory_dir(&shared) => {
                    if shared.exists() {
                        tracing::warn!(dir = %shared.display(), "removing the shared memory of a snapshot a restart interrupted");
                    }
                    self.discard_shared(&shared);
                }
                _ => {
                    let _ = std::fs::remove_file(intent.path());
                }
            }
        }
    }

    /// A new directory `<vm-dir>/shared/<random>` for a loading QEMU (jailed as the bake
    /// uid: it writes only there), with a scratch overlay of the bake's disk to start it
    /// with (the snapshot's own disk is in the root-only snapshot directory; a paused guest
    /// never touches it).
    async fn new_shared(&self, r: &SandboxRecord) -> CoreResult<SharedTarget> {
        let rootfs = self.cfg.templates_dir.join(&r.template).join("rootfs");
        let (_, _, bake) = self.bake_of(r, &rootfs).await?;
        let shared = self.new_shared_dir(false)?;
        let prepared = (|| {
            give_to(&shared, BAKE_UID, 0o700)?;
            let base = bake
                .config
                .root_disk
                .as_ref()
                .ok_or_else(|| CoreError::Internal("bake without a root disk".into()))?;
            let scratch = base
                .overlay_at(&shared.join("scratch.qcow2"))
                .map_err(|e| CoreError::from(VmError::from(e)))?;
            give_to(&scratch.top, BAKE_UID, 0o600)?;
            Ok(scratch)
        })();
        let scratch = match prepared {
            Ok(scratch) => scratch,
            Err(e) => {
                self.discard_shared(&shared);
                return Err(e);
            }
        };
        Ok(SharedTarget {
            bake,
            dir: shared,
            scratch,
            jail: hutch_vm::qemu::QemuJail {
                uid: BAKE_UID,
                gid: BAKE_UID,
                groups: vec![],
                cgroup_procs: vec![],
            },
        })
    }

    /// After the shared memory directory `shared` was filled (`memory` and `state`) with
    /// outcome `loaded`: on success hand its files to root, name it from the snapshot
    /// directory `dir` and delete the snapshot's full stream if it has one (returns the
    /// bytes the shared memory adds); on failure delete it.
    pub(super) fn publish_shared(
        &self,
        shared: &Path,
        dir: &Path,
        loaded: CoreResult<()>,
    ) -> CoreResult<u64> {
        let published = loaded.and_then(|()| {
            // Back to root: restores map the memory file (group read-write, as QEMU 7.2
            // opens it so) and read the state by a descriptor; no QEMU may change them.
            give_to(shared, 0, 0o755)?;
            let memory = shared.join("memory");
            std::os::unix::fs::chown(&memory, Some(0), Some(MEMORY_GID))
                .map_err(CoreError::io("chown", &memory))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&memory, std::fs::Permissions::from_mode(0o660))
                .map_err(CoreError::io("chmod", &memory))?;
            give_to(&shared.join("state"), 0, 0o644)?;
            let _ = std::fs::remove_file(shared.join("qemu.log"));
            hutch_vm::share::link_shared(dir, shared).map_err(CoreError::from)?;
            let _ = std::fs::remove_file(dir.join(SNAPSHOT_STATE));
            let used = |p: &Path| {
                use std::os::unix::fs::MetadataExt;
                std::fs::metadata(p).map_or(0, |m| m.blocks() * 512)
            };
            Ok(used(&memory) + used(&shared.join("state")))
        });
        match &published {
            Ok(_) => self.forget_shared_intent(shared),
            Err(_) => self.discard_shared(shared),
        }
        published
    }

    /// Delete the shared memory of the snapshot in `dir`, if it has one.
    pub(super) fn remove_shared_memory(&self, dir: &Path) -> CoreResult<()> {
        let Some(shared) = hutch_vm::share::shared_dir(dir) else {
            return Ok(());
        };
        // Only ever a directory this backend made.
        if !self.is_shared_memory_dir(&shared) {
            return Err(CoreError::Internal(format!(
                "snapshot {} names {} as its shared memory",
                dir.display(),
                shared.display()
            )));
        }
        match std::fs::remove_dir_all(&shared) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(CoreError::io("remove", shared)(e))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_removes_shared_memory_only_of_snapshots_never_finished() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut cfg = crate::Config::new(
            tmp.path().join("state"),
            PathBuf::from("/nonexistent/hutch"),
            PathBuf::new(),
        );
        cfg.vm_dir = tmp.path().join("vm");
        let vm = VmBackend::new(cfg.clone(), None, None);
        // A snapshot that was finished, one a crash interrupted, and a path outside the
        // cache that an intent names (never deleted).
        let finished = vm.new_shared_dir(false).expect("shared dir");
        let snapshot = cfg.snapshot_dir(&crate::ids::new_snapshot_id());
        std::fs::create_dir_all(&snapshot).expect("snapshot dir");
        hutch_vm::share::link_shared(&snapshot, &finished).expect("link");
        let interrupted = vm.new_shared_dir(false).expect("shared dir");
        std::fs::write(interrupted.join("memory"), b"ram").expect("memory");
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        std::fs::write(
            vm.shared_intents_dir().join("bogus"),
            elsewhere.display().to_string(),
        )
        .expect("intent");

        vm.sweep_interrupted_shared();
        assert!(
            finished.is_dir(),
            "a finished snapshot's memory was removed"
        );
        assert!(
            !interrupted.exists(),
            "an interrupted snapshot's memory is left"
        );
        assert!(
            elsewhere.is_dir(),
            "a directory outside the cache was removed"
        );
        let left = std::fs::read_dir(vm.shared_intents_dir())
            .expect("intents")
            .count();
        assert_eq!(left, 0, "intents are dropped once settled");
    }
}
