//! Directory trees as tar streams (`GET`/`PUT /v1/files/archive`, `hutch cp` of a directory).
//!
//! One implementation serves both ends that touch files: the agent makes and unpacks archives
//! inside the sandbox (the host only relays the bytes), and the CLI makes and unpacks them on
//! the user's machine. Both treat an archive they receive as hostile input.
//!
//! # Format
//! POSIX ustar as GNU tar writes it: long names and link targets in GNU `L`/`K` entries, which
//! [`TarParser`] also reads, as well as pax `path`, `linkpath` and `size` records. An archive
//! of a directory holds its contents with paths relative to it (no `./` prefix, directories
//! with a trailing `/`); an archive of a file or symlink holds that one entry under its own
//! name. Modes (permission bits), modification times and numeric owners are recorded.
//!
//! # What [`ArchiveWriter`] puts in
//! Directories, regular files and symlinks, walked without following any symlink: a symlink is
//! stored as a link (its target text), never as what it points to. FIFOs, sockets and devices
//! are left out. [`ArchiveWriter::with_filter`] leaves out what a filter refuses (the CLI's
//! `.dockerignore`). A file that shrinks while it is read is padded with zeros to the size in its
//! header; one that grows is cut at that size.
//!
//! # What [`Extractor`] refuses
//! Every entry is created below the destination directory through directory descriptors, each
//! component opened with `O_NOFOLLOW`, so nothing is written through a symlink, whether the
//! archive made it or it was there before. Refused, which fails the whole request (entries
//! already unpacked stay):
//! - absolute paths and paths with a `..` component;
//! - symlinks whose target is absolute or climbs above the destination (`../..`);
//! - hard links whose target is absolute or has a `..` component;
//! - devices, FIFOs, sockets, sparse and other special entries;
//! - a path whose parent is an existing symlink or file.
//!
//! Directories are created with at least `rwx` for their owner (so their contents can be
//! written). Files are owned by whoever unpacks; without [`ExtractOptions::keep_special_bits`]
//! setuid, setgid and sticky bits are dropped. Long names and pax headers are capped at
//! [`MAX_HEADER_DATA`] bytes.

mod build;
mod extract;
mod parse;

pub use build::{ArchiveWriter, WalkChoice};
pub use extract::{ExtractOptions, Extractor};
pub use parse::{EntryHeader, EntryKind, TarEvent, TarParser};

/// Largest GNU long name, long link or pax header accepted.
pub const MAX_HEADER_DATA: u64 = 1 << 20;

/// Content type of archive bodies.
pub const CONTENT_TYPE: &str = "application/x-tar";

/// Why making or unpacking an archive failed.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The bytes are not a tar stream this module reads.
    #[error("not a valid tar stream: {0}")]
    Malformed(String),
    /// An entry would land outside the destination, or is of a kind never unpacked.
    #[error("refused archive entry {path:?}: {why}")]
    Refused {
        /// The entry's path as the archive names it.
        path: String,
        /// Why it was refused.
        why: String,
    },
    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was tried (`open`, `mkdir`, ...).
        op: &'static str,
        /// The path it was tried on.
        path: String,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
}

impl ArchiveError {
    fn io(op: &'static str, path: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }

    fn refused(path: &[u8], why: impl Into<String>) -> Self {
        Self::Refused {
            path: String::from_utf8_lossy(path).into_owned(),
            why: why.into(),
        }
    }
}

/// Result alias of this module.
pub type ArchiveResult<T> = Result<T, ArchiveError>;

#[cfg(test)]
mod tests;
