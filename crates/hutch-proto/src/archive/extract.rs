//! Unpacking parsed entries below a destination directory, never outside it (blocking).
//!
//! Every path is checked before anything is created, then walked from the destination's
//! directory descriptor one component at a time with `openat(O_NOFOLLOW | O_DIRECTORY)`:
//! a symlink anywhere on the way, planted by the archive or there before, fails the open
//! instead of being followed. The final component is created with `O_EXCL | O_NOFOLLOW`
//! after whatever non-directory was there is unlinked (never followed).

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use super::{ArchiveError, ArchiveResult, EntryHeader, EntryKind, TarEvent};

/// How to unpack.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExtractOptions {
    /// Keep setuid, setgid and sticky bits (the agent inside a sandbox does; the CLI on the
    /// user's machine does not).
    pub keep_special_bits: bool,
    /// Give entries the numeric owners the archive records (the agent, for a Dockerfile
    /// build's `COPY`, as root of its sandbox); otherwise they belong to whoever unpacks.
    pub keep_owners: bool,
}

/// A file being written.
struct OpenFile {
    file: File,
    path: Vec<u8>,
    mode: u32,
    mtime: u64,
}

/// Applies [`TarEvent`]s below one directory.
pub struct Extractor {
    root: OwnedFd,
    options: ExtractOptions,
    current: Option<OpenFile>,
    entries: u64,
    bytes: u64,
}

/// The result of a libc call: `-1` becomes the thread's `errno`.
fn cvt(ret: libc::c_int) -> std::io::Result<libc::c_int> {
    if ret == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn c_name(name: &[u8]) -> CString {
    CString::new(name).expect("entry paths were checked to hold no NUL byte")
}

fn lossy(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

/// The components of an entry's path, refused if it is absolute, climbs with `..` or holds
/// a NUL. `.` and empty components are dropped; an empty result is the destination itself.
pub(super) fn components(path: &[u8]) -> ArchiveResult<Vec<&[u8]>> {
    if path.first() == Some(&b'/') {
        return Err(ArchiveError::refused(
            path,
            "absolute paths are not unpacked",
        ));
    }
    if path.contains(&0) {
        return Err(ArchiveError::refused(path, "a path with a NUL byte"));
    }
    let mut out = Vec::new();
    for part in path.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => {
                return Err(ArchiveError::refused(
                    path,
                    "paths with a `..` component are not unpacked",
                ))
            }
            name => out.push(name),
        }
    }
    Ok(out)
}

/// Check a symlink target stays below the destination when resolved from the link's own
/// directory (`depth` components below the destination).
pub(super) fn check_symlink_target(path: &[u8], target: &[u8], depth: usize) -> ArchiveResult<()> {
    if target.is_empty() || target.contains(&0) {
        return Err(ArchiveError::refused(
            path,
            "a symlink with an empty or NUL target",
        ));
    }
    if target.first() == Some(&b'/') {
        return Err(ArchiveError::refused(
            path,
            "a symlink to an absolute path points outside the destination",
        ));
    }
    let mut level = depth as i64;
    for part in target.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => level -= 1,
            _ => level += 1,
        }
        if level < 0 {
            return Err(ArchiveError::refused(
                path,
                "a symlink whose target climbs out of the destination",
            ));
        }
    }
    Ok(())
}

/// `openat(dir, name, flags)`.
fn open_at(
    dir: RawFd,
    name: &[u8],
    flags: libc::c_int,
    mode: libc::mode_t,
) -> std::io::Result<OwnedFd> {
    let name = c_name(name);
    // SAFETY: `name` is a valid C string for the call; the returned fd is new and ours.
    let fd = cvt(unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC, mode) })?;
    // SAFETY: `fd` was just returned by openat and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: the entry's type bits, if it exists.
fn file_type_at(dir: RawFd, name: &[u8]) -> std::io::Result<Option<libc::mode_t>> {
    let name = c_name(name);
    // SAFETY: fstatat writes into the zeroed struct we pass.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is a valid C string and `st` a valid out-pointer.
    match cvt(unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) }) {
        Ok(_) => Ok(Some(st.st_mode & libc::S_IFMT)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

impl Extractor {
    /// Unpack below `dir`, created (with its parents) if missing. `dir` itself is resolved
    /// normally: the caller names it.
    pub fn open(dir: &Path, options: ExtractOptions) -> ArchiveResult<Self> {
        let shown = dir.display().to_string();
        std::fs::create_dir_all(dir).map_err(|e| ArchiveError::io("mkdir", &shown, e))?;
        let root = File::open(dir).map_err(|e| ArchiveError::io("open", &shown, e))?;
        if !root
            .metadata()
            .map_err(|e| ArchiveError::io("stat", &shown, e))?
            .is_dir()
        {
            return Err(ArchiveError::io(
                "unpack into",
                shown,
                std::io::Error::from_raw_os_error(libc::ENOTDIR),
            ));
        }
        Ok(Self {
            root: root.into(),
            options,
            current: None,
            entries: 0,
            bytes: 0,
        })
    }

    /// Entries unpacked so far.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// File bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Apply one event of the parser.
    pub fn apply(&mut self, event: TarEvent) -> ArchiveResult<()> {
        match event {
            TarEvent::Entry(header) => self.begin(header),
            TarEvent::Data(data) => match &mut self.current {
                Some(open) => {
                    open.file
                        .write_all(&data)
                        .map_err(|e| ArchiveError::io("write", lossy(&open.path), e))?;
                    self.bytes += data.len() as u64;
                    Ok(())
                }
                None => Ok(()),
            },
            TarEvent::EntryEnd => self.end_file(),
            TarEvent::End => Ok(()),
        }
    }

    fn mode_bits(&self, mode: u32) -> u32 {
        if self.options.keep_special_bits {
            mode & 0o7777
        } else {
            mode & 0o777
        }
    }

    /// Open (creating as needed) the directory holding the last of `parts`, walking without
    /// following symlinks.
    fn parent(&self, path: &[u8], parts: &[&[u8]]) -> ArchiveResult<OwnedFd> {
        let mut dir = open_at(
            self.root.as_raw_fd(),
            b".",
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )
        .map_err(|e| ArchiveError::io("open", ".", e))?;
        let dir_flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        for part in &parts[..parts.len().saturating_sub(1)] {
            let next = match open_at(dir.as_raw_fd(), part, dir_flags, 0) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    let name = c_name(part);
                    // SAFETY: `name` is a valid C string; mkdirat only reads it.
                    match cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o755) }) {
                        Ok(_) => {}
                        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                        Err(e) => return Err(ArchiveError::io("mkdir", lossy(path), e)),
                    }
                    open_at(dir.as_raw_fd(), part, dir_flags, 0)
                }
                other => other,
            };
            dir = next.map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => ArchiveError::refused(
                    path,
                    format!(
                        "{} is a symlink or a file, not a directory",
                        String::from_utf8_lossy(part)
                    ),
                ),
                _ => ArchiveError::io("open", lossy(path), e),
            })?;
        }
        Ok(dir)
    }

    /// Remove a non-directory at `name` in `dir` (never following it) so it can be replaced.
    fn clear(dir: RawFd, name: &[u8], path: &[u8]) -> ArchiveResult<()> {
        match file_type_at(dir, name).map_err(|e| ArchiveError::io("stat", lossy(path), e))? {
            None => Ok(()),
            Some(libc::S_IFDIR) => Err(ArchiveError::refused(
                path,
                "a directory is where the archive has a file or link",
            )),
            Some(_) => {
                let c = c_name(name);
                // SAFETY: `c` is a valid C string; unlinkat removes the name, never follows it.
                cvt(unsafe { libc::unlinkat(dir, c.as_ptr(), 0) })
                    .map(drop)
                    .map_err(|e| ArchiveError::io("unlink", lossy(path), e))
            }
        }
    }

    fn begin(&mut self, header: EntryHeader) -> ArchiveResult<()> {
        self.end_file()?;
        let path = header.path.clone();
        let parts = components(&path)?;
        let Some(name) = parts.last().copied() else {
            // The destination itself (`./`): nothing to create.
            return match header.kind {
                EntryKind::Dir => Ok(()),
                _ => Err(ArchiveError::refused(&path, "an entry without a name")),
            };
        };
        if let EntryKind::Symlink(target) = &header.kind {
            check_symlink_target(&path, target, parts.len() - 1)?;
        }
        let link_parts = match &header.kind {
            EntryKind::HardLink(target) => {
                let parts = components(target).map_err(|_| {
                    ArchiveError::refused(&path, "a hard link to a path outside the destination")
                })?;
                if parts.is_empty() {
                    return Err(ArchiveError::refused(
                        &path,
                        "a hard link to the destination",
                    ));
                }
                Some(parts)
            }
            _ => None,
        };
        if let EntryKind::Other(kind) = header.kind {
            return Err(ArchiveError::refused(
                &path,
                format!(
                    "entries of tar type {:?} (devices, FIFOs, sparse files) are not unpacked",
                    kind as char
                ),
            ));
        }
        let dir = self.parent(&path, &parts)?;
        let mode = self.mode_bits(header.mode);
        match &header.kind {
            EntryKind::Dir => {
                let c = c_name(name);
                // SAFETY: `c` is a valid C string; mkdirat only reads it.
                match cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o700) }) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                    Err(e) => return Err(ArchiveError::io("mkdir", lossy(&path), e)),
                }
                let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
                let made = open_at(dir.as_raw_fd(), name, flags, 0).map_err(|e| {
                    match e.raw_os_error() {
                        Some(libc::ELOOP) | Some(libc::ENOTDIR) => ArchiveError::refused(
                            &path,
                            "a symlink or file is where the archive has a directory",
                        ),
                        _ => ArchiveError::io("open", lossy(&path), e),
                    }
                })?;
                self.chown_fd(made.as_raw_fd(), &header, &path)?;
                // SAFETY: fchmod on a descriptor we own.
                cvt(unsafe { libc::fchmod(made.as_raw_fd(), mode | 0o700) })
                    .map_err(|e| ArchiveError::io("chmod", lossy(&path), e))?;
            }
            EntryKind::File => {
                Self::clear(dir.as_raw_fd(), name, &path)?;
                let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
                let fd = open_at(dir.as_raw_fd(), name, flags, 0o600)
                    .map_err(|e| ArchiveError::io("create", lossy(&path), e))?;
                // Owner before mode: chown clears setuid and setgid.
                self.chown_fd(fd.as_raw_fd(), &header, &path)?;
                self.current = Some(OpenFile {
                    file: File::from(fd),
                    path: path.clone(),
                    mode,
                    mtime: header.mtime,
                });
            }
            EntryKind::Symlink(target) => {
                Self::clear(dir.as_raw_fd(), name, &path)?;
                let (t, c) = (c_name(target), c_name(name));
                // SAFETY: both are valid C strings; symlinkat only reads them.
                cvt(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), c.as_ptr()) })
                    .map_err(|e| ArchiveError::io("symlink", lossy(&path), e))?;
                if self.options.keep_owners {
                    // SAFETY: `c` is a valid C string; AT_SYMLINK_NOFOLLOW changes the link
                    // itself, never what it points to.
                    cvt(unsafe {
                        libc::fchownat(
                            dir.as_raw_fd(),
                            c.as_ptr(),
                            header.uid,
                            header.gid,
                            libc::AT_SYMLINK_NOFOLLOW,
                        )
                    })
                    .map_err(|e| ArchiveError::io("chown", lossy(&path), e))?;
                }
            }
            EntryKind::HardLink(_) => {
                let link_parts = link_parts.expect("hard links have their target's parts");
                let target = link_parts.join(&b'/');
                let source_dir = self.parent(&target, &link_parts)?;
                let source = link_parts.last().copied().expect("checked non-empty");
                Self::clear(dir.as_raw_fd(), name, &path)?;
                let (s, c) = (c_name(source), c_name(name));
                // SAFETY: both are valid C strings; flags 0 link the name itself, never the
                // target of a symlink.
                cvt(unsafe {
                    libc::linkat(
                        source_dir.as_raw_fd(),
                        s.as_ptr(),
                        dir.as_raw_fd(),
                        c.as_ptr(),
                        0,
                    )
                })
                .map_err(|e| ArchiveError::io("link", lossy(&path), e))?;
            }
            EntryKind::Other(_) => unreachable!("refused above"),
        }
        self.entries += 1;
        Ok(())
    }

    /// Give the entry open at `fd` the archive's owner, with [`ExtractOptions::keep_owners`].
    fn chown_fd(&self, fd: RawFd, header: &EntryHeader, path: &[u8]) -> ArchiveResult<()> {
        if !self.options.keep_owners {
            return Ok(());
        }
        // SAFETY: fchown on a descriptor the caller holds open.
        cvt(unsafe { libc::fchown(fd, header.uid, header.gid) })
            .map(drop)
            .map_err(|e| ArchiveError::io("chown", lossy(path), e))
    }

    /// Finish the file being written: its mode and modification time.
    fn end_file(&mut self) -> ArchiveResult<()> {
        let Some(open) = self.current.take() else {
            return Ok(());
        };
        let fd = open.file.as_raw_fd();
        // SAFETY: fchmod on a descriptor we own.
        cvt(unsafe { libc::fchmod(fd, open.mode) })
            .map_err(|e| ArchiveError::io("chmod", lossy(&open.path), e))?;
        let time = libc::timespec {
            tv_sec: open.mtime.min(i64::MAX as u64) as libc::time_t,
            tv_nsec: 0,
        };
        let times = [time, time];
        // SAFETY: `times` is two valid timespecs; futimens only reads them.
        cvt(unsafe { libc::futimens(fd, times.as_ptr()) })
            .map_err(|e| ArchiveError::io("set times of", lossy(&open.path), e))?;
        Ok(())
    }

    /// Finish the last file; call once the stream ended.
    pub fn finish(mut self) -> ArchiveResult<(u64, u64)> {
        self.end_file()?;
        Ok((self.entries, self.bytes))
    }
}
