//! Running host tools during a build: output streamed line by line as
//! [`crate::Progress::Output`], the last lines kept for the error message, and the tool
//! killed with everything it started (its process group) if the build is abandoned or
//! cancelled while it runs, or if it writes nothing for
//! [`crate::BuildOptions::tool_silence_limit`].

use std::collections::VecDeque;
use std::env;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::build::{BuildContext, DEFAULT_TOOL_SILENCE_LIMIT};
use crate::error::{Result, TemplateError};
use crate::sys;

/// Lines of output kept for [`TemplateError::ToolFailed`].
const TAIL_LINES: usize = 25;

/// How often a running tool's build is checked for a cancel.
const CANCEL_POLL: Duration = Duration::from_millis(250);

/// Directories searched for tools besides `$PATH` (root's tools live in `sbin`).
const EXTRA_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// Finds an executable named `name` in `$PATH` or the usual system directories.
pub(crate) fn find_program(name: &str) -> Option<PathBuf> {
    let path_var = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path_var)
        .chain(EXTRA_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// Whether `path` is a regular file with an execute bit.
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The command line of `cmd`, for messages.
fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Kills the child's process group (the child leads it: [`run`]) and reaps the child,
/// unless it was waited for.
struct ChildGuard(Option<Child>);

impl ChildGuard {
    /// Kill the child and whatever it started that is still in its process group.
    fn kill_group(&mut self) {
        if let Some(child) = self.0.as_mut() {
            if let Ok(pgid) = libc::pid_t::try_from(child.id()) {
                // SAFETY: killpg only sends a signal; the group is the child's own (it was
                // made its leader before exec), so nothing else is signalled.
                unsafe {
                    libc::killpg(pgid, libc::SIGKILL);
                }
            }
            let _ = child.kill();
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill_group();
        if let Some(child) = self.0.as_mut() {
            let _ = child.wait();
        }
    }
}

/// Why a tool was stopped before it exited by itself.
enum Stopped {
    /// It wrote nothing for the build's silence limit.
    Silent,
    /// The build was cancelled.
    Cancelled,
}

/// Runs `cmd` to completion, streaming its stdout and stderr lines to the build's progress.
/// A non-zero exit gives [`TemplateError::ToolFailed`] naming the current step.
pub(crate) fn run(ctx: &mut BuildContext<'_>, mut cmd: Command) -> Result<()> {
    let command = describe(&cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("LC_ALL", "C")
        .env("DEBIAN_FRONTEND", "noninteractive");
    sys::kill_with_parent(&mut cmd);
    // Its own process group, so that a stop reaches what it started (debootstrap's dpkg
    // and wget, apt's methods) and none of them keeps the output pipes open.
    cmd.process_group(0);
    let silence_limit = ctx
        .options
        .tool_silence_limit
        .unwrap_or(DEFAULT_TOOL_SILENCE_LIMIT);
    let mut child = cmd
        .spawn()
        .map_err(|e| ctx.fail(format!("could not start `{command}`: {e}")))?;
    let (tx, rx) = mpsc::channel::<String>();
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|stream| {
        let tx = tx.clone();
        thread::spawn(move || forward_lines(stream, &tx))
    })
    .collect();
    drop(tx);
    let mut guard = ChildGuard(Some(child));

    let mut tail = VecDeque::with_capacity(TAIL_LINES);
    let mut last_line = Instant::now();
    let stopped = loop {
        let next = rx.recv_timeout(CANCEL_POLL.min(silence_limit));
        // Looked at whatever came: a tool that keeps printing is cancelled too.
        if ctx.cancelled() {
            break Some(Stopped::Cancelled);
        }
        match next {
            Ok(line) => {
                last_line = Instant::now();
                if tail.len() == TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(line.clone());
                ctx.output(line);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break None,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if last_line.elapsed() >= silence_limit {
                    break Some(Stopped::Silent);
                }
            }
        }
    };
    let tail_text = |tail: VecDeque<String>| {
        if tail.is_empty() {
            String::from("(no output)")
        } else {
            Vec::from(tail).join("\n")
        }
    };
    if let Some(stopped) = stopped {
        // Dropping the guard kills the group; the readers end once it is gone and are not
        // waited for, in case something left the group and still holds a pipe.
        drop(guard);
        return Err(match stopped {
            Stopped::Cancelled => ctx.fail(format!(
                "the build was cancelled while `{command}` ran; it was killed"
            )),
            Stopped::Silent => TemplateError::ToolSilent {
                step: ctx.current_step().to_owned(),
                command,
                seconds: silence_limit.as_secs_f64(),
                tail: tail_text(tail),
            },
        });
    }
    for reader in readers {
        let _ = reader.join();
    }
    let status = match guard.0.take() {
        Some(mut child) => child.wait(),
        None => return Err(ctx.fail("the child process was lost")),
    }
    .map_err(|e| ctx.fail(format!("waiting for `{command}`: {e}")))?;
    if status.success() {
        return Ok(());
    }
    Err(TemplateError::ToolFailed {
        step: ctx.current_step().to_owned(),
        command,
        status: status.to_string(),
        tail: tail_text(tail),
    })
}

/// Sends each line of `stream` (lossily decoded, without its line ending) to `tx`.
fn forward_lines(stream: Box<dyn Read + Send>, tx: &mpsc::Sender<String>) {
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&buf);
                let line = text.trim_end_matches(['\n', '\r']);
                if tx.send(line.to_owned()).is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{BuildOptions, Progress};

    #[test]
    fn streams_output_and_reports_the_tail_on_failure() {
        let options = BuildOptions::default();
        let mut events = Vec::new();
        let mut sink = |p: Progress| events.push(p);
        let mut ctx = BuildContext::new(&options, &mut sink);
        ctx.step("counting").expect("step");
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "for i in $(seq 1 30); do echo line$i; done; echo oops >&2; exit 3",
        ]);
        let err = run(&mut ctx, cmd).expect_err("exit 3");
        let text = err.to_string();
        assert!(
            text.starts_with("template build step `counting` failed: `sh -c"),
            "{text}"
        );
        assert!(text.contains("exit status: 3"), "{text}");
        assert!(text.contains("oops") && text.contains("line30"), "{text}");
        assert!(!text.contains("line5\n"), "only the tail is kept: {text}");
        drop(ctx);
        let outputs = events
            .iter()
            .filter(|e| matches!(e, Progress::Output(_)))
            .count();
        assert_eq!(outputs, 31);
    }

    /// Whether process `pid` still exists (a zombie counts as gone).
    fn alive(pid: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    }

    #[test]
    fn a_silent_tool_is_killed_with_what_it_started() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("grandchild.pid");
        let options = BuildOptions {
            tool_silence_limit: Some(Duration::from_millis(600)),
            ..BuildOptions::default()
        };
        let mut sink = |_: Progress| {};
        let mut ctx = BuildContext::new(&options, &mut sink);
        ctx.step("hanging").expect("step");
        let mut cmd = Command::new("sh");
        // A grandchild that would hold the output pipe open for a minute, then silence.
        cmd.arg("-c").arg(format!(
            "echo started; sleep 60 & echo $! > {}; wait",
            pidfile.display()
        ));
        let began = Instant::now();
        let err = run(&mut ctx, cmd).expect_err("killed for its silence");
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "{:?}",
            began.elapsed()
        );
        let text = err.to_string();
        assert!(
            text.contains("wrote nothing for 0.6 s and was killed"),
            "{text}"
        );
        assert!(text.contains("started"), "the tail is kept: {text}");
        let grandchild = std::fs::read_to_string(&pidfile).expect("pid file");
        let grandchild = grandchild.trim();
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(grandchild) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        assert!(
            !alive(grandchild),
            "the tool's own child {grandchild} was killed too"
        );
    }

    #[test]
    fn a_cancel_stops_a_running_tool() {
        let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let options = BuildOptions {
            cancel: Some(cancel.clone()),
            ..BuildOptions::default()
        };
        let mut sink = |_: Progress| {};
        let mut ctx = BuildContext::new(&options, &mut sink);
        ctx.step("long").expect("step");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "while true; do echo tick; sleep 0.1; done"]);
        let setter = thread::spawn(move || {
            thread::sleep(Duration::from_millis(300));
            cancel.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let err = run(&mut ctx, cmd).expect_err("cancelled");
        setter.join().expect("setter");
        assert!(err.to_string().contains("cancelled"), "{err}");
    }

    #[test]
    fn finds_programs_in_sbin() {
        assert!(find_program("sh").is_some());
        assert!(find_program("hutch-no-such-tool").is_none());
    }
}
