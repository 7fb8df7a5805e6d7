//! The crate's error type. Messages are read by operators: each names the image, layer or
//! entry involved and what to do when there is something to do.

use std::io;
use std::path::{Path, PathBuf};

/// Everything that can go wrong while pulling an image or applying its layers.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The image reference does not parse (`registry/repository:tag` or `@sha256:…`).
    #[error("invalid image reference `{reference}`: {reason}")]
    InvalidReference {
        /// What was given.
        reference: String,
        /// Why it was refused.
        reason: String,
    },
    /// The server's policy does not let this build pull from that registry (before any
    /// connection to it).
    #[error("pulling from {registry} is not allowed: {reason}")]
    RegistryNotAllowed {
        /// The registry host.
        registry: String,
        /// Why.
        reason: String,
    },
    /// `--registry-auth` is not `USER:PASSWORD`.
    #[error("registry credentials must be USER:PASSWORD (got something without a `:`)")]
    InvalidCredentials,
    /// The credential helper `config.json` names for a registry failed.
    #[error("registry credentials for {registry} from {helper}: {reason}")]
    CredentialHelper {
        /// The helper program (`docker-credential-<name>`).
        helper: String,
        /// The registry it was asked about.
        registry: String,
        /// What went wrong.
        reason: String,
    },
    /// A Docker-style `config.json` exists but cannot be used.
    #[error("registry credentials file {}: {reason}", path.display())]
    DockerConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The registry answered 401 (or refused to hand out a token).
    #[error(
        "registry {registry} refused access to `{reference}` (401 Unauthorized): check the \
         credentials (--registry-auth USER:PASS or the `auths` of ~/.docker/config.json)"
    )]
    Unauthorized {
        /// The registry host.
        registry: String,
        /// The image asked for.
        reference: String,
    },
    /// Any other failure talking to the registry (connection, TLS, 404, 5xx, bad answer).
    #[error("pulling `{reference}` from {registry}: {message}")]
    Registry {
        /// The registry host.
        registry: String,
        /// The image asked for.
        reference: String,
        /// What went wrong, as the registry client said it.
        message: String,
    },
    /// An image index without a `linux/amd64` manifest, or an image for another platform.
    #[error("image `{reference}` has no linux/amd64 variant ({found})")]
    WrongPlatform {
        /// The image asked for.
        reference: String,
        /// What it has instead.
        found: String,
    },
    /// A manifest, config or layer of a kind Hutch does not read.
    #[error("unsupported {what} media type `{media_type}`")]
    UnsupportedMediaType {
        /// `layer`, `config`.
        what: &'static str,
        /// The media type found.
        media_type: String,
    },
    /// A digest that is not `sha256:` and 64 lowercase hex digits.
    #[error("invalid or unsupported digest `{0}` (Hutch stores sha256 digests only)")]
    InvalidDigest(String),
    /// Content whose sha256 is not the digest it was asked for by.
    #[error(
        "{what} {expected} does not match its digest: its content hashes to {actual}; refused"
    )]
    DigestMismatch {
        /// `blob`, `layer (uncompressed)`.
        what: &'static str,
        /// The digest the manifest or config names.
        expected: String,
        /// What the bytes hash to.
        actual: String,
    },
    /// A blob larger than its descriptor says, or than the limit.
    #[error("{what} {digest} is larger than {limit} bytes; refused")]
    TooLarge {
        /// `blob`, `config`.
        what: &'static str,
        /// Its digest.
        digest: String,
        /// The bound it crossed.
        limit: u64,
    },
    /// The image configuration cannot be read.
    #[error("image configuration of `{reference}`: {reason}")]
    Config {
        /// The image.
        reference: String,
        /// What is wrong.
        reason: String,
    },
    /// A layer entry that would write outside the root, through a symlink, or otherwise
    /// unsafely; the layer is refused.
    #[error("layer {layer}: entry `{entry}` refused: {reason}")]
    UnsafeEntry {
        /// The layer's digest.
        layer: String,
        /// The entry's path as the archive spells it.
        entry: String,
        /// Why.
        reason: String,
    },
    /// A path inside a root that cannot be written without following a symlink or
    /// replacing something that is not a directory.
    #[error("{path} inside {}: {reason}", root.display())]
    UnsafePath {
        /// The root directory.
        root: PathBuf,
        /// The path, relative to the root.
        path: String,
        /// Why.
        reason: String,
    },
    /// The unpacked image would exceed a size or file-count limit.
    #[error("layer {layer}: unpacking stopped at the {limit} limit of {max} ({detail})")]
    LimitExceeded {
        /// The layer's digest.
        layer: String,
        /// `size` or `file count`.
        limit: &'static str,
        /// The limit.
        max: u64,
        /// What crossed it.
        detail: String,
    },
    /// The pull or the extraction was cancelled (`PullOptions::cancel`,
    /// [`crate::Unpacker::with_cancel`]); what was half downloaded is removed.
    #[error("the pull was cancelled")]
    Cancelled,
    /// A layer that is not a readable (compressed) tar stream.
    #[error("layer {layer} is corrupt: {message}")]
    CorruptLayer {
        /// The layer's digest.
        layer: String,
        /// What the decompressor or tar reader said.
        message: String,
    },
    /// A file system operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}

impl ImageError {
    /// An [`ImageError::Io`] for `action` on `path`.
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// Shorthand used throughout the crate.
pub(crate) type Result<T> = std::result::Result<T, ImageError>;

/// Adds path context to [`io::Result`]s.
pub(crate) trait IoContext<T> {
    /// Maps the error into [`ImageError::Io`] for `action` on `path`.
    fn at(self, action: &'static str, path: &Path) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn at(self, action: &'static str, path: &Path) -> Result<T> {
        self.map_err(|e| ImageError::io(action, path, e))
    }
}
