"""Server-sent event subscriptions, sync and async: lifecycle events (:class:`EventStream`,
:class:`AsyncEventStream`, ``GET /v1/events``) and followed logs (:class:`LogStream`,
:class:`AsyncLogStream`, ``GET /v1/sandboxes/{id}/logs?follow=true``), each an
:class:`SseSubscription` of its request and what to make of each event."""

from __future__ import annotations

import json
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Callable,
    Generic,
    Iterator,
    Optional,
    TypeVar,
)

import httpx

from . import _ops as ops
from . import _protocol as p
from . import errors
from .models import LifecycleEvent, LogLine

if TYPE_CHECKING:
    from .aio import AsyncClient
    from .sandbox import Client

T = TypeVar("T")

Parse = Callable[[str, Any], Optional[T]]
"""What to make of one event (its name and JSON data); ``None`` skips it."""


class SseLines(Generic[T]):
    """Turns the lines of an SSE answer into items (malformed events are skipped)."""

    def __init__(self, parse: Parse[T]) -> None:
        self._sse = p.SSEParser()
        self._parse = parse

    def feed(self, line: str) -> Optional[T]:
        """Feed one line; returns an item when an event is complete."""
        ev = self._sse.feed(line)
        if ev is None:
            return None
        try:
            doc = json.loads(ev[1])
        except ValueError:
            return None
        return self._parse(ev[0], doc)


def _lifecycle_event(event: str, doc: Any) -> Optional[LifecycleEvent]:
    return LifecycleEvent.from_json(doc, event)


def _log_line(event: str, doc: Any) -> Optional[LogLine]:
    return LogLine.from_json(doc) if event == "log" else None


class SseSubscription(Generic[T]):
    """An open SSE answer of a :class:`hutch.Client`; iterate it for items."""

    def __init__(self, client: Client, request: p.Request, parse: Parse[T]) -> None:
        self._client = client
        self._request = request
        self._parse = parse
        self._cm: Any = None
        self._resp: Optional[httpx.Response] = None

    def open(self) -> Any:
        """Start the subscription (done by ``with`` or the first iteration)."""
        if self._resp is None:
            self._cm = self._client.stream(self._request)
            self._resp = self._cm.__enter__()
        return self

    def __enter__(self) -> Any:
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Iterator[T]:
        resp = self.open()._resp
        assert resp is not None
        lines = SseLines(self._parse)
        with self._client._transport_errors():
            for line in resp.iter_lines():
                item = lines.feed(line)
                if item is not None:
                    yield item

    def close(self) -> None:
        """End the subscription."""
        if self._cm is not None:
            cm, self._cm, self._resp = self._cm, None, None
            try:
                cm.__exit__(None, None, None)
            except errors.HutchError:
                pass


class AsyncSseSubscription(Generic[T]):
    """An open SSE answer of a :class:`hutch.AsyncClient`; ``async for`` yields items."""

    def __init__(self, client: AsyncClient, request: p.Request, parse: Parse[T]) -> None:
        self._client = client
        self._request = request
        self._parse = parse
        self._cm: Any = None
        self._resp: Optional[httpx.Response] = None

    async def open(self) -> Any:
        """Start the subscription (done by ``async with`` or the first iteration)."""
        if self._resp is None:
            self._cm = self._client.stream(self._request)
            self._resp = await self._cm.__aenter__()
        return self

    async def __aenter__(self) -> Any:
        return await self.open()

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def __aiter__(self) -> AsyncIterator[T]:
        await self.open()
        assert self._resp is not None
        lines = SseLines(self._parse)
        async for line in self._client._lines(self._resp):
            item = lines.feed(line)
            if item is not None:
                yield item

    async def aclose(self) -> None:
        """End the subscription."""
        if self._cm is not None:
            cm, self._cm, self._resp = self._cm, None, None
            try:
                await cm.__aexit__(None, None, None)
            except errors.HutchError:
                pass


class EventStream(SseSubscription[LifecycleEvent]):
    """An open ``GET /v1/events`` subscription; iterate it for :class:`LifecycleEvent` s."""

    def __init__(self, client: Client, timeout: Optional[float]) -> None:
        super().__init__(client, ops.events(timeout), _lifecycle_event)


class AsyncEventStream(AsyncSseSubscription[LifecycleEvent]):
    """An open ``GET /v1/events`` subscription; ``async for`` yields :class:`LifecycleEvent` s."""

    def __init__(self, client: AsyncClient, timeout: Optional[float]) -> None:
        super().__init__(client, ops.events(timeout), _lifecycle_event)


class LogStream(SseSubscription[LogLine]):
    """A sandbox's followed logs; iterate it for :class:`LogLine` s. It ends when the sandbox
    is gone."""

    def __init__(self, client: Client, request: p.Request) -> None:
        super().__init__(client, request, _log_line)


class AsyncLogStream(AsyncSseSubscription[LogLine]):
    """A sandbox's followed logs; ``async for`` yields :class:`LogLine` s. It ends when the
    sandbox is gone."""

    def __init__(self, client: AsyncClient, request: p.Request) -> None:
        super().__init__(client, request, _log_line)
