//! Hibernated sandboxes that can wake on another host (cluster mode with object storage,
//! `docs/cluster.md`, "Sandboxes between hosts").
//!
//! After a hibernation, a backend that can ([`crate::backend::Capabilities::portable_hibernation`])
//! writes the sandbox's saved state into one archive, and the [`SavedStates`] the server was
//! given keeps it somewhere every node reaches (an object store), retrying while that is
//! down. Once it is there, the record carries a [`SavedState`]: the object's key, size and
//! sha256. Another node may then take the sandbox over ([`crate::Manager::take_over`]): the
//! record moves to it with [`Arrival::Fetch`], its next wake downloads and checks the
//! archive, unpacks it, and starts the sandbox there. A wake where it is drops the saved
//! state (what it saved is no longer the sandbox's state once it runs again).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::CoreResult;
use crate::ids::SandboxId;

/// A hibernated sandbox's state, kept where every node reaches it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedState {
    /// Its object's key.
    pub key: String,
    /// Bytes of the archive.
    pub bytes: u64,
    /// The sha256 of the archive as the node that saved it hashed it (lowercase hex): the
    /// download is checked against this, not against what the store says.
    pub sha256: String,
}

/// Where a sandbox that moved to this node is in its arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arrival {
    /// Its saved state is still to be downloaded and unpacked here.
    Fetch,
    /// Its files are here (its layer): its next start is a first start on this node.
    Start,
}

/// Keeps hibernated sandboxes' saved states where other nodes can fetch them.
#[async_trait::async_trait]
pub trait SavedStates: Send + Sync {
    /// Keep `archive` (a file this call now owns) under `key` as the saved state of
    /// hibernated sandbox `id`: upload it, retrying while the store is down, then remove the
    /// file and report it with [`crate::Manager::state_saved`].
    async fn save(&self, id: &SandboxId, key: &str, archive: PathBuf) -> CoreResult<()>;
    /// Download `saved` into `dest`, checked against its sha256.
    async fn fetch(&self, saved: &SavedState, dest: &Path) -> CoreResult<()>;
    /// Forget sandbox `id`'s saved states: drop an upload still pending, delete `saved`.
    async fn discard(&self, id: &SandboxId, saved: Option<&SavedState>);
    /// Saves not uploaded yet.
    fn pending(&self) -> usize;
    /// Whether the save under `key` is queued and not uploaded yet.
    fn is_pending(&self, key: &str) -> bool;
}
