//! A guest's IPv4 settings (`vm` sandboxes): the host hands the slot's address, gateway and
//! resolver to the agent after every restore, and the agent configures the guest's
//! interface with plain ioctls (address, netmask, up, default route) and writes
//! `/etc/resolv.conf`. An `ns` sandbox never gets here: its network is set up from outside
//! and it holds no capability over it.

use std::net::Ipv4Addr;

use hutch_proto::GuestNetwork;

/// `struct rtentry` (linux/route.h) on x86-64.
#[repr(C)]
struct RtEntry {
    rt_pad1: libc::c_ulong,
    rt_dst: libc::sockaddr,
    rt_gateway: libc::sockaddr,
    rt_genmask: libc::sockaddr,
    rt_flags: libc::c_ushort,
    rt_pad2: libc::c_short,
    rt_pad3: libc::c_ulong,
    rt_pad4: *mut libc::c_void,
    rt_metric: libc::c_short,
    rt_dev: *mut libc::c_char,
    rt_mtu: libc::c_ulong,
    rt_window: libc::c_ulong,
    rt_irtt: libc::c_ushort,
}

fn sockaddr(ip: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size; every bit pattern is valid.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// Parse `a.b.c.d/len`.
pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (ip, len) = s
        .split_once('/')
        .ok_or_else(|| format!("network address {s:?} needs a prefix length"))?;
    let ip: Ipv4Addr = ip
        .parse()
        .map_err(|_| format!("network address {s:?} is not IPv4"))?;
    let len: u8 = len
        .parse()
        .ok()
        .filter(|l| (1..=32).contains(l))
        .ok_or_else(|| format!("prefix length in {s:?} must be 1-32"))?;
    Ok((ip, len))
}

/// The first interface that is not `lo`, by the kernel's listing.
fn first_interface() -> Result<String, String> {
    let text =
        std::fs::read_to_string("/proc/net/dev").map_err(|e| format!("/proc/net/dev: {e}"))?;
    text.lines()
        .skip(2)
        .filter_map(|l| l.split(':').next().map(str::trim))
        .find(|n| *n != "lo" && !n.is_empty())
        .map(String::from)
        .ok_or_else(|| "the guest has no network interface".to_string())
}

fn ifreq(name: &str) -> Result<libc::ifreq, String> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(format!("bad interface name {name:?}"));
    }
    // SAFETY: all-zero is a valid ifreq.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(req)
}

fn ioctl(
    fd: libc::c_int,
    op: libc::c_ulong,
    arg: *mut libc::c_void,
    what: &str,
) -> Result<(), String> {
    // SAFETY: `arg` points to the structure `op` expects, alive for the call.
    let rc = unsafe { libc::ioctl(fd, op, arg) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("{what}: {}", std::io::Error::last_os_error()))
    }
}

/// Configure the interface and resolver as `net` says.
pub fn apply(net: &GuestNetwork) -> Result<(), String> {
    let (addr, len) = parse_cidr(&net.address)?;
    let gateway: Ipv4Addr = net
        .gateway
        .parse()
        .map_err(|_| format!("gateway {:?} is not IPv4", net.gateway))?;
    let name = match &net.interface {
        Some(n) => n.clone(),
        None => first_interface()?,
    };
    // SAFETY: socket takes integers only.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(format!("socket: {}", std::io::Error::last_os_error()));
    }
    let result = configure(fd, &name, addr, len, gateway);
    // SAFETY: `fd` is the socket opened above.
    unsafe { libc::close(fd) };
    result?;
    write_resolv_conf(&net.nameservers)
}

fn configure(
    fd: libc::c_int,
    name: &str,
    addr: Ipv4Addr,
    len: u8,
    gateway: Ipv4Addr,
) -> Result<(), String> {
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_addr = sockaddr(addr);
    ioctl(
        fd,
        libc::SIOCSIFADDR,
        std::ptr::from_mut(&mut req).cast(),
        "set address",
    )?;
    let mask = Ipv4Addr::from(u32::MAX << (32 - u32::from(len)));
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_netmask = sockaddr(mask);
    ioctl(
        fd,
        libc::SIOCSIFNETMASK,
        std::ptr::from_mut(&mut req).cast(),
        "set netmask",
    )?;
    let mut req = ifreq(name)?;
    ioctl(
        fd,
        libc::SIOCGIFFLAGS,
        std::ptr::from_mut(&mut req).cast(),
        "get flags",
    )?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    ioctl(
        fd,
        libc::SIOCSIFFLAGS,
        std::ptr::from_mut(&mut req).cast(),
        "set up",
    )?;
    let mut dev: Vec<libc::c_char> = name.bytes().map(|b| b as libc::c_char).collect();
    dev.push(0);
    let mut route = RtEntry {
        rt_pad1: 0,
        rt_dst: sockaddr(Ipv4Addr::UNSPECIFIED),
        rt_gateway: sockaddr(gateway),
        rt_genmask: sockaddr(Ipv4Addr::UNSPECIFIED),
        rt_flags: (libc::RTF_UP | libc::RTF_GATEWAY) as libc::c_ushort,
        rt_pad2: 0,
        rt_pad3: 0,
        rt_pad4: std::ptr::null_mut(),
        rt_metric: 0,
        rt_dev: dev.as_mut_ptr(),
        rt_mtu: 0,
        rt_window: 0,
        rt_irtt: 0,
    };
    // A guest restored from another sandbox's memory (a fork) still has that sandbox's
    // default route: replace it.
    let mut old = RtEntry {
        rt_gateway: sockaddr(Ipv4Addr::UNSPECIFIED),
        rt_flags: libc::RTF_UP as libc::c_ushort,
        rt_dev: std::ptr::null_mut(),
        ..route
    };
    let _ = ioctl(
        fd,
        libc::SIOCDELRT,
        std::ptr::from_mut(&mut old).cast(),
        "delete the default route",
    );
    match ioctl(
        fd,
        libc::SIOCADDRT,
        std::ptr::from_mut(&mut route).cast(),
        "add default route",
    ) {
        // A default route from an earlier call (the same restore applied twice) is fine.
        Err(e) if e.contains("File exists") => Ok(()),
        other => other,
    }
}

fn write_resolv_conf(nameservers: &[String]) -> Result<(), String> {
    if nameservers.is_empty() {
        return Ok(());
    }
    let mut text =
        String::from("# Written by hutch-agent: DNS goes through the sandbox's resolver.\n");
    for n in nameservers {
        let ip: Ipv4Addr = n
            .parse()
            .map_err(|_| format!("nameserver {n:?} is not IPv4"))?;
        text.push_str(&format!("nameserver {ip}\n"));
    }
    let _ = std::fs::create_dir_all("/etc");
    std::fs::write("/etc/resolv.conf", text).map_err(|e| format!("/etc/resolv.conf: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_are_checked() {
        assert_eq!(
            parse_cidr("10.213.0.2/30"),
            Ok((Ipv4Addr::new(10, 213, 0, 2), 30))
        );
        for bad in [
            "10.213.0.2",
            "10.213.0.2/0",
            "10.213.0.2/33",
            "::1/64",
            "x/3",
        ] {
            assert!(parse_cidr(bad).is_err(), "{bad}");
        }
    }

    /// The ioctls configure a real interface: a veth in a network namespace of a
    /// thread of this test (needs root; nothing outside that namespace is touched).
    #[test]
    fn an_interface_gets_its_address_and_default_route() {
        let out = std::thread::spawn(|| {
            // SAFETY: unshare with CLONE_NEWNET affects this thread only.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
            for args in [
                &["link", "add", "d0", "type", "veth", "peer", "name", "d1"][..],
                &["link", "set", "d1", "up"][..],
            ] {
                let ok = std::process::Command::new("ip")
                    .args(args)
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "ip {args:?}");
            }
            // SAFETY: socket takes integers only.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
            // Twice, the second time as a fork child with another slot: the address and
            // the default route follow.
            configure(
                fd,
                "d0",
                Ipv4Addr::new(10, 9, 0, 6),
                30,
                Ipv4Addr::new(10, 9, 0, 5),
            )
            .expect("configure");
            configure(
                fd,
                "d0",
                Ipv4Addr::new(10, 9, 0, 2),
                30,
                Ipv4Addr::new(10, 9, 0, 1),
            )
            .expect("configure again");
            // SAFETY: closing the socket opened above.
            unsafe { libc::close(fd) };
            let show = |args: &[&str]| {
                String::from_utf8_lossy(
                    &std::process::Command::new("ip")
                        .args(args)
                        .output()
                        .expect("ip")
                        .stdout,
                )
                .to_string()
            };
            (show(&["-o", "addr", "show", "d0"]), show(&["route"]))
        })
        .join()
        .expect("thread");
        let (addr, route) = out;
        assert!(addr.contains("10.9.0.2/30"), "{addr}");
        assert!(route.contains("default via 10.9.0.1 dev d0"), "{route}");
        assert!(!route.contains("10.9.0.5"), "{route}");
        assert!(!addr.contains("10.9.0.6"), "{addr}");
    }
}
