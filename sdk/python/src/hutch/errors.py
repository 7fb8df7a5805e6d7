"""Exceptions raised by the SDK. Every one derives from :class:`HutchError`."""

from __future__ import annotations

import builtins
import json
from typing import Any, Dict, Optional, Type


class HutchError(Exception):
    """Base class of every error raised by this SDK.

    Attributes:
        message: Human-readable explanation (the server's ``error.message`` when there is one).
        status: HTTP status of the answer, or ``None`` when the error did not come from one.
        code: The server's machine-readable ``error.code`` (e.g. ``"not_found"``), if any.
    """

    def __init__(
        self, message: str, *, status: Optional[int] = None, code: Optional[str] = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code

    def __str__(self) -> str:
        parts = []
        if self.status is not None:
            parts.append(str(self.status))
        if self.code:
            parts.append(self.code)
        prefix = f"[{' '.join(parts)}] " if parts else ""
        return f"{prefix}{self.message}"


class AuthError(HutchError):
    """401: the API key is missing or wrong."""


class PermissionDenied(HutchError):
    """403: the sandbox's filesystem refused the operation, or the key may not do this
    (code ``forbidden``, see :class:`Forbidden`)."""


class Forbidden(PermissionDenied):
    """403 ``forbidden``: the API key's scope does not allow this call (a ``read-only`` key's
    exec, an ``exec`` key's delete), a template its tenant may not use, or a key wider than
    the one making it."""


class NotFoundError(HutchError):
    """404: something does not exist (a sandbox, a file, or a route this server lacks)."""


class SandboxNotFound(NotFoundError):
    """404: no such sandbox (never existed, killed, expired, or another tenant's)."""


class FileNotFound(NotFoundError):
    """404: no such file or directory inside the sandbox."""


class ProcessNotFound(NotFoundError):
    """404: no process handle of that pid or tag in the sandbox (or it exited too long ago)."""


class Unsupported(NotFoundError):
    """404 for a route this server does not have (a feature that has not landed yet)."""


class InvalidRequest(HutchError):
    """400 or 422: malformed input, or a valid value the server does not accept.

    A 422 is also how the server refuses features it does not support (yet), for example
    ``fork(mode="live")`` on an ``ns`` sandbox (live forks need the ``vm`` backend), or a
    network policy on a server started with ``--network off``.
    """


class ConflictError(HutchError):
    """409: wrong state.

    For example: exec or file calls on a paused sandbox (resume it first), resume of a
    sandbox that is not paused, deleting a snapshot that sandboxes still use, a sandbox that
    has failed, or a directory that is not empty.
    """


class SandboxFailed(ConflictError):
    """The sandbox died or could not start (``sandbox_failed``)."""


class ProcessExited(ConflictError):
    """409 ``process_exited``: the process handle has exited; it takes no more input,
    signals or resizes."""


class TagInUse(ConflictError):
    """409 ``tag_in_use``: a running process handle of the sandbox already has this tag."""


class QuotaExceeded(HutchError):
    """429: a quota or limit was reached.

    For a tenant's quota (``docs/teams.md``) the server names it: :attr:`quota`
    (``"max_sandboxes"``, …), its :attr:`limit`, what was :attr:`used` before the call, and
    whose (:attr:`tenant`); all ``None`` for other limits.
    """

    quota: Optional[str] = None
    limit: Optional[float] = None
    used: Optional[float] = None
    tenant: Optional[str] = None


class ServerError(HutchError):
    """5xx: a bug or an unexpected failure on the server."""


class TimeoutError(HutchError, builtins.TimeoutError):  # noqa: A001 - part of the public API
    """A request or a read took longer than allowed (client side).

    Also an instance of the built-in :class:`TimeoutError`. A *command* that hits its own
    ``timeout`` is not an error: :attr:`ExecResult.timed_out` is set instead.
    """


class ConnectionError(HutchError):  # noqa: A001 - part of the public API
    """The server could not be reached."""


class PortUnreachable(HutchError):
    """502 from the port proxy: nothing listens on the port inside the sandbox
    (``connection_refused``), or what listens there did not answer with HTTP
    (``bad_gateway``)."""


class BuildFailed(HutchError):
    """A template build ended without a template: a step failed, or it was cancelled.

    Attributes:
        build: The build as it ended (:class:`~hutch.BuildInfo`), its ``error`` the reason.
    """

    def __init__(self, message: str, *, build: Any = None) -> None:
        super().__init__(message, code=getattr(build, "status", None))
        self.build = build


class ContextNotFound(NotFoundError):
    """404: no such code context in the sandbox."""


class NoInterpreter(InvalidRequest):
    """422 ``no_interpreter``: the sandbox's template cannot run code contexts; create the
    sandbox from the ``code-interpreter`` template."""


class InterpreterFailed(ServerError):
    """502 ``interpreter_failed``: the code interpreter inside the sandbox failed."""


_BY_CODE: Dict[str, Type[HutchError]] = {
    "sandbox_failed": SandboxFailed,
    "process_exited": ProcessExited,
    "tag_in_use": TagInUse,
    "no_interpreter": NoInterpreter,
    "interpreter_failed": InterpreterFailed,
    "connection_refused": PortUnreachable,
    "bad_gateway": PortUnreachable,
    "forbidden": Forbidden,
}


def _class_for(status: int, code: Optional[str], message: str, kind: str) -> Type[HutchError]:
    if code and code in _BY_CODE:
        return _BY_CODE[code]
    if status == 401:
        return AuthError
    if status == 403:
        return PermissionDenied
    if status == 404:
        if message.startswith("sandbox "):
            return SandboxNotFound
        if message.startswith("context "):
            return ContextNotFound
        if message.startswith("no process "):
            return ProcessNotFound
        if message.startswith("no such route"):
            return Unsupported
        if kind == "files":
            return FileNotFound
        return NotFoundError
    if status in (400, 422):
        return InvalidRequest
    if status == 409:
        return ConflictError
    if status == 429:
        return QuotaExceeded
    if status >= 500:
        return ServerError
    return HutchError


def from_response(status: int, body: bytes, *, kind: str = "") -> HutchError:
    """Build the exception for a non-2xx answer.

    ``kind`` says what the request was about: ``"files"`` when a 404 that is not about the
    sandbox itself means a missing file, else ``""``.
    """
    code: Optional[str] = None
    message = ""
    err: Any = None
    try:
        doc: Any = json.loads(body.decode("utf-8"))
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            c, m = err.get("code"), err.get("message")
            code = c if isinstance(c, str) else None
            message = m if isinstance(m, str) else ""
    except (ValueError, UnicodeDecodeError):
        pass
    if not message:
        text = body.decode("utf-8", "replace").strip()
        message = text[:500] if text else f"HTTP {status}"
    cls = _class_for(status, code, message, kind)
    e = cls(message, status=status, code=code)
    if isinstance(e, QuotaExceeded) and isinstance(err, dict):
        e.quota = err.get("quota") if isinstance(err.get("quota"), str) else None
        e.limit = err.get("limit") if isinstance(err.get("limit"), (int, float)) else None
        e.used = err.get("used") if isinstance(err.get("used"), (int, float)) else None
        e.tenant = err.get("tenant") if isinstance(err.get("tenant"), str) else None
    return e


def from_event(payload: Dict[str, Any]) -> HutchError:
    """Build the exception for an ``error`` event ending an exec stream."""
    code = payload.get("code") if isinstance(payload.get("code"), str) else None
    message = str(payload.get("message") or "the command could not be run to completion")
    cls = _BY_CODE.get(code or "", HutchError)
    return cls(message, code=code)
