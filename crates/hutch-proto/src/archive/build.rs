//! Making a tar stream of a directory in steps (blocking), so a caller can run each step as
//! one short job and send its bytes before asking for more.
//!
//! Headers come from `tar::Builder` (long names and targets as GNU `L`/`K` entries); a file's
//! data is then copied in chunks of at most the step's size. The walk never follows a
//! symlink: entries are lstat'ed, only real directories are entered, files are opened with
//! `O_NOFOLLOW | O_NONBLOCK` and checked to be regular after the open.

use std::fs::{self, File, Metadata, OpenOptions, ReadDir};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use tar::{Builder, EntryType, Header};

use super::{ArchiveError, ArchiveResult};

/// A directory being walked: where it is and its prefix in the archive (`""` or `"a/b/"`).
struct Walking {
    dir: PathBuf,
    prefix: Vec<u8>,
    entries: ReadDir,
}

/// File data still to copy.
struct Copying {
    file: File,
    remaining: u64,
    padding: usize,
    /// The file ended before its header's size: the rest is zeros.
    shrunk: bool,
}

/// What a directory walk does with one entry ([`ArchiveWriter::with_filter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkChoice {
    /// Archive it (a directory with everything below it that the filter keeps).
    Include,
    /// Leave it out, and for a directory everything below it.
    Skip,
    /// Leave the entry itself out but walk a directory's contents (an entry kept below it
    /// is unpacked with its parents created). For anything else the same as `Skip`.
    EnterOnly,
}

/// The filter of a directory walk: the entry's path in the archive (no trailing `/`) and
/// whether it is a directory (lstat: a symlink to one is not).
type WalkFilter = Box<dyn FnMut(&[u8], bool) -> WalkChoice + Send>;

/// A tar stream of one directory (or file), made step by step.
pub struct ArchiveWriter {
    builder: Builder<Vec<u8>>,
    stack: Vec<Walking>,
    filter: Option<WalkFilter>,
    single: Option<(PathBuf, Vec<u8>)>,
    copying: Option<Copying>,
    finished: bool,
    entries: u64,
    file_bytes: u64,
}

fn header_for(meta: &Metadata, kind: EntryType, size: u64) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(meta.mode() & 0o7777);
    h.set_mtime(meta.mtime().max(0) as u64);
    h.set_uid(u64::from(meta.uid()));
    h.set_gid(u64::from(meta.gid()));
    h.set_size(size);
    h
}

impl ArchiveWriter {
    /// An archive of `path`: a directory's contents, or a file or symlink as one entry.
    pub fn open(path: &Path) -> ArchiveResult<Self> {
        let shown = path.display().to_string();
        let meta = fs::symlink_metadata(path).map_err(|e| ArchiveError::io("stat", &shown, e))?;
        let mut writer = Self {
            builder: Builder::new(Vec::new()),
            stack: Vec::new(),
            filter: None,
            single: None,
            copying: None,
            finished: false,
            entries: 0,
            file_bytes: 0,
        };
        if meta.is_dir() {
            let entries = fs::read_dir(path).map_err(|e| ArchiveError::io("list", &shown, e))?;
            writer.stack.push(Walking {
                dir: path.to_path_buf(),
                prefix: Vec::new(),
                entries,
            });
        } else {
            let name = path
                .file_name()
                .map(|n| n.as_bytes().to_vec())
                .ok_or_else(|| ArchiveError::refused(shown.as_bytes(), "a path without a name"))?;
            writer.single = Some((path.to_path_buf(), name));
        }
        Ok(writer)
    }

    /// Walk a directory through `filter`, called for every entry below it before it is
    /// archived (a `.dockerignore` applied by the CLI). Not called for a single file.
    pub fn with_filter(
        mut self,
        filter: impl FnMut(&[u8], bool) -> WalkChoice + Send + 'static,
    ) -> Self {
        self.filter = Some(Box::new(filter));
        self
    }

    /// Entries archived so far.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Bytes of file data archived so far (as the headers give them).
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    /// The next bytes of the stream, about `max` of them (more when one header is longer);
    /// `None` once the archive is complete.
    pub fn next_chunk(&mut self, max: usize) -> ArchiveResult<Option<Vec<u8>>> {
        if self.finished && self.builder.get_ref().is_empty() {
            return Ok(None);
        }
        while !self.finished && self.builder.get_ref().len() < max {
            let room = max - self.builder.get_ref().len();
            if let Some(copy) = &mut self.copying {
                Self::copy_some(self.builder.get_mut(), copy, room)?;
                if copy.remaining == 0 {
                    let padding = copy.padding;
                    self.builder
                        .get_mut()
                        .extend(std::iter::repeat_n(0u8, padding));
                    self.copying = None;
                }
                continue;
            }
            match self.next_entry()? {
                Some((path, name, meta)) => self.add(&path, name, &meta)?,
                None => {
                    self.builder
                        .finish()
                        .map_err(|e| ArchiveError::io("finish", "archive", e))?;
                    self.finished = true;
                }
            }
        }
        Ok(Some(std::mem::take(self.builder.get_mut())))
    }

    /// The next path to archive, its name in the archive and its lstat.
    fn next_entry(&mut self) -> ArchiveResult<Option<(PathBuf, Vec<u8>, Metadata)>> {
        if let Some((path, name)) = self.single.take() {
            let meta = fs::symlink_metadata(&path)
                .map_err(|e| ArchiveError::io("stat", path.display().to_string(), e))?;
            return Ok(Some((path, name, meta)));
        }
        while let Some(top) = self.stack.last_mut() {
            let Some(item) = top.entries.next() else {
                self.stack.pop();
                continue;
            };
            let item =
                item.map_err(|e| ArchiveError::io("list", top.dir.display().to_string(), e))?;
            let path = item.path();
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue; // gone since it was listed
            };
            let mut name = top.prefix.clone();
            name.extend_from_slice(item.file_name().as_bytes());
            let choice = match &mut self.filter {
                Some(filter) => filter(&name, meta.is_dir()),
                None => WalkChoice::Include,
            };
            match choice {
                WalkChoice::Include => return Ok(Some((path, name, meta))),
                WalkChoice::Skip => continue,
                WalkChoice::EnterOnly if meta.is_dir() => {
                    let Ok(entries) = fs::read_dir(&path) else {
                        continue; // gone since it was listed
                    };
                    name.push(b'/');
                    self.stack.push(Walking {
                        dir: path,
                        prefix: name,
                        entries,
                    });
                }
                WalkChoice::EnterOnly => continue,
            }
        }
        Ok(None)
    }

    fn add(&mut self, path: &Path, mut name: Vec<u8>, meta: &Metadata) -> ArchiveResult<()> {
        let shown = || path.display().to_string();
        let ft = meta.file_type();
        if ft.is_dir() {
            let entries = fs::read_dir(path).map_err(|e| ArchiveError::io("list", shown(), e))?;
            name.push(b'/');
            let mut h = header_for(meta, EntryType::Directory, 0);
            self.builder
                .append_data(
                    &mut h,
                    Path::new(std::ffi::OsStr::from_bytes(&name)),
                    std::io::empty(),
                )
                .map_err(|e| ArchiveError::io("archive", shown(), e))?;
            self.stack.push(Walking {
                dir: path.to_path_buf(),
                prefix: name,
                entries,
            });
            self.entries += 1;
        } else if ft.is_symlink() {
            let target =
                fs::read_link(path).map_err(|e| ArchiveError::io("readlink", shown(), e))?;
            let mut h = header_for(meta, EntryType::Symlink, 0);
            self.builder
                .append_link(
                    &mut h,
                    Path::new(std::ffi::OsStr::from_bytes(&name)),
                    &target,
                )
                .map_err(|e| ArchiveError::io("archive", shown(), e))?;
            self.entries += 1;
        } else if ft.is_file() {
            let file = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(path);
            let Ok(file) = file else {
                return Ok(()); // replaced by a symlink or gone since it was listed
            };
            let meta = file
                .metadata()
                .map_err(|e| ArchiveError::io("stat", shown(), e))?;
            if !meta.is_file() {
                return Ok(());
            }
            let size = meta.len();
            let mut h = header_for(&meta, EntryType::Regular, size);
            // The header alone: the data follows in chunks (copy_some).
            self.builder
                .append_data(
                    &mut h,
                    Path::new(std::ffi::OsStr::from_bytes(&name)),
                    std::io::empty(),
                )
                .map_err(|e| ArchiveError::io("archive", shown(), e))?;
            self.entries += 1;
            self.file_bytes += size;
            self.copying = Some(Copying {
                file,
                remaining: size,
                padding: ((512 - size % 512) % 512) as usize,
                shrunk: false,
            });
        }
        // FIFOs, sockets and devices are left out.
        Ok(())
    }

    /// Copy up to `room` bytes of the file; a file that shrank is padded with zeros.
    fn copy_some(out: &mut Vec<u8>, copy: &mut Copying, room: usize) -> ArchiveResult<()> {
        let want = (copy.remaining.min(room.max(1) as u64)) as usize;
        let start = out.len();
        out.resize(start + want, 0);
        if copy.shrunk {
            copy.remaining -= want as u64;
            return Ok(());
        }
        let n = loop {
            match copy.file.read(&mut out[start..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ArchiveError::io("read", "a file of the archive", e)),
            }
        };
        if n == 0 {
            // The file shrank: its header promised `remaining` more bytes, zeros from here.
            copy.shrunk = true;
            copy.remaining -= want as u64;
            return Ok(());
        }
        out.truncate(start + n);
        copy.remaining -= n as u64;
        Ok(())
    }
}
