//! Blocking filesystem operations behind the file routes. Run them on a blocking thread.
//!
//! Rules shared by every operation: paths are absolute (checked by the caller), final
//! symlinks are never followed by stat/remove/list entries, and errors keep their errno so
//! the host gets `not_found`, `not_empty`, `no_space`, ... rather than a generic failure.

use std::fs::{self, File, Metadata, OpenOptions};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use hutch_proto::{FileEntry, FileType};

use crate::error::{Failure, Result};
use crate::passwd::Owners;
use hutch_proto::time::rfc3339_utc;

/// Most entries one listing returns.
pub const MAX_LIST_ENTRIES: usize = 100_000;
/// Mode of files created without an explicit one.
pub const DEFAULT_FILE_MODE: u32 = 0o644;
/// Most bytes read of a file on a [generated filesystem](GENERATED_FILESYSTEMS).
pub const MAX_GENERATED_FILE_BYTES: usize = 1 << 20;

/// Filesystems whose files the kernel generates as they are read: their size says nothing
/// (0 or 4096) and some never end (`/proc/self/pagemap` spans the whole address space, 7 GB
/// in 8 s), so a read of one is bounded by [`MAX_GENERATED_FILE_BYTES`] instead.
const GENERATED_FILESYSTEMS: [(i64, &str); 14] = [
    (libc::PROC_SUPER_MAGIC, "procfs"),
    (libc::SYSFS_MAGIC, "sysfs"),
    (libc::DEBUGFS_MAGIC, "debugfs"),
    (libc::TRACEFS_MAGIC, "tracefs"),
    (libc::SECURITYFS_MAGIC, "securityfs"),
    (libc::CGROUP_SUPER_MAGIC, "cgroup"),
    (libc::CGROUP2_SUPER_MAGIC, "cgroup2"),
    (libc::BPF_FS_MAGIC, "bpf"),
    (libc::SELINUX_MAGIC, "selinuxfs"),
    (libc::SMACK_MAGIC, "smackfs"),
    (libc::NSFS_MAGIC, "nsfs"),
    (0x6265_6570, "configfs"),
    (0xde5e_81e4, "efivarfs"),
    (0x6165_676c, "pstore"),
];

/// The name of the generated filesystem `file` is on, if it is on one.
fn generated_filesystem(file: &File) -> std::io::Result<Option<&'static str>> {
    let magic = crate::sys::filesystem_type(file.as_raw_fd())?;
    Ok(GENERATED_FILESYSTEMS
        .iter()
        .find(|(m, _)| *m == magic)
        .map(|(_, name)| *name))
}

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
    stat_with(path, &Owners::load())
}

/// [`stat`] with owner names from `owners` (read once by the caller).
pub fn stat_with(path: &str, owners: &Owners) -> Result<FileEntry> {
    let meta = fs::symlink_metadata(path).map_err(|e| Failure::io("stat", path, e))?;
    Ok(entry(Path::new(path), path.to_string(), &meta, owners))
}

fn entry(on_disk: &Path, path: String, meta: &Metadata, owners: &Owners) -> FileEntry {
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
        uid: meta.uid(),
        gid: meta.gid(),
        owner: owners.user(meta.uid()).map(str::to_string),
        group: owners.group(meta.gid()).map(str::to_string),
        symlink_target,
        metadata: super::xattr::read(on_disk),
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
    let owners = Owners::load();
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
            entries.push(entry(&item.path(), child, &meta, &owners));
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

/// A file opened for reading.
pub struct ReadableFile {
    /// The open file.
    pub file: File,
    /// The generated filesystem it is on (`procfs`, `sysfs`, …), whose files are read
    /// whole and bounded ([`read_generated`]) rather than streamed.
    pub generated: Option<&'static str>,
}

/// Open a regular file for reading (directories and special files are refused; the open
/// does not block on a FIFO). Which filesystem it is on is judged on the opened file, so a
/// symlink to `/proc/…` is judged as `/proc`.
pub fn open_read(path: &str) -> Result<ReadableFile> {
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
    let generated = generated_filesystem(&file).map_err(|e| Failure::io("statfs", path, e))?;
    Ok(ReadableFile { file, generated })
}

/// Read the whole of a file on the generated filesystem `filesystem`, refusing (before
/// anything is sent) one longer than [`MAX_GENERATED_FILE_BYTES`].
pub fn read_generated(mut file: File, path: &str, filesystem: &str) -> Result<Vec<u8>> {
    let limit = MAX_GENERATED_FILE_BYTES;
    let mut data = Vec::new();
    // Whole 64 KiB reads (not `take`'s odd remainders): `pagemap` refuses a read whose size
    // is not a multiple of 8 with EINVAL.
    let mut chunk = vec![0u8; 64 << 10];
    while data.len() <= limit {
        let n = match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(Failure::BadRequest(format!(
                    "read {path}: a stream on {filesystem} with nothing to read now; read it with exec"
                )))
            }
            Err(e) => return Err(Failure::io("read", path, e)),
        };
        data.extend_from_slice(&chunk[..n]);
    }
    if data.len() > limit {
        return Err(Failure::BadRequest(format!(
            "read {path}: files on {filesystem} are generated as they are read, and the files \
             API reads at most {limit} bytes (1 MiB) of one; this one is longer: read it with \
             exec (e.g. `head -c`)"
        )));
    }
    Ok(data)
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
    fn generated_files_are_read_whole_up_to_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("big");
        fs::write(&p, vec![7u8; 3 * MAX_GENERATED_FILE_BYTES]).expect("write");
        let on_disk = open_read(p.to_str().expect("utf-8")).expect("open");
        assert_eq!(on_disk.generated, None, "a file on disk is streamed");

        let status = open_read("/proc/self/status").expect("open");
        assert_eq!(status.generated, Some("procfs"));
        let text = read_generated(status.file, "/proc/self/status", "procfs").expect("read");
        assert!(String::from_utf8_lossy(&text).ends_with('\n'));

        let pagemap = open_read("/proc/self/pagemap").expect("open");
        let err = read_generated(pagemap.file, "/proc/self/pagemap", "procfs")
            .expect_err("pagemap spans the address space");
        assert!(
            err.to_string().contains("at most 1048576 bytes (1 MiB)"),
            "{err}"
        );
        let online = open_read("/sys/devices/system/cpu/online").expect("open");
        assert_eq!(online.generated, Some("sysfs"));
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
