//! Hutch's resolver: every DNS packet from a sandbox is redirected here (nftables). A name
//! the sandbox's policy denies gets NXDOMAIN; an allowed one is forwarded upstream. Under
//! domain rules, answers pointing inside (private, loopback, link-local: DNS rebinding) are
//! refused, and with `egress: deny` the answer's addresses are pinned into the sandbox's
//! nftables set for their TTL.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

use crate::dnsmsg::{self, RCODE_NXDOMAIN, RCODE_REFUSED, RCODE_SERVFAIL};
use crate::network::Network;
use crate::policy::{Egress, Verdict};
use crate::NetError;

const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);

/// Bind UDP and TCP on one free port of every address.
pub(crate) async fn bind() -> Result<(UdpSocket, TcpListener), NetError> {
    let mut last = None;
    for _ in 0..16 {
        let udp = UdpSocket::bind(("0.0.0.0", 0))
            .await
            .map_err(NetError::sys("bind the resolver (udp)"))?;
        let port = udp
            .local_addr()
            .map_err(NetError::sys("resolver address"))?
            .port();
        match TcpListener::bind(("0.0.0.0", port)).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) => last = Some(e),
        }
    }
    Err(NetError::Sys {
        op: "bind the resolver (tcp) on its udp port".into(),
        source: last.unwrap_or_else(|| std::io::Error::other("no port")),
    })
}

pub(crate) fn spawn(net: Network, udp: UdpSocket, tcp: TcpListener) {
    let udp = std::sync::Arc::new(udp);
    let n = net.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((len, src)) = udp.recv_from(&mut buf).await else {
                continue;
            };
            let query = buf[..len].to_vec();
            let (n, udp) = (n.clone(), udp.clone());
            tokio::spawn(async move {
                if let Some(reply) = answer(&n, src, &query, false).await {
                    let _ = udp.send_to(&reply, src).await;
                }
            });
        }
    });
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, src)) = tcp.accept().await else {
                continue;
            };
            let n = net.clone();
            tokio::spawn(async move {
                loop {
                    let Ok(len) = conn.read_u16().await else {
                        return;
                    };
                    let mut query = vec![0u8; usize::from(len)];
                    if conn.read_exact(&mut query).await.is_err() {
                        return;
                    }
                    let Some(reply) = answer(&n, src, &query, true).await else {
                        return;
                    };
                    let Ok(rlen) = u16::try_from(reply.len()) else {
                        return;
                    };
                    if conn.write_u16(rlen).await.is_err() || conn.write_all(&reply).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
}

async fn answer(net: &Network, src: SocketAddr, query: &[u8], tcp: bool) -> Option<Vec<u8>> {
    let q = dnsmsg::question(query)?;
    let IpAddr::V4(src_ip) = src.ip() else {
        return Some(dnsmsg::reply_with(query, &q, RCODE_REFUSED));
    };
    let Some((index, policy)) = net.policy_of(src_ip) else {
        return Some(dnsmsg::reply_with(query, &q, RCODE_REFUSED));
    };
    if policy.name(&q.name) == Verdict::Deny {
        tracing::debug!(name = %q.name, index, "resolver: name denied");
        return Some(dnsmsg::reply_with(query, &q, RCODE_NXDOMAIN));
    }
    let upstream = net.inner.cfg.upstream_dns;
    let reply = match forward(upstream, query, tcp).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(name = %q.name, error = %e, "resolver: upstream failed");
            return Some(dnsmsg::reply_with(query, &q, RCODE_SERVFAIL));
        }
    };
    if !policy.has_domain_rules() {
        return Some(reply);
    }
    let ips = dnsmsg::answers_a(&reply).unwrap_or_default();
    if ips.iter().any(|(ip, _)| dnsmsg::is_internal(*ip)) {
        tracing::info!(name = %q.name, index, "resolver: refused an answer pointing inside (rebinding)");
        return Some(dnsmsg::reply_with(query, &q, RCODE_REFUSED));
    }
    if policy.egress == Egress::Deny && !ips.is_empty() {
        let (n, name) = (net.clone(), q.name.clone());
        let pinned: Vec<(Ipv4Addr, u32)> = ips;
        let res = tokio::task::spawn_blocking(move || n.pin(index, &name, &pinned)).await;
        if !matches!(res, Ok(Ok(()))) {
            tracing::warn!(name = %q.name, index, "resolver: pinning failed; answering SERVFAIL");
            return Some(dnsmsg::reply_with(query, &q, RCODE_SERVFAIL));
        }
    }
    Some(reply)
}

async fn forward(upstream: SocketAddr, query: &[u8], tcp: bool) -> std::io::Result<Vec<u8>> {
    if tcp {
        let fut = async {
            let mut c = tokio::net::TcpStream::connect(upstream).await?;
            c.write_u16(query.len() as u16).await?;
            c.write_all(query).await?;
            let len = c.read_u16().await?;
            let mut r = vec![0u8; usize::from(len)];
            c.read_exact(&mut r).await?;
            Ok(r)
        };
        return tokio::time::timeout(UPSTREAM_TIMEOUT, fut)
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "upstream timeout"))?;
    }
    let bind: SocketAddr = if upstream.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let sock = UdpSocket::bind(bind).await?;
    sock.connect(upstream).await?;
    let mut buf = vec![0u8; 4096];
    for _ in 0..2 {
        sock.send(query).await?;
        match tokio::time::timeout(UPSTREAM_TIMEOUT, sock.recv(&mut buf)).await {
            Ok(Ok(n)) if n >= 2 && buf[..2] == query[..2] => return Ok(buf[..n].to_vec()),
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => return Err(e),
            Err(_) => continue,
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "upstream did not answer",
    ))
}
