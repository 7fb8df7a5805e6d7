//! Slots built for real, inside a private network namespace that stands in for the server's
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
        Ok((buf, netns::read_sysctl("net/ipv4/ip_unprivileged_port_start")?))
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
