//! Identifiers and secrets: `sbx_…`, `snap_…`, `vol_…` and `key_…` ids and API keys, from
//! the OS's random source.
//!
//! [`SandboxId`] is a sandbox's id as a type: made here ([`SandboxId::random`]) or parsed once
//! where it comes in ([`str::parse`], which checks the `sbx_` form), then carried typed through
//! the manager and the store. It serializes as the bare string (`#[serde(transparent)]`), so
//! stored records and API JSON are the same bytes as when ids were `String`s; reading a stored
//! record does not re-check the form (the store only holds ids we issued). [`SnapshotId`] is
//! the same for `snap_…` ids, [`VolumeId`] for `vol_…` ids (volume routes take an id or a
//! name, so those are resolved by the manager rather than parsed at the edge).

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A string that is not an id of the kind asked for. Callers answer it as they answer an
/// unknown id ("sandbox … does not exist"), so a malformed id tells a client nothing more.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {raw} does not exist")]
pub struct MalformedId {
    /// What was asked for (`sandbox`, `snapshot`, `volume`).
    pub kind: &'static str,
    /// The string as given.
    pub raw: String,
}

/// An id type: a `String` of one prefixed form, checked when parsed (see the module docs).
macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// A new id: the prefix and 16 characters (80 random bits).
            pub fn random() -> Self {
                Self(format!(concat!($prefix, "{}"), random_token(16)))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = MalformedId;

            fn from_str(s: &str) -> Result<Self, MalformedId> {
                if has_form(s, $prefix) {
                    Ok(Self(s.to_string()))
                } else {
                    Err(MalformedId {
                        kind: $kind,
                        raw: s.to_string(),
                    })
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }
    };
}

prefixed_id!(
    /// A sandbox's id: `sbx_` and 1 to 64 ASCII letters or digits.
    SandboxId,
    "sbx_",
    "sandbox"
);

prefixed_id!(
    /// A snapshot's id: `snap_` and 1 to 64 ASCII letters or digits.
    SnapshotId,
    "snap_",
    "snapshot"
);

prefixed_id!(
    /// A volume's id: `vol_` and 1 to 64 ASCII letters or digits.
    VolumeId,
    "vol_",
    "volume"
);

prefixed_id!(
    /// An API key's public id (not its secret): `key_` and 1 to 64 ASCII letters or digits.
    KeyId,
    "key_",
    "API key"
);

/// Whether `s` is `prefix` and 1 to 64 ASCII letters or digits.
fn has_form(s: &str, prefix: &str) -> bool {
    s.strip_prefix(prefix).is_some_and(|r| {
        !r.is_empty() && r.len() <= 64 && r.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// `len` random characters of a lowercase base32 alphabet.
pub fn random_token(len: usize) -> String {
    let mut bytes = vec![0u8; len];
    getrandom::fill(&mut bytes).expect("the kernel's random source is always available");
    bytes
        .iter()
        .map(|b| ALPHABET[(*b & 31) as usize] as char)
        .collect()
}

/// A new sandbox id, `sbx_` and 16 characters (80 random bits).
pub fn new_sandbox_id() -> SandboxId {
    SandboxId::random()
}

/// A new snapshot id, `snap_` and 16 characters (80 random bits).
pub fn new_snapshot_id() -> SnapshotId {
    SnapshotId::random()
}

/// A new volume id, `vol_` and 16 characters (80 random bits).
pub fn new_volume_id() -> VolumeId {
    VolumeId::random()
}

/// Whether `s` looks like a volume id.
pub fn is_volume_id(s: &str) -> bool {
    has_form(s, "vol_")
}

/// A new API key (`hk_` and 40 characters, 200 random bits).
pub fn new_api_key() -> String {
    format!("hk_{}", random_token(40))
}

/// A random u32 (for uid slot selection).
pub fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).expect("the kernel's random source is always available");
    u32::from_le_bytes(b)
}

/// Whether `s` looks like a sandbox id we could have issued.
pub fn is_sandbox_id(s: &str) -> bool {
    has_form(s, "sbx_")
}

/// Whether `s` looks like a snapshot id we could have issued.
pub fn is_snapshot_id(s: &str) -> bool {
    has_form(s, "snap_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_well_formed() {
        let a = new_sandbox_id();
        let b = new_sandbox_id();
        assert_ne!(a, b);
        assert!(is_sandbox_id(&a));
        assert!(!is_sandbox_id("sbx_../x"));
        assert!(!is_sandbox_id("snap_abc"));
        assert!(new_api_key().starts_with("hk_"));
        assert!(is_snapshot_id(&new_snapshot_id()));
        assert!(!is_snapshot_id("snap_../x"));
        assert!(!is_snapshot_id(&a));
    }

    #[test]
    fn sandbox_id_parses_only_the_sbx_form() {
        let id = new_sandbox_id();
        assert_eq!(id.as_str().parse::<SandboxId>(), Ok(id.clone()));
        for bad in ["sbx_", "sbx_../x", "snap_abc", "", "SBX_abc", "sbx_a b"] {
            let e = bad.parse::<SandboxId>().expect_err("malformed");
            assert_eq!(e.to_string(), format!("sandbox {bad} does not exist"));
        }
        let long = format!("sbx_{}", "a".repeat(65));
        assert!(long.parse::<SandboxId>().is_err());
    }

    #[test]
    fn snapshot_id_parses_only_the_snap_form() {
        let id = new_snapshot_id();
        assert_eq!(id.as_str().parse::<SnapshotId>(), Ok(id.clone()));
        for bad in ["snap_", "snap_../x", "sbx_abc", ""] {
            let e = bad.parse::<SnapshotId>().expect_err("malformed");
            assert_eq!(e.to_string(), format!("snapshot {bad} does not exist"));
        }
    }

    #[test]
    fn volume_id_parses_only_the_vol_form() {
        let id = new_volume_id();
        assert_eq!(id.as_str().parse::<VolumeId>(), Ok(id.clone()));
        for bad in ["vol_", "vol_../x", "snap_abc", "data"] {
            let e = bad.parse::<VolumeId>().expect_err("malformed");
            assert_eq!(e.to_string(), format!("volume {bad} does not exist"));
        }
    }

    #[test]
    fn sandbox_id_serializes_as_the_bare_string() {
        let id: SandboxId = "sbx_0123456789abcdef".parse().expect("well-formed");
        let json = serde_json::to_string(&id).expect("serializes");
        assert_eq!(json, "\"sbx_0123456789abcdef\"");
        assert_eq!(
            serde_json::from_str::<SandboxId>(&json).expect("deserializes"),
            id
        );
        assert_eq!(id.to_string(), "sbx_0123456789abcdef");
    }
}
