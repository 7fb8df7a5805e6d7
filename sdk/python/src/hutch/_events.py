"""Lifecycle event subscriptions: :class:`EventStream` (sync) and :class:`AsyncEventStream`,
both reading ``GET /v1/events`` through :class:`EventLines`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, Optional

import httpx

from . import _ops as ops
from . import _protocol as p
from . import errors
from .models import LifecycleEvent

if TYPE_CHECKING:
    from .aio import AsyncClient
    from .sandbox import Client


class EventLines:
    """Turns the lines of ``/v1/events`` into :class:`LifecycleEvent` s."""

    def __init__(self) -> None:
        self._sse = p.SSEParser()

    def feed(self, line: str) -> Optional[LifecycleEvent]:
        """Feed one line; returns an event when one is complete (malformed ones are skipped)."""
        ev = self._sse.feed(line)
        if ev is None:
            return None
        try:
            doc = json.loads(ev[1])
        except ValueError:
            return None
        return LifecycleEvent.from_json(doc, ev[0])


class EventStream:
    """An open ``GET /v1/events`` subscription; iterate it for :class:`LifecycleEvent` s."""

    def __init__(self, client: Client, timeout: Optional[float]) -> None:
        self._client = client
        self._timeout = timeout
        self._cm: Any = None
        self._resp: Optional[httpx.Response] = None

    def open(self) -> EventStream:
        """Start the subscription (done by ``with`` or the first iteration)."""
        if self._resp is None:
            self._cm = self._client.stream(ops.events(self._timeout))
            self._resp = self._cm.__enter__()
        return self

    def __enter__(self) -> EventStream:
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Iterator[LifecycleEvent]:
        resp = self.open()._resp
        assert resp is not None
        events = EventLines()
        with self._client._transport_errors():
            for line in resp.iter_lines():
                ev = events.feed(line)
                if ev is not None:
                    yield ev

    def close(self) -> None:
        """End the subscription."""
        if self._cm is not None:
            cm, self._cm, self._resp = self._cm, None, None
            try:
                cm.__exit__(None, None, None)
            except errors.HutchError:
                pass


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
            self._cm = self._client.stream(ops.events(self._timeout))
            self._resp = await self._cm.__aenter__()
        return self

    async def __aenter__(self) -> AsyncEventStream:
        return await self.open()

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def __aiter__(self) -> AsyncIterator[LifecycleEvent]:
        await self.open()
        assert self._resp is not None
        events = EventLines()
        async for line in self._client._lines(self._resp):
            ev = events.feed(line)
            if ev is not None:
                yield ev

    async def aclose(self) -> None:
        """End the subscription."""
        if self._cm is not None:
            cm, self._cm, self._resp = self._cm, None, None
            try:
                await cm.__aexit__(None, None, None)
            except errors.HutchError:
                pass
