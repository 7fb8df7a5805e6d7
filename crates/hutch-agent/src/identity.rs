//! `GET /v1/info` and `POST /v1/identity`: who the agent is, and who the host says the
//! sandbox is.
//!
//! Identity is applied after create and after every restore of a `vm` snapshot: the
//! environment replaces the previous identity environment (it is layered into every later
//! exec), and — where the agent is permitted, which on `ns` it usually is not — the
//! hostname is set, host entropy is mixed into the kernel RNG (forked VMs must not share
//! random state) and the wall clock is set. Not being permitted is not an error.

use std::os::fd::AsRawFd;

use hutch_proto::{AgentInfo, IdentityRequest, PROTOCOL_VERSION};

use crate::error::{Failure, Result};
use crate::log::log;
use crate::state::Agent;
use crate::sys;

/// Most entropy bytes accepted in one identity call.
pub const MAX_ENTROPY: usize = 4096;
/// How long the agent waits for the guest kernel to see a grown root disk.
const DISK_RESIZE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long the agent waits for a volume's disk to be probed again.
const VOLUME_PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// Longest hostname the kernel accepts.
const MAX_HOSTNAME: usize = 64;
/// `RNDADDENTROPY` = `_IOW('R', 0x03, int[2])`; not exported by the libc crate.
const RNDADDENTROPY: libc::Ioctl = 0x4008_5203;
/// `RNDRESEEDCRNG` = `_IO('R', 0x07)`: reseed the kernel CRNG from the input pool now.
/// Without it a restored guest keeps generating from the snapshot's CRNG key until the
/// next periodic reseed, so sibling VMs would read the same `/dev/urandom` bytes.
const RNDRESEEDCRNG: libc::Ioctl = 0x5207;

/// `GET /v1/info`.
pub fn info() -> Result<AgentInfo> {
    let (hostname, kernel) = sys::uname().map_err(|e| Failure::Internal(format!("uname: {e}")))?;
    Ok(AgentInfo {
        protocol_version: PROTOCOL_VERSION,
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        hostname,
        kernel,
        pid: sys::getpid(),
    })
}

/// Check an identity request before applying any of it.
pub fn validate(request: &IdentityRequest) -> Result<()> {
    if let Some(name) = &request.hostname {
        let valid = !name.is_empty()
            && name.len() <= MAX_HOSTNAME
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !valid {
            return Err(Failure::BadRequest(format!("invalid hostname {name:?}")));
        }
    }
    if request.entropy.len() > MAX_ENTROPY {
        return Err(Failure::BadRequest(format!(
            "at most {MAX_ENTROPY} entropy bytes"
        )));
    }
    if let Some(bad) = request
        .env
        .keys()
        .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
    {
        return Err(Failure::BadRequest(format!(
            "bad environment variable name {bad:?}"
        )));
    }
    Ok(())
}

/// What an identity call changed beyond the environment (for logs and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// The hostname was set.
    pub hostname: bool,
    /// Entropy was mixed into the kernel RNG.
    pub entropy: bool,
    /// The wall clock was set.
    pub clock: bool,
    /// The guest's interface was configured.
    pub network: bool,
    /// The root filesystem was grown to this many bytes.
    pub root_bytes: Option<u64>,
    /// Volumes mounted.
    pub volumes: usize,
}

/// `POST /v1/identity` (blocking: writes to `/dev/urandom`).
///
/// Hostname, entropy and clock are machine-wide: they are touched only when the agent is
/// the sandbox's init (`is_init`, i.e. PID 1). An agent started by hand or by a test on the
/// host only stores the environment, so it can never rename the host or move its clock.
pub fn apply(agent: &Agent, request: IdentityRequest, is_init: bool) -> Result<Applied> {
    validate(&request)?;
    let mut applied = Applied::default();
    if is_init {
        if let Some(name) = &request.hostname {
            match sys::set_hostname(name) {
                Ok(()) => applied.hostname = true,
                Err(e) if is_not_permitted(&e) => {}
                Err(e) => log!("cannot set the hostname: {e}"),
            }
        }
        if !request.entropy.is_empty() {
            applied.entropy = add_entropy(&request.entropy);
        }
        if let Some(ms) = request.unix_time_ms {
            match sys::set_realtime(ms) {
                Ok(()) => applied.clock = true,
                Err(e) if is_not_permitted(&e) => {}
                Err(e) => log!("cannot set the clock: {e}"),
            }
        }
        if let Some(net) = &request.network {
            crate::netconf::apply(net).map_err(Failure::BadRequest)?;
            applied.network = true;
        }
        if let Some(bytes) = request.root_disk_bytes {
            let grown = crate::rootfs::grow_root(bytes, DISK_RESIZE_WAIT)
                .map_err(|e| Failure::Internal(e.to_string()))?;
            applied.root_bytes = Some(grown);
        }
        crate::volumes::detach(&request.unmount).map_err(|e| Failure::Internal(e.to_string()))?;
        crate::volumes::mount_all(&request.volumes, VOLUME_PROBE_WAIT)
            .map_err(|e| Failure::Internal(e.to_string()))?;
        applied.volumes = request.volumes.len();
    }
    agent.set_identity_env(request.env);
    Ok(applied)
}

fn is_not_permitted(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPERM | libc::EACCES | libc::EROFS)
    )
}

/// Mix `bytes` into the kernel RNG, crediting them when we may (`RNDADDENTROPY` needs
/// `CAP_SYS_ADMIN`), else just stirring them in through a write. True if either worked.
fn add_entropy(bytes: &[u8]) -> bool {
    let Ok(random) = sys::open(c"/dev/urandom", libc::O_WRONLY) else {
        return false;
    };
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut request = Vec::with_capacity(8 + bytes.len());
    request.extend_from_slice(&((bytes.len() * 8) as libc::c_int).to_ne_bytes());
    request.extend_from_slice(&(bytes.len() as libc::c_int).to_ne_bytes());
    request.extend_from_slice(bytes);
    if sys::ioctl_bytes(random.as_raw_fd(), RNDADDENTROPY, &request).is_ok() {
        if let Err(e) = sys::ioctl_int(random.as_raw_fd(), RNDRESEEDCRNG, 0) {
            log!("cannot reseed the kernel RNG: {e}");
        }
        return true;
    }
    use std::io::Write;
    let mut file = std::fs::File::from(random);
    file.write_all(bytes).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_identity() {
        let ok = IdentityRequest {
            hostname: Some("sbx-1.local".into()),
            ..Default::default()
        };
        assert!(validate(&ok).is_ok());
        let bad_host = IdentityRequest {
            hostname: Some("a b".into()),
            ..Default::default()
        };
        assert!(validate(&bad_host).is_err());
        let much = IdentityRequest {
            entropy: vec![0; MAX_ENTROPY + 1],
            ..Default::default()
        };
        assert!(validate(&much).is_err());
        let mut env = IdentityRequest::default();
        env.env.insert("A=B".into(), "x".into());
        assert!(validate(&env).is_err());
    }

    #[test]
    fn outside_init_only_the_environment_is_applied() {
        // Not PID 1 (a test process): hostname, entropy and clock must be left alone.
        assert_ne!(sys::getpid(), 1);
        let agent = Agent::new(std::sync::Arc::default(), Vec::new(), None, 0);
        let (before, _) = sys::uname().expect("uname");
        let request = IdentityRequest {
            hostname: Some("must-not-be-set".into()),
            env: [("K".to_string(), "v".to_string())].into(),
            entropy: vec![1, 2, 3],
            unix_time_ms: Some(0),
            network: None,
            root_disk_bytes: Some(1 << 40),
            unmount: vec!["/".into()],
            volumes: vec![hutch_proto::GuestVolume {
                serial: "hutch-vol0".into(),
                path: "/must-not-be-mounted".into(),
                read_only: false,
            }],
        };
        let applied = apply(&agent, request, false).expect("applies");
        assert_eq!(applied, Applied::default());
        assert_eq!(sys::uname().expect("uname").0, before);
        assert_eq!(agent.identity_env()["K"], "v");
    }

    #[test]
    fn info_reports_the_protocol() {
        let info = info().expect("uname works");
        assert_eq!(info.protocol_version, PROTOCOL_VERSION);
        assert!(!info.kernel.is_empty());
    }
}
