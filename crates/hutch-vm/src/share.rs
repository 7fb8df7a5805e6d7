//! Sharing a memory snapshot's RAM among the guests restored from it.
//!
//! A snapshot of a running guest is a migration stream with all of its RAM (the guest's RAM
//! is private). Restoring children straight from it copies that RAM into each child. To
//! share it instead, the stream is *materialized* once: a paused QEMU with the same devices
//! loads it into a new memory file mapped `share=on`, then saves its device state with
//! `x-ignore-shared` (RAM excluded). Children then restore like sandboxes from a bake: that
//! memory file mapped `share=off` (copy-on-write) plus the small device state.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::qemu::{Console, QemuJail, RootDisk, VmConfig};
use crate::snapshot::{Guest, Snapshot};
use crate::VmError;

/// Bound on loading or saving the stream.
const MIGRATION: Duration = Duration::from_secs(120);

fn io(what: String) -> impl FnOnce(std::io::Error) -> VmError {
    move |source| VmError::Io { what, source }
}

/// Load `stream` (a full migration stream of a guest shaped like `config`, whose disk is
/// `disk`) into `<out>/memory` and write its device state without RAM to `<out>/state`.
/// `out` must exist and be writable by `jail`'s uid when given. Returns a [`Snapshot`] to
/// restore children from (its `root_disk` is `disk`).
pub async fn materialize(
    config: &VmConfig,
    stream: &Path,
    disk: &RootDisk,
    out: &Path,
    jail: Option<QemuJail>,
) -> Result<Snapshot, VmError> {
    let mut loader = Loader::start(config, disk, out, jail).await?;
    let file = std::fs::File::open(stream).map_err(io(format!("open {}", stream.display())))?;
    loader.load(file.as_fd()).await?;
    drop(file);
    loader.finish().await
}

/// A paused QEMU that loads a full migration stream into a new shared memory file (the
/// steps of [`materialize`]).
#[derive(Debug)]
struct Loader {
    guest: Guest,
    out: PathBuf,
    started: std::time::Instant,
    qmp_ready: Duration,
}

impl Loader {
    /// Start the loading QEMU (`-incoming defer`, its memory `<out>/memory` mapped
    /// `share=on`) and open QMP. `out` must exist and be writable by `jail`'s uid when
    /// given; `disk` is the root disk it is started with (a paused guest never touches it).
    pub async fn start(
        config: &VmConfig,
        disk: &RootDisk,
        out: &Path,
        jail: Option<QemuJail>,
    ) -> Result<Self, VmError> {
        let shared = VmConfig {
            memory_file: out.join("memory"),
            share_memory: true,
            incoming: true,
            qmp_socket: out.join("qmp.sock"),
            agent_socket: out.join("agent.sock"),
            console: Console::Discard,
            root_disk: Some(disk.clone()),
            jail,
            tap: None,
            ..config.clone()
        };
        let started = std::time::Instant::now();
        let guest = Guest::start(shared, &out.join("qemu.log")).await?;
        Ok(Self {
            guest,
            out: out.to_path_buf(),
            started,
            qmp_ready: started.elapsed(),
        })
    }

    /// Start loading the stream read from `stream` (QEMU gets its own copy of the
    /// descriptor).
    pub async fn load(&mut self, stream: std::os::fd::BorrowedFd<'_>) -> Result<(), VmError> {
        // The stream was saved without `x-ignore-shared` (see `Qmp::ignore_shared`): its
        // RAM pages land in the shared file.
        self.guest.qmp.getfd("stream", stream).await?;
        self.guest.qmp.migrate_incoming("fd:stream").await?;
        Ok(())
    }

    /// Wait until the stream is loaded, save the device state without RAM to
    /// `<out>/state` and stop QEMU. Returns the snapshot to restore children from.
    pub async fn finish(mut self) -> Result<Snapshot, VmError> {
        let guest = &mut self.guest;
        // The source was stopped when it was saved, so the guest stays paused: its RAM is
        // now in the shared file and nothing runs to change it.
        let status = guest.qmp.wait_incoming(MIGRATION).await?;
        if status == "running" {
            guest.qmp.stop().await?;
        }
        let loaded = self.started.elapsed();
        guest.qmp.set_ignore_shared().await?;
        let state = self.out.join("state");
        let file =
            std::fs::File::create(&state).map_err(io(format!("create {}", state.display())))?;
        guest.qmp.getfd("state", file.as_fd()).await?;
        drop(file);
        guest.qmp.migrate("fd:state").await?;
        guest.qmp.wait_migration(MIGRATION).await?;
        let saved = self.started.elapsed();
        let config = guest.config.clone();
        self.guest.shutdown().await?;
        tracing::debug!(
            qmp_ready_ms = self.qmp_ready.as_millis() as u64,
            loaded_ms = loaded.as_millis() as u64,
            saved_ms = saved.as_millis() as u64,
            total_ms = self.started.elapsed().as_millis() as u64,
            "memory snapshot materialized (times from the loader's spawn)"
        );
        for socket in ["qmp.sock", "agent.sock"] {
            let _ = std::fs::remove_file(self.out.join(socket));
        }
        Ok(Snapshot {
            ram_in_memory_file: true,
            config: VmConfig {
                share_memory: false,
                incoming: false,
                jail: None,
                ..config
            },
            state,
        })
    }
}

/// Where [`materialize`] put its files for the snapshot in `snapshot_dir`, if it did.
pub fn shared_dir(snapshot_dir: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(snapshot_dir.join(SHARED_LINK)).ok()?;
    let dir = PathBuf::from(text.trim());
    dir.is_absolute().then_some(dir)
}

/// Record in `snapshot_dir` where its shared memory lives.
pub fn link_shared(snapshot_dir: &Path, shared: &Path) -> Result<(), VmError> {
    let link = snapshot_dir.join(SHARED_LINK);
    std::fs::write(&link, shared.display().to_string())
        .map_err(io(format!("write {}", link.display())))
}

/// Name of the file in a snapshot directory naming its shared memory directory.
const SHARED_LINK: &str = "shared";
