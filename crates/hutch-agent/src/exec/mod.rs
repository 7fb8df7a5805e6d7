//! `POST /v1/exec` and `POST /v1/signal`: running processes for the host.
//!
//! An exec is one full-duplex HTTP/2 stream. The request body starts with an
//! `ExecRequest` frame and then carries input frames (stdin, EOF, signals, resizes); the
//! response body carries `Started`, output frames, and finally `Exit` (or a single `Error`
//! when the process could not be set up). A program that cannot be found or executed is
//! answered like a shell would: a `hutch: ...` line on stderr and exit code 127 or 126.
//!
//! Every process leads its own session and process group, so signals, the timeout and the
//! "host went away" kill reach everything it started (unless it called `setsid` itself).
//! Exit statuses come from the [`crate::reaper`]. In a `vm` guest every exec runs in a
//! cgroup of its own ([`crate::cgroups`]), so its `Exit` frame says how many of its
//! processes the guest kernel's OOM killer killed.

pub(crate) mod input;
pub(crate) mod output;
mod plan;
mod spawn;

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use hutch_proto::{
    encode_json_frame, AgentError, AgentErrorCode, ExecExit, ExecRequest, ExecStarted, FrameKind,
};
use hyper::body::Incoming;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use self::input::{InputEnd, InputFrames, ProcessStdin, StdinTarget};
use self::output::{pump, FrameSink};
use self::plan::{PlanError, Resolved};
use self::spawn::{ChildStdio, SpawnError, SpawnPlan};
use crate::cgroups::ExecCgroup;
use crate::error::{code_of_io, Failure};
use crate::fdio::FdIo;
use crate::http::{self, AgentBody};
use crate::log::log;
use crate::pty;
use crate::reaper::ExitStatus;
use crate::state::Agent;
use crate::sys;

/// Frames queued between the pumps and the response body (each at most 64 KiB).
const OUTPUT_QUEUE: usize = 8;
/// Exit code for a program that does not exist (as in POSIX shells).
const EXIT_NOT_FOUND: i32 = 127;
/// Exit code for a program that cannot be executed.
const EXIT_NOT_EXECUTABLE: i32 = 126;
/// Exit code of an exec killed by its timeout (as `timeout(1)`).
const EXIT_TIMED_OUT: i32 = 124;

/// `POST /v1/exec`: read the request frame, start the exec, stream its events back.
pub async fn handle_exec(agent: Arc<Agent>, body: Incoming) -> hyper::Response<AgentBody> {
    let mut input = InputFrames::new(body);
    let request = match input.next().await {
        Ok(Some(frame)) if frame.kind == FrameKind::ExecRequest => {
            match frame.json::<ExecRequest>() {
                Ok(request) => request,
                Err(e) => return http::error(&Failure::BadRequest(e.to_string())),
            }
        }
        Ok(Some(frame)) => {
            let message = format!(
                "the first exec frame must be ExecRequest, got {:?}",
                frame.kind
            );
            return http::error(&Failure::BadRequest(message));
        }
        Ok(None) => return http::error(&Failure::BadRequest("empty exec request body".into())),
        Err(e) => return http::error(&Failure::BadRequest(e.to_string())),
    };
    let (tx, rx) = mpsc::channel(OUTPUT_QUEUE);
    let sink = FrameSink::new(tx);
    if request.handle.is_some() {
        tokio::spawn(crate::process::run_handle(agent, request, input, sink));
    } else {
        tokio::spawn(run(agent, request, input, sink));
    }
    http::stream(http::FRAMES_CONTENT_TYPE, rx)
}

/// Start `request` with no host attached (no input; `background` so it outlives nothing in
/// particular): its frames (`Started`, output, `Exit` or `Error`) arrive on the returned
/// channel, which the caller must keep reading.
pub fn spawn_detached(
    agent: Arc<Agent>,
    request: ExecRequest,
) -> mpsc::Receiver<Result<bytes::Bytes, std::io::Error>> {
    let (tx, rx) = mpsc::channel(OUTPUT_QUEUE);
    tokio::spawn(run(agent, request, InputFrames::none(), FrameSink::new(tx)));
    rx
}

/// `POST /v1/signal`: signal the process group of a running exec.
pub async fn handle_signal(agent: Arc<Agent>, body: Incoming) -> Result<(), Failure> {
    let request: hutch_proto::SignalRequest = http::read_json(body).await?;
    check_signal(request.signal)?;
    if !agent.is_running(request.pid) {
        return Err(Failure::NotFound(format!(
            "no running exec with pid {}",
            request.pid
        )));
    }
    sys::kill_group(request.pid, request.signal)
        .map_err(|e| Failure::io("kill", format!("process group {}", request.pid), e))
}

/// Signals the host may send (0 only checks that the group exists).
pub(crate) fn check_signal(signal: i32) -> Result<(), Failure> {
    if (0..=64).contains(&signal) {
        Ok(())
    } else {
        Err(Failure::BadRequest(format!(
            "signal must be between 0 and 64, got {signal}"
        )))
    }
}

/// The process side of a started exec.
pub(crate) struct Started {
    pub pid: u32,
    pub status: oneshot::Receiver<ExitStatus>,
    pub spawned_at: Instant,
    pub outputs: Vec<(Arc<FdIo>, FrameKind)>,
    pub stdin: StdinTarget,
    /// The cgroup the process joined (`vm` guests).
    pub cgroup: Option<ExecCgroup>,
    /// What runs, where and as whom (for a process handle's description).
    pub argv: Vec<String>,
    /// Its working directory.
    pub cwd: String,
    /// The user's name.
    pub user: String,
}

/// Why an exec ended before its process ran.
pub(crate) enum Refused {
    /// Answered with an `Error` frame.
    Error(AgentError),
    /// Answered like a shell: a line on stderr and this exit code.
    Shell { message: String, exit_code: i32 },
}

impl Refused {
    /// The `Error` frame of a process handle that could not start. A handle never answers
    /// like a shell (it would have no pid to attach to): a missing program is
    /// `command_not_found`, one that cannot be executed `permission_denied`.
    pub(crate) fn into_error(self) -> AgentError {
        match self {
            Refused::Error(error) => error,
            Refused::Shell { message, exit_code } => {
                let code = if exit_code == EXIT_NOT_FOUND {
                    AgentErrorCode::CommandNotFound
                } else {
                    AgentErrorCode::PermissionDenied
                };
                let message = message.trim_end();
                AgentError::new(code, message.strip_prefix("hutch: ").unwrap_or(message))
            }
        }
    }
}

async fn run(agent: Arc<Agent>, request: ExecRequest, input: InputFrames, mut sink: FrameSink) {
    let started = match start(&agent, &request).await {
        Ok(started) => started,
        Err(Refused::Error(error)) => {
            sink.send(encode_json_frame(FrameKind::Error, &error)).await;
            return;
        }
        Err(Refused::Shell { message, exit_code }) => {
            sink.send(hutch_proto::encode_frame(
                FrameKind::Stderr,
                message.as_bytes(),
            ))
            .await;
            let exit = ExecExit {
                exit_code,
                signal: None,
                timed_out: false,
                duration_ms: 0,
                oom_kills: None,
            };
            sink.send(encode_json_frame(FrameKind::Exit, &exit)).await;
            return;
        }
    };
    let Started {
        pid,
        status,
        spawned_at,
        outputs,
        stdin,
        cgroup,
        ..
    } = started;
    let running = agent.register_exec(pid);
    let started = ExecStarted { pid, handle: false };
    sink.send(encode_json_frame(FrameKind::Started, &started))
        .await;

    let (exited_tx, exited_rx) = watch::channel(None);
    let pumps: Vec<JoinHandle<()>> = outputs
        .into_iter()
        .map(|(fd, kind)| {
            let (sink, exited) = (sink.clone(), exited_rx.clone());
            tokio::spawn(async move { pump(&fd, kind, sink, exited).await })
        })
        .collect();
    let stdin = Arc::new(ProcessStdin::new(stdin));
    let mut input_task = tokio::spawn(input::feed(input, stdin, pid, false));

    let host = (!request.background).then_some(HostWatch {
        sink: &sink,
        input: &mut input_task,
    });
    let supervised = supervise(pid, request.timeout_ms, status, host).await;
    let duration = spawned_at.elapsed();
    let oom_kills = finish_cgroup(&agent, cgroup);
    let _ = exited_tx.send(Some(Instant::now()));
    for pump in pumps {
        let _ = pump.await;
    }
    drop(running);
    let mut exit = exit_frame(supervised.status, supervised.timed_out, duration);
    exit.oom_kills = oom_kills;
    sink.send(encode_json_frame(FrameKind::Exit, &exit)).await;
    drop(sink);
    input_task.abort();
}

/// How an exec's process ended.
pub(crate) struct Supervised {
    pub status: Option<ExitStatus>,
    pub timed_out: bool,
}

/// The host side of an exec whose process dies with the call: its response sink and its
/// input task, either of which says when the host went away.
pub(crate) struct HostWatch<'a> {
    pub sink: &'a FrameSink,
    pub input: &'a mut JoinHandle<InputEnd>,
}

/// Wait for the process to exit, enforcing the timeout (`timeout_ms`, none for 0) and,
/// with a `host` to watch, killing the group when the host goes away.
pub(crate) async fn supervise(
    pid: u32,
    timeout_ms: Option<u64>,
    mut status: oneshot::Receiver<ExitStatus>,
    host: Option<HostWatch<'_>>,
) -> Supervised {
    let timeout = timeout_ms.filter(|&ms| ms > 0).map(Duration::from_millis);
    // Far enough to never fire when there is no timeout.
    let deadline = Instant::now() + timeout.unwrap_or(Duration::from_secs(100 * 365 * 86_400));
    let sleep = tokio::time::sleep_until(deadline);
    tokio::pin!(sleep);
    let (sink, mut input) = match host {
        Some(HostWatch { sink, input }) => (Some(sink), Some(input)),
        None => (None, None),
    };
    let (mut timed_out, mut host_here, mut input_done) = (false, sink.is_some(), false);
    let host_left = |host_here: &mut bool| {
        *host_here = false;
        let _ = sys::kill_group(pid, libc::SIGKILL);
    };
    loop {
        tokio::select! {
            exit = &mut status => {
                if exit.is_err() {
                    log!("exec {pid}: the reaper dropped its exit status");
                }
                return Supervised { status: exit.ok(), timed_out };
            }
            () = &mut sleep, if timeout.is_some() && !timed_out => {
                timed_out = true;
                let _ = sys::kill_group(pid, libc::SIGKILL);
            }
            () = async {
                match sink {
                    Some(sink) => sink.closed().await,
                    None => std::future::pending().await,
                }
            }, if host_here => host_left(&mut host_here),
            end = async {
                match input.as_mut() {
                    Some(input) => (&mut **input).await,
                    None => std::future::pending().await,
                }
            }, if host_here && !input_done => {
                input_done = true;
                if matches!(end, Ok(InputEnd::HostGone)) {
                    host_left(&mut host_here);
                }
            }
        }
    }
}

/// Read the OOM kills of the exec's cgroup and give it back (see [`crate::cgroups`]).
pub(crate) fn finish_cgroup(agent: &Agent, cgroup: Option<ExecCgroup>) -> Option<u64> {
    let (cgroups, cgroup) = (agent.exec_cgroups.as_ref()?, cgroup?);
    cgroups.finish(cgroup)
}

pub(crate) fn exit_frame(
    status: Option<ExitStatus>,
    timed_out: bool,
    duration: Duration,
) -> ExecExit {
    let (exit_code, signal) = match status {
        Some(ExitStatus::Exited(code)) => (code, None),
        Some(ExitStatus::Signaled(signal)) => (128 + signal, Some(signal)),
        None => (255, None),
    };
    ExecExit {
        exit_code: if timed_out { EXIT_TIMED_OUT } else { exit_code },
        signal,
        timed_out,
        duration_ms: duration.as_millis() as u64,
        oom_kills: None,
    }
}

/// Resolve, set up stdio and spawn. The child-side fds are closed before returning.
pub(crate) async fn start(agent: &Arc<Agent>, request: &ExecRequest) -> Result<Started, Refused> {
    let resolved = resolve(agent, request).await?;
    let stdio = Stdio::new(request).map_err(|e| internal(format!("cannot create pipes: {e}")))?;
    let credentials = plan::credentials(&resolved.account, agent.euid);
    let mut plan = SpawnPlan::new(
        &resolved.program,
        &resolved.argv,
        &resolved.env,
        &resolved.cwd,
        credentials,
        agent.nofile,
    )
    .map_err(|_| {
        refuse(
            AgentErrorCode::BadRequest,
            "command, environment and cwd must not contain NUL bytes",
        )
    })?;
    let cgroup = agent
        .exec_cgroups
        .as_ref()
        .and_then(|cgroups| match cgroups.create() {
            Ok(cgroup) => Some(cgroup),
            Err(e) => {
                log!("exec without a cgroup (OOM kills are not counted): {e}");
                None
            }
        });
    if let Some(cgroup) = &cgroup {
        plan.join_cgroup(cgroup.procs_fd());
    }
    let child_stdio = stdio.child();
    let spawned_at = Instant::now();
    let mut joined = false;
    let spawned = agent
        .reaper
        .spawn(|| spawn::spawn(&plan, child_stdio, &mut joined));
    // Not joined, or nothing runs: the cgroup goes back to the pool at once.
    let cgroup = match cgroup {
        Some(cgroup) if joined && spawned.is_ok() => Some(cgroup),
        unused => {
            if unused.is_some() && spawned.is_ok() {
                log!("an exec could not join its cgroup (OOM kills are not counted)");
            }
            finish_cgroup(agent, unused);
            None
        }
    };
    let (pid, status) = spawned.map_err(|e| spawn_refusal(e, &resolved))?;
    let pid = u32::try_from(pid).map_err(|_| internal("fork returned a negative pid".into()))?;
    let mut started = stdio.into_started(pid, status, spawned_at);
    started.cgroup = cgroup;
    started.argv = resolved.argv;
    started.cwd = resolved.cwd;
    started.user = resolved.account.name;
    Ok(started)
}

async fn resolve(agent: &Arc<Agent>, request: &ExecRequest) -> Result<Resolved, Refused> {
    let (agent, request) = (Arc::clone(agent), request.clone());
    let resolved = tokio::task::spawn_blocking(move || {
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let group = std::fs::read_to_string("/etc/group").unwrap_or_default();
        let identity_env = agent.identity_env();
        let ctx = plan::Context {
            agent_env: &agent.agent_env,
            identity_env: &identity_env,
            passwd: &passwd,
            group: &group,
        };
        plan::resolve(&request, ctx)
    })
    .await
    .map_err(|e| internal(format!("resolving the exec: {e}")))?;
    resolved.map_err(|e| match e {
        PlanError::CommandNotFound(name) => {
            shell_refusal(EXIT_NOT_FOUND, "command not found", &name)
        }
        PlanError::NotExecutable(name) => {
            shell_refusal(EXIT_NOT_EXECUTABLE, "permission denied", &name)
        }
        PlanError::CwdMissing(_) => refuse(AgentErrorCode::NotFound, e.to_string()),
        PlanError::CwdNotDirectory(_) => refuse(AgentErrorCode::NotADirectory, e.to_string()),
        PlanError::BadRequest(_) | PlanError::User(_) => {
            refuse(AgentErrorCode::BadRequest, e.to_string())
        }
    })
}

fn spawn_refusal(error: SpawnError, resolved: &Resolved) -> Refused {
    let name = resolved.argv.first().map_or("", String::as_str);
    match &error {
        SpawnError::Exec(e) => match e.raw_os_error() {
            Some(libc::ENOENT) => shell_refusal(EXIT_NOT_FOUND, "command not found", name),
            Some(libc::EACCES | libc::EPERM | libc::ENOEXEC | libc::EISDIR | libc::ETXTBSY) => {
                shell_refusal(EXIT_NOT_EXECUTABLE, "permission denied", name)
            }
            _ => refuse(code_of_io(e), format!("{name}: {error}")),
        },
        SpawnError::Chdir(e) => refuse(code_of_io(e), format!("{}: {error}", resolved.cwd)),
        SpawnError::Credentials(_) => {
            let message = format!("user {}: {error}", resolved.account.name);
            refuse(AgentErrorCode::PermissionDenied, message)
        }
        SpawnError::Fork(_) | SpawnError::Setup(_) => {
            log!("exec of {name} failed: {error}");
            internal(error.to_string())
        }
    }
}

fn shell_refusal(exit_code: i32, what: &str, name: &str) -> Refused {
    Refused::Shell {
        message: format!("hutch: {what}: {name}\n"),
        exit_code,
    }
}

fn refuse(code: AgentErrorCode, message: impl Into<String>) -> Refused {
    Refused::Error(AgentError::new(code, message))
}

fn internal(message: String) -> Refused {
    refuse(AgentErrorCode::Internal, message)
}

/// The agent's and the child's ends of the process's stdio.
enum Stdio {
    Pipes {
        stdin_child: OwnedFd,
        stdin: Option<OwnedFd>,
        stdout: (OwnedFd, OwnedFd),
        stderr: (OwnedFd, OwnedFd),
    },
    Pty(pty::Pty),
}

impl Stdio {
    fn new(request: &ExecRequest) -> std::io::Result<Self> {
        if let Some(size) = request.pty {
            return pty::open_pty(size).map(Stdio::Pty);
        }
        let (stdin_child, stdin) = if request.stdin {
            let (read, write) = sys::pipe()?;
            (read, Some(write))
        } else {
            match sys::open(c"/dev/null", libc::O_RDONLY) {
                Ok(null) => (null, None),
                // No /dev/null in this sandbox: a pipe with no writer reads as EOF too.
                Err(_) => (sys::pipe()?.0, None),
            }
        };
        Ok(Stdio::Pipes {
            stdin_child,
            stdin,
            stdout: sys::pipe()?,
            stderr: sys::pipe()?,
        })
    }

    fn child(&self) -> ChildStdio {
        match self {
            Stdio::Pipes {
                stdin_child,
                stdout,
                stderr,
                ..
            } => ChildStdio {
                fds: [
                    stdin_child.as_raw_fd(),
                    stdout.1.as_raw_fd(),
                    stderr.1.as_raw_fd(),
                ],
                controlling_tty: false,
            },
            Stdio::Pty(pty) => {
                let slave: RawFd = pty.slave.as_raw_fd();
                ChildStdio {
                    fds: [slave; 3],
                    controlling_tty: true,
                }
            }
        }
    }

    /// Drop the child's ends and register the agent's ends with the reactor.
    fn into_started(
        self,
        pid: u32,
        status: oneshot::Receiver<ExitStatus>,
        spawned_at: Instant,
    ) -> Started {
        let mut started = Started {
            pid,
            status,
            spawned_at,
            outputs: Vec::new(),
            stdin: StdinTarget::Closed,
            cgroup: None,
            argv: Vec::new(),
            cwd: String::new(),
            user: String::new(),
        };
        let register = |fd: OwnedFd| match FdIo::new(fd) {
            Ok(io) => Some(Arc::new(io)),
            Err(e) => {
                log!("exec {pid}: cannot watch a pipe: {e}");
                None
            }
        };
        match self {
            Stdio::Pipes {
                stdin,
                stdout,
                stderr,
                ..
            } => {
                // The child's ends (stdin_child, stdout.1, stderr.1) close here.
                started
                    .outputs
                    .extend(register(stdout.0).map(|fd| (fd, FrameKind::Stdout)));
                started
                    .outputs
                    .extend(register(stderr.0).map(|fd| (fd, FrameKind::Stderr)));
                if let Some(io) = stdin.and_then(register) {
                    started.stdin = StdinTarget::Pipe(io);
                }
            }
            Stdio::Pty(pty::Pty { master, slave }) => {
                drop(slave);
                if let Some(io) = register(master) {
                    started.outputs.push((Arc::clone(&io), FrameKind::Stdout));
                    started.stdin = StdinTarget::Pty(io);
                }
            }
        }
        started
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_shell_conventions() {
        let d = Duration::from_millis(5);
        assert_eq!(
            exit_frame(Some(ExitStatus::Exited(3)), false, d).exit_code,
            3
        );
        let killed = exit_frame(Some(ExitStatus::Signaled(15)), false, d);
        assert_eq!((killed.exit_code, killed.signal), (143, Some(15)));
        let timed_out = exit_frame(Some(ExitStatus::Signaled(9)), true, d);
        assert_eq!(
            (timed_out.exit_code, timed_out.timed_out, timed_out.signal),
            (124, true, Some(9))
        );
        assert_eq!(timed_out.duration_ms, 5);
    }

    #[test]
    fn signal_range_is_checked() {
        assert!(check_signal(15).is_ok());
        assert!(check_signal(0).is_ok());
        assert!(check_signal(-1).is_err());
        assert!(check_signal(65).is_err());
    }
}
