//! What the host keeps about each vm sandbox where its QEMU cannot reach:
//! `<state>/vm-records/<id>/` (root, 0700), never bound into a jail.
//!
//! * `disk-chain`: the images below the sandbox's overlay, as the host made it
//!   (`hutch_vm::disk::RootDisk::save_chain`). A guest's QEMU can rewrite its overlay's
//!   qcow2 header (a plain write to a file it owns), so nothing the host does follows that
//!   header: a wake, a snapshot (its directory gets a copy of the record), a fork child and
//!   the cache's garbage collection all use the record; QEMU's command line names the
//!   chain explicitly and its jail binds only these files.
//! * `console.log`, `console.log.old`: the guest's serial console, at most
//!   `--vm-console-bytes` together (`hutch_vm::console`), drained from QEMU's chardev
//!   socket `console.sock` in its directory by a task of the server (again after a
//!   restart, [`VmBackend::adopt_console`]).
//!
//! The sandbox's disk is copied into a snapshot only if it is still the regular file its
//! QEMU's uid owns, opened without following a link ([`copy_guest_file`]).

use std::path::{Path, PathBuf};

use hutch_vm::console::ConsoleRing;
use hutch_vm::disk::RootDisk;
use hutch_vm::qemu::Console;

use super::{give_to, VmBackend, SNAPSHOT_DISK};
use crate::error::{CoreError, CoreResult};
use crate::model::SandboxRecord;

/// The directory of every vm sandbox's records, in the state directory.
const RECORDS: &str = "vm-records";
/// The recorded chain of a disk: in a sandbox's records and in a vm snapshot's directory.
pub(super) const DISK_CHAIN: &str = "disk-chain";
/// The console ring's newest half, in a sandbox's records.
const CONSOLE_LOG: &str = "console.log";
/// QEMU's console chardev socket, in its directory.
const CONSOLE_SOCKET: &str = "console.sock";
/// How much of the console's end the reason for a QEMU exit is looked for in.
const EXIT_CONSOLE_TAIL: u64 = 64 << 10;

impl VmBackend {
    /// `<state>/vm-records/<id>`.
    pub(super) fn records_dir(&self, id: &str) -> PathBuf {
        self.cfg.state_dir.join(RECORDS).join(id)
    }

    /// Create the records directory of `id` (root, 0700) if it is not there.
    pub(super) fn create_records_dir(&self, id: &str) -> CoreResult<()> {
        let dir = self.records_dir(id);
        std::fs::create_dir_all(&dir).map_err(CoreError::io("create", &dir))?;
        give_to(&dir, 0, 0o700)
    }

    /// Remove the records of `id` (only files of ours: no mounts in it). Its QEMU is gone,
    /// but the console drain may still be writing the last bytes QEMU sent: a removal that
    /// met a file created meanwhile is tried again.
    pub(super) fn remove_records(&self, id: &str) -> CoreResult<()> {
        let dir = self.records_dir(id);
        let mut attempts = 0;
        loop {
            match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(_) if attempts < 3 => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => return Err(CoreError::io("remove", &dir)(e)),
                Ok(()) => return Ok(()),
            }
        }
    }

    /// The console of sandbox `id`'s QEMU: a socket in its directory drained into the ring
    /// in its records.
    pub(super) fn console(&self, id: &str) -> Console {
        Console::Ring {
            socket: self.dir(id).join(CONSOLE_SOCKET),
            ring: self.console_ring(id),
        }
    }

    fn console_ring(&self, id: &str) -> ConsoleRing {
        ConsoleRing::new(
            self.records_dir(id).join(CONSOLE_LOG),
            self.cfg.vm_console_bytes,
        )
    }

    /// Sandbox `id`'s console as a log (`GET /v1/sandboxes/{id}/logs?source=console`): the
    /// ring's older half, then its newest; raw guest bytes, no times.
    pub(super) fn console_log_file(&self, id: &str) -> crate::logs::LogFile {
        let ring = self.console_ring(id);
        crate::logs::LogFile {
            source: crate::logs::LogSource::Console,
            paths: vec![ring.old_path(), ring.path],
            timestamped: false,
            lines: crate::logs::LineFilter::All,
        }
    }

    /// The end of sandbox `r`'s console (what a QEMU exit is explained from).
    pub(super) fn console_tail(&self, r: &SandboxRecord) -> String {
        self.console_ring(&r.id).tail(EXIT_CONSOLE_TAIL)
    }

    /// Drain the console of a running QEMU this server did not start (re-adopted after a
    /// restart): while no server was connected its output was dropped.
    pub(super) fn adopt_console(&self, r: &SandboxRecord) {
        if let Console::Ring { socket, ring } = self.console(&r.id) {
            hutch_vm::console::spawn_drain(socket, ring);
        }
    }

    /// Record `disk`'s chain as sandbox `id`'s.
    pub(super) fn record_disk(&self, id: &str, disk: &RootDisk) -> CoreResult<()> {
        disk.save_chain(&self.records_dir(id).join(DISK_CHAIN))
            .map_err(|e| hutch_vm::VmError::from(e).into())
    }

    /// Sandbox `id`'s disk: its overlay `top` over the chain recorded when it was made.
    pub(super) fn recorded_disk(&self, id: &str, top: &Path) -> CoreResult<RootDisk> {
        RootDisk::load_chain(top, &self.records_dir(id).join(DISK_CHAIN)).map_err(|source| {
            CoreError::DiskUnusable {
                what: format!("sandbox {id}"),
                source,
            }
        })
    }

    /// The disk of the vm snapshot in `dir`, copied to `top`: the snapshot's chain record.
    pub(super) fn snapshot_disk(&self, dir: &Path, top: &Path) -> CoreResult<RootDisk> {
        RootDisk::load_chain(top, &dir.join(DISK_CHAIN)).map_err(|source| CoreError::DiskUnusable {
            what: format!("snapshot {}", dir.display()),
            source,
        })
    }

    /// Copy sandbox `r`'s overlay into the snapshot directory `dir` with its recorded chain
    /// (its guest stopped, or gone).
    pub(super) fn copy_disk(&self, r: &SandboxRecord, dir: &Path) -> CoreResult<()> {
        let overlay = self.dir(&r.id).join("disk.qcow2");
        let disk = self.recorded_disk(&r.id, &overlay)?;
        let copy = dir.join(SNAPSHOT_DISK);
        let owner = r.uid_slot * super::UID_RANGE;
        copy_guest_file(&overlay, &copy, owner)
            .map_err(CoreError::io("copy the disk", &overlay))?;
        disk.with_top(&copy)
            .save_chain(&dir.join(DISK_CHAIN))
            .map_err(|e| hutch_vm::VmError::from(e).into())
    }

    /// Delete cache entries unused for [`hutch_vm::gc::MAX_UNUSED`], keeping the bakes and
    /// images behind every vm sandbox and snapshot of this server (from their recorded disk
    /// chains, never from an image's header; and marked used for other servers sharing the
    /// cache) and the shared memory of its snapshots. Blocking.
    pub fn collect_garbage(&self) {
        let mut keep = std::collections::HashSet::new();
        let bakes = self.cfg.vm_dir.join("bakes");
        let mut records = Vec::new();
        for parent in [self.cfg.state_dir.join(RECORDS), self.cfg.snapshots_dir()] {
            let Ok(entries) = std::fs::read_dir(&parent) else {
                continue;
            };
            records.extend(entries.flatten().map(|e| e.path()));
        }
        for dir in records {
            // Only snapshot directories name shared memory (root-only, written by us).
            if dir.starts_with(self.cfg.snapshots_dir()) {
                if let Some(shared) = hutch_vm::share::shared_dir(&dir) {
                    hutch_vm::gc::touch(&shared);
                    keep.insert(shared);
                }
            }
            let Ok(disk) = RootDisk::load_chain(&dir.join(SNAPSHOT_DISK), &dir.join(DISK_CHAIN))
            else {
                continue;
            };
            for layer in &disk.backing {
                // A bake's disk keeps its whole bake directory; an image itself.
                let entry = match layer.path.parent() {
                    Some(p) if p.parent() == Some(bakes.as_path()) => p.to_path_buf(),
                    _ => layer.path.clone(),
                };
                if entry.starts_with(&self.cfg.vm_dir) {
                    hutch_vm::gc::touch(&entry);
                    keep.insert(entry);
                }
            }
        }
        let collected = hutch_vm::gc::collect(&self.cfg.vm_dir, hutch_vm::gc::MAX_UNUSED, &keep);
        if !collected.removed.is_empty() {
            tracing::info!(removed = ?collected.removed, "unused vm cache entries removed");
        }
    }
}

/// Copy `src`, a file in a QEMU's directory (which that QEMU could have replaced by a link,
/// a FIFO or a hard link to another file), to a new file `dst`: opened without following a
/// link and without blocking, copied only if it is a regular file with one link owned by
/// `owner` (the QEMU's uid), from the descriptor that was checked.
pub(super) fn copy_guest_file(src: &Path, dst: &Path, owner: u32) -> std::io::Result<u64> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut from = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(src)?;
    let meta = from.metadata()?;
    if !meta.file_type().is_file() || meta.uid() != owner || meta.nlink() != 1 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} is not the guest's own regular file (uid {}, {} links)",
                src.display(),
                meta.uid(),
                meta.nlink()
            ),
        ));
    }
    let mut to = hutch_vm::qemu::create_fresh(dst)?;
    std::io::copy(&mut from, &mut to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_file_is_copied_only_if_it_is_the_guests_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let me = nix_uid();
        let disk = dir.path().join("disk.qcow2");
        std::fs::write(&disk, b"QFI\xfbdata").expect("write");
        let copied = dir.path().join("copy");
        assert_eq!(copy_guest_file(&disk, &copied, me).expect("copy"), 8);
        assert_eq!(std::fs::read(&copied).expect("read"), b"QFI\xfbdata");
        // Not the owner asked for.
        assert!(copy_guest_file(&disk, &dir.path().join("c2"), me + 1).is_err());
        // A planted link to a host file is not followed.
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"host only").expect("write");
        let link = dir.path().join("link.qcow2");
        std::os::unix::fs::symlink(&secret, &link).expect("symlink");
        assert!(copy_guest_file(&link, &dir.path().join("c3"), me).is_err());
        // Nor a hard link to it.
        let hard = dir.path().join("hard.qcow2");
        std::fs::hard_link(&secret, &hard).expect("link");
        assert!(copy_guest_file(&hard, &dir.path().join("c4"), me).is_err());
        // A FIFO does not block the copy.
        let fifo = dir.path().join("fifo.qcow2");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("cstr");
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        assert!(copy_guest_file(&fifo, &dir.path().join("c5"), me).is_err());
    }

    fn nix_uid() -> u32 {
        // SAFETY: getuid has no failure mode and touches no memory.
        unsafe { libc::getuid() }
    }
}
