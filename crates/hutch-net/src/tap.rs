//! Networking for `vm` sandboxes: a slot's namespace turned into a small L2 segment. The
//! sandbox address moves from the namespace's `eth0` to the guest: `eth0` and a TAP device
//! become ports of a bridge `br0`, QEMU gets the TAP's descriptor, and the guest configures
//! the slot's address on its virtio-net interface. Policy stays where it is (the host end
//! `hz<N>` and the server's nftables), so a guest is filtered exactly like an `ns` sandbox.

use std::fs::OpenOptions;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use futures_util::TryStreamExt;
use rtnetlink::{Handle, LinkBridge, LinkUnspec};

use crate::link::{self, nl};
use crate::{netns, NetError};

/// Name of the TAP device in a slot namespace.
pub const TAP_NAME: &str = "tap0";
/// Name of the bridge in a slot namespace.
pub const BRIDGE_NAME: &str = "br0";

const TUNSETIFF: libc::c_ulong = 0x4004_54CA;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Create the TAP device in the slot namespace `slot_ns`, bridge it with `eth0`, move the
/// slot's address off `eth0` (the guest takes it), and return the TAP's descriptor for QEMU
/// (`-netdev tap,fd=…`). The device lives as long as the descriptor.
pub fn attach_tap(slot_ns: &OwnedFd) -> Result<OwnedFd, NetError> {
    netns::run_in(slot_ns, || {
        let tun = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(NetError::sys("open /dev/net/tun"))?;
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            // No vnet header: QEMU uses the TAP like its hub backend (see hutch-vm).
            flags: IFF_TAP | IFF_NO_PI,
            _pad: [0; 22],
        };
        req.name[..TAP_NAME.len()].copy_from_slice(TAP_NAME.as_bytes());
        // SAFETY: TUNSETIFF reads and writes an ifreq, which `req` is, for the call.
        let rc = unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, &mut req) };
        if rc != 0 {
            return Err(NetError::sys("TUNSETIFF tap0")(
                std::io::Error::last_os_error(),
            ));
        }
        link::block_on_netlink(|handle| async move { bridge(&handle).await })?;
        Ok(OwnedFd::from(tun))
    })
}

/// The index of `name`, which must exist.
async fn index_of(h: &Handle, name: &str) -> Result<u32, NetError> {
    link::index_of(h, name)
        .await?
        .ok_or_else(|| NetError::Invalid(format!("{name} is missing in the slot namespace")))
}

async fn bridge(h: &Handle) -> Result<(), NetError> {
    let eth0 = index_of(h, "eth0").await?;
    let mut addrs = h.address().get().set_link_index_filter(eth0).execute();
    let mut found = Vec::new();
    while let Some(a) = addrs.try_next().await.map_err(nl("list eth0 addresses"))? {
        found.push(a);
    }
    for a in found {
        h.address()
            .del(a)
            .execute()
            .await
            .map_err(nl("remove eth0's address"))?;
    }
    // A woken guest's slot already has its bridge (the old TAP went with the old QEMU).
    let br = match index_of(h, BRIDGE_NAME).await {
        Ok(i) => i,
        Err(_) => {
            h.link()
                .add(LinkBridge::new(BRIDGE_NAME).build())
                .execute()
                .await
                .map_err(nl("add br0"))?;
            index_of(h, BRIDGE_NAME).await?
        }
    };
    let tap = index_of(h, TAP_NAME).await?;
    for port in [eth0, tap] {
        h.link()
            .set(LinkUnspec::new_with_index(port).controller(br).up().build())
            .execute()
            .await
            .map_err(nl("add a port to br0"))?;
    }
    h.link()
        .set(LinkUnspec::new_with_index(br).up().build())
        .execute()
        .await
        .map_err(nl("set br0 up"))?;
    Ok(())
}

/// The guest's network settings for slot addresses `addrs`: (address/prefix, gateway, DNS).
pub fn guest_config(addrs: &crate::addr::SlotAddrs) -> (String, IpAddr, IpAddr) {
    (
        format!("{}/{}", addrs.sandbox, crate::addr::SLOT_PREFIX),
        IpAddr::V4(addrs.gateway),
        IpAddr::V4(addrs.gateway),
    )
}
