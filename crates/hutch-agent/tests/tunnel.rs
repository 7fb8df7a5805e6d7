//! TCP tunnels (`POST /v1/tcp`) through the real agent binary and the real client: bytes
//! both ways, half-close, a large transfer, nothing listening, bad ports, and a dropped
//! tunnel closing the socket on the agent's side.
//!
//! The agent under test runs on the host here, so "loopback inside the sandbox" is the
//! host's loopback and the test's own listener is the service.

mod common;

use std::time::Duration;

use common::TestAgent;
use hutch_proto::client::ClientError;
use hutch_proto::AgentErrorCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

async fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    (l, port)
}

#[tokio::test]
async fn bytes_flow_both_ways_and_half_close_reaches_the_service() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let (l, port) = listener().await;
    // The service: read everything until end of file, answer with its length and a reply.
    let service = tokio::spawn(async move {
        let (mut sock, _) = l.accept().await.expect("accept");
        let mut got = Vec::new();
        sock.read_to_end(&mut got).await.expect("read");
        sock.write_all(format!("got {} bytes: ", got.len()).as_bytes())
            .await
            .expect("write");
        sock.write_all(&got).await.expect("write");
        got
    });
    let mut tunnel = client.connect_tcp(port).await.expect("tunnel");
    tunnel
        .write_all(b"hello through the agent")
        .await
        .expect("write");
    tunnel.shutdown().await.expect("shutdown");
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), tunnel.read_to_string(&mut answer))
        .await
        .expect("in time")
        .expect("read");
    assert_eq!(answer, "got 23 bytes: hello through the agent");
    assert_eq!(service.await.expect("service"), b"hello through the agent");
}

#[tokio::test]
async fn a_large_transfer_round_trips_under_flow_control() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let (l, port) = listener().await;
    // An echo service.
    tokio::spawn(async move {
        let (sock, _) = l.accept().await.expect("accept");
        let (mut r, mut w) = sock.into_split();
        let _ = tokio::io::copy(&mut r, &mut w).await;
    });
    let tunnel = client.connect_tcp(port).await.expect("tunnel");
    let (mut r, mut w) = tokio::io::split(tunnel);
    // More than every window on the way (agent stream window 2 MiB, client 4 MiB).
    let data: Vec<u8> = (0..24u32 << 20).map(|i| (i % 251) as u8).collect();
    let expected = data.clone();
    let writer = tokio::spawn(async move {
        w.write_all(&data).await.expect("write");
        w.shutdown().await.expect("shutdown");
    });
    let mut back = Vec::with_capacity(expected.len());
    tokio::time::timeout(Duration::from_secs(60), r.read_to_end(&mut back))
        .await
        .expect("in time")
        .expect("read");
    writer.await.expect("writer");
    assert_eq!(back.len(), expected.len());
    assert!(back == expected, "echoed bytes differ");
}

#[tokio::test]
async fn nothing_listening_is_connection_refused_naming_the_port() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let (l, port) = listener().await;
    drop(l);
    match client.connect_tcp(port).await {
        Err(ClientError::Agent(e)) => {
            assert_eq!(e.code, AgentErrorCode::ConnectionRefused);
            assert!(
                e.message
                    .contains(&format!("nothing is listening on port {port}")),
                "{}",
                e.message
            );
        }
        other => panic!("expected connection_refused, got {other:?}"),
    }
    // The connection is still fine for other calls.
    client.info().await.expect("info after a refused tunnel");
}

#[tokio::test]
async fn a_dropped_tunnel_closes_the_socket_inside() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let (l, port) = listener().await;
    let tunnel = client.connect_tcp(port).await.expect("tunnel");
    let (mut sock, _) = l.accept().await.expect("accept");
    drop(tunnel);
    // The service sees the connection end (end of file or a reset), not a hang.
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(10), sock.read(&mut buf))
        .await
        .expect("the agent closed the socket");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}
