//! Slots built for real, inside a private network namespace that stands in for the server's
#![allow(clippy::unwrap_used)]
//! (so nothing touches the machine's own network). Needs root.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;

use hutch_net::addr::Pool;
use hutch_net::{link, netns};

fn private_host_ns() -> OwnedFd {
    std::thread::spawn(|| netns::unshare_new().expect("unshare a stand-in host namespace"))
        .join()
        .expect("thread")
}

#[test]
fn a_slot_routes_between_sandbox_and_host_and_is_removed() {
    let host = private_host_ns();
    let pool = Pool::new("10.213.0.0/24".parse().unwrap()).unwrap();
    let addrs = pool.slot(5).unwrap();
    let slot = link::build_slot(&host, addrs).expect("build slot");
    assert_eq!(link::list_host_links(&host).unwrap(), vec![5]);

    let gw = addrs.gateway;
    let listener = netns::run_in(&host, move || {
        TcpListener::bind((gw, 0)).map_err(|e| hutch_net::NetError::Invalid(e.to_string()))
    })
    .expect("listen on the gateway");
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut c, peer) = listener.accept().unwrap();
        c.write_all(b"hi").unwrap();
        peer
    });
    let (got, sysctl) = netns::run_in(&slot.netns, move || {
        let mut s = TcpStream::connect((gw, port))
            .map_err(|e| hutch_net::NetError::Invalid(format!("connect: {e}")))?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).ok();
        Ok((
            buf,
            netns::read_sysctl("net/ipv4/ip_unprivileged_port_start")?,
        ))
    })
    .expect("connect from the slot");
    assert_eq!(got, "hi");
    assert_eq!(sysctl, "0", "the slot's own sysctl was written");
    let peer = server.join().unwrap();
    assert_eq!(peer.ip(), std::net::IpAddr::V4(addrs.sandbox));

    // A second build of the same slot replaces a stale link instead of failing.
    let again = link::build_slot(&host, addrs).expect("rebuild over a stale link");
    drop(slot);
    link::remove_host_link(&host, 5).expect("remove");
    assert!(link::list_host_links(&host).unwrap().is_empty());
    drop(again);
}

#[test]
fn the_rulesets_load_and_unload_in_nft() {
    use hutch_net::nft;
    use hutch_net::policy::{Egress, Policy, PolicySpec};
    let host = private_host_ns();
    let base = nft::BaseRules {
        pool: "10.213.0.0/16".parse().unwrap(),
        resolver_port: 5353,
        proxy_port: 3129,
        mining_ports: nft::DEFAULT_MINING_PORTS.to_vec(),
    };
    let policy = Policy::from_spec(&PolicySpec {
        egress: Egress::Deny,
        allow: vec![
            "good.test".into(),
            "*.good.test".into(),
            "10.0.0.0/8".into(),
        ],
        deny: vec!["192.0.2.0/24".into()],
    })
    .unwrap();
    let counters = netns::run_in(&host, move || {
        nft::run(&nft::base_ruleset(&base))?;
        nft::run(&nft::base_ruleset(&base))?; // a reload replaces the table
        nft::run(&nft::clear_policy(4))?; // clearing what does not exist is fine
        nft::run(&nft::apply_policy(4, &policy, 1, &[]))?;
        nft::run(&nft::add_pins(4, &[("203.0.113.20".parse().unwrap(), 30)]))?;
        nft::run(&nft::apply_policy(
            4,
            &policy,
            2,
            &[("203.0.113.20".parse().unwrap(), 20)],
        ))?;
        // A sandbox interface seen by the counters (as a packet from hz4 would add it).
        nft::run("add element inet hutch conn_count { \"hz4\" }\nadd element inet hutch byte_count { \"hz4\" }\n")?;
        let c = nft::counters()?;
        nft::run(&nft::remove_slot(4))?;
        nft::run(&nft::remove_slot(4))?;
        Ok((c, nft::counters()?))
    })
    .expect("nft scripts");
    assert!(counters.0.contains_key("hz4"), "{:?}", counters.0);
    assert!(
        counters.1.is_empty(),
        "slot counters removed: {:?}",
        counters.1
    );
}

#[test]
fn a_vm_slot_bridges_a_tap_with_eth0_and_hands_the_address_to_the_guest() {
    let host = private_host_ns();
    let pool = Pool::new("10.213.0.0/24".parse().unwrap()).unwrap();
    let addrs = pool.slot(7).unwrap();
    let slot = link::build_slot(&host, addrs).expect("build slot");
    let tap = hutch_net::tap::attach_tap(&slot.netns).expect("attach tap");
    let path = format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        std::os::fd::AsRawFd::as_raw_fd(&slot.netns)
    );
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={path}"))
        .args(["ip", "-o", "addr", "show"])
        .output()
        .expect("nsenter");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains(&addrs.sandbox.to_string()),
        "eth0 kept the address: {text}"
    );
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={path}"))
        .args(["ip", "-o", "link", "show", "master", "br0"])
        .output()
        .expect("nsenter");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("eth0") && text.contains("tap0"), "{text}");
    // A woken guest gets a new TAP on the same slot (its bridge is reused).
    drop(tap);
    let tap = hutch_net::tap::attach_tap(&slot.netns).expect("attach again");
    drop(tap);
    link::remove_host_link(&host, 7).expect("remove");
}
