//! Cluster mode (docs/cluster.md).
