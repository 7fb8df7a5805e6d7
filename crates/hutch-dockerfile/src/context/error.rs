//! [`ContextError`]: why the build context cannot be read as asked. Each message names
//! the COPY source or the path in the context.

use std::io;
use std::path::PathBuf;

use crate::glob::GlobError;

use super::MAX_ENTRIES;

/// Why a build context cannot be read as asked.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    /// The context directory itself cannot be opened.
    #[error("cannot open the build context {}: {error}", path.display())]
    Open {
        /// The directory.
        path: PathBuf,
        /// Why.
        error: io::Error,
    },
    /// A source (or a path read) climbs out of the context with `..`.
    #[error("COPY source `{source_path}` is outside the build context")]
    Outside {
        /// The source as given.
        source_path: String,
    },
    /// An absolute source.
    #[error(
        "COPY source `{source_path}` is an absolute path; sources are relative to the build \
         context (write `{}`)",
        source_path.trim_start_matches('/')
    )]
    Absolute {
        /// The source as given.
        source_path: String,
    },
    /// A named source that is not in the context (or is excluded by `.dockerignore`).
    #[error("COPY source `{source_path}` not found in the build context")]
    NotFound {
        /// The source as given.
        source_path: String,
    },
    /// A wildcard source that matches nothing.
    #[error("COPY source `{source_path}` matched no files in the build context")]
    NoMatch {
        /// The source as given.
        source_path: String,
    },
    /// A bad wildcard pattern.
    #[error("COPY source `{source_path}` is not a valid pattern: {reason}")]
    BadPattern {
        /// The source as given.
        source_path: String,
        /// Why.
        reason: GlobError,
    },
    /// A symlink on the way to a source leads out of the context.
    #[error(
        "COPY source `{source_path}`: `{link}` is a symlink to `{target}`, outside the build \
         context; symlinks are followed only inside it"
    )]
    SymlinkOutside {
        /// The source as given.
        source_path: String,
        /// The symlink, relative to the context root.
        link: String,
        /// Its target as stored.
        target: String,
    },
    /// More than 40 symlinks on the way to a source.
    #[error("COPY source `{source_path}`: too many levels of symlinks")]
    SymlinkLoop {
        /// The source as given.
        source_path: String,
    },
    /// A fifo, socket or device where files are copied.
    #[error("`{path}` in the build context is a {kind}; only files, directories and symlinks can be copied")]
    UnsupportedType {
        /// Relative to the context root.
        path: String,
        /// `fifo`, `socket`, `character device`, `block device`.
        kind: &'static str,
    },
    /// A file name that is not UTF-8.
    #[error("a name in `{dir}` of the build context is not UTF-8; rename it or leave it out with .dockerignore")]
    NotUtf8 {
        /// The directory, relative to the context root.
        dir: String,
    },
    /// More entries than [`MAX_ENTRIES`].
    #[error("COPY source `{source_path}` has more than {MAX_ENTRIES} entries")]
    TooManyEntries {
        /// The source as given.
        source_path: String,
    },
    /// A file asked for with a size bound is larger.
    #[error("`{path}` in the build context is larger than {limit} bytes")]
    TooLarge {
        /// Relative to the context root.
        path: String,
        /// The bound.
        limit: u64,
    },
    /// The operating system refused an operation.
    #[error("{action} `{path}` in the build context: {error}")]
    Io {
        /// What was being done (`reading`, `opening`…).
        action: &'static str,
        /// Relative to the context root.
        path: String,
        /// Why.
        error: io::Error,
    },
}
