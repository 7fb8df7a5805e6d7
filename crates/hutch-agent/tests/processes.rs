//! Process handles through the real agent binary and the real client: start, list, attach
//! by pid and by tag (with what was written before), late attaches, stdin, signals, PTY
//! resizes, detaching, tags, the ring, back-pressure and the timeout.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{argv, is_alive, request, shell, TestAgent};
use hutch_proto::client::{ClientError, ExecEvent, ExecEvents};
use hutch_proto::{
    AgentErrorCode, Command, ExecExit, ExecRequest, HandleSpec, MissedOutput, ProcessSelector,
    ProcessState, PtySize,
};
use hutch_testkit::wait_until;

/// A handle request for `cmd`, tagged or not.
fn handle(cmd: Command, tag: Option<&str>) -> ExecRequest {
    let mut req = request(cmd);
    req.handle = Some(HandleSpec {
        tag: tag.map(String::from),
    });
    req
}

/// What an event stream carries until its exit: stdout, stderr, missed output, the exit.
#[derive(Debug, Default)]
struct Drained {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    missed: Vec<MissedOutput>,
    exit: Option<ExecExit>,
}

async fn drain(events: &mut ExecEvents) -> Drained {
    let mut out = Drained::default();
    let read = async {
        while let Some(event) = events.next().await {
            match event.expect("event") {
                ExecEvent::Stdout(b) => out.stdout.extend_from_slice(&b),
                ExecEvent::Stderr(b) => out.stderr.extend_from_slice(&b),
                ExecEvent::Missed(m) => out.missed.push(m),
                ExecEvent::Exit(exit) => {
                    out.exit = Some(exit);
                    return;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("the stream ended in time");
    out
}

/// Read until stdout contains `needle`.
async fn read_until(events: &mut ExecEvents, needle: &str) -> String {
    let mut output = String::new();
    let read = async {
        while !output.contains(needle) {
            match events.next().await.expect("events").expect("event") {
                ExecEvent::Stdout(b) => output.push_str(&String::from_utf8_lossy(&b)),
                ExecEvent::Exit(exit) => panic!("exited ({exit:?}) before {needle:?}: {output:?}"),
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .unwrap_or_else(|_| panic!("no {needle:?} in time"));
    output
}

#[tokio::test]
async fn a_handle_is_listed_and_attached_by_pid_and_tag_with_what_it_wrote_before() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let (marker, ready) = (agent.path("go"), agent.path("ready"));
    let script = format!(
        "echo before; echo err-before >&2; touch {ready}; \
         while [ ! -e {marker} ]; do sleep 0.05; done; echo after"
    );
    let (pid, session) = client
        .start_process(handle(shell(&script), Some("worker")))
        .await
        .expect("start");
    // Detach at once: the process keeps running.
    drop(session);

    let list = client.list_processes().await.expect("list").processes;
    let info = list.iter().find(|p| p.pid == pid).expect("listed");
    assert_eq!(info.tag.as_deref(), Some("worker"));
    assert_eq!(info.state, ProcessState::Running);
    assert_eq!(info.cmd, vec!["/bin/sh", "-c", &script]);
    assert_eq!(info.user, "root");
    let by_tag = client
        .process_info(&ProcessSelector::Tag("worker".into()))
        .await
        .expect("info by tag");
    assert_eq!(by_tag.pid, pid);

    // Attach only once it has written its first lines.
    wait_until(Duration::from_secs(10), async || {
        std::path::Path::new(&ready).exists().then_some(())
    })
    .await
    .expect("it wrote its first lines");
    let (attached, mut by_pid) = client
        .attach_process(&ProcessSelector::Pid(pid), true)
        .await
        .expect("attach by pid");
    assert_eq!(attached, pid);
    let (_, mut by_tag) = client
        .attach_process(&ProcessSelector::Tag("worker".into()), true)
        .await
        .expect("attach by tag");
    std::fs::write(&marker, "").expect("let it finish");
    for events in [&mut by_pid, &mut by_tag] {
        let out = drain(events).await;
        assert_eq!(out.stdout, b"before\nafter\n");
        assert_eq!(out.stderr, b"err-before\n");
        assert!(out.missed.is_empty());
        assert_eq!(out.exit.map(|e| e.exit_code), Some(0));
    }
    let info = client
        .process_info(&ProcessSelector::Pid(pid))
        .await
        .expect("info");
    assert_eq!(info.state, ProcessState::Exited);
    assert_eq!(info.exit.map(|e| e.exit_code), Some(0));
}

#[tokio::test]
async fn a_late_attach_gets_the_output_and_exit_of_a_process_that_is_gone() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let (pid, session) = client
        .start_process(handle(
            shell("echo out; echo err >&2; exit 7"),
            Some("quick"),
        ))
        .await
        .expect("start");
    drop(session);
    wait_until(Duration::from_secs(10), async || {
        let info = client.process_info(&ProcessSelector::Pid(pid)).await.ok()?;
        (info.state == ProcessState::Exited).then_some(())
    })
    .await
    .expect("it exited");
    let (_, mut events) = client
        .attach_process(&ProcessSelector::Tag("quick".into()), true)
        .await
        .expect("attach");
    let out = drain(&mut events).await;
    assert_eq!(
        (out.stdout.as_slice(), out.stderr.as_slice()),
        (&b"out\n"[..], &b"err\n"[..])
    );
    assert_eq!(out.exit.map(|e| e.exit_code), Some(7));

    // Without replay, an exited process answers its exit alone.
    let (_, mut events) = client
        .attach_process(&ProcessSelector::Pid(pid), false)
        .await
        .expect("attach");
    let out = drain(&mut events).await;
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
    assert_eq!(out.exit.map(|e| e.exit_code), Some(7));

    // An exited process takes no input and no signal; its tag is free again.
    let err = client
        .signal_process(&ProcessSelector::Pid(pid), libc::SIGTERM)
        .await
        .expect_err("exited");
    assert!(
        matches!(err, ClientError::Agent(ref e) if e.code == AgentErrorCode::Exited),
        "{err:?}"
    );
    let (again, session) = client
        .start_process(handle(argv(&["true"]), Some("quick")))
        .await
        .expect("the tag of an exited handle can be used again");
    assert_ne!(again, pid);
    drop(session);
}

#[tokio::test]
async fn start_and_stream_loses_nothing_of_a_process_that_exits_at_once() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    // 10 MiB at full speed, far more than the ring: the starting call holds it back.
    let total = 10 << 20;
    let req = handle(
        shell(&format!(
            "head -c {total} /dev/urandom | tee {}",
            agent.path("copy")
        )),
        None,
    );
    let (_, session) = client.start_process(req).await.expect("start");
    let (_input, mut events) = session.into_parts();
    let out = drain(&mut events).await;
    assert!(out.missed.is_empty(), "{:?}", out.missed);
    assert_eq!(out.exit.map(|e| e.exit_code), Some(0));
    let written = std::fs::read(agent.path("copy")).expect("tee's copy");
    assert_eq!(written.len(), total);
    assert!(
        out.stdout == written,
        "the stream differs from what was written"
    );
}

#[tokio::test]
async fn an_attached_reader_gets_10_mib_byte_exact() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let fifo = agent.path("gate");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(status.success());
    let total = 10 << 20;
    let copy = agent.path("copy");
    // Waits on the fifo so the reader attaches (without replay) before any output.
    let script = format!("read x < {fifo}; head -c {total} /dev/urandom | tee {copy}");
    let (pid, session) = client
        .start_process(handle(shell(&script), None))
        .await
        .expect("start");
    drop(session);
    let (_, mut events) = client
        .attach_process(&ProcessSelector::Pid(pid), false)
        .await
        .expect("attach");
    std::fs::write(&fifo, "go\n").expect("open the gate");
    let out = drain(&mut events).await;
    assert!(out.missed.is_empty(), "{:?}", out.missed);
    let written = std::fs::read(&copy).expect("tee's copy");
    assert_eq!(out.stdout.len(), total);
    assert!(
        out.stdout == written,
        "the stream differs from what was written"
    );
}

#[tokio::test]
async fn a_ring_overflow_reports_what_was_dropped_and_keeps_the_newest() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    // 3 MiB of numbered lines with nobody attached, then a last line.
    let script = "seq 1 400000; echo LAST";
    let (pid, session) = client
        .start_process(handle(shell(script), None))
        .await
        .expect("start");
    drop(session);
    wait_until(Duration::from_secs(20), async || {
        let info = client.process_info(&ProcessSelector::Pid(pid)).await.ok()?;
        (info.state == ProcessState::Exited).then_some(())
    })
    .await
    .expect("it exited");
    let (_, mut events) = client
        .attach_process(&ProcessSelector::Pid(pid), true)
        .await
        .expect("attach");
    let out = drain(&mut events).await;
    let expected: String = (1..=400_000).map(|i| format!("{i}\n")).collect::<String>() + "LAST\n";
    assert_eq!(out.missed.len(), 1, "{:?}", out.missed);
    let dropped = out.missed[0].stdout as usize;
    assert_eq!(out.missed[0].stderr, 0);
    assert_eq!(out.stdout.len(), 1 << 20, "the ring keeps 1 MiB");
    assert_eq!(dropped + out.stdout.len(), expected.len());
    assert!(
        out.stdout == expected.as_bytes()[dropped..],
        "not the newest bytes"
    );
}

#[tokio::test]
async fn stdin_from_other_calls_then_close_stdin_ends_cat() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let mut req = handle(argv(&["cat"]), Some("cat"));
    req.stdin = true;
    let (pid, session) = client.start_process(req).await.expect("start");
    // Ending the starting call does not close a handle's stdin.
    drop(session);
    let cat = ProcessSelector::Tag("cat".into());
    client
        .process_input(&cat, Bytes::from_static(b"hello "))
        .await
        .expect("input");
    let chunks = futures_util::stream::iter(vec![
        Ok(Bytes::from_static(b"wor")),
        Ok(Bytes::from_static(b"ld\n")),
    ]);
    client
        .process_input_stream(&ProcessSelector::Pid(pid), chunks)
        .await
        .expect("streamed input");
    assert!(is_alive(pid), "cat is still waiting for input");
    client.close_process_stdin(&cat).await.expect("close stdin");
    let (_, mut events) = client.attach_process(&cat, true).await.expect("attach");
    let out = drain(&mut events).await;
    assert_eq!(out.stdout, b"hello world\n");
    assert_eq!(out.exit.map(|e| e.exit_code), Some(0));

    // A process started without stdin says so.
    let (pid, session) = client
        .start_process(handle(argv(&["sleep", "30"]), None))
        .await
        .expect("start");
    drop(session);
    let err = client
        .process_input(&ProcessSelector::Pid(pid), Bytes::from_static(b"x"))
        .await
        .expect_err("no stdin");
    assert!(
        matches!(err, ClientError::Agent(ref e) if e.code == AgentErrorCode::BadRequest && e.message.contains("without stdin")),
        "{err:?}"
    );
    client
        .signal_process(&ProcessSelector::Pid(pid), libc::SIGKILL)
        .await
        .expect("kill");
}

#[tokio::test]
async fn signals_reach_a_handle_from_any_call() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let (pid, session) = client
        .start_process(handle(argv(&["sleep", "100"]), Some("sleeper")))
        .await
        .expect("start");
    drop(session);
    let (_, mut events) = client
        .attach_process(&ProcessSelector::Pid(pid), true)
        .await
        .expect("attach");
    let other = agent.client().await;
    other
        .signal_process(&ProcessSelector::Tag("sleeper".into()), libc::SIGTERM)
        .await
        .expect("signal");
    let exit = drain(&mut events).await.exit.expect("exit");
    assert_eq!((exit.exit_code, exit.signal), (143, Some(libc::SIGTERM)));
    let err = client
        .signal_process(&ProcessSelector::Pid(pid), 99)
        .await
        .expect_err("bad signal");
    assert!(
        matches!(err, ClientError::Agent(ref e) if e.code == AgentErrorCode::BadRequest),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_handle_terminal_is_resized_from_another_call() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let mut req = handle(shell("stty size; read line; stty size"), Some("term"));
    req.pty = Some(PtySize { cols: 80, rows: 24 });
    let (_, session) = client.start_process(req).await.expect("start");
    let (_input, mut events) = session.into_parts();
    read_until(&mut events, "24 80").await;
    let term = ProcessSelector::Tag("term".into());
    client
        .resize_process(
            &term,
            PtySize {
                cols: 132,
                rows: 43,
            },
        )
        .await
        .expect("resize");
    let info = client.process_info(&term).await.expect("info");
    assert_eq!(
        info.pty,
        Some(PtySize {
            cols: 132,
            rows: 43
        })
    );
    client
        .process_input(&term, Bytes::from_static(b"\n"))
        .await
        .expect("type a line");
    read_until(&mut events, "43 132").await;

    // A process without a terminal cannot be resized.
    let (pid, session) = client
        .start_process(handle(argv(&["sleep", "30"]), None))
        .await
        .expect("start");
    drop(session);
    let err = client
        .resize_process(&ProcessSelector::Pid(pid), PtySize { cols: 10, rows: 10 })
        .await
        .expect_err("no terminal");
    assert!(
        matches!(err, ClientError::Agent(ref e) if e.message.contains("no terminal")),
        "{err:?}"
    );
    client
        .signal_process(&ProcessSelector::Pid(pid), libc::SIGKILL)
        .await
        .expect("kill");
}

#[tokio::test]
async fn detaching_and_dropped_connections_never_kill_a_handle() {
    let agent = TestAgent::start().await;
    let (client, cutter) = agent.client_with_cutter().await;
    let (pid, session) = client
        .start_process(handle(argv(&["sleep", "100"]), None))
        .await
        .expect("start");
    let (_, attached) = client
        .attach_process(&ProcessSelector::Pid(pid), true)
        .await
        .expect("attach");
    drop(attached);
    drop(session);
    // The whole connection goes away.
    cutter
        .shutdown(std::net::Shutdown::Both)
        .expect("cut the connection");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(is_alive(pid), "the handle died with its callers");
    let client = agent.client().await;
    let info = client
        .process_info(&ProcessSelector::Pid(pid))
        .await
        .expect("still known");
    assert_eq!(info.state, ProcessState::Running);
    client
        .signal_process(&ProcessSelector::Pid(pid), libc::SIGKILL)
        .await
        .expect("kill");
}

#[tokio::test]
async fn tags_are_unique_and_unknown_handles_are_not_found() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let (pid, session) = client
        .start_process(handle(argv(&["sleep", "100"]), Some("only")))
        .await
        .expect("start");
    drop(session);
    let err = client
        .start_process(handle(argv(&["sleep", "100"]), Some("only")))
        .await
        .expect_err("duplicate tag");
    assert!(
        matches!(err, ClientError::Agent(ref e) if e.code == AgentErrorCode::AlreadyExists && e.message.contains("\"only\"")),
        "{err:?}"
    );
    for selector in [
        ProcessSelector::Pid(999_999),
        ProcessSelector::Tag("nobody".into()),
    ] {
        let err = client.process_info(&selector).await.expect_err("unknown");
        assert!(
            matches!(err, ClientError::Agent(ref e) if e.code == AgentErrorCode::NotFound),
            "{err:?}"
        );
        let err = client
            .attach_process(&selector, true)
            .await
            .expect_err("unknown");
        assert!(
            matches!(err, ClientError::Agent(ref e) if e.code == AgentErrorCode::NotFound),
            "{err:?}"
        );
    }
    // A program that cannot be found is refused; no handle is left behind.
    let err = client
        .start_process(handle(argv(&["no-such-program-xyz"]), Some("ghost")))
        .await
        .expect_err("not found");
    assert!(
        matches!(err, ClientError::Agent(ref e) if e.code == AgentErrorCode::CommandNotFound && e.message == "command not found: no-such-program-xyz"),
        "{err:?}"
    );
    let tags: Vec<_> = client
        .list_processes()
        .await
        .expect("list")
        .processes
        .into_iter()
        .filter_map(|p| p.tag)
        .collect();
    assert_eq!(tags, vec!["only".to_string()]);
    client
        .signal_process(&ProcessSelector::Pid(pid), libc::SIGKILL)
        .await
        .expect("kill");
}

#[tokio::test]
async fn the_timeout_kills_a_handle_and_says_so() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let mut req = handle(shell("echo up; sleep 100"), None);
    req.timeout_ms = Some(300);
    let (pid, session) = client.start_process(req).await.expect("start");
    drop(session);
    wait_until(Duration::from_secs(10), async || {
        let info = client.process_info(&ProcessSelector::Pid(pid)).await.ok()?;
        (info.state == ProcessState::Exited).then_some(())
    })
    .await
    .expect("the timeout ended it");
    let (_, mut events) = client
        .attach_process(&ProcessSelector::Pid(pid), true)
        .await
        .expect("attach");
    let out = drain(&mut events).await;
    assert_eq!(out.stdout, b"up\n");
    let exit = out.exit.expect("exit");
    assert!(exit.timed_out);
    assert_eq!((exit.exit_code, exit.signal), (124, Some(libc::SIGKILL)));
}
