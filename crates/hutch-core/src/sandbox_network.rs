//! A sandbox's network as its record keeps it and the API shows it: the validated egress
//! policy ([`hutch_net::policy::Policy`]) and the address of the slot it holds.
//!
//! A create's or `PUT …/network`'s [`PolicySpec`] is validated into a [`Policy`] once, in the
//! manager; from there on the policy travels typed (record, networking, warm pool, events).
//!
//! On disk and on the wire it is the JSON of earlier versions, where the record held a JSON
//! value: `{"egress", "allow", "deny"}` in canonical spelling ([`Policy::to_spec`]), plus
//! `"address"` while the sandbox has a slot; the view adds `"connections_out"` and
//! `"bytes_out"`. A stored value that does not validate any more (or never did) reads as
//! loopback only, as it did before.

use std::net::Ipv4Addr;

use hutch_net::policy::{Egress, Policy, PolicySpec};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A sandbox's egress policy and, while it holds a slot, its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxNetwork {
    /// The validated policy.
    pub policy: Policy,
    /// The sandbox's address on its slot (`None`: no slot, or loopback only).
    pub address: Option<Ipv4Addr>,
}

impl SandboxNetwork {
    /// Loopback only (`egress: none`), no address.
    pub fn loopback_only() -> Self {
        Self {
            policy: Policy {
                egress: Egress::None,
                ..Policy::default()
            },
            address: None,
        }
    }

    /// `policy` without an address yet.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            address: None,
        }
    }
}

impl Serialize for SandboxNetwork {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let spec = self.policy.to_spec();
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("egress", &spec.egress)?;
        map.serialize_entry("allow", &spec.allow)?;
        map.serialize_entry("deny", &spec.deny)?;
        if let Some(address) = self.address {
            map.serialize_entry("address", &address.to_string())?;
        }
        map.end()
    }
}

/// The stored form: the spec's fields, the address, and the view's traffic counters (which
/// earlier versions never stored, but a value copied from a view may hold).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    #[serde(default)]
    egress: Egress,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default)]
    address: Option<String>,
    #[serde(default, rename = "connections_out")]
    _connections_out: Option<serde::de::IgnoredAny>,
    #[serde(default, rename = "bytes_out")]
    _bytes_out: Option<serde::de::IgnoredAny>,
}

/// A stored value, or anything else (read as loopback only).
#[derive(Deserialize)]
#[serde(untagged)]
enum StoredOrNot {
    Stored(Stored),
    Unreadable(serde::de::IgnoredAny),
}

impl<'de> Deserialize<'de> for SandboxNetwork {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let StoredOrNot::Stored(stored) = StoredOrNot::deserialize(deserializer)? else {
            tracing::warn!("a stored network policy does not parse: loopback only");
            return Ok(Self::loopback_only());
        };
        let spec = PolicySpec {
            egress: stored.egress,
            allow: stored.allow,
            deny: stored.deny,
        };
        let Ok(policy) = Policy::from_spec(&spec) else {
            tracing::warn!(
                ?spec,
                "a stored network policy does not validate: loopback only"
            );
            return Ok(Self::loopback_only());
        };
        Ok(Self {
            policy,
            address: stored.address.and_then(|a| a.parse().ok()),
        })
    }
}

/// The `network` of a sandbox in the API: its policy and address, and the traffic it sent
/// out (networked sandboxes with a live slot, on `GET /v1/sandboxes/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkView {
    /// Policy and address.
    #[serde(flatten)]
    pub network: SandboxNetwork,
    /// Connections (and UDP flows) opened out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections_out: Option<u64>,
    /// Bytes sent out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_out: Option<u64>,
}

impl From<SandboxNetwork> for NetworkView {
    fn from(network: SandboxNetwork) -> Self {
        Self {
            network,
            connections_out: None,
            bytes_out: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn policy(spec: serde_json::Value) -> Policy {
        let spec: PolicySpec = serde_json::from_value(spec).expect("a spec");
        Policy::from_spec(&spec).expect("a valid spec")
    }

    /// The JSON every earlier version stored (`policy_json`: the spec, then the address).
    #[test]
    fn stored_values_of_earlier_versions_load() {
        let stored = json!({
            "egress": "deny",
            "allow": ["203.0.113.10", "*.example.com"],
            "deny": [],
            "address": "10.200.0.6"
        });
        let n: SandboxNetwork = serde_json::from_value(stored.clone()).expect("loads");
        assert_eq!(
            n.policy,
            policy(json!({"egress": "deny", "allow": ["203.0.113.10", "*.example.com"]}))
        );
        assert_eq!(n.address, Some(Ipv4Addr::new(10, 200, 0, 6)));
        assert_eq!(serde_json::to_value(&n).expect("serializes"), stored);

        let n: SandboxNetwork =
            serde_json::from_value(json!({"egress": "none", "allow": [], "deny": []}))
                .expect("loads");
        assert_eq!(n, SandboxNetwork::loopback_only());
        assert_eq!(
            serde_json::to_value(&n).expect("serializes"),
            json!({"egress": "none", "allow": [], "deny": []})
        );
    }

    #[test]
    fn a_value_that_does_not_validate_reads_as_loopback_only() {
        for bad in [
            json!({"egress": "allow", "allow": ["::1"]}),
            json!({"egress": "sideways"}),
            json!({"egress": "allow", "surprise": true}),
            json!("allow"),
        ] {
            let n: SandboxNetwork = serde_json::from_value(bad.clone()).expect("loads");
            assert_eq!(n, SandboxNetwork::loopback_only(), "{bad}");
        }
    }

    #[test]
    fn the_view_adds_traffic_and_reads_back() {
        let view = NetworkView {
            network: SandboxNetwork {
                policy: policy(json!({"egress": "allow"})),
                address: Some(Ipv4Addr::new(10, 200, 0, 2)),
            },
            connections_out: Some(3),
            bytes_out: Some(1200),
        };
        let v = serde_json::to_value(&view).expect("serializes");
        assert_eq!(
            v,
            json!({"egress": "allow", "allow": [], "deny": [], "address": "10.200.0.2",
                   "connections_out": 3, "bytes_out": 1200})
        );
        let back: NetworkView = serde_json::from_value(v).expect("reads back");
        assert_eq!(back, view);
    }
}
