//! Blocking filesystem operations behind the file routes. Run them on a blocking thread.
//!
//! Rules shared by every operation: paths are absolute (checked by the caller), final
//! symlinks are never followed by stat/remove/list entries, and errors keep their errno so
//! the host gets `not_found`, `not_empty`, `no_space`, ... rather than a generic failure.

use std::fs::{self, File, Metadata, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use hutch_proto::{FileEntry, FileType};

use crate::error::{Failure, Result};
use hutch_proto::time::rfc3339_utc;

/// Most entries one listing returns.
pub const MAX_LIST_ENTRIES: usize = 100_000;
/// Mode of files created without an explicit one.
pub const DEFAULT_FILE_MODE: u32 = 0o644;

/// Parse a mode like `0644`, `644` or `0o755`.
pub fn parse_mode(text: &str) -> Result<u32> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    let bad = || Failure::BadRequest(format!("mode must be octal like 0644, got {text:?}"));
    if digits.is_empty() || digits.len() > 5 {
        return Err(bad());
    }
    let mode = u32::from_str_radix(digits, 8).map_err(|_| bad())?;
    if mode > 0o7777 {
        return Err(bad());
    }
    Ok(mode)
}

/// The entry for `path` itself (lstat: a symlink is reported as one).
pub fn stat(path: &str) -> Result<FileEntry> {
    let meta = fs::symlink_metadata(path).map_err(|e| Failure::io("stat", path, e))?;
    Ok(entry(Path::new(path), path.to_string(), &meta))
}

fn entry(on_disk: &Path, path: String, meta: &Metadata) -> FileEntry {
    let ft = meta.file_type();
    let file_type = if ft.is_symlink() {
        FileType::Symlink
    } else if ft.is_dir() {
        FileType::Dir
    } else if ft.is_file() {
        FileType::File
    } else {
        FileType::Other
    };
    let symlink_target = if ft.is_symlink() {
        fs::read_link(on_disk)
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    let name = match path.trim_end_matches('/').rsplit_once('/') {
        Some((_, name)) if !name.is_empty() => name.to_string(),
        _ => "/".to_string(),
    };
    FileEntry {
        name,
        path,
        file_type,
        size: meta.len(),
        mode: meta.permissions().mode() & 0o7777,
        modified_at: rfc3339_utc(meta.mtime()),
        symlink_target,
    }
}

/// Entries below the directory `path`, `depth` levels deep, sorted by path. Symlinks are
/// listed, not followed; unreadable subdirectories are listed without their contents.
pub fn list(path: &str, depth: u32) -> Result<Vec<FileEntry>> {
    if depth == 0 {
        return Err(Failure::BadRequest("depth must be at least 1".into()));
    }
    let meta = fs::metadata(path).map_err(|e| Failure::io("list", path, e))?;
    if !meta.is_dir() {
        return Err(Failure::NotADirectory(format!(
            "list {path}: not a directory"
        )));
    }
    let base = match path.trim_end_matches('/') {
        "" => String::new(),
        trimmed => trimmed.to_string(),
    };
    let mut entries = Vec::new();
    let mut pending = vec![(base, 1u32)];
    let mut first = true;
    while let Some((dir, level)) = pending.pop() {
        let on_disk = if dir.is_empty() { "/" } else { dir.as_str() };
        let reader = match fs::read_dir(on_disk) {
            Ok(reader) => reader,
            Err(e) if first => return Err(Failure::io("list", path, e)),
            Err(_) => continue,
        };
        first = false;
        for item in reader.flatten() {
            let name = item.file_name().to_string_lossy().into_owned();
            let child = format!("{dir}/{name}");
            let Ok(meta) = fs::symlink_metadata(item.path()) else {
                continue;
            };
            if meta.is_dir() && level < depth {
                pending.push((child.clone(), level + 1));
            }
            entries.push(entry(&item.path(), child, &meta));
            if entries.len() > MAX_LIST_ENTRIES {
                return Err(Failure::BadRequest(format!(
                    "{path} has more than {MAX_LIST_ENTRIES} entries within depth {depth}; list with a smaller depth"
                )));
            }
        }
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(entries)
}

/// Remove a file, symlink or (with `recursive`) directory tree, never following symlinks.
pub fn remove(path: &str, recursive: bool) -> Result<()> {
    if path.trim_end_matches('/').is_empty() {
        return Err(Failure::BadRequest("refusing to remove /".into()));
    }
    let meta = fs::symlink_metadata(path).map_err(|e| Failure::io("remove", path, e))?;
    let result = if meta.is_dir() {
        if recursive {
            fs::remove_dir_all(path)
        } else {
            fs::remove_dir(path)
        }
    } else {
        fs::remove_file(path)
    };
    result.map_err(|e| Failure::io("remove", path, e))
}

/// Create a directory and its parents; fine if it already is a directory.
pub fn mkdir(path: &str) -> Result<()> {
    match fs::create_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Err(Failure::AlreadyExists(format!(
            "mkdir {path}: exists and is not a directory"
        ))),
        Err(e) => Err(Failure::io("mkdir", path, e)),
    }
}

/// Rename `from` to `to`, creating `to`'s parents.
pub fn rename(from: &str, to: &str) -> Result<()> {
    if from.trim_end_matches('/').is_empty() || to.trim_end_matches('/').is_empty() {
        return Err(Failure::BadRequest("cannot move /".into()));
    }
    fs::symlink_metadata(from).map_err(|e| Failure::io("move", from, e))?;
    create_parents(to)?;
    fs::rename(from, to).map_err(|e| Failure::io("move", format!("{from} to {to}"), e))
}

fn create_parents(path: &str) -> Result<()> {
    match Path::new(path).parent() {
        Some(parent) if !parent.as_os_str().is_empty() => match fs::create_dir_all(parent) {
            Ok(()) => Ok(()),
            // create_dir_all meets a file where a directory should be.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Err(Failure::NotADirectory(
                format!("{path}: {} is not a directory", parent.display()),
            )),
            Err(e) => Err(Failure::io("create parent of", path, e)),
        },
        _ => Ok(()),
    }
}

/// Open a regular file for reading (directories and special files are refused; the open
/// does not block on a FIFO).
pub fn open_read(path: &str) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Failure::io("open", path, e))?;
    let ft = file
        .metadata()
        .map_err(|e| Failure::io("stat", path, e))?
        .file_type();
    if ft.is_dir() {
        return Err(Failure::IsADirectory(format!(
            "read {path}: is a directory"
        )));
    }
    if !ft.is_file() {
        let what = if ft.is_fifo() {
            "a FIFO"
        } else {
            "not a regular file"
        };
        return Err(Failure::BadRequest(format!("read {path}: {what}")));
    }
    Ok(file)
}

/// Create or truncate `path` (parents created) for writing. With `mode`, the file gets
/// exactly that mode; without, a new file gets 0644 and an existing file keeps its own.
/// FIFOs and sockets are refused (a write could block forever); character devices such as
/// `/dev/null` are allowed.
pub fn open_write(path: &str, mode: Option<u32>) -> Result<File> {
    create_parents(path)?;
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode.unwrap_or(DEFAULT_FILE_MODE))
        // Opening a FIFO without a reader must fail (ENXIO), not block.
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENXIO) => Failure::BadRequest(format!("write {path}: not a regular file")),
            _ => Failure::io("open", path, e),
        })?;
    let ft = file
        .metadata()
        .map_err(|e| Failure::io("stat", path, e))?
        .file_type();
    if ft.is_fifo() || ft.is_socket() {
        return Err(Failure::BadRequest(format!(
            "write {path}: not a regular file"
        )));
    }
    crate::sys::set_nonblocking(file.as_raw_fd(), false)
        .map_err(|e| Failure::io("open", path, e))?;
    if let Some(mode) = mode {
        if ft.is_file() {
            // The umask narrowed the mode of a new file, and an existing file kept its own.
            file.set_permissions(fs::Permissions::from_mode(mode))
                .map_err(|e| Failure::io("chmod", path, e))?;
        }
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_modes() {
        assert_eq!(parse_mode("0644").expect("valid"), 0o644);
        assert_eq!(parse_mode("755").expect("valid"), 0o755);
        assert_eq!(parse_mode("0o4755").expect("valid"), 0o4755);
        for bad in ["", "0x644", "999", "17777", "rw-r--r--"] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn entry_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f.txt");
        fs::write(&p, "abc").expect("write");
        let e = stat(p.to_str().expect("utf-8")).expect("stat");
        assert_eq!(
            (e.name.as_str(), e.size, e.file_type),
            ("f.txt", 3, FileType::File)
        );
        assert_eq!(stat("/").expect("root").name, "/");
    }
}
