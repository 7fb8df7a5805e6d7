//! Shared harness of the agent's integration tests: start the real agent binary on a unix
//! socket in a temporary directory, connect the real client, poll instead of sleeping, and
//! kill the agent (by its pid) when the test ends.

#![allow(dead_code)]

use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use hutch_proto::client::AgentClient;
use hutch_proto::{Command, ExecRequest};
use hutch_testkit::wait_until;

/// A running agent process serving `serve --listen <dir>/a.sock`.
pub struct TestAgent {
    child: Child,
    /// Scratch directory of the test (also holds the socket and the agent's log).
    pub dir: tempfile::TempDir,
    /// The agent's socket.
    pub socket: PathBuf,
}

impl TestAgent {
    /// Start an agent with `serve --listen <dir>/a.sock` and wait until it accepts
    /// connections.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("a.sock");
        let mut command = agent_command(&dir);
        command.arg("serve").arg("--listen").arg(&socket);
        Self::spawn(command, dir, socket).await
    }

    /// Start an agent with these arguments; the socket path is `<dir>/a.sock` but nothing
    /// waits for it (for listeners other than `--listen`).
    pub async fn start_with_args(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("a.sock");
        let mut command = agent_command(&dir);
        command.args(args);
        let child = command.spawn().expect("start hutch-agent");
        Self { child, dir, socket }
    }

    /// Start an agent the way the jail does: `serve --listen-fd 3` with a listening unix
    /// socket (bound by the test) inherited on fd 3.
    pub async fn start_on_inherited_fd() -> Self {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;

        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("inherited.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        let fd = listener.as_raw_fd();
        let mut command = agent_command(&dir);
        command.arg("serve").arg("--listen-fd").arg("3");
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe calls (dup2, fcntl) on an fd that is open in the parent.
        unsafe {
            command.pre_exec(move || {
                let ret = if fd == 3 {
                    libc::fcntl(3, libc::F_SETFD, 0)
                } else {
                    libc::dup2(fd, 3)
                };
                if ret < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let agent = Self::spawn(command, dir, socket).await;
        // The agent owns its copy; ours closes here.
        drop(listener);
        agent
    }

    async fn spawn(
        mut command: std::process::Command,
        dir: tempfile::TempDir,
        socket: PathBuf,
    ) -> Self {
        let child = command.spawn().expect("start hutch-agent");
        let agent = Self { child, dir, socket };
        let socket = agent.socket.clone();
        wait_until(Duration::from_secs(10), async || {
            StdUnixStream::connect(&socket).is_ok().then_some(())
        })
        .await
        .expect("timed out waiting until the agent listens");
        agent
    }

    /// The agent's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A new connection.
    pub async fn client(&self) -> AgentClient {
        AgentClient::connect_unix(&self.socket)
            .await
            .expect("connect to the agent")
    }

    /// A new connection plus a handle that can cut it from outside (shutdown of a dup).
    pub async fn client_with_cutter(&self) -> (AgentClient, StdUnixStream) {
        let stream = StdUnixStream::connect(&self.socket).expect("connect");
        let cutter = stream.try_clone().expect("dup the socket");
        stream.set_nonblocking(true).expect("nonblocking");
        let stream = tokio::net::UnixStream::from_std(stream).expect("register");
        (
            AgentClient::handshake(stream).await.expect("handshake"),
            cutter,
        )
    }

    /// A path inside the test's scratch directory (as a string, as the protocol wants).
    pub fn path(&self, rel: &str) -> String {
        self.dir
            .path()
            .join(rel)
            .to_str()
            .expect("utf-8 temp path")
            .to_string()
    }

    /// The agent's log so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }
}

/// The agent's command with a small, known environment (like a jail's), its stderr in
/// `<dir>/agent.log`.
fn agent_command(dir: &tempfile::TempDir) -> std::process::Command {
    let log = std::fs::File::create(dir.path().join("agent.log")).expect("log file");
    let mut command = std::process::Command::new(agent_binary());
    command
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("TERM", "linux")
        .env("FROM_AGENT", "agent")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    command
}

/// The agent under test: `HUTCH_TEST_AGENT_BIN` (e.g. the static release build), else the
/// debug binary cargo built for these tests.
pub fn agent_binary() -> PathBuf {
    std::env::var_os("HUTCH_TEST_AGENT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_hutch-agent")))
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        let pid = self.child.id();
        // Everything the agent started leads its own process group: kill those groups
        // first, so no workload outlives the test (they would be re-parented away).
        for (child, _) in children_of(pid) {
            // SAFETY: kill has no memory effects; these pids are the agent's children.
            unsafe {
                libc::kill(-(child as libc::pid_t), libc::SIGKILL);
                libc::kill(child as libc::pid_t, libc::SIGKILL);
            }
        }
        // SAFETY: kill has no memory effects; the pid is our own child, not yet waited for.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// A value from `/proc/<pid>/status` in KiB (e.g. `VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// An exec request with defaults.
pub fn request(cmd: Command) -> ExecRequest {
    ExecRequest {
        cmd,
        env: Default::default(),
        cwd: None,
        user: None,
        timeout_ms: None,
        pty: None,
        stdin: false,
        background: false,
        handle: None,
    }
}

/// `Command::Argv` from string slices.
pub fn argv(args: &[&str]) -> Command {
    Command::Argv(args.iter().map(|s| s.to_string()).collect())
}

/// `Command::Shell`.
pub fn shell(line: &str) -> Command {
    Command::Shell(line.to_string())
}

/// `(pid, state)` of `/proc/<pid>/stat`, if the process (or its zombie) exists.
pub fn proc_stat(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ppid ...": comm may contain spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// True while the process exists and is not a zombie.
pub fn is_alive(pid: u32) -> bool {
    matches!(proc_stat(pid), Some((state, _)) if state != 'Z')
}

/// True once the process is gone entirely (exited and reaped).
pub fn is_gone(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

/// `(pid, state)` of every process whose parent is `parent`.
pub fn children_of(parent: u32) -> Vec<(u32, char)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| match proc_stat(pid) {
            Some((state, ppid)) if ppid == parent => Some((pid, state)),
            _ => None,
        })
        .collect()
}
