"""What the sync and async clients share beyond single calls (those are in
:mod:`hutch._ops`): configuration, request building and error mapping, a sandbox's local
state, and the bookkeeping of a streamed exec. Nothing here does I/O; :mod:`hutch.sandbox`
and :mod:`hutch.aio` do it around these. (Events, files and terminals: :mod:`hutch._events`,
:mod:`hutch._files`, :mod:`hutch._pty`.)"""

from __future__ import annotations

import os
from typing import (
    Any,
    Callable,
    Dict,
    Generic,
    List,
    Optional,
    Tuple,
    TypeVar,
    Union,
)

import httpx

from . import _protocol as p
from . import errors
from ._config import Config, resolve
from ._version import USER_AGENT
from .models import SandboxInfo

PathLike = Union[str, "os.PathLike[str]"]


class ClientBase:
    """Configuration, request building and error mapping of :class:`hutch.Client` and
    :class:`hutch.AsyncClient`; they add the sending."""

    config: Config
    _http: Union[httpx.Client, httpx.AsyncClient]

    def _setup(
        self,
        url: Optional[str],
        api_key: Optional[str],
        timeout: float,
        state_dir: Optional[PathLike],
        tenant: Optional[str] = None,
    ) -> Dict[str, Any]:
        """Resolve the configuration; returns the keyword arguments for the httpx client."""
        self.config = resolve(url, api_key, state_dir)
        headers = {"User-Agent": USER_AGENT}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        tenant = tenant if tenant is not None else os.environ.get("HUTCH_TENANT") or None
        if tenant:
            headers["X-Hutch-Tenant"] = tenant
        self._timeout = timeout
        self._implicit = False
        self._refs = 0
        self._closed = False
        args: Dict[str, Any] = {
            "base_url": self.config.url,
            "headers": headers,
            "timeout": httpx.Timeout(timeout, connect=10.0),
        }
        # A plain-HTTP server needs no TLS: without this httpx loads the CA bundle for every
        # client it makes (~20-90 ms), which a `Sandbox.create()` without a shared client
        # paid on every call. Redirects are not followed, so no request can reach TLS.
        if self.config.url.startswith("http://"):
            args["verify"] = False
        return args

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self.config.url

    def _retain(self) -> None:
        self._refs += 1

    def _build(self, req: p.Request) -> httpx.Request:
        timeout: Any = (
            httpx.USE_CLIENT_DEFAULT
            if req.timeout is p._UNSET
            else httpx.Timeout(self._timeout, connect=10.0, read=req.timeout)
        )
        return self._http.build_request(
            req.method,
            req.path,
            params=tuple(req.params) if req.params is not None else None,
            json=req.json,
            content=req.content,
            timeout=timeout,
            headers=p.drop_none(
                {"accept": req.accept, "content-type": req.content_type, **(req.headers or {})}
            )
            or None,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise errors.HutchError("this client is closed")

    def _http_error(self, status: int, body: bytes, req: p.Request) -> errors.HutchError:
        return p.auth_hint(errors.from_response(status, body, kind=req.kind), self.config)

    def _transport_error(self, e: Exception) -> errors.HutchError:
        if isinstance(e, httpx.TimeoutException):
            return errors.TimeoutError(f"request to {self.url} timed out: {e}")
        return errors.ConnectionError(f"cannot reach the Hutch server at {self.url}: {e}")


C = TypeVar("C", bound=ClientBase)


class SandboxBase(Generic[C]):
    """A sandbox's local state, shared by :class:`hutch.Sandbox` and
    :class:`hutch.AsyncSandbox`."""

    _name = "Sandbox"
    """The class name in ``repr`` (subclasses of the public classes keep it)."""

    def __init__(self, info: SandboxInfo, client: C) -> None:
        self._info = info
        self._client = client
        self._released = False
        client._retain()

    @property
    def id(self) -> str:
        """The sandbox id, ``sbx_…``."""
        return self._info.id

    @property
    def info(self) -> SandboxInfo:
        """The sandbox as last seen (see :meth:`refresh`)."""
        return self._info

    @property
    def state(self) -> str:
        """The state as last seen (see :meth:`refresh`)."""
        return self._info.state

    @property
    def client(self) -> C:
        """The client this sandbox talks through."""
        return self._client

    def __repr__(self) -> str:
        return (
            f"{self._name}(id={self.id!r}, template={self._info.template!r}, state={self.state!r})"
        )

    def _set(self, info: SandboxInfo) -> SandboxInfo:
        self._info = info
        return info

    def port_url(self, port: int, path: str = "/") -> str:
        """The URL at which the server proxies HTTP and WebSocket to ``port`` inside the sandbox.

        The service only needs to listen inside the sandbox (on 127.0.0.1, ::1 or any
        address); the server reaches it through the sandbox's agent. Requests to the URL
        need the API key in the ``Authorization`` header, like every call (see
        :meth:`port_request`); the key is never accepted in a URL. For a browser, ask
        :meth:`browser_url` for a short-lived signed link instead.

        Args:
            port: TCP port inside the sandbox (1-65535).
            path: Path (and query) below the port, default ``/``.
        """
        return p.port_url(self._client.url, self.id, port, path)

    def _pty_connect(
        self,
        cmd: Optional[str],
        cols: int,
        rows: int,
        user: Optional[str],
        cwd: Optional[str],
        open_timeout: float,
    ) -> Tuple[str, Dict[str, Any]]:
        """The URL and the ``websockets`` ``connect`` arguments of a terminal session."""
        url = p.pty_url(
            self._client.url, self.id, cmd=cmd, cols=cols, rows=rows, user=user, cwd=cwd
        )
        return url, {
            "additional_headers": p.ws_headers(self._client.config.api_key),
            "open_timeout": open_timeout,
            "max_size": 16 * 1024 * 1024,
            "user_agent_header": USER_AGENT,
        }


class ExecStreamRun:
    """Turns the lines of ``/exec/stream`` into the callback calls to make and an exit code."""

    def __init__(
        self,
        on_stdout: Optional[Callable[[str], Any]],
        on_stderr: Optional[Callable[[str], Any]],
        on_start: Optional[Callable[[int], Any]],
    ) -> None:
        self._sse = p.SSEParser()
        self._state = p.ExecStreamState()
        self._callbacks: Dict[str, Optional[Callable[[Any], Any]]] = {
            "stdout": on_stdout,
            "stderr": on_stderr,
            "start": on_start,
        }
        self.exit_code: Optional[int] = None
        """Set once the ``exit`` event has arrived: the stream is over."""

    def feed(self, line: str) -> List[Tuple[Callable[[Any], Any], Any]]:
        """Feed one line; returns the ``(callback, value)`` calls to make, in order.

        Raises :class:`~hutch.errors.HutchError` on an ``error`` event.
        """
        ev = self._sse.feed(line)
        if ev is None:
            return []
        calls: List[Tuple[Callable[[Any], Any], Any]] = []
        for kind, value in self._state.handle(*ev):
            if kind == "exit":
                self.exit_code = int(value.get("exit_code", -1))
                break
            cb = self._callbacks.get(kind)
            if cb is not None:
                calls.append((cb, value))
        return calls

    @staticmethod
    def ended() -> errors.HutchError:
        """The error for a stream that ended before its ``exit`` event."""
        return errors.HutchError("the exec stream ended without an exit event")
