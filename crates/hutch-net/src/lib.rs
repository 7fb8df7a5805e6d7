//! Sandbox networking (DESIGN.md §5).
//!
//! Every networked sandbox gets a **slot**: a network namespace owned by the host (so root
//! inside a sandbox holds no capability over its own interfaces, addresses, routes or
//! firewall), a veth pair whose host end `hz<N>` lives in the server's network namespace, and
//! a /30 from a private pool (gateway `.1` on the host end, the sandbox `.2` on `eth0`).
//! Slots are built ahead of time with netlink ([`link`]) so a create only hands one out.
//!
//! Policy is enforced in the server's namespace, outside the sandbox: one nftables table
//! ([`nft`]) drops what is always forbidden (link-local/metadata, other sandboxes, the host's
//! own services, spoofed sources, mining ports) and jumps to a per-sandbox chain for the
//! sandbox's own egress policy ([`policy`]). Domain rules go through Hutch's resolver
//! ([`dns`]), which answers only allowed names and pins their addresses, and a transparent
//! proxy ([`proxy`]) that checks the TLS SNI or HTTP Host on ports 443 and 80.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod addr;
pub mod dnsmsg;
pub mod link;
pub mod netns;
pub mod nft;
pub mod policy;
pub mod sni;
pub mod tap;

mod cached;
mod network;
mod proxy;
mod resolver;
mod services;

mod error;

pub use error::NetError;
pub use network::{system_nameserver, NetConfig, Network, SlotCounts, SlotLease, Traffic};
