"""The synchronous client: `Client`, `Sandbox`, `Files`, `PtySession` and `EventStream`."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from types import TracebackType
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
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
from ._code import CodeMethods
from ._exec import ExecMethods
from ._core import ClientBase, ExecStreamRun, PathLike, SandboxBase
from ._events import EventStream, LogStream
from ._files import Files
from ._pty import PtySession
from ._templates import Templates
from ._tenants import TenantMethods
from .models import (
    ExploreResult,
    LogLine,
    SandboxInfo,
    Snapshot,
    Template,
    Usage,
    Volume,
)

__all__ = ["Client", "Sandbox", "Files", "PtySession", "EventStream"]

T = TypeVar("T")


class Client(TenantMethods, ClientBase):
    """A connection to a Hutch server, shared by the sandboxes created through it.

    Most code never builds one: :meth:`Sandbox.create` and friends make their own from
    ``HUTCH_URL`` / ``HUTCH_API_KEY`` (or ``<state dir>/admin.key``). Build one to share a
    connection pool between many sandboxes, or to reach server-wide calls such as
    :meth:`templates` and :meth:`events`.

    Args:
        url: Server base URL. Default ``$HUTCH_URL``, else ``http://127.0.0.1:7700``.
        api_key: Bearer key. Default ``$HUTCH_API_KEY``, else ``<state dir>/admin.key``.
        timeout: Default per-request timeout in seconds (commands get their own, see
            :meth:`Sandbox.exec`).
        state_dir: Where to look for ``admin.key`` (default: as ``hutch serve`` picks it).
        tenant: The tenant an admin key acts for (sent as ``X-Hutch-Tenant``; default
            ``$HUTCH_TENANT``).
    """

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: float = 30.0,
        state_dir: Optional[PathLike] = None,
        tenant: Optional[str] = None,
    ) -> None:
        self._http: httpx.Client = httpx.Client(
            **self._setup(url, api_key, timeout, state_dir, tenant)
        )
        self._lock = threading.Lock()

    # -- plumbing ---------------------------------------------------------------------

    def _raise_for(self, resp: httpx.Response, req: p.Request) -> None:
        if resp.status_code >= 400:
            raise self._http_error(resp.status_code, resp.read(), req)

    @contextmanager
    def _transport_errors(self) -> Iterator[None]:
        try:
            yield
        except httpx.TransportError as e:
            raise self._transport_error(e) from e

    def request(self, req: p.Request) -> httpx.Response:
        """Send ``req``; raise the mapped :class:`~hutch.errors.HutchError` on a non-2xx answer."""
        self._check_open()
        with self._transport_errors():
            resp = self._http.send(self._build(req))
        self._raise_for(resp, req)
        return resp

    def request_json(self, req: p.Request) -> Any:
        """Send ``req`` and decode its JSON answer."""
        return self.request(req).json()

    def _call(self, call: ops.Call[T]) -> T:
        return call.parse(self.request(call.request))

    def _all(self, listing: ops.Listing[T]) -> List[T]:
        """Every record of a paginated listing, following the server's cursors."""
        items: List[T] = []
        cursor: Optional[str] = None
        while True:
            page, cursor = listing.parse(self.request(listing.page(cursor)))
            items.extend(page)
            if cursor is None:
                return items

    @contextmanager
    def stream(self, req: p.Request) -> Iterator[httpx.Response]:
        """Send ``req`` and yield the response with its body unread (for SSE)."""
        self._check_open()
        with self._transport_errors():
            resp = self._http.send(self._build(req), stream=True)
            try:
                self._raise_for(resp, req)
                yield resp
            finally:
                resp.close()

    def _retain(self) -> None:
        with self._lock:
            self._refs += 1

    def _release(self) -> None:
        with self._lock:
            self._refs -= 1
            last = self._refs <= 0
        if last and self._implicit:
            self.close()

    def close(self) -> None:
        """Close the connection pool. Sandboxes using this client stop working."""
        if not self._closed:
            self._closed = True
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- server-wide calls --------------------------------------------------------------

    def health(self) -> Dict[str, Any]:
        """``GET /healthz``: ``{"status": "ok", "version": …}``. Needs no key."""
        return self._call(ops.health())

    @property
    def templates(self) -> Templates:
        """The server's templates: ``client.templates()`` lists them;
        ``client.templates.build(name, context_dir)`` builds one from a Dockerfile,
        ``.build_from_image(name, ref)`` and ``.upload_image(name, path)`` from an image,
        ``.get(name)``, ``.update(name, start=…)`` and ``.delete(name)`` read, change and
        delete one."""
        return Templates(self)

    def events(self, *, timeout: Optional[float] = None) -> EventStream:
        """Subscribe to lifecycle events (``sandbox.created``, ``sandbox.killed``, …).

        Use as a context manager; the subscription is live once the ``with`` block starts::

            with client.events() as events:
                for ev in events:
                    print(ev.type, ev.sandbox_id)

        Args:
            timeout: Longest wait for the next event in seconds (``None``: forever);
                exceeding it raises :class:`~hutch.errors.TimeoutError`.
        """
        return EventStream(self, timeout)

    def snapshots(self) -> List[Snapshot]:
        """The named snapshots this key's tenant may see, oldest first.

        Take one with :meth:`Sandbox.snapshot`. The hidden snapshots behind forks are not
        listed.
        """
        return self._all(ops.snapshots())

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        """One snapshot, with the sandboxes that currently use it (:attr:`Snapshot.used_by`).

        Raises:
            NotFoundError: No such snapshot (or another tenant's).
        """
        return self._call(ops.get_snapshot(snapshot_id))

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete a snapshot and its files.

        Sandboxes created from a snapshot use its files in place (they are not copied), so
        the server refuses while any of them still exists, running, paused or hibernated:
        kill them first (:attr:`Snapshot.used_by` from :meth:`get_snapshot` lists them). The
        sandbox the snapshot was taken of does not count.

        Raises:
            ConflictError: Sandboxes created from it still exist (409).
            NotFoundError: No such snapshot.
        """
        self._call(ops.delete_snapshot(snapshot_id))

    def create_volume(self, name: str, size_mib: int = 1024) -> Volume:
        """Create a durable volume: a fixed-size filesystem that outlives sandboxes.

        Mount it with ``Sandbox.create(volumes=[{"volume": vol.id, "path": "/data"}])``
        (the name works as well as the id). Its data survives the sandboxes; writes beyond
        ``size_mib`` fail inside the sandbox with ``ENOSPC``.

        Args:
            name: 1–64 characters of ``A-Z a-z 0-9 _ . -``, not starting with ``.`` or
                ``vol_``; unique per tenant.
            size_mib: Size limit in MiB, 4–1048576.

        Raises:
            InvalidRequest: A bad name or size.
            ConflictError: A volume with this name exists already.
        """
        return self._call(ops.create_volume(name, size_mib))

    def volumes(self) -> List[Volume]:
        """The volumes this key's tenant may see."""
        return self._all(ops.volumes())

    def get_volume(self, volume: str) -> Volume:
        """One volume, by id (``vol_…``) or name, with where it is attached
        (:attr:`Volume.attached`) and, while mounted, :attr:`Volume.used_bytes`.

        Raises:
            NotFoundError: No such volume (or another tenant's).
        """
        return self._call(ops.get_volume(volume))

    def delete_volume(self, volume: str) -> None:
        """Delete a volume, by id or name, and its data.

        The server refuses while the volume is attached to a sandbox, running, paused or
        hibernated: kill those first (:attr:`Volume.attached` from :meth:`get_volume` lists
        them).

        Raises:
            ConflictError: The volume is attached to a sandbox (409).
            NotFoundError: No such volume.
        """
        self._call(ops.delete_volume(volume))


def _client_for(client: Optional[Client], url: Optional[str], api_key: Optional[str]) -> Client:
    if client is not None:
        return client
    c = Client(url, api_key)
    c._implicit = True
    return c


def _first_call(c: Client, call: ops.Call[T]) -> T:
    """``c._call(call)``, closing ``c`` if that fails and ``c`` was made for this call."""
    try:
        return c._call(call)
    except BaseException:
        if c._implicit:
            c.close()
        raise


class Sandbox(ExecMethods, CodeMethods, SandboxBase[Client]):
    """A sandbox on a Hutch server.

    Create one with :meth:`create` (best as a context manager, which kills it when the block
    ends unless it is persistent), attach to an existing one with :meth:`connect`, or find
    them with :meth:`list`::

        with Sandbox.create(template="base") as sb:
            print(sb.exec(["python3", "-c", "print(6*7)"]).stdout)   # 42
    """

    def __init__(self, info: SandboxInfo, client: Client) -> None:
        """Wrap an existing sandbox; prefer :meth:`create`, :meth:`connect` or :meth:`list`."""
        super().__init__(info, client)
        self.files = Files(self)
        """File operations inside the sandbox: see :class:`Files`."""

    # -- construction ---------------------------------------------------------------------

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
        client: Optional[Client] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> Sandbox:
        """Create a sandbox; it is ``running`` when this returns.

        Every argument is optional; the server fills in the template's defaults.

        Args:
            template: Template name (see :meth:`Client.templates`); the server's default if unset.
            isolation: ``"auto"``, ``"ns"`` or ``"vm"``.
            ttl_seconds: Idle lifetime: the sandbox is reaped after this long without a call.
            persistent: Never reap the sandbox (and do not kill it when a ``with`` block ends).
            metadata: String labels, filterable with :meth:`list`.
            env: Environment for every command.
            cpus: CPU bandwidth in cores (may be fractional).
            memory_mib: Memory limit.
            disk_mib: Disk size.
            pids_max: Process limit.
            network: ``{"egress": "allow" | "deny" | "none", "allow": […], "deny": […]}``:
                the egress policy, enforced on the host (IPv4 addresses, CIDRs, names and
                ``*.suffix`` wildcards; an allow match wins over a deny match, which wins
                over ``egress``). Default ``allow`` on a server with networking; a server
                started with ``--network off`` accepts only ``{"egress": "none"}``.
            volumes: Durable volumes to mount (create them with :meth:`Client.create_volume`):
                ``[{"volume": "vol_… or name", "path": "/data", "read_only": False}]`` or
                :class:`~hutch.VolumeMount` objects. Data written there outlives the sandbox
                (writes beyond the volume's size fail with ``ENOSPC``). A volume can be
                attached read-write to one sandbox at a time, or read-only to any number: else
                409. :attr:`SandboxInfo.volumes` lists the mounts (by id). Forks get only the
                read-only ones.
            snapshot: Start from this snapshot (its id ``snap_…`` from :meth:`snapshot`, or
                its name while no other of your snapshots has it; several raise
                ``ConflictError`` listing their ids) instead of the bare template: the sandbox gets the snapshot's files, copy-on-write (nothing
                is copied), over the snapshot's template, and the resources and environment of
                the snapshot's source sandbox as defaults (other arguments override them).
                ``template`` may be left out (a different one is 422). On ``ns`` no process is
                restored: the sandbox starts with a fresh agent. While the sandbox exists the
                snapshot cannot be deleted.
            idle_hibernate_seconds: Hibernate the sandbox after this many seconds without
                exec, file or PTY calls, with no client connected and under 1 % CPU use
                (``0``/unset: never). Meant for persistent sandboxes; the next call wakes it.
                On ``ns`` its processes end with the hibernation (see :meth:`hibernate`).
            client: Use this :class:`Client` (else one is made from ``url`` / ``api_key`` /
                the environment and closed with the sandbox).
            url: Server URL, when no ``client`` is given.
            api_key: API key, when no ``client`` is given.

        Raises:
            InvalidRequest: A value the server refuses (e.g. a relative volume path, or one
                under ``/proc``).
            NotFoundError: No such template, snapshot or volume.
            ConflictError: The template is not ready, or a volume is attached elsewhere in a
                way that excludes this mount.
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
        c = _client_for(client, url, api_key)
        return cls(_first_call(c, call), c)

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        *,
        client: Optional[Client] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> Sandbox:
        """Attach to an existing sandbox by id.

        Raises:
            SandboxNotFound: No such sandbox.
        """
        c = _client_for(client, url, api_key)
        return cls(_first_call(c, ops.get_sandbox(sandbox_id)), c)

    @classmethod
    def list(
        cls,
        *,
        metadata: Optional[Mapping[str, str]] = None,
        state: Optional[str] = None,
        client: Optional[Client] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
    ) -> List[Sandbox]:
        """List the sandboxes visible to this key.

        Args:
            metadata: Keep only sandboxes whose metadata has all these key/value pairs.
            state: Keep only sandboxes in this state (e.g. ``"running"``).
        """
        c = _client_for(client, url, api_key)
        try:
            sandboxes = [cls(info, c) for info in c._all(ops.list_sandboxes(metadata, state))]
        finally:
            if c._implicit and c._refs == 0:
                c.close()
        return sandboxes

    # -- state ------------------------------------------------------------------------------

    def refresh(self) -> SandboxInfo:
        """Fetch the sandbox's current state (this also refreshes its TTL).

        Raises:
            SandboxNotFound: It was killed or expired.
        """
        return self._set(self._client._call(ops.get_sandbox(self.id)))

    def update(
        self,
        *,
        ttl_seconds: Optional[int] = None,
        persistent: Optional[bool] = None,
        metadata: Optional[Mapping[str, str]] = None,
        idle_hibernate_seconds: Optional[int] = None,
    ) -> SandboxInfo:
        """Change the TTL, persistence, metadata (which replaces the whole map) or idle
        hibernation delay (``0`` turns it off; see :meth:`create`)."""
        call = ops.update_sandbox(
            self.id,
            ttl_seconds=ttl_seconds,
            persistent=persistent,
            metadata=metadata,
            idle_hibernate_seconds=idle_hibernate_seconds,
        )
        return self._set(self._client._call(call))

    def set_ttl(self, ttl_seconds: int) -> SandboxInfo:
        """Set the idle lifetime; the expiry moves to now + ``ttl_seconds``."""
        return self.update(ttl_seconds=ttl_seconds)

    def set_persistent(self, persistent: bool = True) -> SandboxInfo:
        """Make the sandbox persistent (never reaped, kept after a ``with`` block) or not."""
        return self.update(persistent=persistent)

    def set_metadata(self, metadata: Mapping[str, str]) -> SandboxInfo:
        """Replace the sandbox's metadata."""
        return self.update(metadata=metadata)

    def logs(
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
        return self._client._call(ops.logs(self.id, tail=tail, since=since, source=source))

    def follow_logs(
        self,
        *,
        tail: Optional[int] = 0,
        since: Optional[p.LogSince] = None,
        source: Union[str, Sequence[str], None] = None,
        timeout: Optional[float] = None,
    ) -> LogStream:
        """Follow the sandbox's logs: the last ``tail`` lines written so far (none by
        default), then each new line as it is written, until the sandbox is gone. Use as a
        context manager."""
        req = ops.follow_logs(self.id, tail=tail, since=since, source=source, timeout=timeout)
        return LogStream(self._client, req)

    def usage(self) -> Optional[Usage]:
        """Memory, CPU and process counts right now (``None`` if the server cannot read them)."""
        return self._client._call(ops.usage(self.id))

    # -- commands ---------------------------------------------------------------------------

    def exec_stream(
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
        """Run a command, calling back with its output as it is produced.

        Callbacks run in this thread, in the order the output arrived, and all of them have
        run before this returns. Output is decoded as UTF-8 incrementally (invalid bytes
        become U+FFFD). If a callback raises, the stream is dropped, which kills the command.

        Args:
            cmd, env, cwd, stdin, timeout, user: As for :meth:`exec`.
            on_stdout: Called with each chunk of standard output.
            on_stderr: Called with each chunk of standard error.
            on_start: Called with the process id once it has started.

        Returns:
            The exit code (124 on timeout, ``128+N`` for signal N).

        Raises:
            SandboxFailed: The sandbox died before the command finished.
        """
        body = p.exec_body(cmd, env=env, cwd=cwd, stdin=stdin, timeout=timeout, user=user)
        req = ops.exec_stream(self.id, body)
        run = ExecStreamRun(on_stdout, on_stderr, on_start)
        with self._client.stream(req) as resp, self._client._transport_errors():
            for line in resp.iter_lines():
                for cb, value in run.feed(line):
                    cb(value)
                if run.exit_code is not None:
                    return run.exit_code
        raise run.ended()

    def pty(
        self,
        cmd: Optional[str] = None,
        *,
        cols: int = 80,
        rows: int = 24,
        user: Optional[str] = None,
        cwd: Optional[str] = None,
        open_timeout: float = 10.0,
    ) -> PtySession:
        """Open an interactive terminal (a WebSocket).

        Args:
            cmd: Program to run with its arguments (default: a login shell). The server
                runs it as ``exec <cmd>`` under ``/bin/sh``, so give one command; wrap
                compound lines as ``"sh -c '…; …'"``.
            cols: Terminal width.
            rows: Terminal height.
            user: User to run as.
            cwd: Working directory.
            open_timeout: Seconds allowed for the handshake.

        Returns:
            A :class:`PtySession`; use it as a context manager so it is closed.
        """
        from websockets.sync.client import connect

        url, options = self._pty_connect(cmd, cols, rows, user, cwd, open_timeout)
        try:
            # `.__enter__()` gives the open connection on every websockets version >= 13.
            ws = connect(url, **options).__enter__()
        except Exception as e:  # noqa: BLE001 - mapped below
            raise p.ws_error(e, self._client.config) from e
        return PtySession(ws)

    # -- ports ------------------------------------------------------------------------------

    def port_request(
        self,
        port: int,
        path: str = "/",
        method: str = "GET",
        **kwargs: Any,
    ) -> httpx.Response:
        """Send an HTTP request to the service on ``port`` inside the sandbox, through the
        server's port proxy, with this client's key. The service's own answer is returned
        whatever its status; Hutch's errors (no such sandbox, nothing listening on the
        port: 502 ``connection_refused``) raise :class:`~hutch.errors.HutchError`.

        ``kwargs`` go to :meth:`httpx.Client.request` (``content``, ``json``, ``headers``,
        ``params``, ``timeout``...).
        """
        url = p.port_path(self.id, port, path)
        with self._client._transport_errors():
            resp = self._client._http.request(method, url, **kwargs)
        p.raise_for_proxy(resp.status_code, resp.headers, resp.content, self._client.config)
        return resp

    def browser_url(self, port: int, path: str = "/", *, ttl_seconds: Optional[int] = None) -> str:
        """A link a browser can open to the service on ``port`` (``path`` below it).

        The server signs a short-lived token for this sandbox and port only
        (``POST /v1/sandboxes/{id}/port-tokens``; ``ttl_seconds`` from 1 to 3600, default
        300). Opening the link trades it for an ``HttpOnly`` cookie for that port; the API
        key is never in it, and the service never sees the token. The link points to the
        server's preview origin (``http://{port}-{id}.localhost:7701/``) when it runs one.
        """
        return self._client._call(ops.browser_url(self.id, port, path, ttl_seconds))

    # -- lifecycle --------------------------------------------------------------------------

    def kill(self) -> None:
        """Destroy the sandbox and everything in it. Killing a sandbox twice is not an error."""
        try:
            self._client._call(ops.kill(self.id))
        except errors.SandboxNotFound:
            pass
        self._info.state = "stopped"

    def _lifecycle(self, action: str, body: Any = None) -> SandboxInfo:
        return self._set(self._client._call(ops.lifecycle(self.id, action, body)))

    def pause(self) -> SandboxInfo:
        """Freeze every process of a running sandbox; it keeps everything but uses no CPU.

        On ``ns`` this is the cgroup freezer: memory, processes, open connections and mounts
        are kept as they are. Until :meth:`resume`, every call on the sandbox except resume,
        kill, get (:meth:`refresh`) and list is refused with 409 (:class:`ConflictError`),
        exec and file calls included. A paused sandbox still expires by its TTL unless it is
        persistent.

        Returns:
            The sandbox, ``state == "paused"``.

        Raises:
            ConflictError: The sandbox is not running.
        """
        return self._lifecycle("pause")

    def resume(self) -> SandboxInfo:
        """Let a paused sandbox run again, exactly where it was.

        Returns:
            The sandbox, ``state == "running"``.

        Raises:
            ConflictError: The sandbox is not paused.
        """
        return self._lifecycle("resume")

    def hibernate(self) -> SandboxInfo:
        """Stop a running sandbox but keep it on disk: it holds no CPU and no memory.

        On ``ns`` **files survive and processes do not**: every process is killed, mounts
        and cgroups are released, and what the sandbox wrote is kept, except ``/tmp`` and
        ``/dev/shm``, which are memory-backed and go with the processes. (Keeping processes
        across hibernation needs the ``vm`` backend.)

        The next exec, file or PTY call wakes it transparently (on ``ns``: a fresh agent over
        the kept files); :meth:`wake` does it explicitly. :meth:`refresh` and :meth:`list`
        do not wake it. It stays hibernated across server restarts and still expires by its
        TTL unless persistent.

        Returns:
            The sandbox, ``state == "hibernated"``.

        Raises:
            ConflictError: The sandbox is not running.
        """
        return self._lifecycle("hibernate")

    def wake(self) -> SandboxInfo:
        """Start a hibernated sandbox again from its state on disk.

        Not needed before exec, file or PTY calls, which wake the sandbox themselves; use it
        to pay the wake-up cost up front. On ``ns`` the sandbox gets a fresh agent over its
        kept files (no process from before the hibernation is running).

        Returns:
            The sandbox, ``state == "running"``, with :attr:`~SandboxInfo.woke_in_ms` set to
            how long the wake took.

        Raises:
            ConflictError: The sandbox is not hibernated.
            SandboxFailed: It could not be started (it stays hibernated with its files).
        """
        return self._lifecycle("wake")

    def snapshot(self, name: Optional[str] = None) -> Snapshot:
        """Take a snapshot that new sandboxes can start from.

        Start one with ``Sandbox.create(snapshot=snap.id)``, or by name
        (``snapshot="warm"``) while no other of your snapshots has that name (several raise
        ``ConflictError`` listing their ids). On ``ns`` a snapshot is
        filesystem-level (``kind == "filesystem"``): the sandbox's files, not its processes,
        memory, ``/tmp`` or ``/dev/shm``. A running sandbox is frozen while its files are read
        (so the snapshot is consistent) and then keeps running; a hibernated one is read from
        disk without being woken. The snapshot does not depend on this sandbox, which can be
        killed at any time; delete it with :meth:`Client.delete_snapshot`.

        Args:
            name: 1–64 characters of ``[A-Za-z0-9._-]``; names need not be unique. Without
                one the snapshot is named by its id.

        Raises:
            InvalidRequest: A bad name.
            ConflictError: The sandbox is paused (or otherwise not running or hibernated).
        """
        return self._client._call(ops.snapshot(self.id, name))

    def fork(self, count: int = 1, *, mode: str = "disk") -> List[Sandbox]:
        """Create ``count`` children of this sandbox, each a sandbox of its own.

        With ``mode="disk"`` (the only mode on ``ns``) the children start from a snapshot of
        this sandbox's files taken once (a running sandbox is frozen meanwhile and then keeps
        running), stacked copy-on-write under each child's own writes: files are carried,
        processes are not (each child starts with a fresh agent). Children get their own id,
        hostname and uid range and this sandbox's template, resources, environment,
        metadata, TTL, persistence and idle setting; :attr:`SandboxInfo.forked_from` names
        this sandbox. Parent and children never see each other's later writes.

        Args:
            count: How many children, 1–16.
            mode: ``"disk"``, or ``"live"`` (memory and running processes too), which needs
                the ``vm`` backend: on ``ns`` it is refused with 422.

        Returns:
            The children, ``running``. Kill them (or use them as context managers) when done.

        Raises:
            InvalidRequest: ``count`` out of range, or ``mode="live"`` on ``ns``.
            ConflictError: The sandbox is paused (or otherwise not running or hibernated).
            QuotaExceeded: The children would together need more memory than the host has.
        """
        children = self._client._call(ops.fork(self.id, count, mode))
        return [Sandbox(info, self._client) for info in children]

    def explore(
        self,
        commands: Sequence[p.Command],
        *,
        timeout: Optional[float] = None,
        keep: str = "winner",
        score_regex: Optional[str] = None,
    ) -> ExploreResult:
        """Try several commands side by side, each in its own fork, and keep the best fork.

        The server disk-forks this sandbox once per command (see :meth:`fork`: files are
        carried, processes are not), runs every command in its own child in parallel, scores
        each outcome, keeps the winner's child as an independent sandbox (``forked_from``
        this one) and destroys the others. This sandbox is unchanged.

        Args:
            commands: 1–16 commands; a string runs under ``/bin/sh -c``, a list runs that
                program directly.
            timeout: Seconds each command may run before it is killed (exit code 124,
                ``timed_out``); the server's default is 60, at most 3600.
            keep: Which child survives; only ``"winner"`` is accepted.
            score_regex: Score each command by the number the first capture group of this
                regex captures in its stdout (0 without a match). Default: 1.0 for exit
                status 0, else 0.0. The best score wins, ties going to the lowest index.

        Returns:
            An :class:`ExploreResult`. ``winner.sandbox_id`` is the surviving child: attach
            with ``Sandbox.connect(result.winner.sandbox_id, client=sb.client)`` and kill it
            when done. There is always a winner, even if every command failed.

        Raises:
            InvalidRequest: No or too many commands, a bad timeout, or a regex without a
                capture group.
            ConflictError: The sandbox is paused (or otherwise not running or hibernated).
        """
        call = ops.explore(self.id, commands, timeout=timeout, keep=keep, score_regex=score_regex)
        return self._client._call(call)

    def update_network(
        self,
        egress: Optional[str] = None,
        *,
        allow: Optional[Sequence[str]] = None,
        deny: Optional[Sequence[str]] = None,
    ) -> None:
        """Change the egress policy at once, including for open connections.

        Args:
            egress: ``"allow"``, ``"deny"`` or ``"none"``.
            allow: Hosts, wildcards (``*.github.com``) or CIDRs to allow.
            deny: Hosts or CIDRs to deny.

        Raises:
            InvalidRequest: A malformed policy (400) or entry (422: IPv6, a bad name).
            ConflictError: The sandbox was created with ``egress: "none"``; it cannot gain a
                network.
        """
        info = self._client._call(ops.update_network(self.id, egress, allow, deny))
        if info is not None:
            self._set(info)

    # -- cleanup ----------------------------------------------------------------------------

    def close(self) -> None:
        """Release the connection (the sandbox keeps running). Idempotent."""
        if not self._released:
            self._released = True
            self._client._release()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        """Kill the sandbox unless it is persistent, even when the block raised."""
        try:
            if not self._info.persistent:
                try:
                    self.kill()
                except errors.HutchError:
                    if exc_type is None:
                        raise
                    # The block's own exception is the one to report.
        finally:
            self.close()
