//! Snapshot bake and restore.
//!
//! **Bake**: cold boot with guest RAM in a `memory-backend-file` (`share=on`, so the RAM
//! lands in the file), wait until the agent answers `GET /v1/info` on its virtio-serial
//! port, disconnect (so the agent is idle, waiting for a new host, in the snapshot),
//! `stop`, enable `x-ignore-shared` and migrate the device state to a file passed with
//! `getfd` (`fd:` URI; `exec:` is forbidden by `-sandbox ...,spawn=deny`).
//!
//! **Restore**: a new QEMU with the identical device set, the same memory file mapped
//! `share=off` (private copy-on-write: the file is never modified and pages are shared
//! between every restored guest), `-incoming defer`, `x-ignore-shared`,
//! `migrate-incoming fd:NAME`, `cont`, then connect to the agent.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hutch_proto::client::AgentClient;
use hutch_proto::AgentInfo;
use tokio::net::UnixStream;

use crate::qemu::{Console, QemuProcess, RootDisk, VmConfig};
use crate::qmp::Qmp;
use crate::VmError;

/// How long QEMU gets to create its QMP socket.
const QMP_CONNECT: Duration = Duration::from_secs(10);
/// How often a wait for the agent checks that QEMU is still running.
const EXIT_CHECK: Duration = Duration::from_millis(100);
/// How long a bake waits for the agent to end its session after the host hung up.
const QUIESCE: Duration = Duration::from_secs(20);
/// How much of the guest console's end error messages quote.
const CONSOLE_TAIL: u64 = 1500;
/// Bound on saving or loading device state.
const MIGRATION: Duration = Duration::from_secs(30);

/// A running guest: its QEMU (killed on drop), QMP session and agent client.
#[derive(Debug)]
pub struct Guest {
    /// The command line it runs with.
    pub config: VmConfig,
    /// QMP, in command mode.
    pub qmp: Qmp,
    process: QemuProcess,
}

/// A baked template snapshot: memory file plus device state plus the config to match.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The bake-time config (restores derive theirs from it).
    pub config: VmConfig,
    /// The device-state file.
    pub state: PathBuf,
    /// Whether `state` was saved with `x-ignore-shared` (RAM left in the memory file: bakes
    /// and shared snapshots) or carries all RAM (hibernation, a memory snapshot's stream).
    /// A load must use the same setting.
    pub ram_in_memory_file: bool,
}

impl Snapshot {
    /// The bake's config without what belongs to the bake's process only (its jail).
    pub fn restorable(config: VmConfig) -> VmConfig {
        VmConfig {
            jail: None,
            ..config
        }
    }
}

/// What a bake measured.
#[derive(Debug, Clone)]
pub struct BakeReport {
    /// QEMU start to the agent's first `/v1/info` reply.
    pub cold_boot: Duration,
    /// `stop` to migration completed.
    pub save: Duration,
    /// Size of the device-state file.
    pub state_bytes: u64,
    /// The agent's answer during the bake.
    pub info: AgentInfo,
}

/// What a restore measured.
#[derive(Debug, Clone)]
pub struct RestoreReport {
    /// QEMU start to the agent's first `/v1/info` reply.
    pub to_first_reply: Duration,
    /// QEMU start to QMP ready.
    pub qmp_ready: Duration,
    /// QEMU start to `cont` done.
    pub resumed: Duration,
    /// The agent's answer.
    pub info: AgentInfo,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VmError {
    let what = what.into();
    move |source| VmError::Io { what, source }
}

impl Guest {
    /// Start QEMU for `config` and open QMP. Output goes to `log`; a console ring starts
    /// being drained as soon as QEMU listens on its socket.
    pub async fn start(config: VmConfig, log: &Path) -> Result<Self, VmError> {
        let mut process = QemuProcess::spawn(&config, log)?;
        if let Console::Ring { socket, ring } = &config.console {
            crate::console::spawn_drain(socket.clone(), ring.clone());
        }
        let qmp = match Qmp::connect(&config.qmp_socket, QMP_CONNECT).await {
            Ok(qmp) => qmp,
            Err(e) => {
                return Err(match process.try_exit() {
                    Some(status) => VmError::Exited {
                        status: status.to_string(),
                        log: process.log_tail(),
                    },
                    None => e.into(),
                })
            }
        };
        Ok(Self {
            config,
            qmp,
            process,
        })
    }

    /// QEMU's pid.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Let the guest run on after this handle is dropped (see [`QemuProcess::detach`]);
    /// returns QEMU's pid.
    pub fn detach(self) -> u32 {
        self.process.detach()
    }

    /// `Some(status)` once QEMU has exited.
    pub fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        self.process.try_exit()
    }

    /// The tail of QEMU's output and of the guest console, for error messages.
    pub fn log_tail(&self) -> String {
        format!(
            "{}\n--- console ---\n{}",
            self.process.log_tail(),
            self.console_tail()
        )
    }

    fn console_tail(&self) -> String {
        let text = match &self.config.console {
            Console::Discard => return String::new(),
            Console::File(path) => {
                String::from_utf8_lossy(&crate::console::tail_of(path, CONSOLE_TAIL)).into_owned()
            }
            Console::Ring { ring, .. } => ring.tail(CONSOLE_TAIL),
        };
        text.trim().to_string()
    }

    /// Connect to the agent's socket and wait until `GET /v1/info` answers, reconnecting
    /// after each failed attempt, for at most `timeout`.
    pub async fn agent(&mut self, timeout: Duration) -> Result<(AgentClient, AgentInfo), VmError> {
        self.agent_on(None, false, timeout).await
    }

    /// Connect QEMU's agent chardev socket (retrying while QEMU creates it) without
    /// speaking to the agent yet.
    pub async fn agent_socket(&self, timeout: Duration) -> Result<UnixStream, VmError> {
        let started = Instant::now();
        loop {
            match UnixStream::connect(&self.config.agent_socket).await {
                Ok(stream) => return Ok(stream),
                Err(e) if started.elapsed() >= timeout => {
                    return Err(io_err(format!(
                        "connect {}",
                        self.config.agent_socket.display()
                    ))(e))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
            }
        }
    }

    /// Like [`Guest::agent`], speaking over the already-connected `first` stream if given.
    ///
    /// One connection at a time, never abandoned while it may be live: QEMU's chardev
    /// serves one client and queues the others, so a connection given up on would be
    /// accepted later, as a new host, and its handshake would land in whatever session the
    /// agent then has. A connection is replaced only after it failed outright (closed), or,
    /// with `watch_port` (a restored guest, whose agent had its port open when it was
    /// saved), when the agent closes and reopens its port meanwhile: a session caught in
    /// the snapshot ended on our handshake, which is then lost, and each new session would
    /// read the rest of our stream as a bad preface.
    pub async fn agent_on(
        &mut self,
        mut first: Option<UnixStream>,
        watch_port: bool,
        timeout: Duration,
    ) -> Result<(AgentClient, AgentInfo), VmError> {
        if watch_port {
            self.qmp.clear_events().await?;
        }
        let started = Instant::now();
        let mut last = String::from("no reply");
        loop {
            let left = timeout.saturating_sub(started.elapsed());
            let stream = match first.take() {
                Some(stream) => stream,
                None => self.agent_socket(left).await?,
            };
            // To really close the connection when it is given up on: the HTTP/2 task owns
            // the stream and may outlive this attempt.
            let closer = stream
                .as_fd()
                .try_clone_to_owned()
                .map(std::os::unix::net::UnixStream::from)
                .map_err(io_err("dup the agent connection"))?;
            let attempt = async {
                let client = AgentClient::handshake_unix(stream)
                    .await
                    .map_err(|e| e.to_string())?;
                let info = client.info().await.map_err(|e| e.to_string())?;
                Ok::<_, String>((client, info))
            };
            tokio::pin!(attempt);
            let failed = loop {
                let left = timeout.saturating_sub(started.elapsed());
                if left.is_zero() {
                    break None;
                }
                let tick = left.min(EXIT_CHECK);
                let reopened = async {
                    if watch_port {
                        self.qmp
                            .wait_port_reopened(crate::qemu::AGENT_PORT_ID, tick)
                            .await
                    } else {
                        tokio::time::sleep(tick).await;
                        Ok(false)
                    }
                };
                let outcome = tokio::select! {
                    done = &mut attempt => Some(done),
                    port = reopened => {
                        if port? {
                            break Some("the agent restarted its session".to_string());
                        }
                        None
                    }
                };
                match outcome {
                    Some(Ok(ready)) => return Ok(ready),
                    Some(Err(e)) => break Some(e),
                    None => {
                        if let Some(status) = self.process.try_exit() {
                            return Err(VmError::Exited {
                                status: status.to_string(),
                                log: self.log_tail(),
                            });
                        }
                    }
                }
            };
            let _ = closer.shutdown(std::net::Shutdown::Both);
            match failed {
                // Closed: safe to try again on a new connection.
                Some(e) if started.elapsed() < timeout => {
                    tracing::debug!(error = %e, "agent connection failed; reconnecting");
                    last = e;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Some(e) => {
                    last = e;
                    break;
                }
                None => break,
            }
        }
        Err(VmError::AgentTimeout {
            seconds: timeout.as_secs_f64(),
            last,
            console: self.console_tail(),
        })
    }

    /// Ask QEMU to exit, then reap it (it is killed if it does not go).
    pub async fn shutdown(mut self) -> Result<(), VmError> {
        self.qmp.quit().await?;
        Ok(())
    }
}

/// Run what every sandbox's first calls run (identity, a program, a shell) once before the
/// snapshot, so the files they read from the root disk (the shell, the dynamic loader and
/// libraries) are already in the guest's page cache in every restored guest instead of
/// being read through virtio-blk and two qcow2 layers on each first exec. Failures only
/// cost that (a template without `/bin/sh`, say).
async fn warm_up(client: &AgentClient) {
    let identity = hutch_proto::IdentityRequest {
        hostname: Some("hutch-bake".into()),
        ..Default::default()
    };
    if let Err(e) = client.identity(&identity).await {
        tracing::debug!(error = %e, "bake warm-up: identity");
    }
    run_first_programs(client).await;
}

/// Run a program and a shell command once (`true`, `sh -c true`): what a sandbox's first
/// exec runs. In a bake this fills the guest's page cache; in a restored guest it also has
/// TCG translate the guest's fork/exec/exit paths, which are not part of a snapshot and
/// cost a new QEMU's first exec 100–180 ms. Failures only cost that.
pub async fn run_first_programs(client: &AgentClient) {
    for cmd in [
        hutch_proto::Command::Argv(vec!["true".into()]),
        hutch_proto::Command::Shell("true".into()),
    ] {
        let request = hutch_proto::ExecRequest {
            cmd,
            env: Default::default(),
            cwd: None,
            user: None,
            timeout_ms: Some(10_000),
            pty: None,
            stdin: false,
            background: false,
            handle: None,
        };
        if let Err(e) = client.exec_collect(request, None, 1 << 16).await {
            tracing::debug!(error = %e, "warm-up exec");
        }
    }
}

/// Bake: cold boot `config` (its memory file must be `share=on`), wait for the agent,
/// start `service` and wait for its ready check (so every restore has it up), and save the
/// device state to `state`.
pub async fn bake(
    config: VmConfig,
    state: &Path,
    log: &Path,
    boot_timeout: Duration,
    service: Option<&hutch_proto::ServiceSpec>,
) -> Result<(Snapshot, BakeReport), VmError> {
    let config = VmConfig {
        share_memory: true,
        incoming: false,
        ..config
    };
    let started = Instant::now();
    let mut guest = Guest::start(config.clone(), log).await?;
    let (client, info) = guest.agent(boot_timeout).await?;
    let cold_boot = started.elapsed();
    warm_up(&client).await;
    if let Some(spec) = service {
        hutch_proto::client::service::start_and_wait(&client, spec)
            .await
            .map_err(|e| VmError::Service(Box::new(e)))?;
    }
    // Hang up and wait until the agent has ended that session and waits for a new host,
    // so no restore starts in the middle of an old session.
    guest.qmp.clear_events().await?;
    drop(client);
    if !guest
        .qmp
        .wait_port_reopened(crate::qemu::AGENT_PORT_ID, QUIESCE)
        .await?
    {
        // A bake of a guest whose agent still holds the old session would restore guests no
        // host can reach (every claim fails "channel closed"), and bakes are cached: fail
        // this one instead, so the next attempt bakes afresh.
        let console = guest.console_tail();
        let _ = guest.shutdown().await;
        return Err(VmError::AgentTimeout {
            seconds: QUIESCE.as_secs_f64(),
            last: "the agent did not reopen its port after the host hung up, so no bake was taken"
                .into(),
            console,
        });
    }

    let saving = Instant::now();
    guest.qmp.stop().await?;
    guest.qmp.set_ignore_shared().await?;
    let file =
        std::fs::File::create(state).map_err(io_err(format!("create {}", state.display())))?;
    guest.qmp.getfd("state", file.as_fd()).await?;
    drop(file);
    guest.qmp.migrate("fd:state").await?;
    guest.qmp.wait_migration(MIGRATION).await?;
    let save = saving.elapsed();
    guest.shutdown().await?;

    let state_bytes = std::fs::metadata(state)
        .map_err(io_err(format!("stat {}", state.display())))?
        .len();
    let snapshot = Snapshot {
        ram_in_memory_file: true,
        config,
        state: state.to_path_buf(),
    };
    Ok((
        snapshot,
        BakeReport {
            cold_boot,
            save,
            state_bytes,
            info,
        },
    ))
}

/// Where a restored guest lives: its directory (sockets, QEMU's log), its root disk, its
/// console and its jail.
#[derive(Debug, Clone)]
pub struct Placement {
    /// QEMU's directory.
    pub dir: PathBuf,
    /// A snapshot baked with a root disk needs one: a copy-on-write overlay of the bake's
    /// disk (the guest's page cache in the snapshot describes that disk's content), with
    /// its chain.
    pub root_disk: Option<RootDisk>,
    /// Where its console goes.
    pub console: Console,
    /// Its confinement.
    pub jail: Option<crate::qemu::QemuJail>,
}

/// Restore `snapshot` into a new guest placed as `placement` says.
pub async fn restore(
    snapshot: &Snapshot,
    placement: Placement,
    timeout: Duration,
) -> Result<(Guest, AgentClient, RestoreReport), VmError> {
    let Placement {
        dir,
        root_disk,
        console,
        jail,
    } = placement;
    let config = VmConfig {
        share_memory: false,
        incoming: true,
        qmp_socket: dir.join("qmp.sock"),
        agent_socket: dir.join("agent.sock"),
        console,
        root_disk,
        jail,
        ..snapshot.config.clone()
    };
    let started = Instant::now();
    let mut guest = Guest::start(config, &dir.join("qemu.log")).await?;
    let qmp_ready = started.elapsed();
    guest.qmp.ignore_shared(snapshot.ram_in_memory_file).await?;
    let file = std::fs::File::open(&snapshot.state)
        .map_err(io_err(format!("open {}", snapshot.state.display())))?;
    guest.qmp.getfd("state", file.as_fd()).await?;
    drop(file);
    guest.qmp.migrate_incoming("fd:state").await?;
    if guest.qmp.wait_incoming(MIGRATION).await? != "running" {
        guest.qmp.cont().await?;
    }
    let resumed = started.elapsed();
    let host = guest.agent_socket(QMP_CONNECT).await?;
    let (client, info) = guest.agent_on(Some(host), true, timeout).await?;
    let to_first_reply = started.elapsed();
    Ok((
        guest,
        client,
        RestoreReport {
            to_first_reply,
            qmp_ready,
            resumed,
            info,
        },
    ))
}
