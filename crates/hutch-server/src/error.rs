//! `ApiError`: the only place HTTP statuses are chosen.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hutch_build::BuildError;
use hutch_core::error::{self, AgentErrorCode};
use hutch_core::interp::InterpError;
use hutch_core::net::NetError;
use hutch_core::CoreError;
use hutch_dockerfile::ContextError as DockerContextError;
use hutch_proto::client::service::ServiceError;
use hutch_template::TemplateError;

use crate::build_context::ContextError;

/// An error answered as `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Machine-readable code.
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
    /// More fields of the error object, beside `code` and `message` (a refused quota's
    /// `quota`, `limit` and `used`).
    pub details: Option<serde_json::Map<String, serde_json::Value>>,
}

impl ApiError {
    /// 400 with `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: "bad_request",
            message: message.into(),
            details: None,
        }
    }

    /// 401.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            code: "unauthorized",
            message: message.into(),
            details: None,
        }
    }

    /// 403: understood and refused, whoever asks.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            code: "forbidden",
            message: message.into(),
            details: None,
        }
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            code: "not_found",
            message: message.into(),
            details: None,
        }
    }

    /// 502: a service inside a sandbox did not answer like an HTTP server (port proxy).
    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_GATEWAY,
            code: "bad_gateway",
            message: message.into(),
            details: None,
        }
    }

    /// 413: a request body over the limit of its route.
    pub fn payload_too_large(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: "payload_too_large",
            message: message.into(),
            details: None,
        }
    }

    /// 415: a body of a type the route does not take.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code: "unsupported_media_type",
            message: message.into(),
            details: None,
        }
    }

    /// 409: the resource is in a state or use that forbids the call.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::CONFLICT,
            code: "conflict",
            message: message.into(),
            details: None,
        }
    }

    /// 422.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "invalid_argument",
            message: message.into(),
            details: None,
        }
    }
}

/// Status and code of an agent's error answer.
fn agent_status(code: AgentErrorCode) -> (StatusCode, &'static str) {
    match code {
        AgentErrorCode::NotFound => (StatusCode::NOT_FOUND, "not_found"),
        AgentErrorCode::IsADirectory => (StatusCode::BAD_REQUEST, "is_a_directory"),
        AgentErrorCode::NotADirectory => (StatusCode::BAD_REQUEST, "not_a_directory"),
        AgentErrorCode::BadRequest => (StatusCode::BAD_REQUEST, "bad_request"),
        AgentErrorCode::NotEmpty => (StatusCode::CONFLICT, "not_empty"),
        AgentErrorCode::AlreadyExists => (StatusCode::CONFLICT, "already_exists"),
        AgentErrorCode::PermissionDenied => (StatusCode::FORBIDDEN, "permission_denied"),
        AgentErrorCode::NoSpace => (StatusCode::INSUFFICIENT_STORAGE, "no_space"),
        AgentErrorCode::CommandNotFound => (StatusCode::BAD_REQUEST, "command_not_found"),
        AgentErrorCode::ConnectionRefused => (StatusCode::BAD_GATEWAY, "connection_refused"),
        AgentErrorCode::Exited => (StatusCode::CONFLICT, "process_exited"),
        AgentErrorCode::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "agent_error"),
    }
}

/// Status and code of a code interpreter's error.
fn interp_status(e: &InterpError) -> (StatusCode, &'static str) {
    match e {
        InterpError::Unavailable { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "no_interpreter"),
        InterpError::UnknownContext(_) => (StatusCode::NOT_FOUND, "not_found"),
        InterpError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_argument"),
        InterpError::Driver(_) => (StatusCode::BAD_GATEWAY, "interpreter_failed"),
    }
}

/// Whether a host command the failed step waited on ran out of its deadline (anywhere in
/// the error's chain of causes: nft under a network error, qemu-img under a vm one, ...).
fn host_command_timed_out(e: &CoreError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.downcast_ref::<hutch_host_command::HostCommandError>()
            .is_some_and(|h| h.timed_out())
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Status and code of a core error, by its variant (and its cause's, where the cause decides).
fn core_status(e: &CoreError) -> (StatusCode, &'static str) {
    const INVALID: (StatusCode, &str) = (StatusCode::UNPROCESSABLE_ENTITY, "invalid_argument");
    const NOT_SUPPORTED: (StatusCode, &str) = (StatusCode::UNPROCESSABLE_ENTITY, "not_supported");
    const CONFLICT: (StatusCode, &str) = (StatusCode::CONFLICT, "conflict");
    const QUOTA: (StatusCode, &str) = (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded");
    const SANDBOX_FAILED: (StatusCode, &str) = (StatusCode::CONFLICT, "sandbox_failed");
    const INTERNAL: (StatusCode, &str) = (StatusCode::INTERNAL_SERVER_ERROR, "internal");
    if host_command_timed_out(e) {
        return (StatusCode::GATEWAY_TIMEOUT, "host_timeout");
    }
    match e {
        CoreError::HostTimeout { .. } => (StatusCode::GATEWAY_TIMEOUT, "host_timeout"),
        CoreError::InvalidArgument(_) => INVALID,
        CoreError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
        CoreError::Conflict(_) | CoreError::WrongState { .. } => CONFLICT,
        CoreError::NotSupported { .. } | CoreError::VmUnavailable(_) => NOT_SUPPORTED,
        CoreError::Quota(_) | CoreError::QuotaExceeded(_) => QUOTA,
        CoreError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
        CoreError::TooManyExecs(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_execs"),
        CoreError::ProcessNotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
        CoreError::ProcessExited(_) => (StatusCode::CONFLICT, "process_exited"),
        CoreError::TagInUse(_) => (StatusCode::CONFLICT, "tag_in_use"),
        CoreError::Agent { code, .. } => agent_status(*code),
        CoreError::NotReady { source, .. } => match source.as_ref() {
            ServiceError::TimedOut { .. } => (StatusCode::GATEWAY_TIMEOUT, "ready_timeout"),
            ServiceError::Exited { .. } => (StatusCode::BAD_GATEWAY, "not_ready"),
            ServiceError::Client(_) => SANDBOX_FAILED,
        },
        CoreError::AgentConnection(_)
        | CoreError::GuestSetup { .. }
        | CoreError::Qmp { .. }
        | CoreError::DiskUnusable { .. }
        | CoreError::FilesLost(_)
        | CoreError::SandboxFailed(_) => SANDBOX_FAILED,
        CoreError::NoSpace { .. } => (StatusCode::INSUFFICIENT_STORAGE, "no_space"),
        CoreError::NodeFenced { .. } => (StatusCode::SERVICE_UNAVAILABLE, "node_fenced"),
        CoreError::StoreUnavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
        CoreError::SavedStateUnavailable(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, "saved_state_unavailable")
        }
        CoreError::Vm(cause) if error::vm_unavailable(cause) => NOT_SUPPORTED,
        CoreError::Vm(cause) if error::vm_guest_failed(cause) => SANDBOX_FAILED,
        CoreError::Volume(cause) if error::volume_damaged(cause) => CONFLICT,
        CoreError::Net(NetError::Invalid(_)) => INVALID,
        CoreError::Net(NetError::PoolExhausted(_)) => QUOTA,
        CoreError::Interp(cause) => interp_status(cause),
        CoreError::Vm(_)
        | CoreError::Volume(_)
        | CoreError::Net(_)
        | CoreError::NetHost { .. }
        | CoreError::Jail(_)
        | CoreError::Template(_)
        | CoreError::Token(_)
        | CoreError::UidSlots(_)
        | CoreError::Io { .. }
        | CoreError::Entropy(_)
        | CoreError::Decode { .. }
        | CoreError::Encode(_)
        | CoreError::Task(_)
        | CoreError::Sqlite(_)
        | CoreError::CorruptRecord(_)
        | CoreError::Database(_)
        | CoreError::SharedStore(_)
        | CoreError::Internal(_) => INTERNAL,
    }
}

/// The fields a core error adds to the error object: a refused quota names itself, its
/// limit and what was in use.
fn core_details(e: &CoreError) -> Option<serde_json::Map<String, serde_json::Value>> {
    let CoreError::QuotaExceeded(q) = e else {
        return None;
    };
    let mut m = serde_json::Map::new();
    m.insert("quota".into(), q.quota.as_str().into());
    m.insert("limit".into(), serde_json::json!(q.limit));
    m.insert("used".into(), serde_json::json!(q.used));
    m.insert("tenant".into(), q.tenant.as_str().into());
    Some(m)
}

impl From<CoreError> for ApiError {
    fn from(e: CoreError) -> Self {
        let message = e.to_string();
        let (status, code) = core_status(&e);
        if status == StatusCode::INTERNAL_SERVER_ERROR && !matches!(e, CoreError::Agent { .. }) {
            tracing::error!(error = %message, "internal error");
        }
        Self {
            status,
            code,
            message,
            details: core_details(&e),
        }
    }
}

/// Status and code of a template store error, by its variant.
fn template_status(e: &TemplateError) -> (StatusCode, &'static str) {
    match e {
        TemplateError::InvalidName(_)
        | TemplateError::BuiltinName(_)
        | TemplateError::InvalidIsolation(_)
        | TemplateError::InvalidTag(_) => (StatusCode::BAD_REQUEST, "bad_request"),
        TemplateError::Unknown(_)
        | TemplateError::NotReady(_)
        | TemplateError::NoRevision { .. } => (StatusCode::NOT_FOUND, "not_found"),
        TemplateError::Image { .. }
        | TemplateError::MissingTool { .. }
        | TemplateError::NotStatic(_)
        | TemplateError::ToolFailed { .. }
        | TemplateError::ToolSilent { .. }
        | TemplateError::StepFailed { .. }
        | TemplateError::StillMounted { .. }
        | TemplateError::Io { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    }
}

/// Status and code of a build context the Dockerfile cannot use as it is, by variant.
fn docker_context_status(e: &DockerContextError) -> (StatusCode, &'static str) {
    match e {
        DockerContextError::Open { .. } | DockerContextError::Io { .. } => {
            (StatusCode::INTERNAL_SERVER_ERROR, "internal")
        }
        DockerContextError::Outside { .. }
        | DockerContextError::Absolute { .. }
        | DockerContextError::NotFound { .. }
        | DockerContextError::NoMatch { .. }
        | DockerContextError::BadPattern { .. }
        | DockerContextError::SymlinkOutside { .. }
        | DockerContextError::SymlinkLoop { .. }
        | DockerContextError::UnsupportedType { .. }
        | DockerContextError::TooManyEntries { .. }
        | DockerContextError::TooLarge { .. }
        | DockerContextError::NotUtf8 { .. } => (StatusCode::BAD_REQUEST, "bad_request"),
    }
}

/// Status and code of a build error, by its variant (and its cause's where that decides).
fn build_status(e: &BuildError) -> (StatusCode, &'static str) {
    match e {
        BuildError::BadRequest(_) | BuildError::Ignore(_) => {
            (StatusCode::BAD_REQUEST, "bad_request")
        }
        BuildError::Dockerfile(_) => (StatusCode::BAD_REQUEST, "invalid_dockerfile"),
        BuildError::Context(cause) => docker_context_status(cause),
        BuildError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
        BuildError::StepFailed(_) => (StatusCode::UNPROCESSABLE_ENTITY, "build_failed"),
        BuildError::Cancelled => (StatusCode::CONFLICT, "cancelled"),
        BuildError::TooMany(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_builds"),
        BuildError::Core(cause) => core_status(cause),
        BuildError::Template(cause) => template_status(cause),
        BuildError::Agent(_) => (StatusCode::CONFLICT, "sandbox_failed"),
        BuildError::Io { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    }
}

impl From<BuildError> for ApiError {
    fn from(e: BuildError) -> Self {
        let message = e.to_string();
        let (status, code) = build_status(&e);
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %message, "internal error");
        }
        Self {
            status,
            code,
            message,
            details: match &e {
                BuildError::Core(cause) => core_details(cause),
                _ => None,
            },
        }
    }
}

impl From<TemplateError> for ApiError {
    fn from(e: TemplateError) -> Self {
        let message = e.to_string();
        let (status, code) = template_status(&e);
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %message, "internal error");
        }
        Self {
            status,
            code,
            message,
            details: None,
        }
    }
}

impl From<ContextError> for ApiError {
    fn from(e: ContextError) -> Self {
        let message = e.to_string();
        let (status, code) = match e {
            ContextError::TooLarge { .. } | ContextError::TooManyEntries { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
            }
            ContextError::Malformed(_) | ContextError::Refused(_) | ContextError::Body(_) => {
                (StatusCode::BAD_REQUEST, "bad_request")
            }
            ContextError::Io(_) => {
                tracing::error!(error = %message, "internal error");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
        };
        Self {
            status,
            code,
            message,
            details: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json({
                let mut error = self.details.unwrap_or_default();
                error.insert("code".into(), self.code.into());
                error.insert("message".into(), self.message.into());
                serde_json::json!({ "error": error })
            }),
        )
            .into_response()
    }
}

/// Result of a handler.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use hutch_core::model::{Isolation, SandboxState};
    use hutch_proto::client::ClientError;

    use super::*;

    fn io() -> std::io::Error {
        std::io::Error::from_raw_os_error(5)
    }

    fn wrong_state() -> CoreError {
        CoreError::WrongState {
            op: Some("pause"),
            id: "sbx_a".into(),
            state: SandboxState::Paused,
            reason: None,
            hint: SandboxState::Paused.hint("sbx_a"),
        }
    }

    fn join_error() -> tokio::task::JoinError {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            let task = tokio::spawn(std::future::pending::<()>());
            task.abort();
            task.await.expect_err("an aborted task")
        })
    }

    /// Every variant of `CoreError` (and every cause that decides its status) and what the
    /// API answers for it.
    fn cases() -> Vec<(CoreError, StatusCode, &'static str)> {
        use hutch_jail::JailError;
        use hutch_vm::VmError;
        let volume_damaged = || JailError::VolumeDamaged {
            repairable: true,
            report: "bad inode".into(),
        };
        let timed_out = || hutch_host_command::HostCommandError::TimedOut {
            program: "nft".into(),
            after: std::time::Duration::from_secs(60),
        };
        vec![
            (
                CoreError::InvalidArgument("ttl".into()),
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_argument",
            ),
            (
                CoreError::HostTimeout {
                    step: "starting sandbox sbx_a (the jail helper)".into(),
                    source: timed_out(),
                },
                StatusCode::GATEWAY_TIMEOUT,
                "host_timeout",
            ),
            // A host command out of time under another error is the same 504.
            (
                CoreError::NetHost {
                    action: "sandbox networking",
                    source: NetError::HostCommand(timed_out()),
                },
                StatusCode::GATEWAY_TIMEOUT,
                "host_timeout",
            ),
            (
                CoreError::Vm(VmError::Disk(hutch_vm::disk::DiskError::HostCommand(
                    timed_out(),
                ))),
                StatusCode::GATEWAY_TIMEOUT,
                "host_timeout",
            ),
            (
                CoreError::NotFound("sandbox sbx_a does not exist".into()),
                StatusCode::NOT_FOUND,
                "not_found",
            ),
            (
                CoreError::Conflict("in use".into()),
                StatusCode::CONFLICT,
                "conflict",
            ),
            (wrong_state(), StatusCode::CONFLICT, "conflict"),
            (
                CoreError::NotSupported {
                    backend: Isolation::Vm,
                    feature: "live fork",
                },
                StatusCode::UNPROCESSABLE_ENTITY,
                "not_supported",
            ),
            (
                CoreError::VmUnavailable(Arc::new(hutch_vm::qemu::QemuError::Missing(
                    "qemu-system-x86_64".into(),
                ))),
                StatusCode::UNPROCESSABLE_ENTITY,
                "not_supported",
            ),
            (
                CoreError::Quota("too many".into()),
                StatusCode::TOO_MANY_REQUESTS,
                "quota_exceeded",
            ),
            (
                CoreError::TooManyExecs("8 running".into()),
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_execs",
            ),
            (
                CoreError::ProcessNotFound("no process 4".into()),
                StatusCode::NOT_FOUND,
                "not_found",
            ),
            (
                CoreError::ProcessExited("process 4 has exited".into()),
                StatusCode::CONFLICT,
                "process_exited",
            ),
            (
                CoreError::TagInUse("the tag \"web\" is taken".into()),
                StatusCode::CONFLICT,
                "tag_in_use",
            ),
            (
                CoreError::AgentConnection(ClientError::Transport("reset".into())),
                StatusCode::CONFLICT,
                "sandbox_failed",
            ),
            (
                CoreError::GuestSetup {
                    step: "identity",
                    source: ClientError::Protocol("bad frame".into()),
                },
                StatusCode::CONFLICT,
                "sandbox_failed",
            ),
            (
                CoreError::Qmp {
                    step: "QMP",
                    source: hutch_vm::qmp::QmpError::Closed,
                },
                StatusCode::CONFLICT,
                "sandbox_failed",
            ),
            (
                CoreError::DiskUnusable {
                    what: "sandbox sbx_a".into(),
                    source: hutch_vm::disk::DiskError::MissingTool {
                        tool: "qemu-img",
                        package: "qemu-utils",
                    },
                },
                StatusCode::CONFLICT,
                "sandbox_failed",
            ),
            (
                CoreError::FilesLost("its files are gone".into()),
                StatusCode::CONFLICT,
                "sandbox_failed",
            ),
            (
                CoreError::NoSpace {
                    what: "cannot create a sandbox: 0 MiB free".into(),
                    source: None,
                },
                StatusCode::INSUFFICIENT_STORAGE,
                "no_space",
            ),
            (
                CoreError::SandboxFailed("died".into()),
                StatusCode::CONFLICT,
                "sandbox_failed",
            ),
            (
                CoreError::Vm(VmError::Qemu(hutch_vm::qemu::QemuError::TooOld {
                    found: "6.0".into(),
                })),
                StatusCode::UNPROCESSABLE_ENTITY,
                "not_supported",
            ),
            (
                CoreError::Vm(VmError::Disk(hutch_vm::disk::DiskError::MissingTool {
                    tool: "qemu-img",
                    package: "qemu-utils",
                })),
                StatusCode::UNPROCESSABLE_ENTITY,
                "not_supported",
            ),
            (
                CoreError::Vm(VmError::Package(hutch_vm::package::PackageError::Tool(
                    "apt-get".into(),
                ))),
                StatusCode::UNPROCESSABLE_ENTITY,
                "not_supported",
            ),
            (
                CoreError::Vm(VmError::Exited {
                    status: "signal 9".into(),
                    log: String::new(),
                }),
                StatusCode::CONFLICT,
                "sandbox_failed",
            ),
            (
                CoreError::Vm(VmError::AgentTimeout {
                    seconds: 30.0,
                    last: "refused".into(),
                    console: String::new(),
                }),
                StatusCode::CONFLICT,
                "sandbox_failed",
            ),
            (
                CoreError::Vm(VmError::Qmp(hutch_vm::qmp::QmpError::Closed)),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::Jail(volume_damaged()),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::Volume(volume_damaged()),
                StatusCode::CONFLICT,
                "conflict",
            ),
            (
                CoreError::Volume(JailError::Setup("mount".into())),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::Net(NetError::Invalid("network.allow: bad".into())),
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_argument",
            ),
            (
                CoreError::Net(NetError::PoolExhausted("10.0.0.0/24".into())),
                StatusCode::TOO_MANY_REQUESTS,
                "quota_exceeded",
            ),
            (
                CoreError::Net(NetError::Nft("missing".into())),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::Net(NetError::Unavailable("off".into())),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::NetHost {
                    action: "the guest's network",
                    source: NetError::Invalid("hz4 is missing in the slot namespace".into()),
                },
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::Template(hutch_template::TemplateError::Unknown("x".into())),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::Token(hutch_core::sandbox_token::TokenError::Malformed),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::UidSlots(hutch_core::uid_slots::UidSlotError::StateDirInUse(
                    PathBuf::from("/var/lib/hutch"),
                )),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::io("create", "/x")(io()),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                // ENOSPC.
                CoreError::io("create", "/x")(std::io::Error::from_raw_os_error(28)),
                StatusCode::INSUFFICIENT_STORAGE,
                "no_space",
            ),
            (
                CoreError::Entropy(getrandom::Error::UNSUPPORTED),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::Decode {
                    path: "/x".into(),
                    source: serde_json::from_str::<u8>("x").expect_err("not JSON"),
                },
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::Encode(serde_json::from_str::<u8>("x").expect_err("not JSON")),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::Task(join_error()),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::Sqlite(rusqlite::Error::InvalidQuery),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::CorruptRecord(serde_json::from_str::<u8>("x").expect_err("not JSON")),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::Database("schema 9".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::NodeFenced {
                    node: "node-a".into(),
                    epoch: 3,
                },
                StatusCode::SERVICE_UNAVAILABLE,
                "node_fenced",
            ),
            (
                CoreError::SharedStore("syntax error".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                CoreError::StoreUnavailable("connection refused".into()),
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
            ),
            (
                CoreError::SavedStateUnavailable("the object store is down".into()),
                StatusCode::SERVICE_UNAVAILABLE,
                "saved_state_unavailable",
            ),
            (
                CoreError::Internal("bug".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                InterpError::Unavailable {
                    sandbox: "sbx_a".into(),
                    template: "minimal".into(),
                    what: "python".into(),
                    detail: "python3 is not installed".into(),
                }
                .into(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "no_interpreter",
            ),
            (
                InterpError::UnknownContext("ctx_a".into()).into(),
                StatusCode::NOT_FOUND,
                "not_found",
            ),
            (
                InterpError::Invalid("cwd".into()).into(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_argument",
            ),
            (
                InterpError::Driver("it hung up".into()).into(),
                StatusCode::BAD_GATEWAY,
                "interpreter_failed",
            ),
        ]
    }

    #[test]
    fn every_core_error_has_its_status_and_code() {
        for (e, status, code) in cases() {
            let what = format!("{e:?}");
            let api = ApiError::from(e);
            assert_eq!((api.status, api.code), (status, code), "{what}");
        }
    }

    #[test]
    fn every_build_error_has_its_status_and_code() {
        let dockerfile = hutch_dockerfile::DockerfileError::UnknownInstruction {
            line: 7,
            word: "FOO".into(),
            hint: String::new(),
        };
        let ignore = hutch_dockerfile::IgnoreError::BareExclamation { line: 1 };
        let outside = hutch_dockerfile::ContextError::Outside {
            source_path: "../x".into(),
        };
        let context_io = hutch_dockerfile::ContextError::Io {
            action: "reading",
            path: "x".into(),
            error: io(),
        };
        let table: Vec<(BuildError, StatusCode, &str)> = vec![
            (
                BuildError::BadRequest("no Dockerfile".into()),
                StatusCode::BAD_REQUEST,
                "bad_request",
            ),
            (
                BuildError::Dockerfile(dockerfile),
                StatusCode::BAD_REQUEST,
                "invalid_dockerfile",
            ),
            (
                BuildError::Ignore(ignore),
                StatusCode::BAD_REQUEST,
                "bad_request",
            ),
            (
                BuildError::Context(outside),
                StatusCode::BAD_REQUEST,
                "bad_request",
            ),
            (
                BuildError::Context(context_io),
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
            (
                BuildError::NotFound("no build".into()),
                StatusCode::NOT_FOUND,
                "not_found",
            ),
            (
                BuildError::StepFailed("exit code 1".into()),
                StatusCode::UNPROCESSABLE_ENTITY,
                "build_failed",
            ),
            (BuildError::Cancelled, StatusCode::CONFLICT, "cancelled"),
            (
                BuildError::Core(CoreError::Quota("too many".into())),
                StatusCode::TOO_MANY_REQUESTS,
                "quota_exceeded",
            ),
            (
                BuildError::Template(TemplateError::BuiltinName("minimal".into())),
                StatusCode::BAD_REQUEST,
                "bad_request",
            ),
            (
                BuildError::Template(TemplateError::NotReady("x".into())),
                StatusCode::NOT_FOUND,
                "not_found",
            ),
            (
                BuildError::Agent(ClientError::Transport("reset".into())),
                StatusCode::CONFLICT,
                "sandbox_failed",
            ),
            (
                BuildError::Io {
                    what: "the cache".into(),
                    source: io(),
                },
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
            ),
        ];
        for (e, status, code) in table {
            let what = format!("{e:?}");
            let api = ApiError::from(e);
            assert_eq!((api.status, api.code), (status, code), "{what}");
        }
        let api = ApiError::from(BuildError::Dockerfile(
            hutch_dockerfile::DockerfileError::UnknownInstruction {
                line: 7,
                word: "FOO".into(),
                hint: String::new(),
            },
        ));
        assert_eq!(
            api.message,
            "Dockerfile line 7: unknown instruction \"FOO\""
        );
    }

    #[test]
    fn context_upload_errors_have_their_status() {
        use crate::build_context::ContextError as C;
        for (e, status) in [
            (C::TooLarge { limit: 1 }, StatusCode::PAYLOAD_TOO_LARGE),
            (
                C::TooManyEntries { limit: 1 },
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            (C::Malformed("x".into()), StatusCode::BAD_REQUEST),
            (C::Refused("x".into()), StatusCode::BAD_REQUEST),
            (C::Body("x".into()), StatusCode::BAD_REQUEST),
            (C::Io("x".into()), StatusCode::INTERNAL_SERVER_ERROR),
        ] {
            let what = format!("{e:?}");
            assert_eq!(ApiError::from(e).status, status, "{what}");
        }
    }

    #[test]
    fn every_agent_code_has_its_status_and_code() {
        use AgentErrorCode as C;
        let table = [
            (C::NotFound, StatusCode::NOT_FOUND, "not_found"),
            (C::IsADirectory, StatusCode::BAD_REQUEST, "is_a_directory"),
            (C::NotADirectory, StatusCode::BAD_REQUEST, "not_a_directory"),
            (C::BadRequest, StatusCode::BAD_REQUEST, "bad_request"),
            (C::NotEmpty, StatusCode::CONFLICT, "not_empty"),
            (C::AlreadyExists, StatusCode::CONFLICT, "already_exists"),
            (
                C::PermissionDenied,
                StatusCode::FORBIDDEN,
                "permission_denied",
            ),
            (C::NoSpace, StatusCode::INSUFFICIENT_STORAGE, "no_space"),
            (
                C::CommandNotFound,
                StatusCode::BAD_REQUEST,
                "command_not_found",
            ),
            (
                C::ConnectionRefused,
                StatusCode::BAD_GATEWAY,
                "connection_refused",
            ),
            (
                C::Internal,
                StatusCode::INTERNAL_SERVER_ERROR,
                "agent_error",
            ),
        ];
        for (code, status, name) in table {
            let api = ApiError::from(CoreError::Agent {
                code,
                message: "from the agent".into(),
            });
            assert_eq!((api.status, api.code), (status, name), "{code:?}");
            assert_eq!(api.message, "from the agent");
        }
    }

    #[test]
    fn messages_are_the_core_errors_text() {
        let api = ApiError::from(wrong_state());
        assert_eq!(
            api.message,
            "cannot pause sandbox sbx_a: it is paused: only resume, kill, get and list are allowed on a paused sandbox (POST /v1/sandboxes/sbx_a/resume)"
        );
        let api = ApiError::from(CoreError::Net(NetError::Invalid(
            "network.allow: bad".into(),
        )));
        assert_eq!(api.message, "network.allow: bad");
    }
}
