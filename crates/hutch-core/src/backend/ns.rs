//! The `ns` backend: the namespace jail of `hutch-jail`, built by the `hutch __jail-spawn`
//! helper (the jail forks, and the server is multi-threaded, so the fork happens in a fresh
//! single-threaded process).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hutch_jail::{JailSpec, Limits, SpawnedJail, Teardown};

use super::{Backend, Started, Usage};
use crate::config::Config;
use crate::error::{CoreError, CoreResult};
use crate::model::{Isolation, SandboxRecord};

/// Size of every sandbox's uid/gid range.
pub const UID_RANGE: u32 = 65_536;
/// Longest unix socket path the kernel accepts (sun_path minus the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The namespace backend.
pub struct NsBackend {
    cfg: Config,
}

impl NsBackend {
    /// A backend using `cfg`'s paths.
    pub fn new(cfg: Config) -> Self {
        Self { cfg }
    }

    fn spec(&self, r: &SandboxRecord, rootfs: &Path) -> JailSpec {
        let mut env: Vec<(String, String)> = vec![
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("HUTCH_SANDBOX_ID".into(), r.id.clone()),
            ("LANG".into(), "C.UTF-8".into()),
        ];
        env.extend(r.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let memory_bytes = r.memory_mib << 20;
        JailSpec {
            id: r.id.clone(),
            template_rootfs: rootfs.to_path_buf(),
            sandbox_dir: self.cfg.sandbox_dir(&r.id),
            uid_base: r.uid_slot * UID_RANGE,
            uid_count: UID_RANGE,
            agent_binary: self.cfg.agent_binary.clone(),
            agent_args: vec![
                "serve".into(),
                "--listen-fd".into(),
                hutch_proto::AGENT_LISTEN_FD.to_string(),
            ],
            agent_socket: self.agent_socket(&r.id),
            hostname: r.id.replace('_', "-"),
            env,
            limits: Limits {
                memory_bytes,
                cpu_millis: (r.cpus * 1000.0).round() as u32,
                pids_max: r.pids_max,
                tmp_bytes: memory_bytes,
            },
            cgroup_parent: self.cfg.cgroup_parent.clone(),
        }
    }

    fn teardown(&self, r: &SandboxRecord) -> Teardown {
        Teardown {
            id: r.id.clone(),
            sandbox_dir: self.cfg.sandbox_dir(&r.id),
            init_pid: r.init_pid,
            init_start_time: r.init_start_time,
            cgroups: r.cgroups.iter().map(PathBuf::from).collect(),
            cgroup_parent: self.cfg.cgroup_parent.clone(),
        }
    }
}

impl Backend for NsBackend {
    fn isolation(&self) -> Isolation {
        Isolation::Ns
    }

    fn create(&self, record: &SandboxRecord, rootfs: &Path) -> CoreResult<Started> {
        let spec = self.spec(record, rootfs);
        if spec.agent_socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(CoreError::Internal(format!(
                "agent socket path {} is longer than {MAX_SOCKET_PATH} bytes: use a shorter --state-dir",
                spec.agent_socket.display()
            )));
        }
        let input = serde_json::to_vec(&spec).map_err(|e| CoreError::Internal(e.to_string()))?;
        let mut child = Command::new(&self.cfg.hutch_exe)
            .arg("__jail-spawn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                CoreError::Internal(format!(
                    "cannot run the jail helper {}: {e}",
                    self.cfg.hutch_exe.display()
                ))
            })?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(&input)
                .map_err(|e| CoreError::Internal(format!("jail helper stdin: {e}")))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| CoreError::Internal(format!("jail helper: {e}")))?;
        let parsed: Result<SpawnedJail, _> = serde_json::from_slice(&out.stdout);
        match parsed {
            Ok(s) if out.status.success() => Ok(Started {
                init_pid: s.init_pid,
                init_start_time: s.init_start_time,
                cgroups: s.cgroups,
            }),
            _ => {
                let msg = serde_json::from_slice::<serde_json::Value>(&out.stdout)
                    .ok()
                    .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(String::from))
                    .unwrap_or_else(|| {
                        format!(
                            "{} {}",
                            String::from_utf8_lossy(&out.stdout).trim(),
                            String::from_utf8_lossy(&out.stderr).trim()
                        )
                    });
                Err(CoreError::SandboxFailed(msg))
            }
        }
    }

    fn destroy(&self, record: &SandboxRecord) -> CoreResult<()> {
        hutch_jail::destroy(&self.teardown(record)).map_err(|e| CoreError::Internal(e.to_string()))
    }

    fn agent_socket(&self, id: &str) -> PathBuf {
        self.cfg.sandbox_dir(id).join("agent.sock")
    }

    fn alive(&self, r: &SandboxRecord) -> bool {
        match (r.init_pid, r.init_start_time) {
            (Some(pid), Some(start)) => hutch_jail::init_alive(pid, start),
            _ => false,
        }
    }

    fn usage(&self, r: &SandboxRecord) -> Option<Usage> {
        if r.cgroups.is_empty() {
            return None;
        }
        let cgroups: Vec<PathBuf> = r.cgroups.iter().map(PathBuf::from).collect();
        let s = hutch_jail::cgroup_stats(&cgroups);
        Some(Usage {
            memory_bytes: s.memory_bytes,
            memory_limit_bytes: s.memory_limit_bytes,
            oom_kills: s.oom_kills,
            cpu_usage_ns: s.cpu_usage_ns,
            pids: s.pids_current,
        })
    }
}
