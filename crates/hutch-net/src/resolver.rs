//! Hutch's resolver: every DNS packet from a sandbox is redirected here (nftables). A name
//! the sandbox's policy denies gets NXDOMAIN; an allowed one is forwarded upstream. Under
//! domain rules, answers pointing inside (private, loopback, link-local: DNS rebinding) are
//! refused, and with `egress: deny` the answer's addresses are pinned into the sandbox's
//! nftables set for their TTL.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::oneshot;

use crate::dnsmsg::{self, RCODE_NXDOMAIN, RCODE_REFUSED, RCODE_SERVFAIL};
use crate::network::{pins_answers_for, Network};
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

/// The latest query of each (source, ID): its number and a receiver that ends once its reply
/// is sent (or abandoned).
type LastQueries = HashMap<(SocketAddr, u16), (u64, oneshot::Receiver<()>)>;

/// Replies to UDP queries that share a source and an ID leave in the order the queries came.
///
/// Queries are answered concurrently, so replies may overtake each other, which DNS allows.
/// But a client can tell replies apart only by source and ID, and some give two queries of
/// one lookup the same ID: busybox `nslookup` (through glibc's `res_mkquery`, whose IDs come
/// from `CLOCK_MONOTONIC`) was seen to do so in TCG guests. It takes the
/// first reply with an ID for the first query with that ID (A before AAAA) and drops the
/// other as a duplicate: an AAAA reply overtaking the A reply loses the A record. So a query
/// waits, before sending its reply, for the reply of the previous query with its source and
/// ID; queries with other IDs never wait.
#[derive(Default)]
struct ReplyOrder {
    last: std::sync::Mutex<LastQueries>,
    next: std::sync::atomic::AtomicU64,
}

/// A query's place in its (source, ID) order.
struct Turn {
    key: (SocketAddr, u16),
    seq: u64,
    previous: Option<oneshot::Receiver<()>>,
    sent: oneshot::Sender<()>,
}

impl ReplyOrder {
    fn map(&self) -> std::sync::MutexGuard<'_, LastQueries> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take a turn; call in arrival order.
    fn arrive(&self, src: SocketAddr, query: &[u8]) -> Option<Turn> {
        let id = u16::from_be_bytes([*query.first()?, *query.get(1)?]);
        let key = (src, id);
        let seq = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (sent, rx) = oneshot::channel();
        let previous = self.map().insert(key, (seq, rx)).map(|(_, prev)| prev);
        Some(Turn {
            key,
            seq,
            previous,
            sent,
        })
    }

    /// Wait until the previous reply of `turn`'s source and ID is out.
    async fn wait(turn: &mut Turn) {
        if let Some(prev) = turn.previous.as_mut() {
            // An error means the previous query's task ended without a reply: go on.
            let _ = prev.await;
        }
        turn.previous = None;
    }

    /// The reply of `turn` is out (or abandoned): let the next one go, forget the key if
    /// no query came after.
    fn done(&self, turn: Turn) {
        let mut map = self.map();
        if map.get(&turn.key).is_some_and(|(seq, _)| *seq == turn.seq) {
            map.remove(&turn.key);
        }
        drop(map);
        let _ = turn.sent.send(());
    }
}

pub(crate) fn spawn(net: Network, udp: UdpSocket, tcp: TcpListener) {
    let udp = std::sync::Arc::new(udp);
    let order = std::sync::Arc::new(ReplyOrder::default());
    let n = net.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((len, src)) = udp.recv_from(&mut buf).await else {
                continue;
            };
            let query = buf[..len].to_vec();
            let Some(mut turn) = order.arrive(src, &query) else {
                continue;
            };
            let (n, udp, order) = (n.clone(), udp.clone(), order.clone());
            tokio::spawn(async move {
                let reply = answer(&n, src, &query, false).await;
                ReplyOrder::wait(&mut turn).await;
                if let Some(reply) = reply {
                    let _ = udp.send_to(&reply, src).await;
                }
                order.done(turn);
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
    // The policy may have changed while the query was upstream (a live change returns as
    // soon as its rules are in): the answer follows the policy of now, not of the question.
    let Some((index, policy)) = net.policy_of(src_ip) else {
        return Some(dnsmsg::reply_with(query, &q, RCODE_REFUSED));
    };
    if policy.name(&q.name) == Verdict::Deny {
        tracing::debug!(name = %q.name, index, "resolver: name denied by a policy changed meanwhile");
        return Some(dnsmsg::reply_with(query, &q, RCODE_NXDOMAIN));
    }
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
        match tokio::task::spawn_blocking(move || n.pin(index, &name, &pinned)).await {
            Ok(Ok(true)) => {}
            // Not pinned: the policy changed again since it was read above; the newest one
            // decides (it may allow the name without pins, egress allow).
            Ok(Ok(false)) => {
                let allowed = net.policy_of(src_ip).is_some_and(|(_, p)| {
                    p.name(&q.name) == Verdict::Allow && !pins_answers_for(&p, &q.name)
                });
                if !allowed {
                    return Some(dnsmsg::reply_with(query, &q, RCODE_NXDOMAIN));
                }
            }
            _ => {
                tracing::warn!(name = %q.name, index, "resolver: pinning failed; answering SERVFAIL");
                return Some(dnsmsg::reply_with(query, &q, RCODE_SERVFAIL));
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reply_waits_for_the_previous_one_of_its_source_and_id_only() {
        let order = ReplyOrder::default();
        let src: SocketAddr = "10.213.0.2:5000".parse().unwrap();
        let other_src: SocketAddr = "10.213.0.6:5000".parse().unwrap();
        let q7 = dnsmsg::build_query(7, "a.test", dnsmsg::TYPE_A);
        let q8 = dnsmsg::build_query(8, "a.test", dnsmsg::TYPE_A);
        let first = order.arrive(src, &q7).unwrap();
        let mut second = order.arrive(src, &q7).unwrap();
        let mut other_id = order.arrive(src, &q8).unwrap();
        let mut other_source = order.arrive(other_src, &q7).unwrap();
        let soon = Duration::from_millis(50);
        for t in [&mut other_id, &mut other_source] {
            tokio::time::timeout(soon, ReplyOrder::wait(t))
                .await
                .expect("another ID or source does not wait");
        }
        assert!(
            tokio::time::timeout(soon, ReplyOrder::wait(&mut second))
                .await
                .is_err(),
            "the second reply with one ID waits for the first"
        );
        order.done(first);
        tokio::time::timeout(soon, ReplyOrder::wait(&mut second))
            .await
            .expect("released once the first is out");
        for t in [second, other_id, other_source] {
            order.done(t);
        }
        assert!(
            order.map().is_empty(),
            "nothing kept once every reply is out"
        );
    }
}
