//! The transparent egress proxy for sandboxes with domain rules: nftables redirects their
//! TCP 80/443 here; the proxy reads the TLS SNI or HTTP Host, judges it together with the
//! original destination (a pinned address cannot be reused for another name), and either
//! relays the connection from the host or refuses it. Relayed connections are tracked per
//! sandbox so a policy change cuts the ones it forbids.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::network::{proxy_verdict, Network, Proxied};
use crate::policy::Verdict;
use crate::sni::{self, Peek};

const PEEK_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) fn spawn(net: Network, listener: TcpListener) {
    tokio::spawn(async move {
        loop {
            let Ok((conn, peer)) = listener.accept().await else {
                continue;
            };
            let net = net.clone();
            tokio::spawn(async move {
                if let Err(e) = handle(net, conn, peer).await {
                    tracing::debug!(%peer, error = %e, "proxy: connection ended");
                }
            });
        }
    });
}

/// The destination the client dialled before nftables redirected it.
fn original_dst(conn: &TcpStream) -> std::io::Result<SocketAddrV4> {
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SO_ORIGINAL_DST (80) at SOL_IP: the pre-NAT destination of a redirected connection.
    // SAFETY: `addr` and `len` are valid for writes of the sizes given; the fd is open.
    let ret = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_IP,
            80,
            std::ptr::from_mut(&mut addr).cast(),
            &mut len,
        )
    };
    if ret != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
        u16::from_be(addr.sin_port),
    ))
}

async fn handle(net: Network, mut conn: TcpStream, peer: SocketAddr) -> std::io::Result<()> {
    let IpAddr::V4(src) = peer.ip() else {
        return Ok(());
    };
    let Some((index, policy)) = net.policy_of(src) else {
        return Ok(());
    };
    let dst = original_dst(&conn)?;
    let mut buf = Vec::with_capacity(4096);
    let name = tokio::time::timeout(PEEK_TIMEOUT, async {
        let mut chunk = [0u8; 4096];
        loop {
            match sni::peek(&buf) {
                Peek::Incomplete => {}
                Peek::Name(n) => return Ok::<_, std::io::Error>(Some(n)),
                Peek::Unnamed => return Ok(None),
            }
            let n = conn.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .unwrap_or(Ok(None))?;
    let pinned = net.pinned(index);
    let verdict = proxy_verdict(&policy, &pinned, *dst.ip(), name.as_deref());
    if verdict == Verdict::Deny {
        tracing::info!(%src, dst = %dst, name = ?name, "proxy: refused by the sandbox's network policy");
        if dst.port() != 443 && buf.first() != Some(&0x16) {
            let body = format!(
                "hutch: {} is not allowed by this sandbox's network policy\n",
                name.as_deref().unwrap_or("this destination")
            );
            let _ = conn
                .write_all(
                    format!(
                        "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
                .await;
        }
        return Ok(());
    }
    let mut upstream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(dst))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timeout"))??;
    upstream.write_all(&buf).await?;
    let relay = tokio::spawn(async move {
        let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
    });
    let id = net.track(
        index,
        Proxied {
            name,
            dst: *dst.ip(),
            abort: relay.abort_handle(),
        },
    );
    let _ = relay.await;
    if let Some(id) = id {
        net.untrack(index, id);
    }
    Ok(())
}
