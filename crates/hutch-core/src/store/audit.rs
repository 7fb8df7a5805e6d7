//! [`AuditStore`]: the audit log's table (`crate::audit`), appended in batches and read in
//! pages. A supertrait of [`super::Store`].

use async_trait::async_trait;

use super::{Page, PageRequest};
use crate::audit::{AuditEntry, AuditQuery};
use crate::error::CoreResult;

/// The audit log (see the module docs).
#[async_trait]
pub trait AuditStore: Send + Sync {
    /// Append `entries` in one transaction, in their order (their `id`s are the store's).
    async fn append_audit(&self, entries: &[AuditEntry]) -> CoreResult<()>;
    /// One page of the entries `query` selects, oldest first.
    async fn list_audit(
        &self,
        query: &AuditQuery,
        page: &PageRequest,
    ) -> CoreResult<Page<AuditEntry>>;
}
