//! Sandbox networking in the manager: the policy a create asks for, the slot a networked
//! sandbox holds while it has processes or is hibernated, live policy changes and traffic.

use std::sync::Arc;

use hutch_net::policy::{Egress, Policy, PolicySpec};
use hutch_net::NetError;

use super::{blocking, wrong_state, Manager};
use crate::error::{CoreError, CoreResult};
use crate::model::{SandboxRecord, SandboxView};

pub(crate) fn net_error(e: NetError) -> CoreError {
    match e {
        NetError::Invalid(m) => CoreError::InvalidArgument(m),
        NetError::PoolExhausted(_) => CoreError::Quota(e.to_string()),
        other => CoreError::Internal(format!("sandbox network: {other}")),
    }
}

/// The policy stored in a record (`None` or unparsable: loopback only).
pub(crate) fn record_policy(r: &SandboxRecord) -> Policy {
    r.network
        .as_ref()
        .and_then(|v| serde_json::from_value::<PolicySpec>(without_status(v)).ok())
        .and_then(|s| Policy::from_spec(&s).ok())
        .unwrap_or(Policy {
            egress: Egress::None,
            ..Policy::default()
        })
}

/// The address of `r`'s slot, as stored with its policy.
pub(crate) fn record_address(r: &SandboxRecord) -> Option<std::net::Ipv4Addr> {
    r.network
        .as_ref()
        .and_then(|v| v.get("address"))
        .and_then(|a| a.as_str())
        .and_then(|a| a.parse().ok())
}

/// A stored network value without the status fields the server adds (address, traffic).
fn without_status(v: &serde_json::Value) -> serde_json::Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        for k in ["address", "connections_out", "bytes_out"] {
            o.remove(k);
        }
    }
    v
}

pub(super) fn policy_json(
    policy: &Policy,
    address: Option<std::net::Ipv4Addr>,
) -> serde_json::Value {
    let mut v = serde_json::to_value(policy.to_spec()).unwrap_or_default();
    if let (Some(o), Some(a)) = (v.as_object_mut(), address) {
        o.insert("address".into(), a.to_string().into());
    }
    v
}

impl Manager {
    /// The policy a create asks for, validated; without one, `allow` where this server gives
    /// sandboxes a network and loopback only where it does not.
    pub(super) fn requested_policy(
        &self,
        requested: Option<&serde_json::Value>,
    ) -> CoreResult<serde_json::Value> {
        let spec = match requested {
            Some(v) => serde_json::from_value::<PolicySpec>(without_status(v))
                .map_err(|e| CoreError::InvalidArgument(format!("network: {e}")))?,
            None if self.network.is_some() => PolicySpec::default(),
            None => PolicySpec {
                egress: Egress::None,
                ..PolicySpec::default()
            },
        };
        let policy = Policy::from_spec(&spec).map_err(net_error)?;
        if policy.networked() && self.network.is_none() {
            return Err(CoreError::InvalidArgument(crate::NO_NETWORK_MESSAGE.into()));
        }
        Ok(policy_json(&policy, None))
    }

    /// Give `r` a network slot if its policy wants one and it holds none this server knows
    /// (blocking: netlink and nft). Records the slot and address in `r`.
    pub(super) fn attach_network(&self, r: &mut SandboxRecord) -> CoreResult<()> {
        let Some(net) = &self.network else {
            r.net_slot = None;
            return Ok(());
        };
        let policy = record_policy(r);
        if !policy.networked() {
            return Ok(());
        }
        if r.net_slot
            .is_some_and(|i| net.netns_path(i, &r.id).is_some())
        {
            return Ok(());
        }
        let lease = net.acquire(&r.id, &policy).map_err(net_error)?;
        r.net_slot = Some(lease.index);
        r.network = Some(policy_json(&policy, Some(lease.addrs.sandbox)));
        Ok(())
    }

    /// Give back `r`'s slot (blocking).
    pub(super) fn detach_network(&self, r: &SandboxRecord) {
        if let (Some(net), Some(i)) = (&self.network, r.net_slot) {
            net.release(i);
        }
    }

    /// After a restart: take over the slot of a running sandbox (its namespace is reached
    /// through its init), or forget the slot of one whose namespace is gone.
    pub(super) fn readopt_network(&self, r: &SandboxRecord, running: bool) -> Option<u32> {
        let (net, index) = (self.network.as_ref()?, r.net_slot?);
        if !running {
            return None;
        }
        let pid = r.init_pid?;
        let path = std::path::PathBuf::from(format!("/proc/{pid}/ns/net"));
        match net.adopt(&r.id, index, &path, &record_policy(r)) {
            Ok(_) => Some(index),
            Err(e) => {
                tracing::error!(id = %r.id, error = %e, "re-adopting a sandbox's network");
                None
            }
        }
    }

    /// Replace a sandbox's egress policy at once (open connections it forbids are cut).
    pub async fn set_network(
        self: &Arc<Self>,
        id: &str,
        spec: PolicySpec,
    ) -> CoreResult<SandboxView> {
        self.load(id).await?;
        let _op = self.op_lock(id).await;
        let r = self.touch(id).await?;
        if !r.state.holds_resources() && r.state != crate::model::SandboxState::Hibernated {
            return Err(wrong_state(&r, Some("change the network of")));
        }
        let policy = Policy::from_spec(&spec).map_err(net_error)?;
        let current = record_policy(&r);
        if policy.networked() && !current.networked() {
            return Err(CoreError::Conflict(format!(
                "sandbox {id} was created without a network (egress \"none\"); it cannot gain one: create a new sandbox with a network policy"
            )));
        }
        let address = record_address(&r);
        if let (Some(net), Some(index)) = (self.network.clone(), r.net_slot) {
            if net.netns_path(index, id).is_some() {
                let p = policy.clone();
                blocking(move || net.set_policy(index, &p).map_err(net_error)).await?;
            }
        }
        let value = policy_json(&policy, address);
        let r = self
            .store
            .modify(id, |rec| {
                rec.network = Some(value.clone());
                Ok(())
            })
            .await?;
        self.events.publish(
            "sandbox.network_changed",
            id,
            r.tenant(),
            Some(value.to_string()),
        );
        Ok(r.view())
    }

    /// Connections and bytes out of a sandbox, merged into its view's `network`.
    pub(super) fn add_traffic(&self, r: &SandboxRecord, view: &mut SandboxView) {
        let (Some(net), Some(index)) = (&self.network, r.net_slot) else {
            return;
        };
        if net.netns_path(index, &r.id).is_none() {
            return;
        }
        if let Ok(t) = net.traffic(index) {
            if let Some(o) = view.network.as_object_mut() {
                o.insert("connections_out".into(), t.connections_out.into());
                o.insert("bytes_out".into(), t.bytes_out.into());
            }
        }
    }

    /// Traffic of every networked sandbox, by id (for `/metrics`).
    pub fn traffic_all(&self) -> std::collections::HashMap<String, hutch_net::Traffic> {
        self.network
            .as_ref()
            .and_then(|n| n.traffic_all().ok())
            .unwrap_or_default()
    }
}
