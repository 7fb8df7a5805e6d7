//! Exec through the real agent binary and the real client: output, exit codes, timeouts,
//! signals, stdin, environment, concurrency, large output, caps and reaping.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{argv, children_of, is_gone, request, shell, TestAgent};
use hutch_proto::client::{ClientError, ExecEvent};
use hutch_proto::{AgentErrorCode, IdentityRequest};
use hutch_testkit::wait_until;

const CAP: usize = 64 << 20;

#[tokio::test]
async fn argv_exec_keeps_stdout_stderr_and_exit_apart() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let req = request(argv(&["sh", "-c", "echo out; echo err >&2; exit 3"]));
    let out = client.exec_collect(req, None, CAP).await.expect("exec");
    assert_eq!(&out.stdout[..], b"out\n");
    assert_eq!(&out.stderr[..], b"err\n");
    assert_eq!(out.exit.exit_code, 3);
    assert_eq!(out.exit.signal, None);
    assert!(!out.exit.timed_out);

    // No shell in between: metacharacters arrive verbatim.
    let out = client
        .exec_collect(request(argv(&["echo", "$HOME", "a;b", "*"])), None, CAP)
        .await
        .expect("exec");
    assert_eq!(&out.stdout[..], b"$HOME a;b *\n");
}

#[tokio::test]
async fn shell_string_runs_under_sh() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let out = client
        .exec_collect(request(shell("echo $((6*7)) | tr 4 x; exit 7")), None, CAP)
        .await
        .expect("exec");
    assert_eq!(&out.stdout[..], b"x2\n");
    assert_eq!(out.exit.exit_code, 7);
}

#[tokio::test]
async fn missing_and_unexecutable_programs_answer_like_a_shell() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let out = client
        .exec_collect(request(argv(&["no-such-command-xyz", "arg"])), None, CAP)
        .await
        .expect("exec");
    assert_eq!(out.exit.exit_code, 127);
    assert_eq!(
        &out.stderr[..],
        b"hutch: command not found: no-such-command-xyz\n"
    );
    assert!(out.stdout.is_empty());

    let out = client
        .exec_collect(request(argv(&["/nonexistent/tool"])), None, CAP)
        .await
        .expect("exec");
    assert_eq!(out.exit.exit_code, 127);
    assert_eq!(
        &out.stderr[..],
        b"hutch: command not found: /nonexistent/tool\n"
    );

    let script = agent.path("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").expect("write script");
    let out = client
        .exec_collect(request(argv(&[&script])), None, CAP)
        .await
        .expect("exec");
    assert_eq!(out.exit.exit_code, 126);
    assert_eq!(
        out.stderr,
        Bytes::from(format!("hutch: permission denied: {script}\n"))
    );
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let mut req = request(shell("sleep 100 & echo $!; sleep 100"));
    req.timeout_ms = Some(300);
    let started = Instant::now();
    let out = client.exec_collect(req, None, CAP).await.expect("exec");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(out.exit.exit_code, 124);
    assert!(out.exit.timed_out);
    assert_eq!(out.exit.signal, Some(libc::SIGKILL));
    let background: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("the shell printed the background pid");
    wait_until(Duration::from_secs(5), async || {
        (is_gone(background)).then_some(())
    })
    .await
    .expect("timed out waiting until the background sleep is gone");
}

#[tokio::test]
async fn signals_end_processes_with_128_plus_n() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;

    // In-band: a Signal frame on the exec stream.
    let mut session = client
        .exec(request(argv(&["sleep", "100"])))
        .await
        .expect("exec");
    let Some(Ok(ExecEvent::Started { pid })) = session.next_event().await else {
        panic!("no Started event")
    };
    assert!(pid > 1);
    session.signal(libc::SIGTERM).await.expect("signal");
    let exit = loop {
        match session
            .next_event()
            .await
            .expect("events until exit")
            .expect("event")
        {
            ExecEvent::Exit(exit) => break exit,
            _ => continue,
        }
    };
    assert_eq!((exit.exit_code, exit.signal), (143, Some(libc::SIGTERM)));

    // Out of band: POST /v1/signal with the pid.
    let mut session = client
        .exec(request(argv(&["sleep", "100"])))
        .await
        .expect("exec");
    let Some(Ok(ExecEvent::Started { pid })) = session.next_event().await else {
        panic!("no Started event")
    };
    client
        .signal(pid, libc::SIGKILL)
        .await
        .expect("signal by pid");
    let exit = loop {
        if let ExecEvent::Exit(exit) = session.next_event().await.expect("events").expect("event") {
            break exit;
        }
    };
    assert_eq!((exit.exit_code, exit.signal), (137, Some(libc::SIGKILL)));

    // Only running execs of ours can be signalled.
    let err = client.signal(pid, libc::SIGKILL).await.expect_err("exited");
    assert!(
        matches!(err, ClientError::Agent(ref e) if e.code == AgentErrorCode::NotFound),
        "{err:?}"
    );
    let err = client.signal(1, libc::SIGKILL).await.expect_err("not ours");
    assert!(
        matches!(err, ClientError::Agent(ref e) if e.code == AgentErrorCode::NotFound),
        "{err:?}"
    );
}

#[tokio::test]
async fn stdin_is_fed_and_closed() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let out = client
        .exec_collect(
            request(argv(&["cat"])),
            Some(Bytes::from_static(b"hello\nworld\n")),
            CAP,
        )
        .await
        .expect("exec");
    assert_eq!(&out.stdout[..], b"hello\nworld\n");

    // Without stdin the process reads /dev/null and does not hang.
    let out = client
        .exec_collect(request(argv(&["cat"])), None, CAP)
        .await
        .expect("exec");
    assert!(out.stdout.is_empty());
    assert_eq!(out.exit.exit_code, 0);

    // Piece by piece, then EOF, on a session; 3 MiB exceeds one frame and the pipe buffer.
    let mut req = request(argv(&["wc", "-c"]));
    req.stdin = true;
    let mut session = client.exec(req).await.expect("exec");
    session
        .send_stdin(Bytes::from_static(b"12345"))
        .await
        .expect("stdin");
    session
        .send_stdin(Bytes::from(vec![b'x'; 3 << 20]))
        .await
        .expect("stdin");
    session.close_stdin().await.expect("eof");
    let mut stdout = Vec::new();
    while let Some(event) = session.next_event().await {
        match event.expect("event") {
            ExecEvent::Stdout(data) => stdout.extend_from_slice(&data),
            ExecEvent::Exit(exit) => assert_eq!(exit.exit_code, 0),
            _ => {}
        }
    }
    assert_eq!(
        String::from_utf8_lossy(&stdout).trim(),
        ((3 << 20) + 5).to_string()
    );
}

#[tokio::test]
async fn output_streams_before_the_exit() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let mut session = client
        .exec(request(shell("echo one; sleep 0.5; echo two")))
        .await
        .expect("exec");
    let mut first_line_at = None;
    let mut seen = Vec::new();
    while let Some(event) = session.next_event().await {
        let now = Instant::now();
        match event.expect("event") {
            ExecEvent::Started { .. } => seen.push("started".to_string()),
            ExecEvent::Stdout(data) => {
                first_line_at.get_or_insert(now);
                seen.push(String::from_utf8_lossy(&data).into_owned());
            }
            ExecEvent::Exit(_) => {
                let early = now - first_line_at.expect("a line before the exit");
                assert!(
                    early >= Duration::from_millis(300),
                    "first line only {early:?} before the exit"
                );
                seen.push("exit".to_string());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, vec!["started", "one\n", "two\n", "exit"]);
}

#[tokio::test]
async fn environment_cwd_and_user() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let identity = IdentityRequest {
        env: [
            ("FROM_IDENTITY".to_string(), "id".to_string()),
            ("SHARED".into(), "identity".into()),
        ]
        .into(),
        ..Default::default()
    };
    client.identity(&identity).await.expect("identity");

    let mut req = request(shell("echo $FOO $FROM_IDENTITY $SHARED $USER $HOME; pwd"));
    req.env.insert("FOO".into(), "bar".into());
    req.env.insert("SHARED".into(), "request".into());
    req.cwd = Some(agent.path(""));
    let out = client.exec_collect(req, None, CAP).await.expect("exec");
    let expected = format!(
        "bar id request root /root\n{}\n",
        agent.dir.path().display()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);

    let mut req = request(argv(&["pwd"]));
    req.cwd = Some(agent.path("missing-dir"));
    match client.exec_collect(req, None, CAP).await {
        Err(ClientError::Agent(e)) => assert_eq!(e.code, AgentErrorCode::NotFound, "{e}"),
        other => panic!("expected not_found, got {other:?}"),
    }

    let mut req = request(shell("id -u; id -g; echo $HOME $USER"));
    req.user = Some("nobody".into());
    let out = client
        .exec_collect(req, None, CAP)
        .await
        .expect("exec as nobody");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "65534", "{text}");
    assert_eq!(lines[2], "/nonexistent nobody", "{text}");

    let mut req = request(argv(&["true"]));
    req.user = Some("no-such-user".into());
    match client.exec_collect(req, None, CAP).await {
        Err(ClientError::Agent(e)) => assert_eq!(e.code, AgentErrorCode::BadRequest, "{e}"),
        other => panic!("expected bad_request, got {other:?}"),
    }
}

#[tokio::test]
async fn two_hundred_concurrent_execs_on_one_connection() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let client = client.clone();
        tasks.spawn(async move {
            let req = request(argv(&[
                "sh",
                "-c",
                "echo out-$1; echo err-$1 >&2; exit $(($1 % 7))",
                "sh",
                &i.to_string(),
            ]));
            (i, client.exec_collect(req, None, CAP).await)
        });
    }
    let mut done = 0;
    while let Some(joined) = tasks.join_next().await {
        let (i, result) = joined.expect("task");
        let out = result.unwrap_or_else(|e| panic!("exec {i}: {e}"));
        assert_eq!(out.stdout, Bytes::from(format!("out-{i}\n")));
        assert_eq!(out.stderr, Bytes::from(format!("err-{i}\n")));
        assert_eq!(out.exit.exit_code, i % 7);
        done += 1;
    }
    assert_eq!(done, 200);
}

#[tokio::test]
async fn twenty_mebibytes_of_output_arrive_intact() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let n = 3_000_000;
    let out = client
        .exec_collect(request(argv(&["seq", "1", &n.to_string()])), None, CAP)
        .await
        .expect("exec");
    let expected: String = (1..=n).map(|i| format!("{i}\n")).collect();
    assert!(expected.len() > 20 << 20);
    assert_eq!(out.stdout.len(), expected.len());
    assert!(out.stdout == expected.as_bytes(), "content differs");
    assert!(!out.stdout_truncated);
}

#[tokio::test]
async fn output_over_the_cap_is_truncated_and_flagged() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let out = client
        .exec_collect(
            request(shell("head -c 300000 /dev/zero; echo small >&2")),
            None,
            1000,
        )
        .await
        .expect("exec");
    assert_eq!(out.stdout.len(), 1000);
    assert!(out.stdout_truncated);
    assert_eq!(&out.stderr[..], b"small\n");
    assert!(!out.stderr_truncated);
    assert_eq!(out.exit.exit_code, 0);
}

#[tokio::test]
async fn orphans_are_reaped() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    // The shell exits at once; its background sleep is re-parented to the agent.
    let out = client
        .exec_collect(request(shell("sleep 1 & echo $!")), None, CAP)
        .await
        .expect("exec");
    let orphan: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("pid");
    let adopted = common::proc_stat(orphan).map(|(_, ppid)| ppid);
    assert_eq!(
        adopted,
        Some(agent.pid()),
        "the orphan should be the agent's child by now"
    );
    let pid = agent.pid();
    wait_until(Duration::from_secs(5), async || {
        (is_gone(orphan) && children_of(pid).is_empty()).then_some(())
    })
    .await
    .expect("timed out waiting until the orphan is reaped");

    // Many at once, exiting together.
    let out = client
        .exec_collect(
            request(shell("for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.2 & done")),
            None,
            CAP,
        )
        .await
        .expect("exec");
    assert_eq!(out.exit.exit_code, 0);
    wait_until(Duration::from_secs(5), async || {
        (children_of(pid).is_empty()).then_some(())
    })
    .await
    .expect("timed out waiting until no zombies remain");
}

#[tokio::test]
async fn exit_is_not_held_by_grandchildren_keeping_the_pipe() {
    let agent = TestAgent::start().await;
    let client = agent.client().await;
    let started = Instant::now();
    let out = client
        .exec_collect(request(shell("echo before; sleep 30 & exit 0")), None, CAP)
        .await
        .expect("exec");
    // The pipes are drained for at most 100 ms after the shell exits.
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "waited {:?}",
        started.elapsed()
    );
    assert_eq!(&out.stdout[..], b"before\n");
    // The sleep is still running (only timeouts and dropped calls kill the group); clean up.
    for (pid, _) in children_of(agent.pid()) {
        // SAFETY: kill has no memory effects.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
}

#[tokio::test]
async fn workloads_get_their_own_session_and_a_normal_oom_score() {
    let agent = TestAgent::start().await;
    // Stand-in for the jail's -999: any non-zero score of the agent must not be inherited.
    // (Raising one's own score needs no privilege.)
    std::fs::write(format!("/proc/{}/oom_score_adj", agent.pid()), "300")
        .expect("set the agent's oom_score_adj");
    let client = agent.client().await;
    let out = client
        .exec_collect(
            request(shell(
                "cat /proc/self/oom_score_adj; echo $$; ps -o sid= -o pgid= -p $$",
            )),
            None,
            CAP,
        )
        .await
        .expect("exec");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "0", "{text}");
    // The process leads its own process group and session (fields 5 and 6 of its stat).
    let pid = lines[1].trim();
    let ids: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(ids, vec![pid, pid], "{text}");
}
