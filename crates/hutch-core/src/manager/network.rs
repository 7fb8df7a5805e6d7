//! Sandbox networking in the manager: the policy a create asks for, the slot a networked
//! sandbox holds while it has processes (a hibernated one gives it back and keeps only its
//! address, which its wake takes again when free), live policy changes and traffic.

use std::sync::Arc;

use hutch_net::policy::{Egress, Policy, PolicySpec};

use super::{blocking, wrong_state, Manager};
use crate::error::{CoreError, CoreResult};
use crate::ids::SandboxId;
use crate::model::{SandboxRecord, SandboxView};
use crate::sandbox_network::SandboxNetwork;

/// The policy stored in a record (`None`: loopback only).
pub(crate) fn record_policy(r: &SandboxRecord) -> Policy {
    r.network
        .as_ref()
        .map(|n| n.policy.clone())
        .unwrap_or_else(|| SandboxNetwork::loopback_only().policy)
}

/// The address of `r`'s slot, as stored with its policy.
pub(crate) fn record_address(r: &SandboxRecord) -> Option<std::net::Ipv4Addr> {
    r.network.as_ref().and_then(|n| n.address)
}

impl Manager {
    /// The policy a create asks for, validated; without one, `allow` where this server gives
    /// sandboxes a network and loopback only where it does not.
    pub(super) fn requested_policy(
        &self,
        requested: Option<&PolicySpec>,
    ) -> CoreResult<SandboxNetwork> {
        let spec = match requested {
            Some(spec) => spec.clone(),
            None if self.network.is_some() => PolicySpec::default(),
            None => PolicySpec {
                egress: Egress::None,
                ..PolicySpec::default()
            },
        };
        let policy = Policy::from_spec(&spec).map_err(CoreError::from)?;
        if policy.networked() && self.network.is_none() {
            return Err(CoreError::InvalidArgument(crate::NO_NETWORK_MESSAGE.into()));
        }
        Ok(SandboxNetwork::new(policy))
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
        // A woken sandbox gets its address back when no other sandbox took it meanwhile.
        let preferred = record_address(r).and_then(|a| net.slot_of_address(a));
        let lease = net
            .acquire_preferring(&r.id, &policy, preferred)
            .map_err(CoreError::from)?;
        r.net_slot = Some(lease.index);
        r.network = Some(SandboxNetwork {
            policy,
            address: Some(lease.addrs.sandbox),
        });
        Ok(())
    }

    /// Give back `r`'s slot if it holds it (blocking).
    pub(super) fn detach_network(&self, r: &SandboxRecord) {
        if let (Some(net), Some(i)) = (&self.network, r.net_slot) {
            net.release_held(i, &r.id);
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
        id: &SandboxId,
        spec: PolicySpec,
    ) -> CoreResult<SandboxView> {
        self.load(id).await?;
        let _op = self.op_lock(id).await;
        let r = self.touch(id).await?;
        if !r.state.holds_resources() && r.state != crate::model::SandboxState::Hibernated {
            return Err(wrong_state(&r, Some("change the network of")));
        }
        let policy = Policy::from_spec(&spec).map_err(CoreError::from)?;
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
                blocking(move || net.set_policy(index, &p).map_err(CoreError::from)).await?;
            }
        }
        let network = SandboxNetwork { policy, address };
        let r = self
            .store
            .modify(id, |rec| {
                rec.network = Some(network.clone());
                Ok(())
            })
            .await?;
        self.events.publish(
            "sandbox.network_changed",
            id,
            r.tenant(),
            Some(serde_json::to_string(&network).map_err(CoreError::Encode)?),
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
            view.network.connections_out = Some(t.connections_out);
            view.network.bytes_out = Some(t.bytes_out);
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
