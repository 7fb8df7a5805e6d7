"""The asyncio client: :class:`AsyncClient`, :class:`AsyncSandbox`, :class:`AsyncFiles`,
:class:`AsyncPtySession`. Same surface as the synchronous one, with ``await``."""

from __future__ import annotations

import inspect
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
    TypeVar,
    Union,
)

import httpx

from . import _ops as ops
from . import _protocol as p
from . import errors
from ._code import AsyncCodeMethods
from ._exec import AsyncExecMethods
from ._core import ClientBase, ExecStreamRun, PathLike, SandboxBase
from ._events import AsyncEventStream, AsyncLogStream
from ._files import AsyncFiles
from ._pty import AsyncPtySession
from ._templates import AsyncTemplates
from ._tenants import AsyncTenantMethods
from .models import (
    ExploreResult,
    LogLine,
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

T = TypeVar("T")


class AsyncClient(AsyncTenantMethods, ClientBase):
    """An asyncio connection to a Hutch server; see :class:`hutch.Client` for the arguments."""

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: float = 30.0,
        state_dir: Optional[PathLike] = None,
        tenant: Optional[str] = None,
    ) -> None:
        self._http: httpx.AsyncClient = httpx.AsyncClient(
            **self._setup(url, api_key, timeout, state_dir, tenant)
        )

    async def _raise_for(self, resp: httpx.Response, req: p.Request) -> None:
        if resp.status_code >= 400:
            raise self._http_error(resp.status_code, await resp.aread(), req)

    async def request(self, req: p.Request) -> httpx.Response:
        """Send ``req``; raise the mapped :class:`~hutch.errors.HutchError` on a non-2xx answer."""
        self._check_open()
        try:
            resp = await self._http.send(self._build(req))
        except httpx.TransportError as e:
            raise self._transport_error(e) from e
        await self._raise_for(resp, req)
        return resp

    async def request_json(self, req: p.Request) -> Any:
        """Send ``req`` and decode its JSON answer."""
        return (await self.request(req)).json()

    async def _call(self, call: ops.Call[T]) -> T:
        return call.parse(await self.request(call.request))

    async def _all(self, listing: ops.Listing[T]) -> List[T]:
        """Every record of a paginated listing, following the server's cursors."""
        items: List[T] = []
        cursor: Optional[str] = None
        while True:
            page, cursor = listing.parse(await self.request(listing.page(cursor)))
            items.extend(page)
            if cursor is None:
                return items

    @asynccontextmanager
    async def stream(self, req: p.Request) -> AsyncIterator[httpx.Response]:
        """Send ``req`` and yield the response with its body unread (for SSE)."""
        self._check_open()
        try:
            resp = await self._http.send(self._build(req), stream=True)
        except httpx.TransportError as e:
            raise self._transport_error(e) from e
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
            raise self._transport_error(e) from e

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
        return await self._call(ops.health())

    @property
    def templates(self) -> AsyncTemplates:
        """The server's templates (see :attr:`hutch.Client.templates`): ``await
        client.templates()`` lists them; ``await client.templates.build(…)`` builds one."""
        return AsyncTemplates(self)

    def events(self, *, timeout: Optional[float] = None) -> AsyncEventStream:
        """Subscribe to lifecycle events; use with ``async with`` then ``async for``."""
        return AsyncEventStream(self, timeout)

    async def snapshots(self) -> List[Snapshot]:
        """The named snapshots this key's tenant may see, oldest first (see
        :meth:`hutch.Client.snapshots`)."""
        return await self._all(ops.snapshots())

    async def get_snapshot(self, snapshot_id: str) -> Snapshot:
        """One snapshot, with the sandboxes that use it (``used_by``); ``NotFoundError`` if
        there is none."""
        return await self._call(ops.get_snapshot(snapshot_id))

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a snapshot and its files.

        Refused with :class:`~hutch.errors.ConflictError` (409) while sandboxes created from
        it still exist (they use its files in place; ``used_by`` lists them): kill them first.
        """
        await self._call(ops.delete_snapshot(snapshot_id))

    async def create_volume(self, name: str, size_mib: int = 1024) -> Volume:
        """Create a durable volume (see :meth:`hutch.Client.create_volume`)."""
        return await self._call(ops.create_volume(name, size_mib))

    async def volumes(self) -> List[Volume]:
        """The volumes this key's tenant may see (see :meth:`hutch.Client.volumes`)."""
        return await self._all(ops.volumes())

    async def get_volume(self, volume: str) -> Volume:
        """One volume by id (``vol_…``) or name, with where it is attached; ``NotFoundError``
        if there is none."""
        return await self._call(ops.get_volume(volume))

    async def delete_volume(self, volume: str) -> None:
        """Delete a volume (by id or name) and its data.

        Refused with :class:`~hutch.errors.ConflictError` (409) while it is attached to a
        sandbox, running, paused or hibernated (``attached`` lists them): kill them first.
        """
        await self._call(ops.delete_volume(volume))


def _client_for(
    client: Optional[AsyncClient], url: Optional[str], api_key: Optional[str]
) -> AsyncClient:
    if client is not None:
        return client
    c = AsyncClient(url, api_key)
    c._implicit = True
    return c


async def _first_call(c: AsyncClient, call: ops.Call[T]) -> T:
    """``c._call(call)``, closing ``c`` if that fails and ``c`` was made for this call."""
    try:
        return await c._call(call)
    except BaseException:
        if c._implicit:
            await c.aclose()
        raise


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


class AsyncSandbox(AsyncExecMethods, AsyncCodeMethods, SandboxBase[AsyncClient]):
    """A sandbox, driven from asyncio. The methods mirror :class:`hutch.Sandbox`::

    async with AsyncSandbox.create(template="base") as sb:
        result = await sb.exec(["python3", "-c", "print(6*7)"])
    """

    _name = "AsyncSandbox"

    def __init__(self, info: SandboxInfo, client: AsyncClient) -> None:
        """Wrap an existing sandbox; prefer :meth:`create`, :meth:`connect` or :meth:`list`."""
        super().__init__(info, client)
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
        call = ops.create_sandbox(
            p.create_body(
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
        )

        async def make() -> AsyncSandbox:
            c = _client_for(client, url, api_key)
            return cls(await _first_call(c, call), c)

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
        return cls(await _first_call(c, ops.get_sandbox(sandbox_id)), c)

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
            infos = await c._all(ops.list_sandboxes(metadata, state))
            sandboxes = [cls(info, c) for info in infos]
        finally:
            if c._implicit and c._refs == 0:
                await c.aclose()
        return sandboxes

    async def refresh(self) -> SandboxInfo:
        """Fetch the current state (also refreshes the TTL)."""
        return self._set(await self._client._call(ops.get_sandbox(self.id)))

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
        call = ops.update_sandbox(
            self.id,
            ttl_seconds=ttl_seconds,
            persistent=persistent,
            metadata=metadata,
            idle_hibernate_seconds=idle_hibernate_seconds,
        )
        return self._set(await self._client._call(call))

    async def set_ttl(self, ttl_seconds: int) -> SandboxInfo:
        """Set the idle lifetime."""
        return await self.update(ttl_seconds=ttl_seconds)

    async def set_persistent(self, persistent: bool = True) -> SandboxInfo:
        """Make the sandbox persistent or not."""
        return await self.update(persistent=persistent)

    async def set_metadata(self, metadata: Mapping[str, str]) -> SandboxInfo:
        """Replace the sandbox's metadata."""
        return await self.update(metadata=metadata)

    async def logs(
        self,
        *,
        tail: Optional[int] = None,
        since: Optional[p.LogSince] = None,
        source: Union[str, Sequence[str], None] = None,
    ) -> List[LogLine]:
        """The sandbox's logs: its agent's (``ns``) or its guest console (``vm``), oldest
        first. ``tail`` keeps the last lines; ``since`` the lines from a time on (RFC 3339,
        a duration before now such as ``"10m"``, Unix seconds or a ``datetime``; only for
        logs with times, the agent's); ``source`` picks ``"agent"`` or ``"console"``."""
        return await self._client._call(ops.logs(self.id, tail=tail, since=since, source=source))

    def follow_logs(
        self,
        *,
        tail: Optional[int] = 0,
        since: Optional[p.LogSince] = None,
        source: Union[str, Sequence[str], None] = None,
        timeout: Optional[float] = None,
    ) -> AsyncLogStream:
        """Follow the sandbox's logs: the last ``tail`` lines written so far (none by
        default), then each new line as it is written, until the sandbox is gone. Use as a
        context manager (``async with``, ``async for``)."""
        req = ops.follow_logs(self.id, tail=tail, since=since, source=source, timeout=timeout)
        return AsyncLogStream(self._client, req)

    async def usage(self) -> Optional[Usage]:
        """Memory, CPU and process counts right now."""
        return await self._client._call(ops.usage(self.id))

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
        req = ops.exec_stream(self.id, body)
        run = ExecStreamRun(on_stdout, on_stderr, on_start)
        async with self._client.stream(req) as resp:
            async for line in self._client._lines(resp):
                for cb, value in run.feed(line):
                    await _maybe_await(cb(value))
                if run.exit_code is not None:
                    return run.exit_code
        raise run.ended()

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
            raise self._client._transport_error(e) from e
        p.raise_for_proxy(resp.status_code, resp.headers, resp.content, self._client.config)
        return resp

    async def browser_url(
        self, port: int, path: str = "/", *, ttl_seconds: Optional[int] = None
    ) -> str:
        """A signed, short-lived link a browser can open (see
        :meth:`hutch.Sandbox.browser_url`)."""
        return await self._client._call(ops.browser_url(self.id, port, path, ttl_seconds))

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

        url, options = self._pty_connect(cmd, cols, rows, user, cwd, open_timeout)
        try:
            ws = await connect(url, **options)
        except Exception as e:  # noqa: BLE001 - mapped below
            raise p.ws_error(e, self._client.config) from e
        return AsyncPtySession(ws)

    async def kill(self) -> None:
        """Destroy the sandbox. Killing a sandbox twice is not an error."""
        try:
            await self._client._call(ops.kill(self.id))
        except errors.SandboxNotFound:
            pass
        self._info.state = "stopped"

    async def _lifecycle(self, action: str, body: Any = None) -> SandboxInfo:
        return self._set(await self._client._call(ops.lifecycle(self.id, action, body)))

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

    async def snapshot(self, name: Optional[str] = None) -> Snapshot:
        """Take a snapshot (named by its id without ``name``); start sandboxes from it with
        ``create(snapshot=snap.id)`` or by a unique name.

        On ``ns`` it is filesystem-level (``kind == "filesystem"``): files, not processes,
        memory, ``/tmp`` or ``/dev/shm``. ``name``: 1–64 characters of ``[A-Za-z0-9._-]``.
        See :meth:`hutch.Sandbox.snapshot`.
        """
        return await self._client._call(ops.snapshot(self.id, name))

    async def fork(self, count: int = 1, *, mode: str = "disk") -> List[AsyncSandbox]:
        """Create ``count`` (1–16) children of this sandbox.

        ``mode="disk"``: each child gets a copy-on-write view of this sandbox's files and a
        fresh agent (processes are not carried); ``"live"`` needs the ``vm`` backend and is
        refused on ``ns`` with :class:`~hutch.errors.InvalidRequest` (422). See
        :meth:`hutch.Sandbox.fork`.
        """
        children = await self._client._call(ops.fork(self.id, count, mode))
        return [AsyncSandbox(info, self._client) for info in children]

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
        call = ops.explore(self.id, commands, timeout=timeout, keep=keep, score_regex=score_regex)
        return await self._client._call(call)

    async def update_network(
        self,
        egress: Optional[str] = None,
        *,
        allow: Optional[Sequence[str]] = None,
        deny: Optional[Sequence[str]] = None,
    ) -> None:
        """Change the egress policy at once, including for open connections (see the sync
        :meth:`hutch.Sandbox.update_network`)."""
        info = await self._client._call(ops.update_network(self.id, egress, allow, deny))
        if info is not None:
            self._set(info)

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
