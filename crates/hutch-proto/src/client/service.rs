//! Starting a sandbox's service and waiting until its ready check passes (see
//! [`crate::ServiceSpec`]). Used by the server after a sandbox starts and by the `vm` bake,
//! so a baked guest is snapshotted with its service already up.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Method;

use super::{json_body, AgentClient, ClientError, ClientResult};
use crate::{ExecRequest, ReadyCheck, ReadyProbe, ServiceSpec, ServiceState, ServiceStatus};

/// Most bytes of a failed ready command's output kept for the message.
const PROBE_OUTPUT_CAP: usize = 4 << 10;

/// Why a service did not become ready.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The start command ended before the check passed.
    #[error("the start command exited {} before {}{}", exit_text(.status), ready_text(.check.as_ref()), tail_text(&.status.tail))]
    Exited {
        /// The agent's account of it.
        status: ServiceStatus,
        /// The check it was waiting for.
        check: Option<ReadyCheck>,
    },
    /// The check did not pass in its time.
    #[error("the ready check ({}) did not pass within {} ms{}{}", .check.describe(), .check.timeout_ms, last_text(.last.as_deref()), tail_text(.tail))]
    TimedOut {
        /// The check.
        check: ReadyCheck,
        /// What its last attempt said.
        last: Option<String>,
        /// The start command's last lines.
        tail: Vec<String>,
    },
    /// The agent could not be asked.
    #[error("{0}")]
    Client(#[from] ClientError),
}

fn exit_text(status: &ServiceStatus) -> String {
    match (status.exit_code, status.signal) {
        (_, Some(signal)) => format!("on signal {signal}"),
        (Some(code), None) => format!("with status {code}"),
        (None, None) => "".into(),
    }
}

fn ready_text(check: Option<&ReadyCheck>) -> String {
    match check {
        Some(check) => format!("its ready check ({}) passed", check.describe()),
        None => "the sandbox was ready".into(),
    }
}

fn last_text(last: Option<&str>) -> String {
    last.map(|l| format!(" (last attempt: {l})"))
        .unwrap_or_default()
}

fn tail_text(tail: &[String]) -> String {
    if tail.is_empty() {
        return "; it printed nothing".into();
    }
    format!("; its last output:\n{}", tail.join("\n"))
}

impl AgentClient {
    /// `POST /v1/service`: start the sandbox's service (once; a second call answers with
    /// the first one's status).
    pub async fn start_service(&self, spec: &ServiceSpec) -> ClientResult<ServiceStatus> {
        self.json_call(Method::POST, "/v1/service", Some(json_body(spec)))
            .await
    }

    /// `GET /v1/service`.
    pub async fn service_status(&self) -> ClientResult<ServiceStatus> {
        self.json_call(Method::GET, "/v1/service", None).await
    }
}

/// Start `spec` unless the agent runs it already (a `vm` guest restored from a snapshot
/// taken with it up), then wait until its ready check passes. Returns whether this call
/// started it.
pub async fn start_and_wait(
    client: &AgentClient,
    spec: &ServiceSpec,
) -> Result<bool, ServiceError> {
    let status = client.service_status().await?;
    let started = match status.state {
        ServiceState::NotStarted => {
            let status = client.start_service(spec).await?;
            if status.state == ServiceState::Exited {
                return Err(ServiceError::Exited {
                    status,
                    check: spec.ready.clone(),
                });
            }
            true
        }
        ServiceState::Running => false,
        ServiceState::Exited => {
            return Err(ServiceError::Exited {
                status,
                check: spec.ready.clone(),
            })
        }
    };
    if let Some(check) = &spec.ready {
        wait_ready(client, spec, check).await?;
    }
    Ok(started)
}

/// Probe `check` until it passes, the service exits, or the check's time is up.
pub async fn wait_ready(
    client: &AgentClient,
    spec: &ServiceSpec,
    check: &ReadyCheck,
) -> Result<(), ServiceError> {
    let deadline = Instant::now() + Duration::from_millis(check.timeout_ms);
    loop {
        let last = match probe(client, spec, check).await {
            Ok(()) => return Ok(()),
            Err(Probe::Failed(why)) => why,
            Err(Probe::Client(e)) => return Err(e.into()),
        };
        let status = client.service_status().await?;
        if status.state == ServiceState::Exited {
            return Err(ServiceError::Exited {
                status,
                check: Some(check.clone()),
            });
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(ServiceError::TimedOut {
                check: check.clone(),
                last: Some(last),
                tail: status.tail,
            });
        }
        let pause = Duration::from_millis(check.interval_ms.max(1));
        tokio::time::sleep(pause.min(deadline - now)).await;
    }
}

/// Why one attempt did not pass.
enum Probe {
    /// The probe answered: not ready (what it said).
    Failed(String),
    /// The agent could not be asked.
    Client(ClientError),
}

async fn probe(client: &AgentClient, spec: &ServiceSpec, check: &ReadyCheck) -> Result<(), Probe> {
    match &check.probe {
        ReadyProbe::Port(port) => match client.connect_tcp(*port).await {
            Ok(tunnel) => {
                drop(tunnel);
                Ok(())
            }
            Err(ClientError::Agent(e)) => Err(Probe::Failed(e.message)),
            Err(e) => Err(Probe::Client(e)),
        },
        ReadyProbe::Cmd(cmd) => {
            let request = ExecRequest {
                cmd: cmd.clone(),
                env: spec.env.clone(),
                cwd: spec.cwd.clone(),
                user: spec.user.clone(),
                timeout_ms: Some(check.attempt_timeout_ms.max(1)),
                pty: None,
                stdin: false,
                background: false,
                handle: None,
            };
            let done = client
                .exec_collect(request, None::<Bytes>, PROBE_OUTPUT_CAP)
                .await
                .map_err(Probe::Client)?;
            if done.exit.exit_code == 0 {
                return Ok(());
            }
            let output = String::from_utf8_lossy(if done.stderr.is_empty() {
                &done.stdout
            } else {
                &done.stderr
            })
            .trim()
            .to_string();
            let what = if done.exit.timed_out {
                format!("killed after {} ms", check.attempt_timeout_ms)
            } else {
                format!("exit {}", done.exit.exit_code)
            };
            Err(Probe::Failed(if output.is_empty() {
                what
            } else {
                format!("{what}: {output}")
            }))
        }
    }
}
