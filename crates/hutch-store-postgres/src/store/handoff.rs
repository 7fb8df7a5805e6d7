//! Taking over a hibernated sandbox of a dead or draining node ([`Store::take_over_sandbox`]).
//!
//! One transaction: this node's fence (`FOR SHARE`, as every node-side write), then the
//! sandbox's row `FOR UPDATE` with its owner node's row, checked (another node, `dead` or
//! `draining`; the sandbox `hibernated` with a saved state), then the row rewritten with this
//! node's id and uid slot. Two nodes taking over the same sandbox serialize on its row; the
//! second finds it owned by the first and gets `None`. The owner's own writes of the row are
//! fenced by its `node_id`, so once moved, the old owner can no longer change it.

use hutch_core::handoff::Arrival;
use hutch_core::ids::SandboxId;
use hutch_core::model::SandboxRecord;
#[cfg(doc)]
use hutch_core::store::Store;
use hutch_core::{CoreError, CoreResult};

use super::rows::{sandbox_row, SandboxColumns};
use super::sql::{execute, pg, rows};
use super::PostgresStore;

impl PostgresStore {
    pub(super) async fn take_over(
        &self,
        id: &SandboxId,
        uid_slot: u32,
    ) -> CoreResult<Option<SandboxRecord>> {
        let node = self.fence.node_id();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        self.hold_fence(&tx).await?;
        let found = rows(
            &tx,
            "SELECT s.record, s.tenant FROM sandboxes s JOIN nodes n ON n.id = s.node_id
              WHERE s.id = $1 AND s.node_id <> $2 AND n.state IN ('dead', 'draining')
                AND s.state = 'hibernated' AND s.record ? 'saved_state'
              FOR UPDATE OF s",
            &[&id.as_str(), &node],
        )
        .await?;
        let Some(row) = found.first() else {
            return Ok(None);
        };
        let mut record = sandbox_row(row)?;
        record.uid_slot = uid_slot;
        record.net_slot = None;
        record.init_pid = None;
        record.init_start_time = None;
        record.cgroups.clear();
        record.arrival = Some(Arrival::Fetch);
        let c = SandboxColumns::of(&record)?;
        let written = execute(
            &tx,
            "UPDATE sandboxes SET node_id = $2, uid_slot = $3, record = $4 WHERE id = $1",
            &[&c.id, &node, &c.uid_slot, &c.record],
        )
        .await;
        match written {
            Ok(_) => {}
            Err(CoreError::Conflict(_)) => {
                return Err(CoreError::Conflict(format!("uid slot {uid_slot} in use")))
            }
            Err(e) => return Err(e),
        }
        tx.commit().await.map_err(pg)?;
        Ok(Some(record))
    }
}
