//! The agent under load on one connection: more than a thousand execs in flight, a thousand
//! streams reset at once, and backpressure from a host that stops reading.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{argv, children_of, is_alive, is_gone, proc_stat, request, status_kib, TestAgent};
use futures_util::future::join_all;
use hutch_proto::client::{ExecEvent, ExecSession};
use hutch_testkit::wait_until;

/// More than the 1024 concurrent streams the protocol promises.
const IN_FLIGHT: usize = 1100;

async fn started_pid(session: &mut ExecSession) -> u32 {
    match session.next_event().await {
        Some(Ok(ExecEvent::Started { pid })) => pid,
        other => panic!("expected Started, got {other:?}"),
    }
}

#[tokio::test]
async fn more_than_a_thousand_execs_in_flight_on_one_connection() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    // Every `cat` waits for its stdin, so all of them are running at the same time.
    let sessions = join_all((0..IN_FLIGHT).map(|_| {
        let client = client.clone();
        async move {
            let mut req = request(argv(&["cat"]));
            req.stdin = true;
            let mut session = client.exec(req).await.expect("exec");
            let pid = started_pid(&mut session).await;
            (pid, session)
        }
    }))
    .await;
    let running = children_of(agent.pid()).len();
    assert!(running >= IN_FLIGHT, "only {running} processes running");

    let results = join_all(sessions.into_iter().enumerate().map(
        |(i, (_, mut session))| async move {
            session
                .send_stdin(Bytes::from(format!("line {i}\n")))
                .await
                .expect("stdin");
            session.close_stdin().await.expect("eof");
            let mut stdout = Vec::new();
            let mut exit = None;
            while let Some(event) = session.next_event().await {
                match event.expect("event") {
                    ExecEvent::Stdout(data) => stdout.extend_from_slice(&data),
                    ExecEvent::Exit(e) => exit = Some(e.exit_code),
                    other => panic!("unexpected {other:?}"),
                }
            }
            (i, stdout, exit)
        },
    ))
    .await;
    for (i, stdout, exit) in results {
        assert_eq!(String::from_utf8_lossy(&stdout), format!("line {i}\n"));
        assert_eq!(exit, Some(0), "exec {i}");
    }
    client.info().await.expect("the connection is still fine");
}

#[tokio::test]
async fn a_thousand_sessions_dropped_at_once_are_all_killed() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let sessions = join_all((0..IN_FLIGHT).map(|_| {
        let client = client.clone();
        async move {
            let mut session = client
                .exec(request(argv(&["sleep", "1000"])))
                .await
                .expect("exec");
            (started_pid(&mut session).await, session)
        }
    }))
    .await;
    let pids: Vec<u32> = sessions.iter().map(|(pid, _)| *pid).collect();
    drop(sessions);
    let agent_pid = agent.pid();
    wait_until(Duration::from_secs(30), async || {
        (children_of(agent_pid).is_empty()).then_some(())
    })
    .await
    .expect("timed out waiting until every dropped exec is killed and reaped");
    assert!(pids.iter().all(|&pid| is_gone(pid)));
    // Neither the connection nor the agent minded.
    let out = client
        .exec_collect(request(argv(&["echo", "ok"])), None, 64)
        .await
        .expect("exec after the resets");
    assert_eq!(&out.stdout[..], b"ok\n");
}

#[tokio::test]
async fn a_host_that_stops_reading_blocks_the_writer_not_the_agent_memory() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let before = status_kib(agent.pid(), "VmRSS").expect("agent RSS");
    // Endless output; the host reads nothing for a while.
    let mut session = client
        .exec(request(argv(&["yes", "0123456789abcdef0123456789abcdef"])))
        .await
        .expect("exec");
    let pid = started_pid(&mut session).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // `yes` is blocked writing to a full pipe, not producing into the agent's memory.
    let sleeping = || proc_stat(pid).map(|(state, _)| state) == Some('S');
    wait_until(Duration::from_secs(5), async || sleeping().then_some(()))
        .await
        .expect("timed out waiting until the writer blocks");
    let after = status_kib(agent.pid(), "VmRSS").expect("agent RSS");
    assert!(
        after < before + 32 * 1024,
        "agent RSS grew from {before} KiB to {after} KiB"
    );
    // Reading again lets it go on.
    let mut got = 0usize;
    while got < 64 << 20 {
        match session.next_event().await.expect("events").expect("event") {
            ExecEvent::Stdout(data) => got += data.len(),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(is_alive(pid));
    drop(session);
    wait_until(Duration::from_secs(5), async || {
        (is_gone(pid)).then_some(())
    })
    .await
    .expect("timed out waiting until the writer is killed");
}

#[tokio::test]
async fn a_long_lived_connection_survives_thousands_of_reset_streams() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    // A server keeps one connection per sandbox for hours; every call it abandons, and every
    // session it drops with its input still open, resets a stream. None of that may add up
    // to the connection being torn down.
    for round in 0..1500 {
        let mut req = request(argv(&["true"]));
        req.stdin = round % 2 == 0;
        let mut session = client
            .exec(req)
            .await
            .unwrap_or_else(|e| panic!("exec {round}: {e}"));
        if round % 3 == 0 {
            // Abandoned right after it started.
            started_pid(&mut session).await;
        } else {
            // Read to the end, input still open.
            while let Some(event) = session.next_event().await {
                event.unwrap_or_else(|e| panic!("event {round}: {e}"));
            }
        }
        drop(session);
    }
    assert!(!client.is_closed());
    client.info().await.expect("info on the same connection");
    let agent_pid = agent.pid();
    wait_until(Duration::from_secs(10), async || {
        (children_of(agent_pid).is_empty()).then_some(())
    })
    .await
    .expect("timed out waiting until nothing is left running");
}

#[tokio::test]
async fn a_few_stalled_streams_do_not_stall_the_connection() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    // Eight execs nobody reads (say, slow browser clients behind the server): each can fill
    // its stream window, but together they must not use up the connection's window.
    let mut stalled = Vec::new();
    for _ in 0..8 {
        let mut session = client
            .exec(request(argv(&["yes", "stalled output line"])))
            .await
            .expect("exec");
        stalled.push((started_pid(&mut session).await, session));
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        client.exec_collect(request(argv(&["seq", "1", "100000"])), None, 1 << 20),
    )
    .await
    .expect("other calls still get through")
    .expect("exec");
    assert_eq!(out.stdout.len(), 588_895);
    drop(stalled);
}

#[tokio::test]
async fn processes_that_do_not_read_stdin_do_not_stall_the_connection() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let mut pushers = Vec::new();
    for _ in 0..8 {
        let mut req = request(argv(&["sleep", "100"]));
        req.stdin = true;
        let mut session = client.exec(req).await.expect("exec");
        started_pid(&mut session).await;
        let (input, events) = session.into_parts();
        // Megabytes of stdin nobody reads: the sends block on flow control.
        pushers.push((
            tokio::spawn(async move {
                let _ = input.send_stdin(Bytes::from(vec![b'x'; 3 << 20])).await;
            }),
            events,
        ));
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        client.exec_collect(request(argv(&["echo", "through"])), None, 1024),
    )
    .await
    .expect("other calls still get through")
    .expect("exec");
    assert_eq!(&out.stdout[..], b"through\n");
    for (pusher, _events) in &pushers {
        pusher.abort();
    }
}
