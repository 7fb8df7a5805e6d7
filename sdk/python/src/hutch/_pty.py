"""Interactive terminals: :class:`PtySession` (sync) and :class:`AsyncPtySession`, which
share their state and the bookkeeping of ``read_until`` and ``wait`` (:class:`PtyBase`)
and differ only in how they receive from the WebSocket."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Callable, Optional, Union

from . import _protocol as p
from . import errors


class Deadline:
    """A point in time ``timeout`` seconds from now (never, for ``None``) on clock ``now``."""

    def __init__(self, timeout: Optional[float], now: Callable[[], float]) -> None:
        self._now = now
        self._at = None if timeout is None else now() + timeout

    def left(self) -> Optional[float]:
        """Seconds left (negative once passed); ``None`` for no deadline."""
        return None if self._at is None else self._at - self._now()


class PtyBase:
    """A terminal session's state, shared by :class:`hutch.PtySession` and
    :class:`hutch.AsyncPtySession`; they add the WebSocket I/O."""

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

    @staticmethod
    def _resize_message(cols: int, rows: int) -> str:
        return json.dumps({"type": "resize", "cols": cols, "rows": rows})

    def _output(self, msg: Any) -> Optional[bytes]:
        """One WebSocket message: output (bytes), or ``None`` for a control message, which
        is applied (``exit`` sets :attr:`exit_code`, ``error`` sets :attr:`error`)."""
        if isinstance(msg, bytes):
            return msg
        try:
            ctl = json.loads(msg)
        except ValueError:
            return None
        if ctl.get("type") == "exit":
            self.exit_code = int(ctl.get("exit_code", -1))
        elif ctl.get("type") == "error":
            self.error = str(ctl.get("message", "terminal session failed"))
        return None

    def _take_pending(self) -> bytes:
        out, self._pending = self._pending, b""
        return out


class ReadUntil:
    """The bookkeeping of ``read_until``, the caller only receiving chunks::

        reader = ReadUntil(pty, pattern, timeout, clock)
        while (out := reader.match()) is None:
            left = reader.left()
            try:
                chunk = receive(left)
            except errors.TimeoutError:
                raise reader.timed_out() from None
            reader.add(chunk)

    Whatever was read and not returned stays pending on the session for its next read.
    """

    def __init__(
        self,
        pty: PtyBase,
        pattern: Union[str, bytes],
        timeout: Optional[float],
        now: Callable[[], float],
    ) -> None:
        self._pty = pty
        self._pattern = pattern
        self._needle = p.to_bytes(pattern)
        self._deadline = Deadline(timeout, now)
        self._buf = pty._take_pending()

    def match(self) -> Optional[bytes]:
        """Everything up to and including the pattern, once it has arrived."""
        if self._needle not in self._buf:
            return None
        end = self._buf.index(self._needle) + len(self._needle)
        self._pty._pending = self._buf[end:]
        return self._buf[:end]

    def left(self) -> Optional[float]:
        """Seconds left to wait (``None``: forever); raises once the time is up."""
        left = self._deadline.left()
        if left is not None and left <= 0:
            raise self.timed_out()
        return left

    def timed_out(self) -> errors.TimeoutError:
        """The error to raise when the pattern did not arrive in time."""
        self._pty._pending = self._buf
        return errors.TimeoutError(f"{self._pattern!r} did not appear in the terminal in time")

    def add(self, chunk: bytes) -> None:
        """Take in what was read; an empty chunk (the terminal closed) raises."""
        if not chunk:
            self._pty._pending = self._buf
            raise errors.HutchError(
                f"the terminal closed (exit code {self._pty.exit_code}) before "
                f"{self._pattern!r} appeared"
            )
        self._buf += chunk


class PtySession(PtyBase):
    """An interactive terminal in a sandbox (from :meth:`Sandbox.pty`).

    ``read`` returns raw terminal bytes (with echo, prompts and escape sequences) as the
    program writes them; ``send`` types into it::

        with sb.pty() as term:
            term.send("echo hi-$((1+1))\\n")
            term.read_until("hi-2")
    """

    def send(self, data: Union[str, bytes]) -> None:
        """Type ``data`` (text is sent as UTF-8)."""
        self._ws.send(p.to_bytes(data))

    def resize(self, cols: int, rows: int) -> None:
        """Change the terminal size."""
        self._ws.send(self._resize_message(cols, rows))

    def _recv(self, timeout: Optional[float]) -> bytes:
        from websockets.exceptions import ConnectionClosed

        while not self._done:
            try:
                msg = self._ws.recv(timeout=timeout)
            except TimeoutError as e:
                raise errors.TimeoutError("no terminal output in time") from e
            except ConnectionClosed:
                self._done = True
                break
            out = self._output(msg)
            if out is not None:
                return out
        return b""

    def read(self, timeout: Optional[float] = None) -> bytes:
        """The next chunk of output; ``b""`` once the program has exited.

        Args:
            timeout: Seconds to wait (``None``: forever).

        Raises:
            TimeoutError: Nothing arrived in time.
        """
        return self._take_pending() or self._recv(timeout)

    def read_until(self, pattern: Union[str, bytes], timeout: Optional[float] = 10.0) -> bytes:
        """Read until ``pattern`` appears; returns everything up to and including it.

        Output after the pattern is kept for the next read.

        Raises:
            TimeoutError: The pattern did not appear within ``timeout`` seconds.
            HutchError: The program exited first.
        """
        reader = ReadUntil(self, pattern, timeout, time.monotonic)
        while (out := reader.match()) is None:
            left = reader.left()
            try:
                chunk = self._recv(left)
            except errors.TimeoutError:
                raise reader.timed_out() from None
            reader.add(chunk)
        return out

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Discard output until the program exits; returns its exit code."""
        deadline = Deadline(timeout, time.monotonic)
        self._pending = b""
        while not self._done:
            left = deadline.left()
            self._recv(None if left is None else max(0.0, left))
        return self.exit_code

    def close(self) -> None:
        """Close the terminal; the program is killed if still running."""
        self._done = True
        try:
            self._ws.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass

    def __enter__(self) -> PtySession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncPtySession(PtyBase):
    """An interactive terminal, driven from asyncio; see :class:`hutch.PtySession`."""

    async def send(self, data: Union[str, bytes]) -> None:
        """Type ``data`` (text is sent as UTF-8)."""
        await self._ws.send(p.to_bytes(data))

    async def resize(self, cols: int, rows: int) -> None:
        """Change the terminal size."""
        await self._ws.send(self._resize_message(cols, rows))

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
            out = self._output(msg)
            if out is not None:
                return out
        return b""

    async def read(self, timeout: Optional[float] = None) -> bytes:
        """The next chunk of output; ``b""`` once the program has exited."""
        return self._take_pending() or await self._recv(timeout)

    async def read_until(
        self, pattern: Union[str, bytes], timeout: Optional[float] = 10.0
    ) -> bytes:
        """Read until ``pattern`` appears; returns everything up to and including it."""
        reader = ReadUntil(self, pattern, timeout, asyncio.get_running_loop().time)
        while (out := reader.match()) is None:
            left = reader.left()
            try:
                chunk = await self._recv(left)
            except errors.TimeoutError:
                raise reader.timed_out() from None
            reader.add(chunk)
        return out

    async def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Discard output until the program exits; returns its exit code."""
        deadline = Deadline(timeout, asyncio.get_running_loop().time)
        self._pending = b""
        while not self._done:
            left = deadline.left()
            await self._recv(None if left is None else max(0.0, left))
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
