//! Running host tools during a build: output streamed line by line as
//! [`crate::Progress::Output`], the last lines kept for the error message, and the child
//! killed if the build is abandoned while it runs.

use std::collections::VecDeque;
use std::env;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;

use crate::build::BuildContext;
use crate::error::{Result, TemplateError};
use crate::sys;

/// Lines of output kept for [`TemplateError::ToolFailed`].
const TAIL_LINES: usize = 25;

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

/// Kills and reaps the child unless it was waited for.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
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
    for line in rx {
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line.clone());
        ctx.output(line);
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
        tail: if tail.is_empty() {
            String::from("(no output)")
        } else {
            Vec::from(tail).join("\n")
        },
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

    #[test]
    fn finds_programs_in_sbin() {
        assert!(find_program("sh").is_some());
        assert!(find_program("hutch-no-such-tool").is_none());
    }
}
