"""What the sync and async clients share: request shapes, SSE parsing, stream decoding."""

from __future__ import annotations

import base64
import codecs
import datetime
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote, urlencode

from . import errors
from ._config import Config
from .models import SandboxInfo, VolumeMount

Command = Union[str, Sequence[str]]
"""A command: a string runs under ``/bin/sh -c``; a list runs that program without a shell."""

_UNSET: Any = object()

VolumeSpec = Union[Mapping[str, Any], VolumeMount]
"""A volume to mount on create: ``{"volume": "vol_… or name", "path": "/data",
"read_only": False}`` or a :class:`~hutch.VolumeMount`."""


@dataclass
class Request:
    """One HTTP request, independent of the transport."""

    method: str
    path: str
    params: Optional[List[Tuple[str, str]]] = None
    json: Any = None
    content: Any = None
    """The raw body: bytes, or an (async) iterator of bytes for a streamed upload."""
    content_type: Optional[str] = None
    """The ``Content-Type`` of a raw body."""
    timeout: Any = _UNSET
    """Read timeout in seconds; ``None`` waits forever; unset uses the client's default."""
    kind: str = ""
    """Error-mapping hint, see :func:`hutch.errors.from_response`."""
    accept: Optional[str] = None
    """The ``Accept`` header, for routes that answer in several formats."""
    headers: Optional[Dict[str, str]] = None
    """Further headers (a file's ``X-Hutch-Meta-*`` metadata)."""


def sandbox_path(sandbox_id: str, suffix: str = "") -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}{suffix}"


def template_path(name: str, suffix: str = "") -> str:
    return f"/v1/templates/{quote(name, safe='')}{suffix}"


def build_path(name: str, build_id: str, suffix: str = "") -> str:
    return template_path(name, f"/builds/{quote(build_id, safe='')}{suffix}")


def build_params(
    name: str,
    dockerfile: str,
    build_args: Optional[Mapping[str, Any]],
    target: Optional[str],
    no_cache: bool,
    insecure_registries: Optional[Sequence[str]] = None,
) -> List[Tuple[str, str]]:
    """The query of ``POST /v1/templates`` with a build context."""
    params = [("name", name), ("dockerfile", dockerfile)]
    if target is not None:
        params.append(("target", target))
    if no_cache:
        params.append(("no_cache", "true"))
    for key, value in (build_args or {}).items():
        if not key or "=" in key:
            raise errors.InvalidRequest(
                f"build arg names must be non-empty without '=', got {key!r}"
            )
        params.append(("build_arg", f"{key}={value}"))
    params.extend(("insecure_registry", host) for host in registry_hosts(insecure_registries))
    return params


def registry_credentials(auth: Optional[str]) -> Optional[str]:
    """``USER:PASSWORD`` for a registry, checked (the password may contain ``:``)."""
    if auth is not None and (not isinstance(auth, str) or ":" not in auth):
        raise errors.InvalidRequest("registry credentials are USER:PASSWORD")
    return auth


def registry_hosts(hosts: Optional[Sequence[str]]) -> List[str]:
    """Registries to speak plain HTTP to (``host`` or ``host:port``); a lone string is one."""
    if hosts is None:
        return []
    listed = [hosts] if isinstance(hosts, str) else list(hosts)
    for host in listed:
        if not isinstance(host, str) or not host or "/" in host:
            raise errors.InvalidRequest(
                f"an insecure registry is a host or host:port, got {host!r}"
            )
    return listed


def drop_none(d: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def create_body(
    *,
    template: Optional[str],
    isolation: Optional[str],
    ttl_seconds: Optional[int],
    persistent: Optional[bool],
    metadata: Optional[Mapping[str, str]],
    env: Optional[Mapping[str, str]],
    cpus: Optional[float],
    memory_mib: Optional[int],
    disk_mib: Optional[int],
    pids_max: Optional[int],
    network: Optional[Mapping[str, Any]],
    volumes: Optional[Sequence[VolumeSpec]],
    snapshot: Optional[str],
    idle_hibernate_seconds: Optional[int] = None,
) -> Dict[str, Any]:
    return drop_none(
        {
            "template": template,
            "isolation": isolation,
            "ttl_seconds": ttl_seconds,
            "persistent": persistent,
            "metadata": dict(metadata) if metadata is not None else None,
            "env": dict(env) if env is not None else None,
            "cpus": cpus,
            "memory_mib": memory_mib,
            "disk_mib": disk_mib,
            "pids_max": pids_max,
            "network": dict(network) if network is not None else None,
            "volumes": [volume_json(v) for v in volumes] if volumes is not None else None,
            "snapshot": snapshot,
            "idle_hibernate_seconds": idle_hibernate_seconds,
        }
    )


def volume_json(v: VolumeSpec) -> Dict[str, Any]:
    return v.to_json() if isinstance(v, VolumeMount) else dict(v)


def command_json(cmd: Command) -> Union[str, List[str]]:
    """A command as the API takes it: a string for ``/bin/sh -c``, else a list of str."""
    if isinstance(cmd, (bytes, bytearray)):
        raise TypeError("a command must be a str (shell command line) or a sequence of str (argv)")
    return cmd if isinstance(cmd, str) else [str(a) for a in cmd]


def fork_body(count: int, mode: str) -> Dict[str, Any]:
    return {"count": count, "mode": mode}


def explore_body(
    commands: Sequence[Command],
    *,
    timeout: Optional[float],
    keep: str,
    score_regex: Optional[str],
) -> Dict[str, Any]:
    if isinstance(commands, (str, bytes, bytearray)):
        raise TypeError("commands must be a sequence of commands, not a single string")
    return drop_none(
        {
            "commands": [command_json(c) for c in commands],
            "timeout_seconds": timeout,
            "keep": keep,
            "score_regex": score_regex,
        }
    )


def explore_read_timeout(timeout: Optional[float]) -> Optional[float]:
    """How long to wait for an explore answer: the commands run in parallel, so their
    timeout plus slack for forking and cleaning up. ``None`` (the server's default, 60 s)
    waits forever: the server always answers once every command has ended or been killed."""
    if timeout is None:
        return None
    return float(timeout) + 60.0


def snapshot_path(snapshot_id: str) -> str:
    return f"/v1/snapshots/{quote(snapshot_id, safe='')}"


def volume_path(volume: str) -> str:
    return f"/v1/volumes/{quote(volume, safe='')}"


def list_params(
    metadata: Optional[Mapping[str, str]], state: Optional[str]
) -> List[Tuple[str, str]]:
    params: List[Tuple[str, str]] = []
    if state is not None:
        params.append(("state", state))
    for k, v in (metadata or {}).items():
        params.append((f"metadata.{k}", str(v)))
    return params


LogSince = Union[str, float, int, datetime.datetime]
"""A time for ``since``: RFC 3339 text, a duration before now (``"10m"``), Unix seconds, or
a ``datetime`` (a naive one is taken as UTC)."""


def log_params(
    *,
    tail: Optional[int],
    since: Optional[LogSince],
    source: Union[str, Sequence[str], None],
    follow: bool,
) -> List[Tuple[str, str]]:
    """The query of ``GET /v1/sandboxes/{id}/logs``."""
    params: List[Tuple[str, str]] = []
    if source is not None:
        params.append(("source", source if isinstance(source, str) else ",".join(source)))
    if tail is not None:
        if isinstance(tail, bool) or not isinstance(tail, int) or tail < 0:
            raise ValueError(f"tail must be a whole number of lines >= 0, got {tail!r}")
        params.append(("tail", str(tail)))
    if since is not None:
        params.append(("since", since_text(since)))
    if follow:
        params.append(("follow", "true"))
    return params


def since_text(since: LogSince) -> str:
    """``since`` as the server reads it."""
    if isinstance(since, datetime.datetime):
        if since.tzinfo is None:
            since = since.replace(tzinfo=datetime.timezone.utc)
        return since.isoformat()
    if isinstance(since, bool):
        raise ValueError("since must be a time, a duration or Unix seconds, not a bool")
    if isinstance(since, (int, float)):
        return repr(float(since)) if isinstance(since, float) else str(since)
    return str(since)


def parse_sandboxes(doc: Any) -> List[SandboxInfo]:
    return [SandboxInfo.from_json(s) for s in (doc or {}).get("sandboxes", [])]


def exec_body(
    cmd: Command,
    *,
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    stdin: Union[str, bytes, None],
    timeout: Optional[float],
    user: Optional[str],
) -> Dict[str, Any]:
    if isinstance(cmd, (bytes, bytearray)):
        raise TypeError("cmd must be a str (shell command line) or a sequence of str (argv)")
    body: Dict[str, Any] = {"cmd": command_json(cmd)}
    if env is not None:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if cwd is not None:
        body["cwd"] = cwd
    if user is not None:
        body["user"] = user
    if isinstance(stdin, str):
        body["stdin"] = stdin
    elif stdin is not None:
        body["stdin_b64"] = base64.b64encode(bytes(stdin)).decode("ascii")
    if timeout is not None:
        body["timeout_seconds"] = timeout
    return body


def exec_read_timeout(timeout: Optional[float]) -> Optional[float]:
    """How long to wait for a collected exec's answer: the command's timeout plus slack.

    ``None`` (the server's default, 60 s unless configured otherwise) and ``0`` (no limit)
    wait forever: the server always answers once the command ends.
    """
    if not timeout:
        return None
    return float(timeout) + 30.0


def file_params(path: str, **extra: Any) -> List[Tuple[str, str]]:
    params = [("path", path)]
    for k, v in extra.items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        params.append((k, str(v)))
    return params


def mode_text(mode: Union[int, str, None]) -> Optional[str]:
    """``0o644`` or ``"0644"`` → ``"0644"``."""
    if mode is None:
        return None
    if isinstance(mode, int):
        return format(mode, "04o")
    return str(mode)


def pty_url(
    base_url: str,
    sandbox_id: str,
    *,
    cmd: Optional[str],
    cols: int,
    rows: int,
    user: Optional[str],
    cwd: Optional[str],
) -> str:
    if base_url.startswith("https://"):
        ws_base = "wss://" + base_url[len("https://") :]
    elif base_url.startswith("http://"):
        ws_base = "ws://" + base_url[len("http://") :]
    else:
        ws_base = base_url
    query = drop_none({"cols": cols, "rows": rows, "cmd": cmd, "user": user, "cwd": cwd})
    return f"{ws_base}{sandbox_path(sandbox_id, '/pty')}?{urlencode(query)}"


def check_port(port: int) -> int:
    """``port`` if it is a port number (1-65535), else ``ValueError``."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port must be an integer from 1 to 65535, got {port!r}")
    return port


def port_path(sandbox_id: str, port: int, path: str = "/") -> str:
    """``/v1/sandboxes/{id}/ports/{port}/{path}``: the port proxy (``path`` is passed as is,
    query included; a missing leading ``/`` is added)."""
    check_port(port)
    if not path.startswith("/"):
        path = "/" + path
    return sandbox_path(sandbox_id, f"/ports/{port}{path}")


def port_url(base_url: str, sandbox_id: str, port: int, path: str = "/") -> str:
    """The full proxy URL on the API origin (requests need the ``Authorization`` header)."""
    return base_url + port_path(sandbox_id, port, path)


def link_with_path(link: str, path: str = "/") -> str:
    """The server's browser link (``…/?hutch_token=…``, at the port's root) moved to
    ``path`` (query included) below the same root, the token kept last."""
    root, _, token = link.partition("?hutch_token=")
    if not path.startswith("/"):
        path = "/" + path
    url = root.rstrip("/") + path
    return url + ("&" if "?" in path else "?") + urlencode({"hutch_token": token})


PROXY_VIA = "1.1 hutch"
"""What the port proxy adds to ``Via`` on the service's answers (Hutch's own errors lack it)."""


def raise_for_proxy(status: int, headers: Mapping[str, str], body: bytes, config: Config) -> None:
    """Raise Hutch's own errors on the port proxy; the service's answers, whatever their
    status, are marked ``Via: 1.1 hutch`` and pass."""
    if status < 400 or PROXY_VIA in (headers.get("via") or ""):
        return
    raise auth_hint(errors.from_response(status, body), config)


def ws_headers(api_key: Optional[str]) -> Dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def to_bytes(data: Union[str, bytes, bytearray, memoryview]) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    return bytes(data)


class SSEParser:
    """Incremental parser of ``text/event-stream`` lines into ``(event, data)`` pairs."""

    def __init__(self) -> None:
        self._event = ""
        self._data: List[str] = []

    def feed(self, line: str) -> Optional[Tuple[str, str]]:
        """Feed one line (without its newline); returns an event when a blank line ends one."""
        if line == "":
            if not self._data and not self._event:
                return None
            out = (self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


class ExecStreamState:
    """Turns the events of ``/exec/stream`` into callback calls and a final exit code.

    Output chunks are decoded incrementally as UTF-8 (a character split across two chunks
    is delivered whole; invalid bytes become U+FFFD), so callbacks always receive ``str``.
    """

    def __init__(self) -> None:
        self._decoders = {
            "stdout": codecs.getincrementaldecoder("utf-8")("replace"),
            "stderr": codecs.getincrementaldecoder("utf-8")("replace"),
        }
        self.pid: Optional[int] = None
        self.exit: Optional[Dict[str, Any]] = None

    def handle(self, event: str, data: str) -> List[Tuple[str, Any]]:
        """Process one event; returns ``(kind, value)`` actions for the caller to dispatch.

        Kinds: ``"start"`` (pid), ``"stdout"`` / ``"stderr"`` (text), ``"exit"`` (payload).
        Raises :class:`~hutch.errors.HutchError` on an ``error`` event.
        """
        try:
            payload = json.loads(data) if data else {}
        except ValueError:
            payload = {}
        if event == "start":
            self.pid = payload.get("pid")
            return [("start", self.pid)]
        if event in ("stdout", "stderr"):
            if isinstance(payload.get("data"), str):
                raw = payload["data"].encode("utf-8")
            elif isinstance(payload.get("data_b64"), str):
                raw = base64.b64decode(payload["data_b64"])
            else:
                return []
            text = self._decoders[event].decode(raw)
            return [(event, text)] if text else []
        if event == "exit":
            actions: List[Tuple[str, Any]] = []
            for name, dec in self._decoders.items():
                tail = dec.decode(b"", final=True)
                if tail:
                    actions.append((name, tail))
            self.exit = payload
            actions.append(("exit", payload))
            return actions
        if event == "error":
            raise errors.from_event(payload)
        return []


OutputCallback = Callable[[str], Any]


def auth_hint(err: errors.HutchError, config: Config) -> errors.HutchError:
    if isinstance(err, errors.AuthError):
        err.message = f"{err.message} (API key from {config.key_source})"
    return err


def ws_error(e: Exception, config: Config) -> errors.HutchError:
    """Map a failed WebSocket handshake to the same exceptions as HTTP calls."""
    response = getattr(e, "response", None)
    status = getattr(response, "status_code", None) or getattr(e, "status_code", None)
    if status is not None:
        body = getattr(response, "body", b"") or b""
        return auth_hint(errors.from_response(int(status), bytes(body)), config)
    if isinstance(e, (TimeoutError, errors.TimeoutError)):
        return errors.TimeoutError(f"opening the terminal timed out: {e}")
    if isinstance(e, OSError):
        return errors.ConnectionError(f"cannot reach the Hutch server at {config.url}: {e}")
    return errors.HutchError(f"could not open the terminal: {e}")
