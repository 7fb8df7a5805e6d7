"""The asyncio client: :class:`AsyncClient`, :class:`AsyncSandbox`, :class:`AsyncFiles`,
:class:`AsyncPtySession`. Same surface as the synchronous one, with ``await``."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from contextlib import asynccontextmanager
from types import TracebackType
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    Generator,
    List,
    Mapping,
    Optional,
    Sequence,
    Type,
    Union,
)

import httpx

from . import _protocol as p
from . import errors
from ._config import resolve
from ._version import USER_AGENT
from .models import (
    ExecResult,
    ExploreResult,
    FileEntry,
    LifecycleEvent,
    SandboxInfo,
    Snapshot,
    Template,
    Usage,
    Volume,
)

__all__ = [
    "AsyncClient",
    "AsyncSandbox",
    "AsyncFiles",
    "AsyncPtySession",
    "AsyncEventStream",
    "PendingSandbox",
]

PathLike = Union[str, "os.PathLike[str]"]


class AsyncClient:
    """An asyncio connection to a Hutch server; see :class:`hutch.Client` for the arguments."""

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: float = 30.0,
        state_dir: Optional[PathLike] = None,
    ) -> None:
        self.config = resolve(url, api_key, state_dir)
        headers = {"User-Agent": USER_AGENT}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        self._timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=self.config.url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
        )
        self._implicit = False
        self._refs = 0
        self._closed = False

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self.config.url

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
        )

    async def _raise_for(self, resp: httpx.Response, req: p.Request) -> None:
        if resp.status_code >= 400:
            body = await resp.aread()
            raise p.auth_hint(
                errors.from_response(resp.status_code, body, kind=req.kind), self.config
            )

    def _map_transport(self, e: Exception) -> errors.HutchError:
        if isinstance(e, httpx.TimeoutException):
            return errors.TimeoutError(f"request to {self.url} timed out: {e}")
        return errors.ConnectionError(f"cannot reach the Hutch server at {self.url}: {e}")

    async def request(self, req: p.Request) -> httpx.Response:
        """Send ``req``; raise the mapped :class:`~hutch.errors.HutchError` on a non-2xx answer."""
        if self._closed:
            raise errors.HutchError("this client is closed")
        try:
            resp = await self._http.send(self._build(req))
        except httpx.TransportError as e:
            raise self._map_transport(e) from e
        await self._raise_for(resp, req)
        return resp

    async def request_json(self, req: p.Request) -> Any:
        """Send ``req`` and decode its JSON answer."""
        return (await self.request(req)).json()

    @asynccontextmanager
    async def stream(self, req: p.Request) -> AsyncIterator[httpx.Response]:
        """Send ``req`` and yield the response with its body unread (for SSE)."""
        if self._closed:
            raise errors.HutchError("this client is closed")
        try:
            resp = await self._http.send(self._build(req), stream=True)
        except httpx.TransportError as e:
            raise self._map_transport(e) from e
        try:
            await self._raise_for(resp, req)
            yield resp
        finally:
            await resp.aclose()

    async def _lines(self, resp: httpx.Response) -> AsyncIterator[str]:
        try:
            async for line in resp.aiter_lines():
                yield line
        except httpx.TransportError as e:
            raise self._map_transport(e) from e

    def _retain(self) -> None:
        self._refs += 1

    async def _release(self) -> None:
        self._refs -= 1
        if self._refs <= 0 and self._implicit:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        if not self._closed:
            self._closed = True
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def health(self) -> Dict[str, Any]:
        """``GET /healthz``."""
        return dict(await self.request_json(p.Request("GET", "/healthz")))

    async def templates(self) -> List[Template]:
        """The templates sandboxes can be created from."""
        doc = await self.request_json(p.Request("GET", "/v1/templates"))
        return [Template.from_json(t) for t in doc.get("templates", [])]

    def events(self, *, timeout: Optional[float] = None) -> AsyncEventStream:
        """Subscribe to lifecycle events; use with ``async with`` then ``async for``."""
        return AsyncEventStream(self, timeout)

    async def snapshots(self) -> List[Snapshot]:
        """The named snapshots this key's tenant may see, oldest first (see
        :meth:`hutch.Client.snapshots`)."""
        doc = await self.request_json(p.Request("GET", "/v1/snapshots"))
        return [Snapshot.from_json(s) for s in doc.get("snapshots", [])]

    async def get_snapshot(self, snapshot_id: str) -> Snapshot:
        """One snapshot, with the sandboxes that use it (``used_by``); ``NotFoundError`` if
        there is none."""
        doc = await self.request_json(p.Request("GET", p.snapshot_path(snapshot_id)))
        return Snapshot.from_json(doc)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a snapshot and its files.

        Refused with :class:`~hutch.errors.ConflictError` (409) while sandboxes created from
        it still exist (they use its files in place; ``used_by`` lists them): kill them first.
        """
        await self.request(p.Request("DELETE", p.snapshot_path(snapshot_id), timeout=None))

    async def create_volume(self, name: str, size_mib: int = 1024) -> Volume:
        """Create a durable volume (see :meth:`hutch.Client.create_volume`)."""
        doc = await self.request_json(
            p.Request(
                "POST", "/v1/volumes", json={"name": name, "size_mib": size_mib}, timeout=None
            )
        )
        return Volume.from_json(doc)

    async def volumes(self) -> List[Volume]:
        """The volumes this key's tenant may see (see :meth:`hutch.Client.volumes`)."""
        doc = await self.request_json(p.Request("GET", "/v1/volumes"))
        return [Volume.from_json(v) for v in doc.get("volumes", [])]

    async def get_volume(self, volume: str) -> Volume:
        """One volume by id (``vol_…``) or name, with where it is attached; ``NotFoundError``
        if there is none."""
        return Volume.from_json(await self.request_json(p.Request("GET", p.volume_path(volume))))

    async def delete_volume(self, volume: str) -> None:
        """Delete a volume (by id or name) and its data.

        Refused with :class:`~hutch.errors.ConflictError` (409) while it is attached to a
        sandbox, running, paused or hibernated (``attached`` lists them): kill them first.
        """
        await self.request(p.Request("DELETE", p.volume_path(volume), timeout=None))


def _client_for(
    client: Optional[AsyncClient], url: Optional[str], api_key: Optional[str]
) -> AsyncClient:
    if client is not None:
        return client
    c = AsyncClient(url, api_key)
    c._implicit = True
    return c


class AsyncEventStream:
    """An open ``GET /v1/events`` subscription; ``async for`` yields :class:`LifecycleEvent` s."""

    def __init__(self, client: AsyncClient, timeout: Optional[float]) -> None:
        self._client = client
        self._timeout = timeout
        self._cm: Any = None
        self._resp: Optional[httpx.Response] = None

    async def open(self) -> AsyncEventStream:
        """Start the subscription (done by ``async with`` or the first iteration)."""
        if self._resp is None:
            self._cm = self._client.stream(p.Request("GET", "/v1/events", timeout=self._timeout))
            self._resp = await self._cm.__aenter__()
        return self

    async def __aenter__(self) -> AsyncEventStream:
        return await self.open()

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def __aiter__(self) -> AsyncIterator[LifecycleEvent]:
        await self.open()
        assert self._resp is not None
        parser = p.SSEParser()
        async for line in self._client._lines(self._resp):
            ev = parser.feed(line)
            if ev is None:
                continue
            try:
                doc = json.loads(ev[1])
            except ValueError:
                continue
            yield LifecycleEvent.from_json(doc, ev[0])

    async def aclose(self) -> None:
        """End the subscription."""
        if self._cm is not None:
            cm, self._cm, self._resp = self._cm, None, None
            try:
                await cm.__aexit__(None, None, None)
            except errors.HutchError:
                pass


class PendingSandbox:
    """What :meth:`AsyncSandbox.create` returns: await it, or use it with ``async with``."""

    def __init__(self, factory: Callable[[], Awaitable[AsyncSandbox]]) -> None:
        self._factory = factory
        self._sandbox: Optional[AsyncSandbox] = None

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._factory().__await__()

    async def __aenter__(self) -> AsyncSandbox:
        self._sandbox = await self._factory()
        return self._sandbox

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        if self._sandbox is not None:
            await self._sandbox.__aexit__(exc_type, exc, tb)


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value


class AsyncSandbox:
    """A sandbox, driven from asyncio. The methods mirror :class:`hutch.Sandbox`::

    async with AsyncSandbox.create(template="base") as sb:
        result = await sb.exec(["python3", "-c", "print(6*7)"])
    """

    def __init__(self, info: SandboxInfo, client: AsyncClient) -> None:
        """Wrap an existing sandbox; prefer :meth:`create`, :meth:`connect` or :meth:`list`."""
        self._info = info
        self._client = client
        self._released = False
        client._retain()
        self.files = AsyncFiles(self)
        """File operations inside the sandbox: see :class:`AsyncFiles`."""

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        *,
        isolation: Optional[str] = None,
        ttl_seconds: Optional[int] = None,
        persistent: Optional[bool] = None,
        metadata: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        cpus: Optional[float] = None,
        memory_mib: Optional[int] = None,
        disk_mib: Optional[int] = None,
        pids_max: Optional[int] = None,
        network: Optional[Mapping[str, Any]] = None,
        volumes: Optional[Sequence[p.VolumeSpec]] = None,
        snapshot: Optional[str] = None,
        idle_hibernate_seconds: Optional[int] = None,
        client: Optional[AsyncClient] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> PendingSandbox:
        """Create a sandbox (arguments as :meth:`hutch.Sandbox.create`, including ``volumes``:
        durable volumes from :meth:`AsyncClient.create_volume` to mount).

        ``await AsyncSandbox.create()`` gives the sandbox; ``async with AsyncSandbox.create()
        as sb:`` also kills it when the block ends (unless persistent), even on error.
        """
        body = p.create_body(
            template=template,
            isolation=isolation,
            ttl_seconds=ttl_seconds,
            persistent=persistent,
            metadata=metadata,
            env=env,
            cpus=cpus,
            memory_mib=memory_mib,
            disk_mib=disk_mib,
            pids_max=pids_max,
            network=network,
            volumes=volumes,
            snapshot=snapshot,
            idle_hibernate_seconds=idle_hibernate_seconds,
        )

        async def make() -> AsyncSandbox:
            c = _client_for(client, url, api_key)
            try:
                doc = await c.request_json(
                    p.Request("POST", "/v1/sandboxes", json=body, timeout=None)
                )
            except BaseException:
                if c._implicit:
                    await c.aclose()
                raise
            return cls(SandboxInfo.from_json(doc), c)

        return PendingSandbox(make)

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        *,
        client: Optional[AsyncClient] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> AsyncSandbox:
        """Attach to an existing sandbox by id (:class:`~hutch.errors.SandboxNotFound` if none)."""
        c = _client_for(client, url, api_key)
        try:
            doc = await c.request_json(p.Request("GET", p.sandbox_path(sandbox_id)))
        except BaseException:
            if c._implicit:
                await c.aclose()
            raise
        return cls(SandboxInfo.from_json(doc), c)

    @classmethod
    async def list(
        cls,
        *,
        metadata: Optional[Mapping[str, str]] = None,
        state: Optional[str] = None,
        client: Optional[AsyncClient] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> List[AsyncSandbox]:
        """List the sandboxes visible to this key, optionally filtered by metadata and state."""
        c = _client_for(client, url, api_key)
        try:
            doc = await c.request_json(
                p.Request("GET", "/v1/sandboxes", params=p.list_params(metadata, state))
            )
            sandboxes = [cls(info, c) for info in p.parse_sandboxes(doc)]
        finally:
            if c._implicit and c._refs == 0:
                await c.aclose()
        return sandboxes

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
        """The state as last seen."""
        return self._info.state

    @property
    def client(self) -> AsyncClient:
        """The client this sandbox talks through."""
        return self._client

    def __repr__(self) -> str:
        return (
            f"AsyncSandbox(id={self.id!r}, template={self._info.template!r}, state={self.state!r})"
        )

    def _set(self, doc: Any) -> SandboxInfo:
        self._info = SandboxInfo.from_json(doc)
        return self._info

    async def refresh(self) -> SandboxInfo:
        """Fetch the current state (also refreshes the TTL)."""
        return self._set(await self._client.request_json(p.Request("GET", p.sandbox_path(self.id))))

    async def update(
        self,
        *,
        ttl_seconds: Optional[int] = None,
        persistent: Optional[bool] = None,
        metadata: Optional[Mapping[str, str]] = None,
        idle_hibernate_seconds: Optional[int] = None,
    ) -> SandboxInfo:
        """Change the TTL, persistence, metadata (which replaces the whole map) or idle
        hibernation delay (``0`` turns it off)."""
        body = p.drop_none(
            {
                "ttl_seconds": ttl_seconds,
                "persistent": persistent,
                "metadata": dict(metadata) if metadata is not None else None,
                "idle_hibernate_seconds": idle_hibernate_seconds,
            }
        )
        return self._set(
            await self._client.request_json(p.Request("PATCH", p.sandbox_path(self.id), json=body))
        )

    async def set_ttl(self, ttl_seconds: int) -> SandboxInfo:
        """Set the idle lifetime."""
        return await self.update(ttl_seconds=ttl_seconds)

    async def set_persistent(self, persistent: bool = True) -> SandboxInfo:
        """Make the sandbox persistent or not."""
        return await self.update(persistent=persistent)

    async def set_metadata(self, metadata: Mapping[str, str]) -> SandboxInfo:
        """Replace the sandbox's metadata."""
        return await self.update(metadata=metadata)

    async def usage(self) -> Optional[Usage]:
        """Memory, CPU and process counts right now."""
        doc = await self._client.request_json(p.Request("GET", p.sandbox_path(self.id, "/usage")))
        u = doc.get("usage")
        return Usage.from_json(u) if isinstance(u, dict) else None

    async def exec(
        self,
        cmd: p.Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Union[str, bytes, None] = None,
        timeout: Optional[float] = None,
        user: Optional[str] = None,
    ) -> ExecResult:
        """Run a command to completion (see :meth:`hutch.Sandbox.exec`)."""
        body = p.exec_body(cmd, env=env, cwd=cwd, stdin=stdin, timeout=timeout, user=user)
        doc = await self._client.request_json(
            p.Request(
                "POST",
                p.sandbox_path(self.id, "/exec"),
                json=body,
                timeout=p.exec_read_timeout(timeout),
            )
        )
        return ExecResult.from_json(doc)

    async def exec_stream(
        self,
        cmd: p.Command,
        *,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
        on_start: Optional[Callable[[int], Any]] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Union[str, bytes, None] = None,
        timeout: Optional[float] = None,
        user: Optional[str] = None,
    ) -> int:
        """Run a command, calling back with output as it arrives; returns the exit code.

        Callbacks may be plain functions or coroutine functions (awaited in order).
        See :meth:`hutch.Sandbox.exec_stream`.
        """
        body = p.exec_body(cmd, env=env, cwd=cwd, stdin=stdin, timeout=timeout, user=user)
        req = p.Request("POST", p.sandbox_path(self.id, "/exec/stream"), json=body, timeout=None)
        state = p.ExecStreamState()
        parser = p.SSEParser()
        callbacks: Dict[str, Optional[Callable[[Any], Any]]] = {
            "stdout": on_stdout,
            "stderr": on_stderr,
            "start": on_start,
        }
        async with self._client.stream(req) as resp:
            async for line in self._client._lines(resp):
                ev = parser.feed(line)
                if ev is None:
                    continue
                for kind, value in state.handle(*ev):
                    if kind == "exit":
                        return int(value.get("exit_code", -1))
                    cb = callbacks.get(kind)
                    if cb is not None:
                        await _maybe_await(cb(value))
        raise errors.HutchError("the exec stream ended without an exit event")

    def port_url(self, port: int, path: str = "/", *, with_token: bool = False) -> str:
        """The URL of the port proxy for ``port`` (see :meth:`hutch.Sandbox.port_url`)."""
        token = self._client.config.api_key if with_token else None
        return p.port_url(self._client.url, self.id, port, path, token)

    async def port_request(
        self,
        port: int,
        path: str = "/",
        method: str = "GET",
        **kwargs: Any,
    ) -> httpx.Response:
        """Send an HTTP request to the service on ``port`` inside the sandbox (see
        :meth:`hutch.Sandbox.port_request`)."""
        url = p.port_path(self.id, port, path)
        try:
            resp = await self._client._http.request(method, url, **kwargs)
        except httpx.TransportError as e:
            raise self._client._map_transport(e) from e
        p.raise_for_proxy(resp.status_code, resp.headers, resp.content, self._client.config)
        return resp

    async def pty(
        self,
        cmd: Optional[str] = None,
        *,
        cols: int = 80,
        rows: int = 24,
        user: Optional[str] = None,
        cwd: Optional[str] = None,
        open_timeout: float = 10.0,
    ) -> AsyncPtySession:
        """Open an interactive terminal (see :meth:`hutch.Sandbox.pty`)."""
        from websockets.asyncio.client import connect

        url = p.pty_url(
            self._client.url, self.id, cmd=cmd, cols=cols, rows=rows, user=user, cwd=cwd
        )
        try:
            ws = await connect(
                url,
                additional_headers=p.ws_headers(self._client.config.api_key),
                open_timeout=open_timeout,
                max_size=16 * 1024 * 1024,
                user_agent_header=USER_AGENT,
            )
        except Exception as e:  # noqa: BLE001 - mapped below
            raise p.ws_error(e, self._client.config) from e
        return AsyncPtySession(ws)

    async def kill(self) -> None:
        """Destroy the sandbox. Killing a sandbox twice is not an error."""
        try:
            await self._client.request(p.Request("DELETE", p.sandbox_path(self.id)))
        except errors.SandboxNotFound:
            pass
        self._info.state = "stopped"

    async def _lifecycle(self, action: str, body: Any = None) -> SandboxInfo:
        doc = await self._client.request_json(
            p.Request("POST", p.sandbox_path(self.id, f"/{action}"), json=body, timeout=None)
        )
        return self._set(doc)

    async def pause(self) -> SandboxInfo:
        """Freeze every process (cgroup freezer on ``ns``): no CPU, everything kept in memory.

        Until :meth:`resume`, every call but resume, kill, get and list, exec and file calls
        included, raises :class:`~hutch.errors.ConflictError` (409). See
        :meth:`hutch.Sandbox.pause`.
        """
        return await self._lifecycle("pause")

    async def resume(self) -> SandboxInfo:
        """Let a paused sandbox run again (:class:`~hutch.errors.ConflictError` if it is not
        paused)."""
        return await self._lifecycle("resume")

    async def hibernate(self) -> SandboxInfo:
        """Stop the sandbox and keep it on disk; the next exec, file or PTY call wakes it.

        On ``ns`` **files survive and processes do not** (nor do ``/tmp`` and ``/dev/shm``,
        which are memory-backed). See :meth:`hutch.Sandbox.hibernate`.
        """
        return await self._lifecycle("hibernate")

    async def wake(self) -> SandboxInfo:
        """Start a hibernated sandbox again (on ``ns``: a fresh agent over its kept files).

        Returns the sandbox with :attr:`~hutch.SandboxInfo.woke_in_ms` set.
        :class:`~hutch.errors.ConflictError` if it is not hibernated.
        """
        return await self._lifecycle("wake")

    async def snapshot(self, name: str) -> Snapshot:
        """Take a named snapshot; start sandboxes from it with ``create(snapshot=snap.id)``.

        On ``ns`` it is filesystem-level (``kind == "filesystem"``): files, not processes,
        memory, ``/tmp`` or ``/dev/shm``. ``name``: 1–64 characters of ``[A-Za-z0-9._-]``.
        See :meth:`hutch.Sandbox.snapshot`.
        """
        doc = await self._client.request_json(
            p.Request(
                "POST",
                p.sandbox_path(self.id, "/snapshots"),
                json={"name": name},
                timeout=None,
            )
        )
        return Snapshot.from_json(doc)

    async def fork(self, count: int = 1, *, mode: str = "disk") -> List[AsyncSandbox]:
        """Create ``count`` (1–16) children of this sandbox.

        ``mode="disk"``: each child gets a copy-on-write view of this sandbox's files and a
        fresh agent (processes are not carried); ``"live"`` needs the ``vm`` backend and is
        refused on ``ns`` with :class:`~hutch.errors.InvalidRequest` (422). See
        :meth:`hutch.Sandbox.fork`.
        """
        doc = await self._client.request_json(
            p.Request(
                "POST",
                p.sandbox_path(self.id, "/fork"),
                json=p.fork_body(count, mode),
                timeout=None,
            )
        )
        return [AsyncSandbox(info, self._client) for info in p.parse_sandboxes(doc)]

    async def explore(
        self,
        commands: Sequence[p.Command],
        *,
        timeout: Optional[float] = None,
        keep: str = "winner",
        score_regex: Optional[str] = None,
    ) -> ExploreResult:
        """Run each command (1–16) in its own disk fork, in parallel, and keep the best fork.

        Exit status 0 scores 1.0 (or ``score_regex``'s first capture group on stdout); ties go
        to the lowest index. The winner's child survives (``winner.sandbox_id``), the others
        are destroyed, this sandbox is unchanged. See :meth:`hutch.Sandbox.explore`.
        """
        body = p.explore_body(commands, timeout=timeout, keep=keep, score_regex=score_regex)
        doc = await self._client.request_json(
            p.Request(
                "POST",
                p.sandbox_path(self.id, "/explore"),
                json=body,
                timeout=p.explore_read_timeout(timeout),
            )
        )
        return ExploreResult.from_json(doc)

    async def update_network(
        self,
        egress: Optional[str] = None,
        *,
        allow: Optional[Sequence[str]] = None,
        deny: Optional[Sequence[str]] = None,
    ) -> None:
        """Change the egress policy at once, including for open connections (see the sync
        :meth:`hutch.Sandbox.update_network`)."""
        body = p.drop_none(
            {
                "egress": egress,
                "allow": list(allow) if allow is not None else None,
                "deny": list(deny) if deny is not None else None,
            }
        )
        resp = await self._client.request(
            p.Request("PUT", p.sandbox_path(self.id, "/network"), json=body)
        )
        if resp.content:
            doc = resp.json()
            if isinstance(doc, dict) and "id" in doc:
                self._set(doc)

    async def close(self) -> None:
        """Release the connection (the sandbox keeps running). Idempotent."""
        if not self._released:
            self._released = True
            await self._client._release()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        """Kill the sandbox unless it is persistent, even when the block raised."""
        try:
            if not self._info.persistent:
                try:
                    await self.kill()
                except errors.HutchError:
                    if exc_type is None:
                        raise
        finally:
            await self.close()


class AsyncFiles:
    """File operations inside a sandbox (``sb.files``); see :class:`hutch.Files`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    def _path(self, suffix: str = "") -> str:
        return p.sandbox_path(self._sb.id, "/files" + suffix)

    async def read_bytes(self, path: str) -> bytes:
        """Read a whole file as bytes."""
        resp = await self._sb._client.request(
            p.Request("GET", self._path(), params=p.file_params(path), kind="files", timeout=None)
        )
        return resp.content

    async def read(self, path: str, *, encoding: str = "utf-8", errors: str = "strict") -> str:
        """Read a whole file as text."""
        return (await self.read_bytes(path)).decode(encoding, errors)

    async def write(
        self,
        path: str,
        data: Union[str, bytes, bytearray, memoryview],
        *,
        mode: Union[int, str, None] = None,
    ) -> None:
        """Create or replace a file; parent directories are created."""
        await self._sb._client.request(
            p.Request(
                "PUT",
                self._path(),
                params=p.file_params(path, mode=p.mode_text(mode)),
                content=p.to_bytes(data),
                kind="files",
                timeout=None,
            )
        )

    async def list(self, path: str = "/", *, depth: int = 1) -> List[FileEntry]:
        """List a directory (depth 1–32)."""
        doc = await self._sb._client.request_json(
            p.Request(
                "GET", self._path("/list"), params=p.file_params(path, depth=depth), kind="files"
            )
        )
        return [FileEntry.from_json(e) for e in doc.get("entries", [])]

    async def stat(self, path: str) -> FileEntry:
        """Describe one path."""
        doc = await self._sb._client.request_json(
            p.Request("GET", self._path("/stat"), params=p.file_params(path), kind="files")
        )
        return FileEntry.from_json(doc)

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        try:
            await self.stat(path)
        except errors.FileNotFound:
            return False
        return True

    async def mkdir(self, path: str) -> None:
        """Create a directory and its parents."""
        await self._sb._client.request(
            p.Request("POST", self._path("/mkdir"), json={"path": path}, kind="files")
        )

    async def move(self, src: str, dst: str) -> None:
        """Move or rename ``src`` to ``dst``."""
        await self._sb._client.request(
            p.Request("POST", self._path("/move"), json={"from": src, "to": dst}, kind="files")
        )

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file or directory (non-empty ones need ``recursive=True``)."""
        await self._sb._client.request(
            p.Request(
                "DELETE",
                self._path(),
                params=p.file_params(path, recursive=recursive or None),
                kind="files",
                timeout=None,
            )
        )


class AsyncPtySession:
    """An interactive terminal, driven from asyncio; see :class:`hutch.PtySession`."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._pending = b""
        self._done = False
        self.exit_code: Optional[int] = None
        """The program's exit status, once it has exited."""
        self.error: Optional[str] = None
        """The server's message if the session failed."""

    @property
    def closed(self) -> bool:
        """True once the program exited or the socket closed."""
        return self._done

    async def send(self, data: Union[str, bytes]) -> None:
        """Type ``data`` (text is sent as UTF-8)."""
        await self._ws.send(p.to_bytes(data))

    async def resize(self, cols: int, rows: int) -> None:
        """Change the terminal size."""
        await self._ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    async def _recv(self, timeout: Optional[float]) -> bytes:
        from websockets.exceptions import ConnectionClosed

        while not self._done:
            try:
                msg = await asyncio.wait_for(self._ws.recv(), timeout)
            except asyncio.TimeoutError as e:
                raise errors.TimeoutError("no terminal output in time") from e
            except ConnectionClosed:
                self._done = True
                break
            if isinstance(msg, bytes):
                return msg
            try:
                ctl = json.loads(msg)
            except ValueError:
                continue
            if ctl.get("type") == "exit":
                self.exit_code = int(ctl.get("exit_code", -1))
            elif ctl.get("type") == "error":
                self.error = str(ctl.get("message", "terminal session failed"))
        return b""

    async def read(self, timeout: Optional[float] = None) -> bytes:
        """The next chunk of output; ``b""`` once the program has exited."""
        if self._pending:
            out, self._pending = self._pending, b""
            return out
        return await self._recv(timeout)

    async def read_until(
        self, pattern: Union[str, bytes], timeout: Optional[float] = 10.0
    ) -> bytes:
        """Read until ``pattern`` appears; returns everything up to and including it."""
        loop = asyncio.get_running_loop()
        needle = p.to_bytes(pattern)
        deadline = None if timeout is None else loop.time() + timeout
        buf, self._pending = self._pending, b""
        while needle not in buf:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                self._pending = buf
                raise errors.TimeoutError(f"{pattern!r} did not appear in the terminal in time")
            try:
                chunk = await self._recv(left)
            except errors.TimeoutError:
                self._pending = buf
                raise errors.TimeoutError(
                    f"{pattern!r} did not appear in the terminal in time"
                ) from None
            if not chunk:
                self._pending = buf
                raise errors.HutchError(
                    f"the terminal closed (exit code {self.exit_code}) before {pattern!r} appeared"
                )
            buf += chunk
        end = buf.index(needle) + len(needle)
        self._pending = buf[end:]
        return buf[:end]

    async def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Discard output until the program exits; returns its exit code."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        self._pending = b""
        while not self._done:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            await self._recv(left)
        return self.exit_code

    async def close(self) -> None:
        """Close the terminal; the program is killed if still running."""
        self._done = True
        try:
            await self._ws.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass

    async def __aenter__(self) -> AsyncPtySession:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
