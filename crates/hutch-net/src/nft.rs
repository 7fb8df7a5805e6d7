//! The nftables side: one table, `inet hutch`, in the server's network namespace.
//!
//! The base ruleset (loaded whole at start, replacing any leftover) holds what is always true
//! for every sandbox interface `hz*`: reverse-path anti-spoofing, IPv4 only, DNS redirected
//! to Hutch's resolver, the host's own services closed except the resolver and the proxy,
//! link-local/metadata and other sandboxes unreachable, mining ports refused, NAT out. A
//! sandbox with a non-default policy gets a chain `p<N>` (jumped to through the verdict map
//! `sandbox_policy`) with interval sets of allowed and denied networks and a timeout set of
//! addresses pinned by the resolver.
//!
//! Live changes: the per-sandbox chain marks each connection it admits with the policy's
//! generation (`ct mark`) and accepts established packets only under that mark, so a new
//! generation re-judges every open connection on its next packet and resets those the new
//! policy forbids.
//!
//! Changes go through `nft -f -` in one transaction each (a ruleset load measured 6 ms here);
//! none is on the path of a default create.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::process::Command;

use crate::addr::{host_ifname, Ipv4Net};
use crate::policy::Policy;
use crate::NetError;

/// The table's name.
pub const TABLE: &str = "inet hutch";

/// Stratum mining pool ports refused by default (operator-configurable).
pub const DEFAULT_MINING_PORTS: &[u16] = &[
    3333, 3334, 4444, 5555, 7777, 8888, 9999, 14433, 14444, 45560, 45700,
];

/// What the base ruleset needs to know.
#[derive(Debug, Clone)]
pub struct BaseRules {
    /// The sandbox pool.
    pub pool: Ipv4Net,
    /// Port of Hutch's resolver on every gateway address.
    pub resolver_port: u16,
    /// Port of the transparent proxy.
    pub proxy_port: u16,
    /// TCP ports always refused.
    pub mining_ports: Vec<u16>,
}

fn port_set(ports: &[u16]) -> String {
    let list: Vec<String> = ports.iter().map(u16::to_string).collect();
    list.join(", ")
}

/// The whole base table, as one script that replaces any previous one.
pub fn base_ruleset(b: &BaseRules) -> String {
    let pool = b.pool;
    let res = b.resolver_port;
    let proxy = b.proxy_port;
    let mining = if b.mining_ports.is_empty() {
        String::new()
    } else {
        format!("elements = {{ {} }}; ", port_set(&b.mining_ports))
    };
    format!(
        r#"table inet hutch {{}}
delete table inet hutch
table inet hutch {{
  set mining_tcp {{ type inet_service; {mining}}}
  set proxied {{ type ifname; }}
  map sandbox_policy {{ type ifname : verdict; }}
  set conn_count {{ type ifname; flags dynamic; }}
  set byte_count {{ type ifname; flags dynamic; }}
  chain prerouting_filter {{
    type filter hook prerouting priority -150; policy accept;
    iifname "hz*" update @byte_count {{ iifname counter }}
    iifname "hz*" meta nfproto ipv6 drop comment "sandbox networks are IPv4 only"
    iifname "hz*" ip saddr != {pool} drop comment "anti-spoof: outside the pool"
    iifname "hz*" fib saddr . iif oif missing drop comment "anti-spoof: not this slot's address"
  }}
  chain prerouting_nat {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname "hz*" meta l4proto {{ tcp, udp }} th dport 53 redirect to :{res} comment "all DNS to Hutch's resolver"
    iifname @proxied tcp dport {{ 80, 443 }} redirect to :{proxy} comment "domain rules: SNI/Host proxy"
  }}
  chain input {{
    type filter hook input priority 0; policy accept;
    iifname "hz*" ct state established,related accept
    iifname "hz*" meta l4proto {{ tcp, udp }} th dport {res} accept comment "resolver"
    iifname "hz*" tcp dport {proxy} ct state new update @conn_count {{ iifname counter }} accept comment "proxy"
    iifname "hz*" tcp dport {proxy} accept
    iifname "hz*" drop comment "the host's own services (Hutch's API included)"
    iifname != "hz*" iifname != "lo" meta l4proto {{ tcp, udp }} th dport {{ {res}, {proxy} }} drop comment "resolver and proxy serve sandboxes only"
  }}
  chain forward {{
    type filter hook forward priority 0; policy accept;
    oifname "hz*" ct state established,related accept
    oifname "hz*" drop comment "nothing enters a sandbox unasked (other sandboxes included)"
    iifname "hz*" ip daddr 169.254.0.0/16 drop comment "link-local, cloud metadata"
    iifname "hz*" ip daddr {pool} drop comment "other sandboxes"
    iifname "hz*" ip daddr {{ 0.0.0.0/8, 127.0.0.0/8, 224.0.0.0/4, 255.255.255.255 }} drop
    iifname "hz*" tcp dport @mining_tcp reject with tcp reset comment "mining pools"
    iifname "hz*" meta l4proto {{ tcp, udp }} th dport 53 drop comment "DNS only through Hutch"
    iifname "hz*" ct state new update @conn_count {{ iifname counter }}
    iifname "hz*" iifname vmap @sandbox_policy
    iifname "hz*" accept
  }}
  chain postrouting_nat {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {pool} oifname != "hz*" masquerade
  }}
}}
"#
    )
}

fn chain(index: u32) -> String {
    format!("p{index}")
}

/// Script removing everything of slot `index` (policy chain, sets, traffic counters). Each
/// object is first (re)declared so the deletes succeed whether or not it existed.
pub fn remove_slot(index: u32) -> String {
    let mut s = clear_policy(index);
    let ifname = host_ifname(index);
    for set in ["conn_count", "byte_count"] {
        let _ = write!(
            s,
            "add element {TABLE} {set} {{ \"{ifname}\" }}\ndelete element {TABLE} {set} {{ \"{ifname}\" }}\n"
        );
    }
    s
}

/// Script taking slot `index` back to the open default (no chain, no sets).
pub fn clear_policy(index: u32) -> String {
    let c = chain(index);
    let ifname = host_ifname(index);
    format!(
        "add chain {TABLE} {c}\n\
         add element {TABLE} sandbox_policy {{ \"{ifname}\" : jump {c} }}\n\
         delete element {TABLE} sandbox_policy {{ \"{ifname}\" }}\n\
         add element {TABLE} proxied {{ \"{ifname}\" }}\n\
         delete element {TABLE} proxied {{ \"{ifname}\" }}\n\
         flush chain {TABLE} {c}\ndelete chain {TABLE} {c}\n\
         {sets}",
        sets = ["allow", "deny", "pins"]
            .iter()
            .map(|k| {
                let flags = if *k == "pins" { "timeout" } else { "interval" };
                format!(
                    "add set {TABLE} {c}_{k} {{ type ipv4_addr; flags {flags}; }}\n\
                     delete set {TABLE} {c}_{k}\n"
                )
            })
            .collect::<String>()
    )
}

fn elements(nets: &[Ipv4Net]) -> String {
    let list: Vec<String> = nets.iter().map(ToString::to_string).collect();
    list.join(", ")
}

/// Script installing `policy` for slot `index` under generation `generation`, with `pins`
/// (address, seconds left) kept from the resolver. An open policy clears everything instead.
pub fn apply_policy(
    index: u32,
    policy: &Policy,
    generation: u32,
    pins: &[(Ipv4Addr, u32)],
) -> String {
    if policy.is_open() {
        return clear_policy(index);
    }
    let c = chain(index);
    let ifname = host_ifname(index);
    let mark = format!("0x{generation:08x}");
    let mut s = String::new();
    // Declare (idempotent), then empty, the chain and its sets.
    let _ = writeln!(s, "add chain {TABLE} {c}");
    let _ = writeln!(s, "flush chain {TABLE} {c}");
    for (k, flags) in [
        ("allow", "interval"),
        ("deny", "interval"),
        ("pins", "timeout"),
    ] {
        let _ = writeln!(
            s,
            "add set {TABLE} {c}_{k} {{ type ipv4_addr; flags {flags}; }}"
        );
        let _ = writeln!(s, "flush set {TABLE} {c}_{k}");
    }
    let allow = policy.nets(true);
    if !allow.is_empty() {
        let _ = writeln!(
            s,
            "add element {TABLE} {c}_allow {{ {} }}",
            elements(&allow)
        );
    }
    let deny = policy.nets(false);
    if !deny.is_empty() {
        let _ = writeln!(s, "add element {TABLE} {c}_deny {{ {} }}", elements(&deny));
    }
    let pins: Vec<String> = pins
        .iter()
        .filter(|(_, secs)| *secs > 0)
        .map(|(ip, secs)| format!("{ip} timeout {secs}s"))
        .collect();
    if !pins.is_empty() {
        let _ = writeln!(s, "add element {TABLE} {c}_pins {{ {} }}", pins.join(", "));
    }
    let rule = |s: &mut String, r: &str| {
        let _ = writeln!(s, "add rule {TABLE} {c} {r}");
    };
    rule(&mut s, &format!("ct mark {mark} accept"));
    rule(
        &mut s,
        &format!("ip daddr @{c}_allow ct mark set {mark} accept"),
    );
    if policy.has_domain_rules() {
        rule(
            &mut s,
            "udp dport 443 reject with icmpx type admin-prohibited",
        );
        rule(
            &mut s,
            &format!("ip daddr @{c}_pins ct mark set {mark} accept"),
        );
    }
    rule(
        &mut s,
        &format!("ip daddr @{c}_deny meta l4proto tcp reject with tcp reset"),
    );
    rule(
        &mut s,
        &format!("ip daddr @{c}_deny reject with icmpx type admin-prohibited"),
    );
    match policy.egress {
        crate::policy::Egress::Allow => rule(&mut s, &format!("ct mark set {mark} accept")),
        _ => {
            rule(&mut s, "meta l4proto tcp reject with tcp reset");
            rule(&mut s, "reject with icmpx type admin-prohibited");
        }
    }
    let _ = writeln!(
        s,
        "add element {TABLE} sandbox_policy {{ \"{ifname}\" : jump {c} }}"
    );
    if policy.has_domain_rules() {
        let _ = writeln!(s, "add element {TABLE} proxied {{ \"{ifname}\" }}");
    } else {
        let _ = writeln!(s, "add element {TABLE} proxied {{ \"{ifname}\" }}");
        let _ = writeln!(s, "delete element {TABLE} proxied {{ \"{ifname}\" }}");
    }
    s
}

/// Script pinning `ips` (with seconds to live) for slot `index`.
pub fn add_pins(index: u32, ips: &[(Ipv4Addr, u32)]) -> String {
    let list: Vec<String> = ips
        .iter()
        .map(|(ip, secs)| format!("{ip} timeout {}s", (*secs).max(1)))
        .collect();
    format!(
        "add element {TABLE} p{index}_pins {{ {} }}\n",
        list.join(", ")
    )
}

/// Run an nft script in one transaction (in the calling thread's network namespace).
pub fn run(script: &str) -> Result<(), NetError> {
    let out = hutch_host_command::run(
        Command::new("nft").args(["-f", "-"]),
        Some(script.as_bytes()),
    )
    .map_err(nft_failed)?;
    if out.success() {
        Ok(())
    } else {
        Err(NetError::Nft(format!(
            "nft failed ({}): {}",
            out.how(),
            out.stderr_text()
        )))
    }
}

/// An `nft` that could not run or ran out of time.
fn nft_failed(e: hutch_host_command::HostCommandError) -> NetError {
    match e {
        hutch_host_command::HostCommandError::Spawn { source, .. } => {
            NetError::Nft(format!("run nft (install the nftables package): {source}"))
        }
        other => NetError::HostCommand(other),
    }
}

/// Packets and bytes of one named counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counter {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// Traffic counters of every sandbox interface: (connections, bytes) by interface name.
pub fn counters() -> Result<HashMap<String, (Counter, Counter)>, NetError> {
    let mut out: HashMap<String, (Counter, Counter)> = HashMap::new();
    // One `nft` run lists every set of the table with its elements and their counters.
    let res = hutch_host_command::run(
        Command::new("nft").args(["-j", "list", "sets", "table", "inet", "hutch"]),
        None,
    )
    .map_err(nft_failed)?;
    if !res.success() {
        return Err(NetError::Nft(format!(
            "listing the counter sets ({}): {}",
            res.how(),
            res.stderr_text()
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(&res.stdout)
        .map_err(|e| NetError::Nft(format!("nft -j output: {e}")))?;
    for set in v["nftables"].as_array().into_iter().flatten() {
        let conns = match set["set"]["name"].as_str() {
            Some("conn_count") => true,
            Some("byte_count") => false,
            _ => continue,
        };
        for e in set["set"]["elem"].as_array().into_iter().flatten() {
            // An element is a bare name until its rule has counted something.
            let (name, c) = match e.as_str() {
                Some(n) => (Some(n), &serde_json::Value::Null),
                None => (e["elem"]["val"].as_str(), &e["elem"]["counter"]),
            };
            let Some(name) = name else { continue };
            let counter = Counter {
                packets: c["packets"].as_u64().unwrap_or(0),
                bytes: c["bytes"].as_u64().unwrap_or(0),
            };
            let entry = out.entry(name.to_string()).or_default();
            if conns {
                entry.0 = counter;
            } else {
                entry.1 = counter;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Egress, PolicySpec};

    fn pol(egress: Egress, allow: &[&str]) -> Policy {
        Policy::from_spec(&PolicySpec {
            egress,
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: vec![],
        })
        .unwrap()
    }

    #[test]
    fn an_open_policy_needs_no_chain() {
        let s = apply_policy(3, &pol(Egress::Allow, &[]), 1, &[]);
        assert!(s.contains("delete chain inet hutch p3"));
        assert!(!s.contains("add rule"));
    }

    #[test]
    fn a_deny_policy_with_names_proxies_and_pins() {
        let s = apply_policy(
            3,
            &pol(Egress::Deny, &["good.test", "10.0.0.0/8"]),
            9,
            &[("203.0.113.20".parse().unwrap(), 60)],
        );
        assert!(s.contains("add element inet hutch p3_allow { 10.0.0.0/8 }"));
        assert!(s.contains("203.0.113.20 timeout 60s"));
        assert!(s.contains("ct mark 0x00000009 accept"));
        assert!(s.contains("udp dport 443 reject"));
        assert!(s.contains("add element inet hutch proxied { \"hz3\" }\n"));
        assert!(s
            .trim_end()
            .ends_with("add element inet hutch proxied { \"hz3\" }"));
    }
}
