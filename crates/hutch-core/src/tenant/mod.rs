//! Tenants: who owns a sandbox, a snapshot or a volume, and whose records a caller may see.
//!
//! A [`Tenant`] is the name an API key belongs to (`api_keys.tenant`). It is stored as a
//! column of every sandbox, snapshot and volume row (`store/sqlite.rs`); the API still shows
//! a sandbox's tenant as its `tenant_id` metadata key, derived from that column. A
//! [`TenantScope`] is what a request may see: one tenant's records, or (admin keys) all.
//!
//! - [`settings`]: a tenant's record: quotas, defaults for its sandboxes, allowed templates.
//! - [`keys`]: API keys, their scopes and selectors.
//! - [`quota`]: what a tenant uses and the check of an operation against its quotas.

pub mod keys;
pub mod quota;
pub mod settings;

use std::fmt;

use serde::{Deserialize, Serialize};

/// The name admin keys carry as their tenant: no tenant may be created under it.
pub const ADMIN_TENANT: &str = "admin";

/// Longest tenant name.
pub const MAX_TENANT_NAME: usize = 64;

/// The tenant a record belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Tenant(String);

impl Tenant {
    /// The tenant named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    /// A tenant name a client chose, checked: 1 to 64 lowercase ASCII letters, digits, `-`
    /// and `_`, starting with a letter or a digit, and not `admin`.
    pub fn parse(name: &str) -> Result<Self, crate::CoreError> {
        let well_formed = !name.is_empty()
            && name.len() <= MAX_TENANT_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
            && name
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric());
        if !well_formed {
            return Err(crate::CoreError::InvalidArgument(format!(
                "invalid tenant name {name:?}: 1 to {MAX_TENANT_NAME} lowercase letters, digits, \
                 '-' or '_', starting with a letter or a digit"
            )));
        }
        if name == ADMIN_TENANT {
            return Err(crate::CoreError::InvalidArgument(format!(
                "{ADMIN_TENANT:?} is the name admin keys carry: choose another tenant name"
            )));
        }
        Ok(Self(name.to_string()))
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

    #[test]
    fn tenant_names_are_checked_with_a_message() {
        assert_eq!(
            Tenant::parse("team-ml_2").expect("valid").as_str(),
            "team-ml_2"
        );
        for bad in ["", "Acme", "-x", "a b", "a/b", &"x".repeat(65)] {
            let e = Tenant::parse(bad).expect_err(bad);
            assert!(e.to_string().starts_with("invalid tenant name"), "{e}");
        }
        assert_eq!(
            Tenant::parse("admin").expect_err("reserved").to_string(),
            "\"admin\" is the name admin keys carry: choose another tenant name"
        );
    }
}
