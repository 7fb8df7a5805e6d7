//! Host commands the server waits on, under a deadline.
//!
//! Every program the server runs and waits for on the host (the `ns` jail helper, `nft`,
//! `mkfs.*`, `qemu-img`, ...) goes through [`run`] (or [`run_within`]): its input is written
//! and its output read by threads of their own, and the wait ends at the deadline, when the
//! program is killed (`SIGKILL`, which also ends a stopped one) and reaped, and the caller
//! gets [`HostCommandError::TimedOut`] naming it. A program that dies of a signal is reported
//! with the signal's name, never as an empty message.
//!
//! The deadline is process-wide ([`set_timeout`]; `hutch serve
//! --host-command-timeout-seconds`, default [`DEFAULT_TIMEOUT`]).

use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The deadline of a host command unless set otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// After a kill, how long the output readers may take to see the end of their pipes (a
/// grandchild that kept them open is not waited for).
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

static TIMEOUT_MS: AtomicU64 = AtomicU64::new(DEFAULT_TIMEOUT.as_millis() as u64);

/// Set the deadline of every host command [`run`] starts from now on (at least 1 ms).
pub fn set_timeout(limit: Duration) {
    TIMEOUT_MS.store((limit.as_millis() as u64).max(1), Ordering::Relaxed);
}

/// The deadline [`run`] applies.
pub fn timeout() -> Duration {
    Duration::from_millis(TIMEOUT_MS.load(Ordering::Relaxed))
}

/// A host command that ran to its end.
#[derive(Debug)]
pub struct Finished {
    /// How it ended.
    pub status: ExitStatus,
    /// What it wrote to stdout.
    pub stdout: Vec<u8>,
    /// What it wrote to stderr.
    pub stderr: Vec<u8>,
}

impl Finished {
    /// Whether it exited with status 0.
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// How it ended, in words: `exit status 3`, `killed by signal 9 (SIGKILL)`.
    pub fn how(&self) -> String {
        describe(self.status)
    }

    /// Its stderr, trimmed and lossily decoded.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).trim().to_string()
    }
}

/// Why a host command gave no [`Finished`].
#[derive(Debug, thiserror::Error)]
pub enum HostCommandError {
    /// It could not be started.
    #[error("run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// It did not finish within its deadline and was killed.
    #[error("{program} did not finish within {} s and was killed", after.as_secs().max(1))]
    TimedOut {
        /// The program.
        program: String,
        /// The deadline it had.
        after: Duration,
    },
    /// Waiting for it failed.
    #[error("wait for {program}: {source}")]
    Wait {
        /// The program.
        program: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl HostCommandError {
    /// Whether the command ran out of time.
    pub fn timed_out(&self) -> bool {
        matches!(self, HostCommandError::TimedOut { .. })
    }
}

/// How `status` ended, in words.
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig} ({})", signal_name(sig)),
        _ => status.to_string(),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        _ => "signal",
    }
}

/// Run `cmd` (its stdin fed `input`, or null; stdout and stderr collected) within the
/// process-wide deadline ([`timeout`]).
pub fn run(cmd: &mut Command, input: Option<&[u8]>) -> Result<Finished, HostCommandError> {
    run_within(cmd, input, timeout())
}

/// [`run`] within `limit`.
pub fn run_within(
    cmd: &mut Command,
    input: Option<&[u8]>,
    limit: Duration,
) -> Result<Finished, HostCommandError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let deadline = Instant::now() + limit;
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| HostCommandError::Spawn {
            program: program.clone(),
            source,
        })?;
    // Input in a thread of its own: a program that stops reading (or is stopped) must not
    // block the wait. A program that died early makes the write fail; its status says why.
    if let (Some(mut stdin), Some(input)) = (child.stdin.take(), input) {
        let input = input.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
    }
    let stdout = reader(child.stdout.take());
    let stderr = reader(child.stderr.take());
    let status = match wait_until(&mut child, deadline) {
        Ok(Some(status)) => status,
        Ok(None) => {
            kill(&mut child);
            return Err(HostCommandError::TimedOut {
                program,
                after: limit,
            });
        }
        Err(source) => {
            kill(&mut child);
            return Err(HostCommandError::Wait { program, source });
        }
    };
    // Its output ends with it (or soon after: a grandchild may hold the pipes; what it read
    // so far was read while it ran).
    Ok(Finished {
        status,
        stdout: stdout.recv_timeout(DRAIN_AFTER_EXIT).unwrap_or_default(),
        stderr: stderr.recv_timeout(DRAIN_AFTER_EXIT).unwrap_or_default(),
    })
}

/// Read `pipe` to its end in a thread; the bytes arrive on the channel.
fn reader(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    } else {
        let _ = tx.send(Vec::new());
    }
    rx
}

/// Wait for `child` until `deadline`: `None` when it is still running then.
fn wait_until(child: &mut Child, deadline: Instant) -> std::io::Result<Option<ExitStatus>> {
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// SIGKILL `child` (a stopped one too) and reap it.
fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_and_status_come_back() {
        let done = run_within(
            Command::new("sh").args(["-c", "cat; echo err >&2; exit 3"]),
            Some(b"in"),
            Duration::from_secs(10),
        )
        .expect("ran");
        assert_eq!(done.stdout, b"in");
        assert_eq!(done.stderr_text(), "err");
        assert_eq!(done.how(), "exit status 3");
    }

    #[test]
    fn a_command_past_its_deadline_is_killed() {
        let t0 = Instant::now();
        let e = run_within(
            Command::new("sleep").arg("30"),
            None,
            Duration::from_millis(200),
        )
        .expect_err("timed out");
        assert!(e.timed_out(), "{e}");
        assert!(
            e.to_string().contains("sleep did not finish within 1 s"),
            "{e}"
        );
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_stopped_command_is_killed_at_its_deadline() {
        // It stops itself before reading its input.
        let e = run_within(
            Command::new("sh").args(["-c", "kill -STOP $$; cat"]),
            Some(&vec![b'x'; 1 << 20]),
            Duration::from_millis(300),
        )
        .expect_err("timed out");
        assert!(e.timed_out(), "{e}");
    }

    #[test]
    fn a_killed_command_says_by_which_signal() {
        let done = run_within(
            Command::new("sh").args(["-c", "kill -KILL $$"]),
            None,
            Duration::from_secs(10),
        )
        .expect("ran");
        assert_eq!(done.how(), "killed by signal 9 (SIGKILL)");
    }
}
