//! `ApiError`: the only place HTTP statuses are chosen.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use hutch_core::error::{self, AgentErrorCode};
use hutch_core::interp::InterpError;
use hutch_core::net::NetError;
use hutch_core::CoreError;
use hutch_proto::client::service::ServiceError;

/// An error answered as `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Machine-readable code.
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
}

impl ApiError {
    /// 400 with `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: "bad_request",
            message: message.into(),
        }
    }

    /// 401.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            code: "unauthorized",
            message: message.into(),
        }
    }

    /// 403: understood and refused, whoever asks.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            code: "forbidden",
            message: message.into(),
        }
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            code: "not_found",
            message: message.into(),
        }
    }

    /// 502: a service inside a sandbox did not answer like an HTTP server (port proxy).
    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_GATEWAY,
            code: "bad_gateway",
            message: message.into(),
        }
    }

    /// 413: a request body over the limit of its route.
    pub fn payload_too_large(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code: "payload_too_large",
            message: message.into(),
        }
    }

    /// 422.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "invalid_argument",
            message: message.into(),
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

/// Status and code of a core error, by its variant (and its cause's, where the cause decides).
fn core_status(e: &CoreError) -> (StatusCode, &'static str) {
    const INVALID: (StatusCode, &str) = (StatusCode::UNPROCESSABLE_ENTITY, "invalid_argument");
    const NOT_SUPPORTED: (StatusCode, &str) = (StatusCode::UNPROCESSABLE_ENTITY, "not_supported");
    const CONFLICT: (StatusCode, &str) = (StatusCode::CONFLICT, "conflict");
    const QUOTA: (StatusCode, &str) = (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded");
    const SANDBOX_FAILED: (StatusCode, &str) = (StatusCode::CONFLICT, "sandbox_failed");
    const INTERNAL: (StatusCode, &str) = (StatusCode::INTERNAL_SERVER_ERROR, "internal");
    match e {
        CoreError::InvalidArgument(_) => INVALID,
        CoreError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
        CoreError::Conflict(_) | CoreError::WrongState { .. } => CONFLICT,
        CoreError::NotSupported { .. } | CoreError::VmUnavailable(_) => NOT_SUPPORTED,
        CoreError::Quota(_) => QUOTA,
        CoreError::TooManyExecs(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_execs"),
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
        | CoreError::SandboxFailed(_) => SANDBOX_FAILED,
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
        | CoreError::Internal(_) => INTERNAL,
    }
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
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(serde_json::json!({"error": {"code": self.code, "message": self.message}})),
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
        vec![
            (
                CoreError::InvalidArgument("ttl".into()),
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_argument",
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
