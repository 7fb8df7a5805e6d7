//! The agent across connections: info, dropped streams and connections, background execs,
//! and survival of client disconnects.

mod common;

use std::net::Shutdown;
use std::time::Duration;

use common::{argv, is_alive, is_gone, request, TestAgent};
use hutch_proto::client::{ClientError, ExecEvent, ExecSession};
use hutch_proto::PROTOCOL_VERSION;
use hutch_testkit::wait_until;

async fn started_pid(session: &mut ExecSession) -> u32 {
    match session.next_event().await {
        Some(Ok(ExecEvent::Started { pid })) => pid,
        other => panic!("expected Started, got {other:?}"),
    }
}

#[tokio::test]
async fn info_describes_the_agent() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let info = client.info().await.expect("info");
    assert_eq!(info.protocol_version, PROTOCOL_VERSION);
    assert_eq!(info.pid, agent.pid());
    assert!(!info.kernel.is_empty() && !info.hostname.is_empty());
    assert!(!client.is_closed());
    client.ready().await.expect("ready");
}

#[tokio::test]
async fn dropping_the_session_kills_the_process() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let mut session = client
        .exec(request(argv(&["sleep", "1000"])))
        .await
        .expect("exec");
    let pid = started_pid(&mut session).await;
    assert!(is_alive(pid));
    drop(session);
    wait_until(Duration::from_secs(5), async || {
        (is_gone(pid)).then_some(())
    })
    .await
    .expect("timed out waiting until the process is killed and reaped");
    // The connection is still fine.
    client.info().await.expect("info after a reset stream");
}

#[tokio::test]
async fn dropping_the_connection_kills_running_execs_and_the_agent_serves_on() {
    let agent = TestAgent::start().await;
    let (client, cutter) = agent.client_with_cutter().await;
    let mut pids = Vec::new();
    let mut sessions = Vec::new();
    for _ in 0..3 {
        let mut session = client
            .exec(request(argv(&["sleep", "1000"])))
            .await
            .expect("exec");
        pids.push(started_pid(&mut session).await);
        sessions.push(session);
    }
    cutter.shutdown(Shutdown::Both).expect("cut the connection");
    for pid in pids {
        wait_until(Duration::from_secs(5), async || {
            (is_gone(pid)).then_some(())
        })
        .await
        .expect("timed out waiting until the process is killed");
    }
    // The client notices.
    let err = sessions[0]
        .next_event()
        .await
        .expect("an event")
        .expect_err("connection gone");
    assert!(err.is_transport(), "{err:?}");
    wait_until(Duration::from_secs(5), async || {
        client.is_closed().then_some(())
    })
    .await
    .expect("timed out waiting until the client sees the closed connection");
    assert!(matches!(
        client.info().await,
        Err(ClientError::Transport(_))
    ));

    // The agent survived and takes new connections.
    let fresh = agent.client().await;
    let out = fresh
        .exec_collect(request(argv(&["echo", "still here"])), None, 1024)
        .await
        .expect("exec on a new connection");
    assert_eq!(&out.stdout[..], b"still here\n");
    assert!(agent.log().contains("starting as pid"), "{}", agent.log());
}

#[tokio::test]
async fn background_execs_survive_the_host_going_away() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let mut req = request(common::shell("while true; do echo tick; sleep 0.01; done"));
    req.background = true;
    let mut session = client.exec(req).await.expect("exec");
    let pid = started_pid(&mut session).await;
    drop(session);
    // Still running well after the drop, even though its output goes nowhere now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(is_alive(pid), "background exec died");
    // Still signallable by pid from another connection.
    let other = agent.client().await;
    other.signal(pid, libc::SIGKILL).await.expect("signal");
    wait_until(Duration::from_secs(5), async || {
        (is_gone(pid)).then_some(())
    })
    .await
    .expect("timed out waiting until the background exec is gone");
}

#[tokio::test]
async fn many_connections_come_and_go() {
    let agent = TestAgent::start().await;
    for i in 0..20 {
        let client = agent.client().await;
        let out = client
            .exec_collect(request(argv(&["echo", &i.to_string()])), None, 64)
            .await
            .expect("exec");
        assert_eq!(out.stdout, bytes::Bytes::from(format!("{i}\n")));
    }
    // Garbage instead of HTTP/2 does not hurt the agent either.
    {
        use std::io::Write;
        let mut raw = std::os::unix::net::UnixStream::connect(&agent.socket).expect("connect");
        let _ = raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    agent
        .client()
        .await
        .info()
        .await
        .expect("info after garbage");
}

#[tokio::test]
async fn serves_a_listening_socket_inherited_on_fd_3() {
    let agent = TestAgent::start_on_inherited_fd().await;
    for round in 0..3 {
        let client = agent.client().await;
        let info = client.info().await.expect("info");
        assert_eq!(info.pid, agent.pid());
        let out = client
            .exec_collect(
                request(argv(&["echo", &format!("round {round}")])),
                None,
                64,
            )
            .await
            .expect("exec");
        assert_eq!(out.stdout, bytes::Bytes::from(format!("round {round}\n")));
    }
    // The listening socket is close-on-exec in the agent: no workload inherits it (a
    // workload's own fds are /dev/null and pipes).
    let out = agent
        .client()
        .await
        .exec_collect(request(common::shell("ls -l /proc/$$/fd/")), None, 4096)
        .await
        .expect("exec");
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(listing.contains("pipe:"), "{listing}");
    assert!(!listing.contains("socket:"), "{listing}");
    assert!(
        agent.log().contains("serving on inherited fd 3"),
        "{}",
        agent.log()
    );
}
