//! [`NodeFence`]: the node id and epoch every node-side write is guarded by.

use std::sync::atomic::{AtomicI64, Ordering};

/// This node's id and the epoch it holds: set by registration (a new epoch at every
/// start), read by every guarded write. A write whose epoch is no longer the node's row's
/// (the reaper bumped it) changes nothing.
#[derive(Debug)]
pub struct NodeFence {
    node_id: String,
    epoch: AtomicI64,
}

impl NodeFence {
    /// The fence of node `node_id`, before it registered (epoch 0 matches no row).
    pub fn new(node_id: impl Into<String>) -> Self {
        Self {
            node_id: node_id.into(),
            epoch: AtomicI64::new(0),
        }
    }

    /// The node's id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The epoch the node registered with (0 before it did).
    pub fn epoch(&self) -> i64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Hold `epoch` from now on (after a registration).
    pub fn set_epoch(&self, epoch: i64) {
        self.epoch.store(epoch, Ordering::SeqCst);
    }
}
