//! PTY execs through the real agent: a real terminal, typed input, resizes.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{argv, request, shell, TestAgent};
use hutch_proto::client::{ExecEvent, ExecSession};
use hutch_proto::{ExecExit, PtySize};

const SIZE: PtySize = PtySize { cols: 80, rows: 24 };

/// Read events until the output contains `needle` (or the exec ends); returns all output.
async fn read_until(
    session: &mut ExecSession,
    output: &mut String,
    needle: &str,
) -> Option<ExecExit> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !output.contains(needle) {
        let event = tokio::time::timeout_at(deadline, session.next_event())
            .await
            .unwrap_or_else(|_| {
                panic!("timed out waiting for {needle:?}; output so far: {output:?}")
            });
        match event.expect("events").expect("event") {
            ExecEvent::Stdout(data) => output.push_str(&String::from_utf8_lossy(&data)),
            ExecEvent::Stderr(_) => panic!("a PTY has no separate stderr"),
            ExecEvent::Exit(exit) => return Some(exit),
            _ => {}
        }
    }
    None
}

async fn finish(session: &mut ExecSession, output: &mut String) -> ExecExit {
    read_until(session, output, "\u{0}never")
        .await
        .expect("an exit")
}

#[tokio::test]
async fn tty_reports_a_pseudo_terminal() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let mut req = request(shell("tty; echo TERM=$TERM; echo err >&2"));
    req.pty = Some(SIZE);
    let mut session = client.exec(req).await.expect("exec");
    let mut output = String::new();
    let exit = finish(&mut session, &mut output).await;
    assert_eq!(exit.exit_code, 0);
    let first = output.lines().next().expect("a line");
    let n = first
        .trim_end_matches('\r')
        .strip_prefix("/dev/pts/")
        .expect("a /dev/pts path");
    assert!(n.parse::<u32>().is_ok(), "{output:?}");
    assert!(output.contains("TERM=xterm-256color\r\n"), "{output:?}");
    // stderr goes to the terminal too.
    assert!(output.contains("err\r\n"), "{output:?}");
}

#[tokio::test]
async fn typed_input_is_echoed_and_read() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let mut req = request(argv(&["cat"]));
    req.pty = Some(SIZE);
    let mut session = client.exec(req).await.expect("exec");
    session
        .send_stdin(Bytes::from_static(b"hello pty\n"))
        .await
        .expect("type");
    let mut output = String::new();
    // Once from the terminal's echo, once from cat.
    assert!(
        read_until(&mut session, &mut output, "hello pty\r\nhello pty\r\n")
            .await
            .is_none()
    );
    // ^D at the start of a line is end of file for cat.
    session.close_stdin().await.expect("eof");
    let exit = finish(&mut session, &mut output).await;
    assert_eq!(exit.exit_code, 0);
}

#[tokio::test]
async fn resize_is_seen_by_the_process() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let mut req = request(shell("stty size; read line; stty size"));
    req.pty = Some(SIZE);
    let mut session = client.exec(req).await.expect("exec");
    let mut output = String::new();
    assert!(read_until(&mut session, &mut output, "24 80")
        .await
        .is_none());
    session
        .resize(PtySize {
            cols: 132,
            rows: 43,
        })
        .await
        .expect("resize");
    session
        .send_stdin(Bytes::from_static(b"\n"))
        .await
        .expect("type");
    assert!(
        read_until(&mut session, &mut output, "43 132")
            .await
            .is_none(),
        "{output:?}"
    );
    let exit = finish(&mut session, &mut output).await;
    assert_eq!(exit.exit_code, 0);
}

#[tokio::test]
async fn signals_reach_the_terminal_job() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let mut req = request(argv(&["sleep", "100"]));
    req.pty = Some(SIZE);
    let mut session = client.exec(req).await.expect("exec");
    // ^C typed into the terminal: the line discipline sends SIGINT to the foreground group.
    session
        .send_stdin(Bytes::from_static(b"\x03"))
        .await
        .expect("type");
    let mut output = String::new();
    let exit = finish(&mut session, &mut output).await;
    assert_eq!((exit.exit_code, exit.signal), (130, Some(libc::SIGINT)));
}

/// A command that prints and exits at once: its output always arrives before its exit, also
/// many at a time (the host PTY flake).
#[tokio::test]
async fn output_of_a_command_that_exits_at_once_is_never_lost() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..100 {
        let client = client.clone();
        tasks.spawn(async move {
            let mut req = request(shell(&format!("echo from-pty-{i}; exit 4")));
            req.pty = Some(SIZE);
            let mut session = client.exec(req).await.expect("exec");
            let mut output = String::new();
            let exit = finish(&mut session, &mut output).await;
            (i, exit.exit_code, output)
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (i, code, output) = done.expect("task");
        assert_eq!(code, 4);
        assert!(
            output.contains(&format!("from-pty-{i}")),
            "exec {i}: {output:?}"
        );
    }
}
