//! Host-wide claims on uid slots, so that two servers on one host (each with its own state
//! database, where a slot is unique) never give sandboxes the same uid range.
//!
//! The claims directory (default `/run/hutch/uid-slots`, so claims last one boot; root-only,
//! 0700) holds:
//!
//! - `lock`: `flock`ed exclusively around every claim (together with the insert of the
//!   record that uses it, see [`UidSlots::lock`]), take-over, release and reconciliation.
//!   It is never deleted (a waiter on a deleted lock file would coexist with a new holder).
//! - `<N>`: slot N is claimed. The file holds the claiming server's state directory
//!   (canonical path) and a newline; it is created `O_EXCL`, replaced only by a rename.
//!
//! Each server holds an exclusive `flock` on `<state>/uid-slots.owner` for its whole life
//! (the kernel drops it when the process dies). A claim by another state directory is
//! **stale**, and may be taken over, only when that server is not running (its owner lock
//! is free) *and* its database has no sandbox with that slot (a stopped server's sandboxes
//! keep running): the claim was left by a crash between claiming and inserting, or between
//! deleting a record and releasing its slot, or its state directory is gone. A running
//! server's claims are never taken. At start a server re-claims the slots of its surviving
//! records (after a reboot the directory is empty) and drops its own claims that no record
//! holds.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Errors of the host-wide slot claims.
#[derive(Debug, thiserror::Error)]
pub enum UidSlotError {
    /// A file or directory of the claims could not be used.
    #[error("uid slot claims: {what} {}: {source}", path.display())]
    Io {
        /// What was tried (`create`, `lock`, `read`, …).
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// Another server holds the owner lock of this state directory.
    #[error("another hutch server is running on the state directory {}", .0.display())]
    StateDirInUse(PathBuf),
}

type Result<T> = std::result::Result<T, UidSlotError>;

fn at<'p>(what: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> UidSlotError + 'p {
    move |source| UidSlotError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Name of the owner lock in a state directory.
const OWNER_LOCK: &str = "uid-slots.owner";

/// `flock(fd, op)`, retried while interrupted.
fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock only reads its two integer arguments; the fd is open (borrowed).
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// This server's claims in the host-wide directory.
#[derive(Debug)]
pub struct UidSlots {
    dir: PathBuf,
    /// This server's state directory, canonical: what its claim files hold.
    owner: String,
    /// The owner lock, held while this exists.
    _alive: File,
}

/// Held while claiming, inserting the record that uses the claim, or releasing: the
/// host-wide lock.
#[derive(Debug)]
pub struct ClaimsLock<'a> {
    slots: &'a UidSlots,
    _file: File,
}

/// Whether a slot could be claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// It is this server's now (a new claim, or a stale one taken over).
    Claimed,
    /// Another server (or one of this server's records) holds it.
    Taken,
}

impl UidSlots {
    /// Open (creating it 0700 if needed) the claims directory `dir` for the server of
    /// `state_dir`, and take that server's owner lock.
    pub fn open(dir: &Path, state_dir: &Path) -> Result<Self> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(at("create", dir))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(at("chmod", dir))?;
        let state = fs::canonicalize(state_dir).map_err(at("resolve", state_dir))?;
        let alive_path = state.join(OWNER_LOCK);
        let alive = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&alive_path)
            .map_err(at("open", &alive_path))?;
        flock(&alive, libc::LOCK_EX | libc::LOCK_NB).map_err(|e| {
            if e.kind() == io::ErrorKind::WouldBlock {
                UidSlotError::StateDirInUse(state.clone())
            } else {
                at("lock", &alive_path)(e)
            }
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            owner: state.display().to_string(),
            _alive: alive,
        })
    }

    /// Take the host-wide lock (waits for other servers' short critical sections).
    pub fn lock(&self) -> Result<ClaimsLock<'_>> {
        let path = self.dir.join("lock");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(at("open", &path))?;
        flock(&file, libc::LOCK_EX).map_err(at("lock", &path))?;
        Ok(ClaimsLock {
            slots: self,
            _file: file,
        })
    }
}

impl ClaimsLock<'_> {
    fn path(&self, slot: u32) -> PathBuf {
        self.slots.dir.join(slot.to_string())
    }

    /// The state directory holding `slot`'s claim, if it is claimed.
    fn owner_of(&self, slot: u32) -> Result<Option<String>> {
        let path = self.path(slot);
        match fs::read_to_string(&path) {
            Ok(text) => Ok(Some(text.trim_end_matches('\n').to_string())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(at("read", &path)(e)),
        }
    }

    /// Claim `slot` for this server: a new claim, or a stale one taken over. A slot already
    /// claimed by this server is [`Claim::Taken`] (one of its records holds it).
    pub fn claim(&self, slot: u32) -> Result<Claim> {
        let path = self.path(slot);
        let line = format!("{}\n", self.slots.owner);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&path)
        {
            Ok(mut f) => {
                f.write_all(line.as_bytes()).map_err(at("write", &path))?;
                return Ok(Claim::Claimed);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(at("create", &path)(e)),
        }
        let Some(owner) = self.owner_of(slot)? else {
            // Released between the two calls: impossible under the lock, but harmless.
            return self.claim(slot);
        };
        if owner == self.slots.owner || !claim_is_stale(Path::new(&owner), slot) {
            return Ok(Claim::Taken);
        }
        tracing::warn!(slot, previous_owner = %owner, "taking over a stale uid slot claim");
        self.replace(slot, &line)?;
        Ok(Claim::Claimed)
    }

    /// Write `slot`'s claim afresh (a temporary file renamed over it).
    fn replace(&self, slot: u32, line: &str) -> Result<()> {
        let path = self.path(slot);
        let tmp = self
            .slots
            .dir
            .join(format!(".{slot}.{}", std::process::id()));
        let _ = fs::remove_file(&tmp);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&tmp)
            .map_err(at("create", &tmp))?;
        f.write_all(line.as_bytes()).map_err(at("write", &tmp))?;
        fs::rename(&tmp, &path).map_err(at("rename", &path))
    }

    /// Whether this server holds `slot` host-wide, claiming it first when it is free or
    /// stale; `false`: another server holds it (after a reboot, one that started first).
    pub fn hold(&self, slot: u32) -> Result<bool> {
        if self.claim(slot)? == Claim::Claimed {
            return Ok(true);
        }
        Ok(self.owner_of(slot)?.as_deref() == Some(self.slots.owner.as_str()))
    }

    /// Give `slot` back, if this server holds it.
    pub fn release(&self, slot: u32) -> Result<()> {
        if self.owner_of(slot)?.as_deref() == Some(self.slots.owner.as_str()) {
            let path = self.path(slot);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(at("remove", &path)(e)),
            }
        }
        Ok(())
    }

    /// Make the claims match this server's records: claim every slot in `held` (warning
    /// about any another server holds), drop this server's claims on any other slot.
    pub fn reconcile(&self, held: &BTreeSet<u32>) -> Result<()> {
        let entries = fs::read_dir(&self.slots.dir).map_err(at("list", &self.slots.dir))?;
        for entry in entries {
            let entry = entry.map_err(at("list", &self.slots.dir))?;
            let Some(slot) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if !held.contains(&slot) {
                self.release(slot)?;
            }
        }
        for &slot in held {
            if !self.hold(slot)? {
                tracing::warn!(
                    slot,
                    owner = ?self.owner_of(slot)?,
                    "a sandbox of this server has a uid slot another server on this host claimed (after a reboot, that server started first); it cannot be woken"
                );
            }
        }
        Ok(())
    }
}

/// Whether the claim of `slot` by the server of `state_dir` may be taken over: that server
/// is not running and its database has no sandbox with the slot (or is gone).
fn claim_is_stale(state_dir: &Path, slot: u32) -> bool {
    match File::open(state_dir.join(OWNER_LOCK)) {
        Ok(f) => {
            if flock(&f, libc::LOCK_SH | libc::LOCK_NB).is_err() {
                return false; // its server runs
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(_) => return false,
    }
    let db = state_dir.join("state.db");
    if !db.exists() {
        return true;
    }
    let flags =
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let held = rusqlite::Connection::open_with_flags(&db, flags).and_then(|c| {
        c.query_row(
            "SELECT COUNT(*) FROM sandboxes WHERE uid_slot = ?1",
            [slot],
            |r| r.get::<_, i64>(0),
        )
    });
    // A database that cannot be read keeps its claims.
    matches!(held, Ok(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Host {
        claims: tempfile::TempDir,
        a: tempfile::TempDir,
        b: tempfile::TempDir,
    }

    fn host() -> Host {
        Host {
            claims: tempfile::tempdir().expect("tempdir"),
            a: tempfile::tempdir().expect("tempdir"),
            b: tempfile::tempdir().expect("tempdir"),
        }
    }

    #[test]
    fn a_slot_is_one_servers_until_released() {
        let h = host();
        let a = UidSlots::open(h.claims.path(), h.a.path()).expect("a");
        let b = UidSlots::open(h.claims.path(), h.b.path()).expect("b");
        assert_eq!(
            a.lock().expect("lock").claim(20).expect("claim"),
            Claim::Claimed
        );
        assert_eq!(
            a.lock().expect("lock").claim(20).expect("claim"),
            Claim::Taken
        );
        // b runs (its owner lock is held) but a runs too: a's claim is not stale.
        assert_eq!(
            b.lock().expect("lock").claim(20).expect("claim"),
            Claim::Taken
        );
        b.lock().expect("lock").release(20).expect("release");
        assert_eq!(
            b.lock().expect("lock").claim(20).expect("claim"),
            Claim::Taken
        );
        a.lock().expect("lock").release(20).expect("release");
        assert_eq!(
            b.lock().expect("lock").claim(20).expect("claim"),
            Claim::Claimed
        );
    }

    #[test]
    fn a_dead_servers_claim_is_taken_over_only_when_its_database_lacks_the_slot() {
        let h = host();
        let a = UidSlots::open(h.claims.path(), h.a.path()).expect("a");
        {
            let lock = a.lock().expect("lock");
            assert_eq!(lock.claim(30).expect("claim"), Claim::Claimed);
            assert_eq!(lock.claim(31).expect("claim"), Claim::Claimed);
        }
        // a's database has a sandbox on slot 31 (it keeps running while a is stopped).
        let store = crate::store::SqliteStore::open(&h.a.path().join("state.db")).expect("store");
        drop(store);
        let db = rusqlite::Connection::open(h.a.path().join("state.db")).expect("db");
        db.execute(
            "INSERT INTO sandboxes (id, state, uid_slot, record) VALUES ('sbx_x', 'running', 31, '{}')",
            [],
        )
        .expect("insert");
        drop(db);
        drop(a); // a stops: its owner lock goes
        let b = UidSlots::open(h.claims.path(), h.b.path()).expect("b");
        let lock = b.lock().expect("lock");
        assert_eq!(
            lock.claim(30).expect("claim"),
            Claim::Claimed,
            "stale: no record"
        );
        assert_eq!(
            lock.claim(31).expect("claim"),
            Claim::Taken,
            "a's sandbox holds it"
        );
        let owner = fs::read_to_string(h.claims.path().join("30")).expect("claim file");
        let b_dir = fs::canonicalize(h.b.path()).expect("canonical");
        assert_eq!(owner, format!("{}\n", b_dir.display()));
    }

    #[test]
    fn reconcile_reclaims_held_slots_and_drops_the_rest() {
        let h = host();
        let a = UidSlots::open(h.claims.path(), h.a.path()).expect("a");
        {
            let lock = a.lock().expect("lock");
            lock.claim(40).expect("claim");
            lock.claim(41).expect("claim");
        }
        fs::remove_file(h.claims.path().join("40")).expect("a reboot emptied /run");
        let held: BTreeSet<u32> = [40, 42].into_iter().collect();
        a.lock().expect("lock").reconcile(&held).expect("reconcile");
        let mut names: Vec<String> = fs::read_dir(h.claims.path())
            .expect("list")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "lock")
            .collect();
        names.sort();
        assert_eq!(names, ["40", "42"]);
    }

    #[test]
    fn one_state_directory_cannot_be_opened_by_two_servers() {
        let h = host();
        let _a = UidSlots::open(h.claims.path(), h.a.path()).expect("a");
        let err = UidSlots::open(h.claims.path(), h.a.path()).expect_err("second");
        let a_dir = fs::canonicalize(h.a.path()).expect("canonical");
        assert_eq!(
            err.to_string(),
            format!(
                "another hutch server is running on the state directory {}",
                a_dir.display()
            )
        );
    }
}
