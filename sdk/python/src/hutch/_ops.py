"""Every API operation, once: the request it sends and how its answer is parsed.

Each function returns a :class:`Call` (or, for the streamed calls, a bare
:class:`~hutch._protocol.Request`) and does no I/O: :class:`hutch.Client` sends
``call.request`` with its ``httpx.Client`` and :class:`hutch.AsyncClient` awaits it with its
``httpx.AsyncClient``, and both hand the response to ``call.parse``. Arguments are checked
when the call is built (here, or by the :mod:`hutch._protocol` body builders whose result a
call takes), so both clients refuse the same arguments alike before sending anything.
"""

from __future__ import annotations

import base64

from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    Dict,
    Generic,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

import httpx

from ._protocol import (
    Command,
    Request,
    build_params,
    build_path,
    check_port,
    drop_none,
    exec_read_timeout,
    explore_body,
    explore_read_timeout,
    file_params,
    fork_body,
    LogSince,
    link_with_path,
    list_params,
    log_params,
    mode_text,
    parse_sandboxes,
    registry_credentials,
    sandbox_path,
    snapshot_path,
    template_path,
    to_bytes,
    volume_path,
)
from .models import (
    BuildInfo,
    BuildLogLine,
    ExecResult,
    ExploreResult,
    FileEntry,
    LogLine,
    SandboxInfo,
    Snapshot,
    Template,
    Usage,
    Volume,
)

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API operation: the request to send and what to make of its (2xx) response."""

    request: Request
    parse: Callable[[httpx.Response], T]


#: Records asked for per page when a listing follows the server's cursors.
PAGE_LIMIT = 500


@dataclass(frozen=True)
class Listing(Generic[T]):
    """A paginated listing (``GET /v1/sandboxes``, ``/v1/snapshots``, ``/v1/volumes``): the
    request of each page, and what a page holds. The clients follow ``next_cursor`` until the
    server gives none, so a listing returns every record."""

    path: str
    key: str
    model: Callable[[Dict[str, Any]], T]
    params: Tuple[Tuple[str, str], ...] = ()

    def page(self, cursor: Optional[str]) -> Request:
        """The request of the page after ``cursor`` (``None``: the first)."""
        params = list(self.params) + [("limit", str(PAGE_LIMIT))]
        if cursor:
            params.append(("cursor", cursor))
        return Request("GET", self.path, params=params)

    def parse(self, resp: httpx.Response) -> Tuple[List[T], Optional[str]]:
        """A page's records and the cursor of the next page (``None``: it was the last)."""
        doc = resp.json() or {}
        items = [self.model(item) for item in doc.get(self.key, [])]
        cursor = doc.get("next_cursor")
        return items, cursor if isinstance(cursor, str) and cursor else None


def _nothing(resp: httpx.Response) -> None:
    return None


def _content(resp: httpx.Response) -> bytes:
    return resp.content


def _one(model: Callable[[Dict[str, Any]], T]) -> Callable[[httpx.Response], T]:
    """The JSON answer as one ``model``."""
    return lambda resp: model(resp.json())


def _listed(key: str, model: Callable[[Dict[str, Any]], T]) -> Callable[[httpx.Response], List[T]]:
    """The JSON answer's ``key`` list, each item as a ``model``."""
    return lambda resp: [model(item) for item in resp.json().get(key, [])]


# -- server-wide -----------------------------------------------------------------------------


def health() -> Call[Dict[str, Any]]:
    return Call(Request("GET", "/healthz"), lambda resp: dict(resp.json()))


def templates() -> Call[List[Template]]:
    return Call(Request("GET", "/v1/templates"), _listed("templates", Template.from_json))


def get_template(name: str) -> Call[Template]:
    return Call(Request("GET", template_path(name)), _one(Template.from_json))


def delete_template(name: str) -> Call[None]:
    return Call(Request("DELETE", template_path(name), timeout=None), _nothing)


def build_template(
    name: str,
    content: Any,
    *,
    dockerfile: str,
    build_args: Optional[Mapping[str, Any]],
    target: Optional[str],
    no_cache: bool,
    registry_auth: Optional[str] = None,
    insecure_registries: Optional[Sequence[str]] = None,
    secrets: Optional[Mapping[str, Union[str, bytes]]] = None,
) -> Call[BuildInfo]:
    """``POST /v1/templates`` with a packed build context (``content``: its bytes as an
    iterator, sync or async, for the client that sends it); ``registry_auth`` goes in the
    ``X-Hutch-Registry-Auth`` header, for the registry of the ``FROM`` images, and
    ``secrets`` in ``X-Hutch-Build-Secret`` (``id=<base64>``, comma-separated), for
    ``RUN --mount=type=secret``."""
    params = build_params(name, dockerfile, build_args, target, no_cache, insecure_registries)
    headers = drop_none(
        {
            "X-Hutch-Registry-Auth": registry_credentials(registry_auth),
            "X-Hutch-Build-Secret": build_secrets_header(secrets),
        }
    )
    request = Request(
        "POST",
        "/v1/templates",
        params=params,
        content=content,
        content_type="application/x-tar",
        timeout=None,
        headers=headers or None,
    )
    return Call(request, _one(BuildInfo.from_json))


def build_secrets_header(secrets: Optional[Mapping[str, Union[str, bytes]]]) -> Optional[str]:
    """``id=<base64>, …`` for ``X-Hutch-Build-Secret`` (text is sent as UTF-8)."""
    if not secrets:
        return None
    entries = []
    for secret_id, value in secrets.items():
        if not secret_id or any(c in secret_id for c in "=,/") or not secret_id.isprintable():
            raise ValueError(f"secret id {secret_id!r} must be a name without '=', ',' or '/'")
        raw = value.encode() if isinstance(value, str) else bytes(value)
        entries.append(f"{secret_id}={base64.b64encode(raw).decode('ascii')}")
    return ", ".join(entries)


def get_build(name: str, build_id: str) -> Call[BuildInfo]:
    return Call(Request("GET", build_path(name, build_id)), _one(BuildInfo.from_json))


def list_builds(name: str) -> Call[List[BuildInfo]]:
    request = Request("GET", template_path(name, "/builds"))
    return Call(request, _listed("builds", BuildInfo.from_json))


def cancel_build(name: str, build_id: str) -> Call[BuildInfo]:
    return Call(Request("DELETE", build_path(name, build_id)), _one(BuildInfo.from_json))


def follow_build_logs(name: str, build_id: str, timeout: Optional[float]) -> Request:
    """``GET …/builds/{id}/logs?follow=true``, read as server-sent events until ``end``."""
    return Request(
        "GET",
        build_path(name, build_id, "/logs"),
        params=[("follow", "true")],
        timeout=timeout,
        accept="text/event-stream",
    )


def build_log_event(event: str, doc: Any) -> Optional[Union[BuildLogLine, Dict[str, Any]]]:
    """A ``log`` event as a :class:`BuildLogLine`; the ``end`` event as its data (a dict)."""
    if not isinstance(doc, dict):
        return None
    if event == "log":
        return BuildLogLine.from_json(doc)
    if event == "end":
        return dict(doc)
    return None


def events(timeout: Optional[float]) -> Request:
    """``GET /v1/events``, read as a stream of server-sent events."""
    return Request("GET", "/v1/events", timeout=timeout)


def snapshots() -> Listing[Snapshot]:
    return Listing("/v1/snapshots", "snapshots", Snapshot.from_json)


def get_snapshot(snapshot_id: str) -> Call[Snapshot]:
    return Call(Request("GET", snapshot_path(snapshot_id)), _one(Snapshot.from_json))


def delete_snapshot(snapshot_id: str) -> Call[None]:
    return Call(Request("DELETE", snapshot_path(snapshot_id), timeout=None), _nothing)


def create_volume(name: str, size_mib: int) -> Call[Volume]:
    body = {"name": name, "size_mib": size_mib}
    return Call(Request("POST", "/v1/volumes", json=body, timeout=None), _one(Volume.from_json))


def volumes() -> Listing[Volume]:
    return Listing("/v1/volumes", "volumes", Volume.from_json)


def get_volume(volume: str) -> Call[Volume]:
    return Call(Request("GET", volume_path(volume)), _one(Volume.from_json))


def delete_volume(volume: str) -> Call[None]:
    return Call(Request("DELETE", volume_path(volume), timeout=None), _nothing)


# -- sandboxes -------------------------------------------------------------------------------


def create_sandbox(body: Dict[str, Any]) -> Call[SandboxInfo]:
    """``POST /v1/sandboxes`` with ``body`` from :func:`~hutch._protocol.create_body`."""
    return Call(
        Request("POST", "/v1/sandboxes", json=body, timeout=None), _one(SandboxInfo.from_json)
    )


def get_sandbox(sandbox_id: str) -> Call[SandboxInfo]:
    return Call(Request("GET", sandbox_path(sandbox_id)), _one(SandboxInfo.from_json))


def list_sandboxes(
    metadata: Optional[Mapping[str, str]], state: Optional[str]
) -> Listing[SandboxInfo]:
    params = tuple(list_params(metadata, state))
    return Listing("/v1/sandboxes", "sandboxes", SandboxInfo.from_json, params)


def update_sandbox(
    sandbox_id: str,
    *,
    ttl_seconds: Optional[int],
    persistent: Optional[bool],
    metadata: Optional[Mapping[str, str]],
    idle_hibernate_seconds: Optional[int],
) -> Call[SandboxInfo]:
    body = drop_none(
        {
            "ttl_seconds": ttl_seconds,
            "persistent": persistent,
            "metadata": dict(metadata) if metadata is not None else None,
            "idle_hibernate_seconds": idle_hibernate_seconds,
        }
    )
    return Call(Request("PATCH", sandbox_path(sandbox_id), json=body), _one(SandboxInfo.from_json))


def _usage(resp: httpx.Response) -> Optional[Usage]:
    u = resp.json().get("usage")
    return Usage.from_json(u) if isinstance(u, dict) else None


def logs(
    sandbox_id: str,
    *,
    tail: Optional[int],
    since: Optional[LogSince],
    source: Union[str, Sequence[str], None],
) -> Call[List[LogLine]]:
    """``GET /v1/sandboxes/{id}/logs`` as JSON."""
    params = log_params(tail=tail, since=since, source=source, follow=False)
    req = Request(
        "GET", sandbox_path(sandbox_id, "/logs"), params=params, accept="application/json"
    )
    return Call(req, _listed("lines", LogLine.from_json))


def follow_logs(
    sandbox_id: str,
    *,
    tail: Optional[int],
    since: Optional[LogSince],
    source: Union[str, Sequence[str], None],
    timeout: Optional[float],
) -> Request:
    """``GET /v1/sandboxes/{id}/logs?follow=true``, read as server-sent events."""
    params = log_params(tail=tail, since=since, source=source, follow=True)
    return Request(
        "GET",
        sandbox_path(sandbox_id, "/logs"),
        params=params,
        timeout=timeout,
        accept="text/event-stream",
    )


def usage(sandbox_id: str) -> Call[Optional[Usage]]:
    return Call(Request("GET", sandbox_path(sandbox_id, "/usage")), _usage)


def _browser_link(path: str) -> Callable[[httpx.Response], str]:
    def parse(resp: httpx.Response) -> str:
        return link_with_path(resp.json()["url"], path)

    return parse


def browser_url(
    sandbox_id: str, port: int, path: str, ttl_seconds: Optional[int]
) -> Call[str]:
    """A signed, short-lived link a browser opens (``POST …/port-tokens``)."""
    body: Dict[str, Any] = {"port": check_port(port)}
    if ttl_seconds is not None:
        body["ttl_seconds"] = ttl_seconds
    request = Request("POST", sandbox_path(sandbox_id, "/port-tokens"), json=body)
    return Call(request, _browser_link(path))


def kill(sandbox_id: str) -> Call[None]:
    return Call(Request("DELETE", sandbox_path(sandbox_id)), _nothing)


def lifecycle(sandbox_id: str, action: str, body: Any = None) -> Call[SandboxInfo]:
    """``pause``, ``resume``, ``hibernate`` or ``wake``: the sandbox as it is afterwards."""
    request = Request("POST", sandbox_path(sandbox_id, f"/{action}"), json=body, timeout=None)
    return Call(request, _one(SandboxInfo.from_json))


def snapshot(sandbox_id: str, name: Optional[str]) -> Call[Snapshot]:
    body = {} if name is None else {"name": name}
    request = Request("POST", sandbox_path(sandbox_id, "/snapshots"), json=body, timeout=None)
    return Call(request, _one(Snapshot.from_json))


def fork(sandbox_id: str, count: int, mode: str) -> Call[List[SandboxInfo]]:
    request = Request(
        "POST", sandbox_path(sandbox_id, "/fork"), json=fork_body(count, mode), timeout=None
    )
    return Call(request, lambda resp: parse_sandboxes(resp.json()))


def explore(
    sandbox_id: str,
    commands: Sequence[Command],
    *,
    timeout: Optional[float],
    keep: str,
    score_regex: Optional[str],
) -> Call[ExploreResult]:
    body = explore_body(commands, timeout=timeout, keep=keep, score_regex=score_regex)
    request = Request(
        "POST",
        sandbox_path(sandbox_id, "/explore"),
        json=body,
        timeout=explore_read_timeout(timeout),
    )
    return Call(request, _one(ExploreResult.from_json))


def _network_answer(resp: httpx.Response) -> Optional[SandboxInfo]:
    """The sandbox, when the server sends it back (older servers answer 204)."""
    if resp.content:
        doc = resp.json()
        if isinstance(doc, dict) and "id" in doc:
            return SandboxInfo.from_json(doc)
    return None


def update_network(
    sandbox_id: str,
    egress: Optional[str],
    allow: Optional[Sequence[str]],
    deny: Optional[Sequence[str]],
) -> Call[Optional[SandboxInfo]]:
    body = drop_none(
        {
            "egress": egress,
            "allow": list(allow) if allow is not None else None,
            "deny": list(deny) if deny is not None else None,
        }
    )
    return Call(Request("PUT", sandbox_path(sandbox_id, "/network"), json=body), _network_answer)


# -- commands --------------------------------------------------------------------------------


def exec_command(sandbox_id: str, body: Dict[str, Any]) -> Call[ExecResult]:
    """``POST /exec`` with ``body`` from :func:`~hutch._protocol.exec_body`; the answer is
    awaited for the command's timeout plus slack."""
    timeout = exec_read_timeout(body.get("timeout_seconds"))
    request = Request("POST", sandbox_path(sandbox_id, "/exec"), json=body, timeout=timeout)
    return Call(request, _one(ExecResult.from_json))


def exec_stream(sandbox_id: str, body: Dict[str, Any]) -> Request:
    """``POST /exec/stream`` with ``body`` from :func:`~hutch._protocol.exec_body`, read as
    server-sent events (see :class:`~hutch._core.ExecStreamRun`)."""
    return Request("POST", sandbox_path(sandbox_id, "/exec/stream"), json=body, timeout=None)


# -- files -----------------------------------------------------------------------------------


def _files(sandbox_id: str, suffix: str = "") -> str:
    return sandbox_path(sandbox_id, "/files" + suffix)


def read_file(sandbox_id: str, path: str) -> Call[bytes]:
    request = Request(
        "GET", _files(sandbox_id), params=file_params(path), kind="files", timeout=None
    )
    return Call(request, _content)


def write_file(
    sandbox_id: str,
    path: str,
    data: Union[str, bytes, bytearray, memoryview],
    mode: Union[int, str, None],
    metadata: Optional[Dict[str, str]] = None,
) -> Call[None]:
    request = Request(
        "PUT",
        _files(sandbox_id),
        params=file_params(path, mode=mode_text(mode)),
        content=to_bytes(data),
        kind="files",
        timeout=None,
        headers={f"X-Hutch-Meta-{k}": v for k, v in (metadata or {}).items()} or None,
    )
    return Call(request, _nothing)


def watch_files(sandbox_id: str, path: str, recursive: bool, include_entry: bool) -> Request:
    """``GET /v1/sandboxes/{id}/files/watch``, read as server-sent events."""
    return Request(
        "GET",
        _files(sandbox_id, "/watch"),
        params=file_params(path, recursive=recursive, include_entry=include_entry),
        kind="files",
        timeout=None,
        accept="text/event-stream",
    )


#: Longest life of a signed file URL, in seconds (the server's limit: 7 days).
MAX_FILE_URL_SECONDS = 7 * 24 * 3600


def file_url(
    sandbox_id: str, path: str, op: str, expires_in: float, user: Optional[str]
) -> Call[str]:
    """``POST /v1/sandboxes/{id}/files/url``: a signed URL that reads (``op="read"``) or
    writes (``op="write"``) one file without the API key, until it expires."""
    seconds = int(expires_in)
    if seconds != expires_in or not 1 <= seconds <= MAX_FILE_URL_SECONDS:
        raise ValueError(
            f"expires_in must be a whole number of seconds from 1 to {MAX_FILE_URL_SECONDS}"
            f" (7 days), got {expires_in!r}"
        )
    body = drop_none(
        {"path": path, "op": op, "expires_in_seconds": seconds, "user": user}
    )
    request = Request("POST", _files(sandbox_id, "/url"), json=body, kind="files")
    return Call(request, lambda resp: str(resp.json()["url"]))


def list_files(sandbox_id: str, path: str, depth: int) -> Call[List[FileEntry]]:
    request = Request(
        "GET", _files(sandbox_id, "/list"), params=file_params(path, depth=depth), kind="files"
    )
    return Call(request, _listed("entries", FileEntry.from_json))


def stat_file(sandbox_id: str, path: str) -> Call[FileEntry]:
    request = Request("GET", _files(sandbox_id, "/stat"), params=file_params(path), kind="files")
    return Call(request, _one(FileEntry.from_json))


def make_dir(sandbox_id: str, path: str) -> Call[None]:
    request = Request("POST", _files(sandbox_id, "/mkdir"), json={"path": path}, kind="files")
    return Call(request, _nothing)


def move_file(sandbox_id: str, src: str, dst: str) -> Call[None]:
    body = {"from": src, "to": dst}
    return Call(Request("POST", _files(sandbox_id, "/move"), json=body, kind="files"), _nothing)


def remove_file(sandbox_id: str, path: str, recursive: bool) -> Call[None]:
    request = Request(
        "DELETE",
        _files(sandbox_id),
        params=file_params(path, recursive=recursive or None),
        kind="files",
        timeout=None,
    )
    return Call(request, _nothing)
