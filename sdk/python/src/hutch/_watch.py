"""File watches (``GET /v1/sandboxes/{id}/files/watch`` as server-sent events):
:class:`FileWatch` for :meth:`hutch.Files.watch` and :class:`AsyncFileWatch` for
:meth:`hutch.AsyncFiles.watch`.

A watch is armed when ``watch()`` returns (the server's ``ready`` event has arrived), so
changes made after it are reported. Iterating yields :class:`~hutch.models.FileEvent` s; a
``warning`` (events may have been missed) is kept in :attr:`FileWatch.warnings`; ``end``
(the directory went away) ends the iteration with :attr:`FileWatch.end_reason` set; an
``error`` (the sandbox stopped or was deleted) is raised. Closing the watch (``with``, or
:meth:`FileWatch.stop`) ends it inside the sandbox."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, AsyncIterator, Dict, Iterator, List, Optional

from . import _ops as ops
from . import _protocol as p
from . import errors
from .models import FileEvent

if TYPE_CHECKING:
    from .aio import AsyncClient
    from .sandbox import Client


class _WatchEvents:
    """Turns SSE lines of a watch into its state and events."""

    def __init__(self) -> None:
        self._sse = p.SSEParser()
        self.ready: Dict[str, Any] = {}
        self.warnings: List[Dict[str, Any]] = []
        self.end_reason: Optional[str] = None

    def feed(self, line: str) -> Optional[Any]:
        """One line; returns ``"ready"``, a :class:`FileEvent`, ``"end"`` or ``None``."""
        ev = self._sse.feed(line)
        if ev is None:
            return None
        name, data = ev
        try:
            doc = json.loads(data)
        except ValueError:
            return None
        if name == "ready":
            self.ready = doc
            return "ready"
        if name == "event":
            return FileEvent.from_json(doc)
        if name == "warning":
            self.warnings.append(doc)
            return None
        if name == "end":
            self.end_reason = str(doc.get("reason") or "the watch ended")
            return "end"
        if name == "error":
            raise errors.from_event(doc)
        return None


class FileWatch:
    """A running watch of a sandbox directory; iterate it for :class:`FileEvent` s."""

    def __init__(
        self, client: Client, sandbox_id: str, path: str, recursive: bool, include_entry: bool
    ) -> None:
        self._client = client
        self._state = _WatchEvents()
        self._cm: Any = client.stream(ops.watch_files(sandbox_id, path, recursive, include_entry))
        resp = self._cm.__enter__()
        self._lines: Iterator[str] = resp.iter_lines()
        try:
            with client._transport_errors():
                for line in self._lines:
                    if self._state.feed(line) == "ready":
                        return
            raise errors.ConnectionError("the watch ended before it was armed")
        except BaseException:
            self.stop()
            raise

    @property
    def ready(self) -> Dict[str, Any]:
        """What the server confirmed: ``path``, ``recursive``, ``watched_dirs``."""
        return self._state.ready

    @property
    def warnings(self) -> List[Dict[str, Any]]:
        """Warnings so far (``{"code": "overflow" | "watch_limit", "message"}``)."""
        return self._state.warnings

    @property
    def end_reason(self) -> Optional[str]:
        """Why the watch ended, once the directory went away."""
        return self._state.end_reason

    def __iter__(self) -> Iterator[FileEvent]:
        if self._cm is None:
            return
        with self._client._transport_errors():
            for line in self._lines:
                item = self._state.feed(line)
                if item == "end":
                    return
                if isinstance(item, FileEvent):
                    yield item

    def __enter__(self) -> FileWatch:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        """End the watch (also done by leaving ``with``)."""
        if self._cm is not None:
            cm, self._cm = self._cm, None
            try:
                cm.__exit__(None, None, None)
            except errors.HutchError:
                pass


class AsyncFileWatch:
    """A running watch of a sandbox directory; ``async for`` yields :class:`FileEvent` s."""

    def __init__(self, client: AsyncClient, request: p.Request) -> None:
        self._client = client
        self._request = request
        self._state = _WatchEvents()
        self._cm: Any = None
        self._lines: Optional[AsyncIterator[str]] = None

    async def _open(self) -> AsyncFileWatch:
        """Start the watch and wait until it is armed (done by ``AsyncFiles.watch``)."""
        self._cm = self._client.stream(self._request)
        resp = await self._cm.__aenter__()
        self._lines = self._client._lines(resp).__aiter__()
        try:
            async for line in self._lines:
                if self._state.feed(line) == "ready":
                    return self
            raise errors.ConnectionError("the watch ended before it was armed")
        except BaseException:
            await self.stop()
            raise

    @property
    def ready(self) -> Dict[str, Any]:
        """What the server confirmed: ``path``, ``recursive``, ``watched_dirs``."""
        return self._state.ready

    @property
    def warnings(self) -> List[Dict[str, Any]]:
        """Warnings so far (``{"code", "message"}``)."""
        return self._state.warnings

    @property
    def end_reason(self) -> Optional[str]:
        """Why the watch ended, once the directory went away."""
        return self._state.end_reason

    async def __aiter__(self) -> AsyncIterator[FileEvent]:
        if self._lines is None:
            return
        async for line in self._lines:
            item = self._state.feed(line)
            if item == "end":
                return
            if isinstance(item, FileEvent):
                yield item

    async def __aenter__(self) -> AsyncFileWatch:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def stop(self) -> None:
        """End the watch (also done by leaving ``async with``)."""
        if self._cm is not None:
            cm, self._cm, self._lines = self._cm, None, None
            try:
                await cm.__aexit__(None, None, None)
            except errors.HutchError:
                pass
