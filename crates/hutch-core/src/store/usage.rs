//! [`UsageStore`]: the metered usage (`crate::usage`), appended in batches by the sampler
//! with each live sandbox's last meter reading, and summed by `GET /v1/usage` and the
//! spending caps. A supertrait of [`super::Store`].

use std::collections::HashMap;

use async_trait::async_trait;

use crate::error::CoreResult;
use crate::ids::SandboxId;
use crate::usage::{UsageGroup, UsageInterval, UsageQuery};

/// The counters of one live sandbox at its last sample: where the next interval starts
/// (kept in the store so a restarted server neither counts them again nor loses them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeterReading {
    /// Its cgroup's CPU time (ns).
    pub cpu_ns: u64,
    /// Bytes it had sent out.
    pub egress_bytes: u64,
    /// When (ms since the epoch).
    pub at_ms: i64,
}

/// The usage rows and meter readings (see the module docs).
#[async_trait]
pub trait UsageStore: Send + Sync {
    /// Append `intervals` and write `meters` (`None`: forget the sandbox's reading, it
    /// stopped) in one transaction.
    async fn append_usage(
        &self,
        intervals: &[UsageInterval],
        meters: &[(SandboxId, Option<MeterReading>)],
    ) -> CoreResult<()>;
    /// The sums `query` asks for, one per group, in the group key's order.
    async fn usage_groups(&self, query: &UsageQuery) -> CoreResult<Vec<UsageGroup>>;
    /// The last reading of every live sandbox (server start).
    async fn meter_readings(&self) -> CoreResult<HashMap<SandboxId, MeterReading>>;
}
