//! Building and removing a slot's links with netlink (no `ip` processes).
//!
//! A slot is built on a short-lived thread that holds two netlink sockets: one opened in the
//! server's namespace before the thread unshares a new one, one opened after. The veth pair is
//! created from the host side with its peer placed straight into the new namespace as `eth0`.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use futures_util::TryStreamExt;
use rtnetlink::packet_route::link::{InfoData, InfoKind, InfoVeth};
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder};

use crate::addr::{host_ifname, SlotAddrs, SLOT_PREFIX};
use crate::{netns, NetError};

/// A built slot: its namespace and addresses.
#[derive(Debug)]
pub struct BuiltSlot {
    /// The addresses.
    pub addrs: SlotAddrs,
    /// The slot's network namespace (kept alive by this descriptor).
    pub netns: OwnedFd,
}

pub(crate) fn nl(op: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetError {
    let op = op.into();
    move |e| NetError::Netlink {
        op,
        message: e.to_string(),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, NetError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(NetError::sys("start a netlink runtime"))
}

fn connect() -> Result<(Handle, impl std::future::Future<Output = ()>), NetError> {
    let (conn, handle, _) = rtnetlink::new_connection().map_err(NetError::sys("open netlink"))?;
    Ok((handle, conn))
}

/// Run `f` with a netlink handle of the calling thread's network namespace, on a runtime of
/// its own (for the short-lived threads that enter a namespace).
pub(crate) fn block_on_netlink<T, Fut>(f: impl FnOnce(Handle) -> Fut) -> Result<T, NetError>
where
    Fut: std::future::Future<Output = Result<T, NetError>>,
{
    let rt = runtime()?;
    let _guard = rt.enter();
    let (handle, conn) = connect()?;
    rt.spawn(conn);
    rt.block_on(f(handle))
}

/// Sysctls of every slot namespace: unprivileged ports from 0 (root inside holds no capability
/// in a host-owned namespace, yet may serve on port 80), unprivileged ICMP echo, no IPv6 (the
/// sandbox network is IPv4; no link-local IPv6 path exists).
const SLOT_SYSCTLS: &[(&str, &str)] = &[
    ("net/ipv4/ip_unprivileged_port_start", "0"),
    ("net/ipv4/ping_group_range", "0 2147483647"),
    ("net/ipv6/conf/all/disable_ipv6", "1"),
    ("net/ipv6/conf/default/disable_ipv6", "1"),
];

/// Build slot `addrs`: a new namespace with `lo` and `eth0` up, the sandbox address and a
/// default route via the host end `hz<N>`, which gets the gateway address. `host_ns` is the
/// server's namespace. A stale `hz<N>` (left by a crashed server) is replaced.
pub fn build_slot(host_ns: &OwnedFd, addrs: SlotAddrs) -> Result<BuiltSlot, NetError> {
    let host_ns = host_ns
        .try_clone()
        .map_err(NetError::sys("duplicate the host netns descriptor"))?;
    std::thread::Builder::new()
        .name("hutch-slot".into())
        .spawn(move || -> Result<BuiltSlot, NetError> {
            netns::enter(host_ns.as_fd())?;
            let rt = runtime()?;
            let _guard = rt.enter();
            let (host, host_conn) = connect()?;
            rt.spawn(host_conn);
            let slot_ns = netns::unshare_new()?;
            let (slot, slot_conn) = connect()?;
            rt.spawn(slot_conn);
            for (key, value) in SLOT_SYSCTLS {
                netns::write_sysctl(key, value)?;
            }
            rt.block_on(configure(&host, &slot, &slot_ns, addrs))?;
            Ok(BuiltSlot {
                addrs,
                netns: slot_ns,
            })
        })
        .map_err(NetError::sys("start a slot thread"))?
        .join()
        .map_err(|_| NetError::Invalid("a slot thread panicked".into()))?
}

async fn configure(
    host: &Handle,
    slot: &Handle,
    slot_ns: &OwnedFd,
    addrs: SlotAddrs,
) -> Result<(), NetError> {
    let name = host_ifname(addrs.index);
    if let Some(stale) = index_of(host, &name).await? {
        host.link()
            .del(stale)
            .execute()
            .await
            .map_err(nl(format!("delete stale {name}")))?;
    }
    let peer = LinkMessageBuilder::<LinkUnspec>::new()
        .name("eth0".to_string())
        .setns_by_fd(slot_ns.as_raw_fd())
        .build();
    let veth = LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
        .name(name.clone())
        .address(gateway_mac(addrs.index).to_vec())
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
        .build();
    host.link()
        .add(veth)
        .execute()
        .await
        .map_err(nl(format!("add veth {name}")))?;
    let host_index = index_of(host, &name)
        .await?
        .ok_or_else(|| NetError::Invalid(format!("{name} vanished after its creation")))?;
    host.address()
        .add(host_index, IpAddr::V4(addrs.gateway), SLOT_PREFIX)
        .execute()
        .await
        .map_err(nl(format!("address {} on {name}", addrs.gateway)))?;
    set_up(host, host_index, &name).await?;

    let lo = index_of(slot, "lo")
        .await?
        .ok_or_else(|| NetError::Invalid("no lo in a new namespace".into()))?;
    set_up(slot, lo, "lo").await?;
    let eth0 = index_of(slot, "eth0")
        .await?
        .ok_or_else(|| NetError::Invalid("eth0 missing in the slot namespace".into()))?;
    slot.address()
        .add(eth0, IpAddr::V4(addrs.sandbox), SLOT_PREFIX)
        .execute()
        .await
        .map_err(nl(format!("address {} on eth0", addrs.sandbox)))?;
    set_up(slot, eth0, "eth0").await?;
    let route = RouteMessageBuilder::<Ipv4Addr>::new()
        .gateway(addrs.gateway)
        .output_interface(eth0)
        .build();
    slot.route()
        .add(route)
        .execute()
        .await
        .map_err(nl(format!("default route via {}", addrs.gateway)))?;
    Ok(())
}

/// The MAC address of slot `index`'s host end (its gateway): the same every time the slot is
/// built, so a `vm` guest woken from memory onto a rebuilt slot (its slot is given back at
/// hibernation) still reaches its gateway through the neighbour entry it kept. Locally
/// administered, unicast: `02:68:7a` and the slot number.
pub(crate) fn gateway_mac(index: u32) -> [u8; 6] {
    let [_, a, b, c] = index.to_be_bytes();
    [0x02, 0x68, 0x7a, a, b, c]
}

async fn set_up(handle: &Handle, index: u32, name: &str) -> Result<(), NetError> {
    handle
        .link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(nl(format!("set {name} up")))
}

pub(crate) async fn index_of(handle: &Handle, name: &str) -> Result<Option<u32>, NetError> {
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(Some(msg)) => Ok(Some(msg.header.index)),
        Ok(None) => Ok(None),
        // ENODEV: no such link.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(nl(format!("look up {name}"))(e)),
    }
}

/// Delete slot `index`'s host end (which deletes the pair) in the namespace `host_ns`; a
/// missing link is not an error.
pub fn remove_host_link(host_ns: &OwnedFd, index: u32) -> Result<(), NetError> {
    netns::run_in(host_ns, move || {
        block_on_netlink(|host| async move {
            let name = host_ifname(index);
            if let Some(i) = index_of(&host, &name).await? {
                match host.link().del(i).execute().await {
                    Ok(()) => {}
                    Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => {}
                    Err(e) => return Err(nl(format!("delete {name}"))(e)),
                }
            }
            Ok(())
        })
    })
}

/// Names of every `hz<N>` link in `host_ns` with their slot numbers.
pub fn list_host_links(host_ns: &OwnedFd) -> Result<Vec<u32>, NetError> {
    netns::run_in(host_ns, move || {
        block_on_netlink(|host| async move {
            let mut out = Vec::new();
            let mut links = host.link().get().execute();
            while let Some(msg) = links.try_next().await.map_err(nl("list links"))? {
                for attr in &msg.attributes {
                    if let rtnetlink::packet_route::link::LinkAttribute::IfName(n) = attr {
                        if let Some(i) = n.strip_prefix("hz").and_then(|d| d.parse().ok()) {
                            out.push(i);
                        }
                    }
                }
            }
            Ok(out)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slots_gateway_mac_is_fixed_local_and_unicast() {
        assert_eq!(
            gateway_mac(0x01_02_03),
            [0x02, 0x68, 0x7a, 0x01, 0x02, 0x03]
        );
        assert_eq!(gateway_mac(7), gateway_mac(7));
        assert_ne!(gateway_mac(7), gateway_mac(8));
        // Locally administered (bit 1), not multicast (bit 0).
        assert_eq!(gateway_mac(9)[0] & 0b11, 0b10);
    }
}
