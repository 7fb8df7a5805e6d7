//! File metadata as `user.*` extended attributes ([`hutch_proto::file_metadata`]): set on
//! the open file of an upload, read (without following symlinks) for stat and list.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use hutch_proto::file_metadata::{self, FileMetadata, XATTR_PREFIX};

use crate::error::{Failure, Result};

/// The largest attribute name list read (the kernel's own limit is 64 KiB).
const MAX_LIST_BYTES: usize = 64 << 10;

/// Sets every pair on `file` (opened for writing at `path`). A filesystem without user
/// attributes is a bad request naming it, not a silent loss.
pub fn set_all(file: &File, path: &str, metadata: &FileMetadata) -> Result<()> {
    file_metadata::check(metadata).map_err(|e| Failure::BadRequest(e.to_string()))?;
    for (key, value) in metadata {
        let name = CString::new(format!("{XATTR_PREFIX}{key}"))
            .map_err(|_| Failure::BadRequest(format!("metadata key {key:?}")))?;
        // SAFETY: the descriptor is open, the name is NUL-terminated and the value is a
        // buffer of the given length.
        let rc = unsafe {
            libc::fsetxattr(
                file.as_raw_fd(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ENOTSUP) => Failure::BadRequest(format!(
                    "{path}: its filesystem keeps no user metadata (extended attributes)"
                )),
                _ => Failure::io("set metadata of", path, e),
            });
        }
    }
    Ok(())
}

/// The pairs of the entry at `path` (itself, not a symlink's target). Attributes that do
/// not fit the rules, and any error (no support, no permission), leave them out.
pub fn read(path: &Path) -> FileMetadata {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return FileMetadata::new();
    };
    let names = match list(&c_path) {
        Some(names) if !names.is_empty() => names,
        _ => return FileMetadata::new(),
    };
    names
        .split(|b| *b == 0)
        .filter_map(|name| {
            let key = std::str::from_utf8(name).ok()?.strip_prefix(XATTR_PREFIX)?;
            if !file_metadata::valid_key(key) {
                return None;
            }
            let value = get(&c_path, name)?;
            file_metadata::valid_value(&value).then(|| (key.to_owned(), value))
        })
        .collect()
}

/// The NUL-separated attribute names of `path`.
fn list(path: &CString) -> Option<Vec<u8>> {
    // SAFETY: a null buffer of length 0 asks for the size.
    let size = unsafe { libc::llistxattr(path.as_ptr(), std::ptr::null_mut(), 0) };
    let size = usize::try_from(size).ok()?.min(MAX_LIST_BYTES);
    if size == 0 {
        return Some(Vec::new());
    }
    let mut buf = vec![0u8; size];
    // SAFETY: the buffer has `size` writable bytes.
    let got = unsafe { libc::llistxattr(path.as_ptr(), buf.as_mut_ptr().cast(), size) };
    buf.truncate(usize::try_from(got).ok()?);
    Some(buf)
}

/// The value of the attribute `name` of `path`, when it is text of a metadata value's size.
fn get(path: &CString, name: &[u8]) -> Option<String> {
    let c_name = CString::new(name).ok()?;
    let mut buf = vec![0u8; file_metadata::MAX_VALUE_BYTES];
    // SAFETY: the buffer has `len` writable bytes; both strings are NUL-terminated.
    let got = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            c_name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    buf.truncate(usize::try_from(got).ok()?);
    String::from_utf8(buf).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_and_foreign_attributes_are_left_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let file = File::create(&path).expect("create");
        let metadata: FileMetadata = [("owner", "agent-7"), ("e2b.run", "42")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        match set_all(&file, "f", &metadata) {
            Ok(()) => {}
            // A temporary directory on a filesystem without user attributes: nothing to test.
            Err(Failure::BadRequest(m)) if m.contains("keeps no user metadata") => return,
            Err(e) => panic!("{e:?}"),
        }
        let c_path = CString::new(path.as_os_str().as_bytes()).expect("path");
        let odd = CString::new("user.Odd Name").expect("name");
        // SAFETY: valid strings and a 1-byte value.
        let rc =
            unsafe { libc::lsetxattr(c_path.as_ptr(), odd.as_ptr(), b"x".as_ptr().cast(), 1, 0) };
        assert_eq!(rc, 0);
        assert_eq!(read(&path), metadata);
        let bad: FileMetadata = [("Upper".to_owned(), "v".to_owned())].into_iter().collect();
        assert!(matches!(
            set_all(&file, "f", &bad),
            Err(Failure::BadRequest(_))
        ));
    }
}
