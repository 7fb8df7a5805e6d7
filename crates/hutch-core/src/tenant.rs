//! Tenants: who owns a sandbox, a snapshot or a volume, and whose records a caller may see.
//!
//! A [`Tenant`] is the name an API key belongs to (`api_keys.tenant`). It is stored as a
//! column of every sandbox, snapshot and volume row (schema 4, `store/sqlite.rs`); the API
//! still shows a sandbox's tenant as its `tenant_id` metadata key, derived from that column.
//! A [`TenantScope`] is what a request may see: one tenant's records, or (admin keys) all.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The tenant a record belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Tenant(String);

impl Tenant {
    /// The tenant named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    /// Its name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whose records a request may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantScope {
    /// Every tenant's (admin keys).
    All,
    /// Only this tenant's.
    Only(Tenant),
}

impl TenantScope {
    /// The scope of a key of `tenant`, `admin` or not.
    pub fn of(tenant: &Tenant, admin: bool) -> Self {
        if admin {
            Self::All
        } else {
            Self::Only(tenant.clone())
        }
    }

    /// Whether a record owned by `owner` is in scope.
    pub fn allows(&self, owner: Option<&Tenant>) -> bool {
        match self {
            Self::All => true,
            Self::Only(t) => owner == Some(t),
        }
    }

    /// The one tenant of this scope (`None`: every tenant).
    pub fn tenant(&self) -> Option<&Tenant> {
        match self {
            Self::All => None,
            Self::Only(t) => Some(t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_allows_its_tenant_only_and_all_allows_everyone() {
        let acme = Tenant::new("acme");
        let only = TenantScope::of(&acme, false);
        assert!(only.allows(Some(&acme)));
        assert!(!only.allows(Some(&Tenant::new("other"))));
        assert!(!only.allows(None));
        let all = TenantScope::of(&acme, true);
        assert!(all.allows(None));
        assert!(all.allows(Some(&Tenant::new("other"))));
        assert_eq!(
            serde_json::to_string(&acme).expect("json"),
            "\"acme\"",
            "a tenant is a plain string on the wire and in records"
        );
    }
}
