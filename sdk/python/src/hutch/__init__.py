"""Python client for Hutch, a self-hosted sandbox runtime for AI agents.

    from hutch import Sandbox

    with Sandbox.create() as sb:
        result = sb.exec(["echo", "hello"])
        print(result.stdout)

Configuration comes from ``HUTCH_URL`` (default ``http://127.0.0.1:7700``) and
``HUTCH_API_KEY`` (default: the server's ``<state dir>/admin.key``). :mod:`hutch.aio` has the
asyncio flavour (:class:`AsyncSandbox`), also exported here.
"""

from ._config import DEFAULT_URL, Config, default_state_dir, resolve
from ._version import __version__
from ._events import AsyncLogStream, LogStream
from ._templates import AsyncBuild, AsyncTemplates, Build, Templates
from .aio import AsyncClient, AsyncEventStream, AsyncFiles, AsyncPtySession, AsyncSandbox
from ._code import CodeContext, Execution, ExecutionError, Logs, Result
from ._process import AsyncProcess, AsyncProcesses, Process, ProcessEvent, Processes
from .errors import (
    AuthError,
    BuildFailed,
    ConflictError,
    ConnectionError,
    ContextNotFound,
    FileNotFound,
    Forbidden,
    HutchError,
    InterpreterFailed,
    InvalidRequest,
    NoInterpreter,
    NotFoundError,
    PermissionDenied,
    PortUnreachable,
    ProcessExited,
    ProcessNotFound,
    QuotaExceeded,
    SandboxFailed,
    SandboxNotFound,
    ServerError,
    TagInUse,
    TimeoutError,
    Unsupported,
)
from .models import (
    BuildInfo,
    BuildLogLine,
    BuildProgress,
    BuildStep,
    ExecResult,
    ExploreOutcome,
    ExploreResult,
    FileEntry,
    FileEvent,
    LifecycleEvent,
    LogLine,
    ProcessExit,
    ProcessInfo,
    SandboxInfo,
    Snapshot,
    Template,
    Usage,
    Volume,
    VolumeAttachment,
    VolumeMount,
)
from ._tenants import ApiKey, AuditEntry, Tenant, UsageReport, UsageTotals
from ._watch import AsyncFileWatch, FileWatch
from .sandbox import Client, EventStream, Files, PtySession, Sandbox

__all__ = [
    "__version__",
    "DEFAULT_URL",
    "Config",
    "default_state_dir",
    "resolve",
    "Client",
    "Sandbox",
    "Files",
    "PtySession",
    "EventStream",
    "LogStream",
    "AsyncClient",
    "AsyncSandbox",
    "AsyncFiles",
    "AsyncPtySession",
    "AsyncEventStream",
    "AsyncLogStream",
    "Templates",
    "AsyncTemplates",
    "Build",
    "AsyncBuild",
    "Tenant",
    "ApiKey",
    "AuditEntry",
    "UsageReport",
    "UsageTotals",
    "BuildInfo",
    "BuildStep",
    "BuildLogLine",
    "BuildProgress",
    "BuildFailed",
    "ExecResult",
    "Process",
    "AsyncProcess",
    "Processes",
    "AsyncProcesses",
    "ProcessEvent",
    "ProcessInfo",
    "ProcessExit",
    "Execution",
    "ExecutionError",
    "Logs",
    "Result",
    "CodeContext",
    "ExploreOutcome",
    "ExploreResult",
    "FileEntry",
    "FileEvent",
    "FileWatch",
    "AsyncFileWatch",
    "LifecycleEvent",
    "LogLine",
    "SandboxInfo",
    "Snapshot",
    "Template",
    "Usage",
    "Volume",
    "VolumeAttachment",
    "VolumeMount",
    "HutchError",
    "AuthError",
    "PermissionDenied",
    "NotFoundError",
    "SandboxNotFound",
    "FileNotFound",
    "Forbidden",
    "ContextNotFound",
    "NoInterpreter",
    "InterpreterFailed",
    "Unsupported",
    "InvalidRequest",
    "ConflictError",
    "ProcessExited",
    "ProcessNotFound",
    "TagInUse",
    "SandboxFailed",
    "PortUnreachable",
    "QuotaExceeded",
    "ServerError",
    "TimeoutError",
    "ConnectionError",
]
