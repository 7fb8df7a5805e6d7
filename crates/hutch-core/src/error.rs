//! The core's error type. The HTTP layer maps each variant to a status in one place
//! (`hutch-server`'s `error.rs`), by matching variants: never by reading a message.
//!
//! A failure with a typed cause keeps it: the backend crates' errors (`hutch_jail`,
//! `hutch_vm`, `hutch_net`, `hutch_template`), the agent client's, SQLite's and the OS's are
//! carried as they are, so `std::error::Error::source()` reaches the original error. The
//! variants that carry a `String` are the sentences a user reads (a bad argument, a missing
//! sandbox, a quota) or invariants with no cause to carry ([`CoreError::Internal`]).
//!
//! The message of each variant is what the API answers; several reproduce, byte for byte,
//! the text earlier versions built with `format!` (tests and clients match them).

use std::path::PathBuf;
use std::sync::Arc;

pub use hutch_proto::AgentErrorCode;
use hutch_vm::{disk::DiskError, VmError};

use crate::model::{Isolation, SandboxState};

/// Errors of the sandbox manager.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// The request was malformed or a value is invalid (422).
    #[error("{0}")]
    InvalidArgument(String),
    /// The named thing does not exist (404).
    #[error("{0}")]
    NotFound(String),
    /// The operation conflicts with what exists (a snapshot in use, an attached volume) (409).
    #[error("{0}")]
    Conflict(String),
    /// The sandbox is in a state that does not allow the operation (409).
    #[error("{}", wrong_state_message(*.op, id, *.state, reason.as_deref(), hint))]
    WrongState {
        /// What was asked (`pause`, `fork`, …); `None` for any use (exec, files).
        op: Option<&'static str>,
        /// The sandbox.
        id: String,
        /// Its state.
        state: SandboxState,
        /// Why it is in that state (a failed sandbox's error).
        reason: Option<String>,
        /// What to do instead ([`SandboxState::hint`]; may be empty).
        hint: String,
    },
    /// The sandbox's isolation backend cannot do this (422).
    #[error("{feature} is not supported on isolation \"{}\"", .backend.as_str())]
    NotSupported {
        /// The backend.
        backend: Isolation,
        /// What it cannot do.
        feature: &'static str,
    },
    /// QEMU is missing or too old on this host: isolation `vm` is unavailable (422).
    #[error("isolation \"vm\" is unavailable: {0}")]
    VmUnavailable(#[source] Arc<hutch_vm::qemu::QemuError>),
    /// A limit or quota would be exceeded (429).
    #[error("{0}")]
    Quota(String),
    /// A tenant's quota would be exceeded (429 `quota_exceeded`, with the quota, its limit
    /// and what was in use).
    #[error(transparent)]
    QuotaExceeded(#[from] crate::tenant::quota::QuotaExceeded),
    /// The caller may not do this, whatever the state (403): a template its tenant is not
    /// allowed, a key wider than its own.
    #[error("{0}")]
    Forbidden(String),
    /// The sandbox already runs as many execs as it may at once (429).
    #[error("{0}")]
    TooManyExecs(String),
    /// The sandbox has no process handle of that pid or tag (any more) (404).
    #[error("{0}")]
    ProcessNotFound(String),
    /// The process handle has exited: it takes no more input, signals or resizes (409).
    #[error("{0}")]
    ProcessExited(String),
    /// A running process handle of the sandbox already has this tag (409).
    #[error("{0}")]
    TagInUse(String),
    /// The sandbox's agent answered with an error about the request (status by its code).
    #[error("{message}")]
    Agent {
        /// The agent's code.
        code: AgentErrorCode,
        /// The agent's message.
        message: String,
    },
    /// The connection to the sandbox's agent failed, or its answer broke the protocol (409).
    #[error("sandbox failed: agent connection: {0}")]
    AgentConnection(#[source] hutch_proto::client::ClientError),
    /// A guest's setup call to its agent (identity, readiness) failed (409).
    #[error("sandbox failed: {step}: {source}")]
    GuestSetup {
        /// Which step.
        step: &'static str,
        /// The agent client's error.
        #[source]
        source: hutch_proto::client::ClientError,
    },
    /// QEMU's QMP did not do what was asked (409).
    #[error("sandbox failed: {step}: {source}")]
    Qmp {
        /// What was asked (`QMP` for a plain command).
        step: &'static str,
        /// QMP's error.
        #[source]
        source: hutch_vm::qmp::QmpError,
    },
    /// A `vm` guest's disk chain record does not hold (409).
    #[error("sandbox failed: the disk of {what} cannot be used: {source}")]
    DiskUnusable {
        /// Whose disk (`sandbox sbx_…`, `snapshot <dir>`).
        what: String,
        /// What is wrong with it.
        #[source]
        source: DiskError,
    },
    /// The template's start command did not become ready: it exited, or its ready check did
    /// not pass in time (502 `not_ready`; 504 `ready_timeout` for a check out of time).
    #[error("sandbox not ready: template {template:?}: {source}")]
    NotReady {
        /// The sandbox's template.
        template: String,
        /// What went wrong.
        #[source]
        source: Box<hutch_proto::client::service::ServiceError>,
    },
    /// The sandbox could not be created or has died (409).
    #[error("sandbox failed: {0}")]
    SandboxFailed(String),
    /// A host command a step waited on did not finish within its deadline (`hutch serve
    /// --host-command-timeout-seconds`): it was killed and what the step made removed (504
    /// `host_timeout`).
    #[error("{step} timed out: {source}; what it had made was removed")]
    HostTimeout {
        /// The step, in words (`starting sandbox sbx_… (the jail helper)`).
        step: String,
        /// The command that ran out of time.
        #[source]
        source: hutch_host_command::HostCommandError,
    },
    /// The `vm` backend's crate failed (status by the cause: a missing host tool is 422, a
    /// guest that died is 409, anything else 500).
    #[error("{}", vm_message(.0))]
    Vm(#[from] VmError),
    /// The jail of an `ns` sandbox, or its host work (cgroups, mounts), failed (500).
    #[error("internal error: {0}")]
    Jail(#[source] hutch_jail::JailError),
    /// The server's state disk has no room for what was asked: below its reserve
    /// (`state_disk.rs`), or a write there failed for want of space (ENOSPC, EDQUOT, SQLite's
    /// `SQLITE_FULL`). What sandboxes had written is kept (507).
    #[error("no space on the server's state disk: {what}")]
    NoSpace {
        /// What could not be done, and what to do about it.
        what: String,
        /// The failure that said so, if one did.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The files a sandbox kept (a hibernated sandbox's writable layer) are gone: it can
    /// never run again and is marked `failed` with this reason (409).
    #[error("sandbox failed: {0}")]
    FilesLost(String),
    /// A volume's image could not be used (a damaged one is 409, anything else 500).
    #[error("{}", volume_message(.0))]
    Volume(#[source] hutch_jail::JailError),
    /// Sandbox networking failed or refused (an invalid policy is 422, an exhausted address
    /// pool 429, anything else 500).
    #[error("{}", net_message(.0))]
    Net(#[from] hutch_net::NetError),
    /// Host networking work failed where no request could have caused it (starting sandbox
    /// networking, a guest's TAP) (500, whatever the cause).
    #[error("internal error: {action}: {source}")]
    NetHost {
        /// What was being done.
        action: &'static str,
        /// The networking error.
        #[source]
        source: hutch_net::NetError,
    },
    /// The template store failed (500).
    #[error("internal error: templates: {0}")]
    Template(#[from] hutch_template::TemplateError),
    /// The sandbox token secret could not be loaded (500).
    #[error("internal error: {0}")]
    Token(#[from] crate::sandbox_token::TokenError),
    /// The host-wide uid slot claims failed (500).
    #[error("internal error: {0}")]
    UidSlots(#[from] crate::uid_slots::UidSlotError),
    /// A file operation on the host failed (500).
    #[error("internal error: {action} {}: {source}", .path.display())]
    Io {
        /// What was tried (`create`, `write`, `rename`, …).
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// The host's entropy source failed (500).
    #[error("internal error: host entropy: {0}")]
    Entropy(#[from] getrandom::Error),
    /// A file the server wrote does not decode (500).
    #[error("internal error: read {}: {source}", .path.display())]
    Decode {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: serde_json::Error,
    },
    /// A value could not be encoded as JSON (500).
    #[error("internal error: {0}")]
    Encode(#[source] serde_json::Error),
    /// A task on the blocking pool panicked or was cancelled (500).
    #[error("internal error: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The state database failed (500).
    #[error("state database: {0}")]
    Sqlite(#[source] rusqlite::Error),
    /// A record in the state database does not decode (500).
    #[error("state database: corrupt record: {0}")]
    CorruptRecord(#[source] serde_json::Error),
    /// The state database cannot be used (its files, its schema) (500).
    #[error("state database: {0}")]
    Database(String),
    /// This node was declared dead by the cluster (the reaper bumped its epoch): it may no
    /// longer change the rows it owns in the cluster database, and changed nothing (503
    /// `node_fenced`).
    #[error("this node ({node}, epoch {epoch}) is no longer a member of the cluster: it was declared dead")]
    NodeFenced {
        /// The node's id.
        node: String,
        /// The epoch it held (no longer its row's).
        epoch: i64,
    },
    /// The cluster database (PostgreSQL) refused or failed a statement (500).
    #[error("cluster database: {0}")]
    SharedStore(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The cluster database could not be reached (503 `store_unavailable`).
    #[error("cluster database unreachable: {0}")]
    StoreUnavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A hibernated sandbox's saved state cannot be fetched from where other nodes keep it
    /// (the object store is down or the object is damaged): it stays hibernated (503
    /// `saved_state_unavailable`).
    #[error("{0}")]
    SavedStateUnavailable(String),
    /// The code interpreter refused or failed (an unknown context is 404, a template that
    /// cannot run code or a bad value 422, a failed driver 502).
    #[error("{0}")]
    Interp(#[from] crate::interp::InterpError),
    /// A bug: an invariant with no cause to carry (500).
    #[error("internal error: {0}")]
    Internal(String),
}

impl CoreError {
    /// A file operation's error, naming what was tried on which path (for `map_err`); a
    /// failure for want of space is [`CoreError::NoSpace`].
    pub fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> CoreError {
        let path = path.into();
        move |source| {
            if is_no_space(&source) {
                return CoreError::NoSpace {
                    what: format!("{action} {}: {source}", path.display()),
                    source: Some(Box::new(source)),
                };
            }
            CoreError::Io {
                action,
                path,
                source,
            }
        }
    }

    /// Whether this is a refusal for want of space on the state disk.
    pub fn is_no_space(&self) -> bool {
        matches!(self, CoreError::NoSpace { .. })
    }

    /// A guest setup call's error (for `map_err`).
    pub fn guest_setup(
        step: &'static str,
    ) -> impl FnOnce(hutch_proto::client::ClientError) -> CoreError {
        move |source| CoreError::GuestSetup { step, source }
    }

    /// A host networking error during `action`, never the caller's fault (for `map_err`).
    pub fn net_host(action: &'static str) -> impl FnOnce(hutch_net::NetError) -> CoreError {
        move |source| CoreError::NetHost { action, source }
    }

    /// A QMP error during `step` (for `map_err`).
    pub fn qmp(step: &'static str) -> impl FnOnce(hutch_vm::qmp::QmpError) -> CoreError {
        move |source| CoreError::Qmp { step, source }
    }
}

impl From<hutch_proto::client::ClientError> for CoreError {
    /// An agent's error answer keeps its code; a broken connection is
    /// [`CoreError::AgentConnection`].
    fn from(e: hutch_proto::client::ClientError) -> Self {
        match e {
            hutch_proto::client::ClientError::Agent(a) => CoreError::Agent {
                code: a.code,
                message: a.message,
            },
            other => CoreError::AgentConnection(other),
        }
    }
}

/// Whether an OS error says the filesystem (or a quota on it) is full.
fn is_no_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

impl From<rusqlite::Error> for CoreError {
    /// `SQLITE_FULL` (the database could not grow) is [`CoreError::NoSpace`]; anything else
    /// [`CoreError::Sqlite`].
    fn from(e: rusqlite::Error) -> Self {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
            return CoreError::NoSpace {
                what: format!("the state database cannot grow ({e})"),
                source: Some(Box::new(e)),
            };
        }
        CoreError::Sqlite(e)
    }
}

impl From<hutch_jail::JailError> for CoreError {
    /// Host work that failed for want of space is [`CoreError::NoSpace`]; anything else
    /// [`CoreError::Jail`].
    fn from(e: hutch_jail::JailError) -> Self {
        match &e {
            hutch_jail::JailError::Sys { op, source } if is_no_space(source) => {
                CoreError::NoSpace {
                    what: format!("{op}: {source}"),
                    source: Some(Box::new(e)),
                }
            }
            _ => CoreError::Jail(e),
        }
    }
}

impl From<crate::ids::MalformedId> for CoreError {
    /// A malformed id is answered as an unknown one: `NotFound`, "sandbox … does not exist".
    fn from(e: crate::ids::MalformedId) -> Self {
        CoreError::NotFound(e.to_string())
    }
}

/// The 409 sentence of a call refused in a state (its text is matched by clients).
fn wrong_state_message(
    op: Option<&str>,
    id: &str,
    state: SandboxState,
    reason: Option<&str>,
    hint: &str,
) -> String {
    let reason = reason.map(|e| format!(" ({e})")).unwrap_or_default();
    let hint = if hint.is_empty() {
        String::new()
    } else {
        format!(": {hint}")
    };
    match op {
        Some(op) => format!(
            "cannot {op} sandbox {id}: it is {}{reason}{hint}",
            state.as_str()
        ),
        None => format!("sandbox {id} is {}{reason}{hint}", state.as_str()),
    }
}

/// Whether a `vm` error means the host lacks what `vm` needs (QEMU, a disk tool, the
/// guest kernel package).
pub fn vm_unavailable(e: &VmError) -> bool {
    matches!(
        e,
        VmError::Qemu(_) | VmError::Disk(DiskError::MissingTool { .. }) | VmError::Package(_)
    )
}

/// Whether a `vm` error means the guest died or never answered.
pub fn vm_guest_failed(e: &VmError) -> bool {
    matches!(e, VmError::Exited { .. } | VmError::AgentTimeout { .. })
}

fn vm_message(e: &VmError) -> String {
    match e {
        VmError::Package(p) => format!(
            "isolation \"vm\" is unavailable: cannot get the guest kernel ({p}); check that apt-get can reach Debian's registry, or pass --vm-kernel-root"
        ),
        e if vm_unavailable(e) => format!("isolation \"vm\" is unavailable: {e}"),
        e if vm_guest_failed(e) => format!("sandbox failed: {e}"),
        e => format!("internal error: {e}"),
    }
}

/// Whether a volume error is a damaged image (the user can repair or delete it).
pub fn volume_damaged(e: &hutch_jail::JailError) -> bool {
    matches!(e, hutch_jail::JailError::VolumeDamaged { .. })
}

fn volume_message(e: &hutch_jail::JailError) -> String {
    if volume_damaged(e) {
        format!("volume: {e}")
    } else {
        format!("internal error: volume: {e}")
    }
}

fn net_message(e: &hutch_net::NetError) -> String {
    match e {
        hutch_net::NetError::Invalid(m) => m.clone(),
        hutch_net::NetError::PoolExhausted(_) => e.to_string(),
        e => format!("internal error: sandbox network: {e}"),
    }
}

/// Result alias for the core.
pub type CoreResult<T> = Result<T, CoreError>;

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn wrong_state_reads_as_before() {
        let e = CoreError::WrongState {
            op: Some("pause"),
            id: "sbx_a".into(),
            state: SandboxState::Failed,
            reason: Some("oom".into()),
            hint: SandboxState::Failed.hint("sbx_a"),
        };
        assert_eq!(
            e.to_string(),
            "cannot pause sandbox sbx_a: it is failed (oom): it cannot run again: create a new sandbox"
        );
        let e = CoreError::WrongState {
            op: None,
            id: "sbx_a".into(),
            state: SandboxState::Running,
            reason: None,
            hint: String::new(),
        };
        assert_eq!(e.to_string(), "sandbox sbx_a is running");
    }

    #[test]
    fn backend_errors_keep_their_source() {
        let jail = hutch_jail::JailError::Setup("pivot_root".into());
        let e = CoreError::from(jail);
        let source = e.source().expect("a jail error has a source");
        assert!(matches!(
            source.downcast_ref::<hutch_jail::JailError>(),
            Some(hutch_jail::JailError::Setup(m)) if m == "pivot_root"
        ));
        assert_eq!(
            e.to_string(),
            "internal error: sandbox setup failed: pivot_root"
        );

        let vm = VmError::Exited {
            status: "exit status: 1".into(),
            log: "boom".into(),
        };
        let e = CoreError::from(vm);
        assert!(matches!(
            e.source().and_then(|s| s.downcast_ref::<VmError>()),
            Some(VmError::Exited { log, .. }) if log == "boom"
        ));
        assert_eq!(
            e.to_string(),
            "sandbox failed: QEMU exited (exit status: 1): boom"
        );

        let net = hutch_net::NetError::Nft("no nft".into());
        let e = CoreError::from(net);
        assert!(matches!(
            e.source()
                .and_then(|s| s.downcast_ref::<hutch_net::NetError>()),
            Some(hutch_net::NetError::Nft(_))
        ));
        assert_eq!(
            e.to_string(),
            "internal error: sandbox network: nftables: no nft"
        );

        let io = std::io::Error::from_raw_os_error(libc::EIO);
        let e = CoreError::io("write", "/x/y")(io);
        assert_eq!(
            e.source()
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .and_then(std::io::Error::raw_os_error),
            Some(libc::EIO)
        );
        assert!(e.to_string().starts_with("internal error: write /x/y: "));
    }

    #[test]
    fn a_full_disk_is_no_space_whichever_layer_says_so() {
        let io = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let e = CoreError::io("write", "/x/y")(io);
        assert!(e.is_no_space(), "{e:?}");
        assert_eq!(
            e.source()
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .and_then(std::io::Error::raw_os_error),
            Some(libc::ENOSPC)
        );
        assert!(e
            .to_string()
            .starts_with("no space on the server's state disk: write /x/y: "));

        let full = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            Some("database or disk is full".into()),
        );
        let e = CoreError::from(full);
        assert!(e.is_no_space(), "{e:?}");
        assert!(
            e.to_string().contains("the state database cannot grow"),
            "{e}"
        );
        assert!(e
            .source()
            .and_then(|s| s.downcast_ref::<rusqlite::Error>())
            .is_some());
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        );
        assert!(matches!(CoreError::from(busy), CoreError::Sqlite(_)));

        let jail = hutch_jail::JailError::Sys {
            op: "copy /a".into(),
            source: std::io::Error::from_raw_os_error(libc::EDQUOT),
        };
        let e = CoreError::from(jail);
        assert!(e.is_no_space(), "{e:?}");
        assert!(e
            .source()
            .and_then(|s| s.downcast_ref::<hutch_jail::JailError>())
            .is_some());
    }

    #[test]
    fn agent_answers_keep_their_code_and_transport_errors_their_cause() {
        use hutch_proto::client::ClientError;
        let e = CoreError::from(ClientError::Agent(hutch_proto::AgentError::new(
            AgentErrorCode::NoSpace,
            "disk full",
        )));
        assert!(matches!(
            &e,
            CoreError::Agent { code: AgentErrorCode::NoSpace, message } if message == "disk full"
        ));
        assert_eq!(e.to_string(), "disk full");

        let e = CoreError::from(ClientError::Transport("reset".into()));
        assert_eq!(
            e.to_string(),
            "sandbox failed: agent connection: agent connection: reset"
        );
        assert!(matches!(
            e.source().and_then(|s| s.downcast_ref::<ClientError>()),
            Some(ClientError::Transport(_))
        ));
    }

    #[test]
    fn a_fenced_node_says_it_was_declared_dead() {
        let e = CoreError::NodeFenced {
            node: "node-a".into(),
            epoch: 3,
        };
        assert_eq!(
            e.to_string(),
            "this node (node-a, epoch 3) is no longer a member of the cluster: it was declared dead"
        );
        let e = CoreError::StoreUnavailable("connection refused".into());
        assert_eq!(
            e.to_string(),
            "cluster database unreachable: connection refused"
        );
        assert!(e.source().is_some());
    }

    #[test]
    fn net_errors_read_as_the_user_sentence_or_as_internal() {
        let e = CoreError::from(hutch_net::NetError::Invalid("network.allow: bad".into()));
        assert_eq!(e.to_string(), "network.allow: bad");
        let e = CoreError::from(hutch_net::NetError::PoolExhausted("10.0.0.0/24".into()));
        assert_eq!(
            e.to_string(),
            "the sandbox address pool 10.0.0.0/24 is exhausted"
        );
    }
}
