//! The private IPv4 pool sandboxes take their addresses from: one /30 per slot.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use crate::NetError;

/// An IPv4 network, `a.b.c.d/len`, with the host bits zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Net {
    /// Network address.
    pub addr: Ipv4Addr,
    /// Prefix length (0–32).
    pub len: u8,
}

impl Ipv4Net {
    /// The network containing `addr` with prefix `len` (host bits cleared).
    pub fn new(addr: Ipv4Addr, len: u8) -> Result<Self, NetError> {
        if len > 32 {
            return Err(NetError::Invalid(format!("prefix length {len} is over 32")));
        }
        Ok(Self {
            addr: Ipv4Addr::from(u32::from(addr) & mask(len)),
            len,
        })
    }

    /// Whether `ip` is inside this network.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.len) == u32::from(self.addr)
    }

    /// Number of addresses.
    pub fn size(&self) -> u64 {
        1u64 << (32 - u32::from(self.len))
    }
}

fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    }
}

impl FromStr for Ipv4Net {
    type Err = NetError;

    fn from_str(s: &str) -> Result<Self, NetError> {
        let bad = || NetError::Invalid(format!("{s:?} is not an IPv4 address or CIDR"));
        let (ip, len) = match s.split_once('/') {
            Some((ip, len)) => (ip, len.parse::<u8>().map_err(|_| bad())?),
            None => (s, 32),
        };
        let ip: Ipv4Addr = ip.parse().map_err(|_| bad())?;
        if len > 32 {
            return Err(bad());
        }
        Ok(Self {
            addr: Ipv4Addr::from(u32::from(ip) & mask(len)),
            len,
        })
    }
}

impl fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// The addresses of one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotAddrs {
    /// Slot number (names the host interface `hz<index>`).
    pub index: u32,
    /// The host end's address, the sandbox's default gateway and resolver.
    pub gateway: Ipv4Addr,
    /// The sandbox's address on `eth0`.
    pub sandbox: Ipv4Addr,
}

/// Prefix length of every slot's link.
pub const SLOT_PREFIX: u8 = 30;

/// The pool: slot `i` is the `i`-th /30 of the network.
#[derive(Debug, Clone, Copy)]
pub struct Pool {
    net: Ipv4Net,
}

impl Pool {
    /// A pool over `net`, which must hold at least one /30 and be private (RFC 1918 or
    /// 100.64.0.0/10), so sandboxes never take addresses of the internet.
    pub fn new(net: Ipv4Net) -> Result<Self, NetError> {
        if net.len > SLOT_PREFIX {
            return Err(NetError::Invalid(format!(
                "the sandbox pool {net} is smaller than one /{SLOT_PREFIX}"
            )));
        }
        let private = [
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "100.64.0.0/10",
        ]
        .iter()
        .filter_map(|c| c.parse::<Ipv4Net>().ok())
        .any(|p| p.len <= net.len && p.contains(net.addr));
        if !private {
            return Err(NetError::Invalid(format!(
                "the sandbox pool {net} must be inside a private range (10/8, 172.16/12, 192.168/16, 100.64/10)"
            )));
        }
        Ok(Self { net })
    }

    /// The network.
    pub fn net(&self) -> Ipv4Net {
        self.net
    }

    /// Number of slots.
    pub fn capacity(&self) -> u32 {
        (self.net.size() / 4).min(u64::from(u32::MAX)) as u32
    }

    /// The addresses of slot `index`.
    pub fn slot(&self, index: u32) -> Option<SlotAddrs> {
        if index >= self.capacity() {
            return None;
        }
        let base = u32::from(self.net.addr) + index * 4;
        Some(SlotAddrs {
            index,
            gateway: Ipv4Addr::from(base + 1),
            sandbox: Ipv4Addr::from(base + 2),
        })
    }

    /// The slot whose sandbox address is `ip`.
    pub fn slot_of(&self, ip: Ipv4Addr) -> Option<u32> {
        if !self.net.contains(ip) {
            return None;
        }
        let off = u32::from(ip) - u32::from(self.net.addr);
        (off % 4 == 2).then_some(off / 4)
    }
}

/// Name of the host end of slot `index`'s veth.
pub fn host_ifname(index: u32) -> String {
    format!("hz{index}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_consecutive_slash_30s() {
        let pool = Pool::new("10.213.0.0/16".parse().unwrap()).unwrap();
        assert_eq!(pool.capacity(), 16384);
        let s = pool.slot(3).unwrap();
        assert_eq!(s.gateway, Ipv4Addr::new(10, 213, 0, 13));
        assert_eq!(s.sandbox, Ipv4Addr::new(10, 213, 0, 14));
        assert_eq!(pool.slot_of(s.sandbox), Some(3));
        assert_eq!(pool.slot_of(s.gateway), None);
        assert!(pool.slot(16384).is_none());
    }

    #[test]
    fn public_or_tiny_pools_are_refused() {
        assert!(Pool::new("8.8.0.0/16".parse().unwrap()).is_err());
        assert!(Pool::new("10.0.0.0/31".parse().unwrap()).is_err());
        assert!("10.0.0.1/33".parse::<Ipv4Net>().is_err());
        assert_eq!(
            "10.1.2.3/8".parse::<Ipv4Net>().unwrap().to_string(),
            "10.0.0.0/8"
        );
    }
}
