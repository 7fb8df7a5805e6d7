//! API keys: whose they are, what they may do, on which sandboxes, until when.
//!
//! A key is a secret shown once, when it is made; the store keeps only its SHA-256
//! ([`hash_secret`]) next to a [`KeyRecord`] with a public id (`key_…`) by which it is listed
//! and revoked. Its [`KeyScope`] says which [`Permission`]s it has; its selector, when not
//! empty, limits it to sandboxes whose metadata holds every pair of it.
//!
//! Two formats of secret exist, both ordinary Hutch keys everywhere: `hk_` and 40 base32
//! characters (200 random bits), and `e2b_` and 40 lowercase hex digits (160 random bits),
//! the form older E2B SDKs check keys against (`^e2b_[0-9a-f]+$`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::Tenant;
use crate::error::{CoreError, CoreResult};
use crate::ids::KeyId;

/// Most pairs a key's selector may hold.
pub const MAX_SELECTOR_PAIRS: usize = 16;
/// Longest key name.
pub const MAX_KEY_NAME: usize = 128;

/// What a request needs of its key, by route (`hutch-server` decides each route's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Permission {
    /// Reading: listings, records, files, logs, events.
    Read,
    /// Using existing sandboxes: exec, terminals, file writes, code, ports.
    Use,
    /// Making and removing things: sandboxes, snapshots, volumes, templates, keys.
    Manage,
    /// The server itself: tenants, every tenant's records.
    Admin,
}

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum KeyScope {
    /// Everything, for every tenant.
    #[serde(rename = "admin")]
    Admin,
    /// Everything within its tenant.
    #[serde(rename = "full")]
    Full,
    /// Exec, files, terminals, code and ports on its tenant's existing sandboxes, and
    /// reading; no creating or deleting.
    #[serde(rename = "exec")]
    Exec,
    /// Reading only.
    #[serde(rename = "read-only")]
    ReadOnly,
}

impl KeyScope {
    /// Every scope, widest first.
    pub const ALL: [KeyScope; 4] = [Self::Admin, Self::Full, Self::Exec, Self::ReadOnly];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Full => "full",
            Self::Exec => "exec",
            Self::ReadOnly => "read-only",
        }
    }

    /// Parse a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether a key of this scope has permission `p`.
    pub fn allows(self, p: Permission) -> bool {
        let widest = match self {
            Self::Admin => Permission::Admin,
            Self::Full => Permission::Manage,
            Self::Exec => Permission::Use,
            Self::ReadOnly => Permission::Read,
        };
        p <= widest
    }

    /// Whether a key of this scope may make keys of scope `other`: only admin keys make
    /// admin keys, full keys make keys of their tenant no wider than themselves, and exec
    /// and read-only keys make none.
    pub fn may_grant(self, other: KeyScope) -> bool {
        match self {
            Self::Admin => true,
            Self::Full => other != Self::Admin,
            Self::Exec | Self::ReadOnly => false,
        }
    }
}

/// Which form a new key's secret takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyFormat {
    /// `hk_` and 40 base32 characters.
    #[default]
    Hutch,
    /// `e2b_` and 40 lowercase hex digits.
    E2b,
}

impl KeyFormat {
    /// A new secret of this form, from the OS's random source.
    pub fn generate(self) -> String {
        match self {
            Self::Hutch => crate::ids::new_api_key(),
            Self::E2b => {
                let mut bytes = [0u8; 20];
                getrandom::fill(&mut bytes)
                    .expect("the kernel's random source is always available");
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                format!("e2b_{hex}")
            }
        }
    }
}

/// The SHA-256 of a key's secret, in hex: what the store keeps and looks keys up by.
pub fn hash_secret(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An API key as stored (without its secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    /// Its public id.
    pub id: KeyId,
    /// The tenant it acts for (admin keys: [`super::ADMIN_TENANT`]).
    pub tenant: Tenant,
    /// What it may do.
    pub scope: KeyScope,
    /// A name for people.
    pub name: Option<String>,
    /// Metadata every sandbox it reaches must hold (empty: every sandbox of its tenant).
    pub selector: BTreeMap<String, String>,
    /// The first characters of its secret, to tell keys apart (`hk_ab3d…`).
    pub prefix: String,
    /// When it was made (ms since the epoch).
    pub created_at_ms: i64,
    /// When it stops working (`None`: never).
    pub expires_at_ms: Option<i64>,
    /// When it was last used, as written to the store (uses are written in batches).
    pub last_used_ms: Option<i64>,
    /// What the sandboxes it creates may spend (`manager/budget.rs`).
    pub budget: KeyBudget,
}

/// A key's spending caps: what the sandboxes it creates may spend per UTC day and month,
/// in cost micros through the rate card (CPU-seconds without one). Stored as JSON
/// (`api_keys.budget`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KeyBudget {
    /// Per UTC day.
    pub daily_budget: Option<u64>,
    /// Per UTC calendar month.
    pub monthly_budget: Option<u64>,
}

impl KeyBudget {
    /// Whether `self` stays within `ceiling` (each cap set there is set here, no higher).
    pub fn within(&self, ceiling: &Self) -> bool {
        let fits = |mine: Option<u64>, max: Option<u64>| match (mine, max) {
            (_, None) => true,
            (Some(m), Some(c)) => m <= c,
            (None, Some(_)) => false,
        };
        fits(self.daily_budget, ceiling.daily_budget)
            && fits(self.monthly_budget, ceiling.monthly_budget)
    }
}

impl KeyRecord {
    /// Whether this key sees every tenant.
    pub fn is_admin(&self) -> bool {
        self.scope == KeyScope::Admin
    }

    /// Whether it has expired by `now_ms`.
    pub fn expired(&self, now_ms: i64) -> bool {
        self.expires_at_ms.is_some_and(|at| at <= now_ms)
    }

    /// Whether a sandbox with `metadata` is within its selector.
    pub fn selects(&self, metadata: &BTreeMap<String, String>) -> bool {
        self.selector
            .iter()
            .all(|(k, v)| metadata.get(k).is_some_and(|m| m == v))
    }

    /// The JSON the API shows.
    pub fn view(&self) -> serde_json::Value {
        let time = |ms: Option<i64>| ms.map(crate::time::rfc3339);
        serde_json::json!({
            "id": self.id,
            "tenant": self.tenant,
            "scope": self.scope,
            "name": self.name,
            "selector": self.selector,
            "prefix": self.prefix,
            "created_at": crate::time::rfc3339(self.created_at_ms),
            "expires_at": time(self.expires_at_ms),
            "last_used_at": time(self.last_used_ms),
            "daily_budget": self.budget.daily_budget,
            "monthly_budget": self.budget.monthly_budget,
        })
    }
}

/// A validated request for a new key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewKey {
    /// Its tenant.
    pub tenant: Tenant,
    /// Its scope.
    pub scope: KeyScope,
    /// A name for people.
    pub name: Option<String>,
    /// Its selector.
    pub selector: BTreeMap<String, String>,
    /// When it stops working.
    pub expires_at_ms: Option<i64>,
    /// The form of its secret.
    pub format: KeyFormat,
    /// Its spending caps.
    pub budget: KeyBudget,
}

impl NewKey {
    /// Check the name and the selector.
    pub fn validate(&self) -> CoreResult<()> {
        if let Some(name) = &self.name {
            if name.is_empty() || name.len() > MAX_KEY_NAME || name.chars().any(char::is_control) {
                return Err(CoreError::InvalidArgument(format!(
                    "a key's name must be 1 to {MAX_KEY_NAME} bytes without control characters"
                )));
            }
        }
        if self.selector.len() > MAX_SELECTOR_PAIRS {
            return Err(CoreError::InvalidArgument(format!(
                "a selector may hold at most {MAX_SELECTOR_PAIRS} pairs"
            )));
        }
        for (k, v) in &self.selector {
            if k.is_empty() || k.len() > 128 || v.len() > 1024 || k == crate::model::TENANT_KEY {
                return Err(CoreError::InvalidArgument(format!(
                    "selector key {k:?}: keys must be 1-128 bytes (not {:?}: a key's tenant is its own) and values at most 1024 bytes",
                    crate::model::TENANT_KEY
                )));
            }
        }
        if self.scope == KeyScope::Admin && !self.selector.is_empty() {
            return Err(CoreError::InvalidArgument(
                "an admin key sees every sandbox: it takes no selector".into(),
            ));
        }
        Ok(())
    }

    /// This request as key `creator` may make it: a key only narrows its maker's rights.
    /// Only admin keys make admin keys or keys of other tenants; exec and read-only keys
    /// make none; the new key keeps every pair of its maker's selector (added when left
    /// out) and expires no later than its maker (its maker's expiry when left out).
    pub fn narrowed_by(mut self, creator: &KeyRecord) -> CoreResult<Self> {
        if !creator.scope.may_grant(self.scope) {
            let article = match creator.scope {
                KeyScope::Admin | KeyScope::Exec => "an",
                KeyScope::Full | KeyScope::ReadOnly => "a",
            };
            return Err(CoreError::Forbidden(format!(
                "{article} {} key cannot make {} keys{}",
                creator.scope.as_str(),
                self.scope.as_str(),
                if creator.scope.may_grant(KeyScope::ReadOnly) {
                    ""
                } else {
                    " (only full and admin keys make keys)"
                }
            )));
        }
        if creator.is_admin() {
            return Ok(self);
        }
        if self.tenant != creator.tenant {
            return Err(CoreError::Forbidden(
                "a tenant's key makes keys of its own tenant only".into(),
            ));
        }
        for (k, v) in &creator.selector {
            match self.selector.get(k) {
                None => {
                    self.selector.insert(k.clone(), v.clone());
                }
                Some(mine) if mine == v => {}
                Some(mine) => {
                    return Err(CoreError::Forbidden(format!(
                        "this key reaches only sandboxes with {k}={v}: it cannot make a key for {k}={mine}"
                    )))
                }
            }
        }
        // A capped key makes keys capped no higher (each spends its own budget: the
        // tenant's budget is the ceiling of them all).
        if self.budget == KeyBudget::default() {
            self.budget = creator.budget;
        } else if !self.budget.within(&creator.budget) {
            return Err(CoreError::Forbidden(format!(
                "this key's budget is daily {:?}, monthly {:?}: it cannot make a key with a larger one",
                creator.budget.daily_budget, creator.budget.monthly_budget
            )));
        }
        match (creator.expires_at_ms, self.expires_at_ms) {
            (Some(limit), None) => self.expires_at_ms = Some(limit),
            (Some(limit), Some(at)) if at > limit => {
                return Err(CoreError::Forbidden(format!(
                    "this key expires at {}: it cannot make a key that outlives it",
                    crate::time::rfc3339(limit)
                )))
            }
            _ => {}
        }
        Ok(self)
    }

    /// The record of this key with secret `secret`, made now.
    pub fn record(&self, secret: &str, now_ms: i64) -> KeyRecord {
        KeyRecord {
            id: KeyId::random(),
            tenant: self.tenant.clone(),
            scope: self.scope,
            name: self.name.clone(),
            selector: self.selector.clone(),
            prefix: secret.chars().take(8).collect::<String>() + "…",
            created_at_ms: now_ms,
            expires_at_ms: self.expires_at_ms,
            last_used_ms: None,
            budget: self.budget,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_grant_no_more_than_they_have() {
        use Permission::*;
        let grid: Vec<(KeyScope, [bool; 4])> = vec![
            (KeyScope::Admin, [true, true, true, true]),
            (KeyScope::Full, [true, true, true, false]),
            (KeyScope::Exec, [true, true, false, false]),
            (KeyScope::ReadOnly, [true, false, false, false]),
        ];
        for (scope, expect) in grid {
            let got = [Read, Use, Manage, Admin].map(|p| scope.allows(p));
            assert_eq!(got, expect, "{scope:?}");
        }
        assert!(KeyScope::Admin.may_grant(KeyScope::Admin));
        assert!(KeyScope::Full.may_grant(KeyScope::Full));
        assert!(!KeyScope::Full.may_grant(KeyScope::Admin));
        assert!(!KeyScope::Exec.may_grant(KeyScope::ReadOnly));
        assert!(!KeyScope::ReadOnly.may_grant(KeyScope::ReadOnly));
        for s in KeyScope::ALL {
            assert_eq!(KeyScope::parse(s.as_str()), Some(s));
            assert_eq!(
                serde_json::to_value(s).expect("json"),
                serde_json::json!(s.as_str())
            );
        }
    }

    #[test]
    fn secrets_have_their_format_and_are_stored_hashed() {
        let e2b = KeyFormat::E2b.generate();
        let hex = e2b.strip_prefix("e2b_").expect("e2b_ prefix");
        assert_eq!(hex.len(), 40);
        assert!(hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_ne!(e2b, KeyFormat::E2b.generate());
        assert!(KeyFormat::Hutch.generate().starts_with("hk_"));
        assert_eq!(
            hash_secret("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_selector_matches_sandboxes_holding_all_its_pairs() {
        let key = NewKey {
            tenant: Tenant::new("acme"),
            scope: KeyScope::Exec,
            name: None,
            selector: [("team".to_string(), "ml".to_string())].into(),
            expires_at_ms: Some(10),
            format: KeyFormat::Hutch,
            budget: Default::default(),
        };
        key.validate().expect("valid");
        let r = key.record("hk_abcdefghij", 1);
        assert_eq!(r.prefix, "hk_abcde…");
        assert!(r.selects(&[("team".into(), "ml".into()), ("x".into(), "y".into())].into()));
        assert!(!r.selects(&[("team".into(), "web".into())].into()));
        assert!(!r.selects(&BTreeMap::new()));
        assert!(!r.expired(9) && r.expired(10));
        let bad = NewKey {
            selector: [("tenant_id".to_string(), "other".to_string())].into(),
            ..key
        };
        assert!(bad.validate().is_err(), "the tenant is not a selector");
    }

    #[test]
    fn a_key_makes_only_narrower_keys() {
        let maker = NewKey {
            tenant: Tenant::new("acme"),
            scope: KeyScope::Full,
            name: None,
            selector: [("team".to_string(), "ml".to_string())].into(),
            expires_at_ms: Some(1000),
            format: KeyFormat::Hutch,
            budget: Default::default(),
        }
        .record("hk_x", 0);
        let ask = |scope, tenant: &str, selector: &[(&str, &str)], expires| NewKey {
            tenant: Tenant::new(tenant),
            scope,
            name: None,
            selector: selector
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            expires_at_ms: expires,
            format: KeyFormat::E2b,
            budget: Default::default(),
        };
        let got = ask(KeyScope::ReadOnly, "acme", &[("x", "y")], None)
            .narrowed_by(&maker)
            .expect("narrower");
        assert_eq!(got.expires_at_ms, Some(1000), "inherits the expiry");
        assert_eq!(got.selector.get("team").map(String::as_str), Some("ml"));
        let refused = |k: NewKey| k.narrowed_by(&maker).expect_err("wider").to_string();
        assert_eq!(
            refused(ask(KeyScope::Admin, "acme", &[], None)),
            "a full key cannot make admin keys"
        );
        assert_eq!(
            refused(ask(KeyScope::Exec, "other", &[], None)),
            "a tenant's key makes keys of its own tenant only"
        );
        assert!(
            refused(ask(KeyScope::Exec, "acme", &[("team", "web")], None))
                .starts_with("this key reaches only sandboxes with team=ml")
        );
        assert!(refused(ask(KeyScope::Exec, "acme", &[], Some(2000)))
            .starts_with("this key expires at"));
        let exec = NewKey {
            scope: KeyScope::Exec,
            ..ask(KeyScope::Exec, "acme", &[], None)
        }
        .record("hk_y", 0);
        assert_eq!(
            ask(KeyScope::ReadOnly, "acme", &[], None)
                .narrowed_by(&exec)
                .expect_err("exec keys make none")
                .to_string(),
            "an exec key cannot make read-only keys (only full and admin keys make keys)"
        );
    }
}
