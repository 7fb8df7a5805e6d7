"""Process handles: processes that outlive the call that started them (``docs/processes.md``).

:meth:`hutch.Sandbox.exec` with ``background=True`` (or ``sb.processes.start``) starts one
and returns a :class:`Process`; ``sb.processes.list()`` and ``sb.processes.connect(pid or
tag)`` find them again. A :class:`Process` attaches to read its output (iterate it, or
:meth:`Process.wait` for the collected result), and reaches its stdin, signals and terminal.
:class:`AsyncProcess` and :class:`AsyncProcesses` are the asyncio twins.

The request shapes and the decoding of the output stream are here, once, for both flavours
(sans I/O): :class:`ProcessOutput` turns NDJSON lines into :class:`ProcessEvent` s and
collects them into an :class:`~hutch.ExecResult`.
"""

from __future__ import annotations

import base64
import codecs
import json
import time
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Tuple,
    Union,
)
from urllib.parse import quote

from . import _protocol as p
from . import errors
from ._ops import Call, _listed, _nothing, _one
from .models import ExecResult, ProcessExit, ProcessInfo

if TYPE_CHECKING:
    from .aio import AsyncSandbox
    from .sandbox import Sandbox

ProcessRef = Union[int, str]
"""A process: its pid (``int``), or its tag (``str``; ``"tag:NAME"`` is taken as ``NAME``)."""

Signal = Union[int, str]
"""A signal: a number (1-64) or a name with or without ``SIG`` (``"TERM"``, ``"SIGKILL"``)."""


def process_segment(ref: ProcessRef) -> str:
    """The path segment naming a process: ``42`` or ``tag:NAME`` (percent-encoded)."""
    if isinstance(ref, bool):
        raise TypeError("a process is a pid (int) or a tag (str), not a bool")
    if isinstance(ref, int):
        return str(ref)
    tag = ref[len("tag:") :] if ref.startswith("tag:") else ref
    if not tag:
        raise errors.InvalidRequest("a tag must not be empty")
    return "tag:" + quote(tag, safe="")


def process_path(sandbox_id: str, ref: ProcessRef, suffix: str = "") -> str:
    return p.sandbox_path(sandbox_id, f"/processes/{process_segment(ref)}{suffix}")


def start_body(
    cmd: p.Command,
    *,
    tag: Optional[str],
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    user: Optional[str],
    timeout: Optional[float],
    pty: Optional[Tuple[int, int]],
    stdin: bool,
) -> Dict[str, Any]:
    """The body of ``POST /v1/sandboxes/{id}/processes``."""
    body = p.exec_body(cmd, env=env, cwd=cwd, stdin=None, timeout=timeout, user=user)
    if tag is not None:
        body["tag"] = tag
    if pty is not None:
        cols, rows = pty
        body["pty"] = {"cols": int(cols), "rows": int(rows)}
    if stdin:
        body["stdin"] = True
    return body


def signal_json(signal: Signal) -> Union[int, str]:
    if isinstance(signal, bool) or not isinstance(signal, (int, str)):
        raise TypeError(f"a signal is a number or a name such as 'TERM', got {signal!r}")
    return signal


# -- calls -----------------------------------------------------------------------------------


def start_process(sandbox_id: str, body: Dict[str, Any]) -> Call[ProcessInfo]:
    request = p.Request("POST", p.sandbox_path(sandbox_id, "/processes"), json=body, timeout=None)
    return Call(request, _one(ProcessInfo.from_json))


def exec_background(sandbox_id: str, body: Dict[str, Any]) -> Call[ProcessInfo]:
    """``POST /exec`` with ``background``: answered with the handle once it runs."""
    request = p.Request("POST", p.sandbox_path(sandbox_id, "/exec"), json=body, timeout=None)
    return Call(request, _one(ProcessInfo.from_json))


def list_processes(sandbox_id: str) -> Call[List[ProcessInfo]]:
    request = p.Request("GET", p.sandbox_path(sandbox_id, "/processes"))
    return Call(request, _listed("processes", ProcessInfo.from_json))


def get_process(sandbox_id: str, ref: ProcessRef) -> Call[ProcessInfo]:
    return Call(p.Request("GET", process_path(sandbox_id, ref)), _one(ProcessInfo.from_json))


def process_output(
    sandbox_id: str, ref: ProcessRef, replay: bool, timeout: Optional[float]
) -> p.Request:
    """``GET …/output`` as NDJSON (read by :class:`ProcessOutput`)."""
    params = None if replay else [("replay", "false")]
    return p.Request(
        "GET",
        process_path(sandbox_id, ref, "/output"),
        params=params,
        timeout=timeout,
        accept="application/x-ndjson",
    )


def send_stdin(sandbox_id: str, ref: ProcessRef, data: Union[str, bytes]) -> Call[None]:
    request = p.Request(
        "POST",
        process_path(sandbox_id, ref, "/stdin"),
        content=p.to_bytes(data),
        content_type="application/octet-stream",
        timeout=None,
    )
    return Call(request, _nothing)


def close_stdin(sandbox_id: str, ref: ProcessRef) -> Call[None]:
    return Call(p.Request("POST", process_path(sandbox_id, ref, "/close-stdin")), _nothing)


def signal_process(sandbox_id: str, ref: ProcessRef, signal: Signal) -> Call[None]:
    body = {"signal": signal_json(signal)}
    return Call(p.Request("POST", process_path(sandbox_id, ref, "/signal"), json=body), _nothing)


def kill_process(sandbox_id: str, ref: ProcessRef) -> Call[None]:
    return Call(p.Request("DELETE", process_path(sandbox_id, ref)), _nothing)


def resize_process(sandbox_id: str, ref: ProcessRef, cols: int, rows: int) -> Call[None]:
    body = {"cols": int(cols), "rows": int(rows)}
    return Call(p.Request("POST", process_path(sandbox_id, ref, "/resize"), json=body), _nothing)


# -- the output stream -----------------------------------------------------------------------


@dataclass
class ProcessEvent:
    """One event of a process's output, in the order it was written."""

    kind: str
    """``"stdout"``, ``"stderr"``, ``"missed"`` or ``"exit"`` (the last)."""
    data: bytes = b""
    """The bytes of a ``stdout`` or ``stderr`` event."""
    missed_stdout: int = 0
    """For ``missed``: bytes of stdout the process's ring dropped before what follows."""
    missed_stderr: int = 0
    """For ``missed``: the same for stderr."""
    exit: Optional[ProcessExit] = None
    """For ``exit``: how the process ended."""

    @property
    def text(self) -> str:
        """The data as text (invalid UTF-8 replaced; a character split across two events is
        not joined here: :meth:`Process.wait` decodes the whole stream)."""
        return self.data.decode("utf-8", "replace")


class ProcessOutput:
    """Decodes the NDJSON lines of ``…/output`` into events and collects the result."""

    def __init__(self) -> None:
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.missed = [0, 0]
        self.exit: Optional[ProcessExit] = None

    def feed(self, line: str) -> Optional[ProcessEvent]:
        """One line; the event it carries, if any. An ``error`` event raises."""
        if not line.strip():
            return None
        try:
            doc = json.loads(line)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        name = doc.get("event")
        if name in ("stdout", "stderr"):
            if isinstance(doc.get("data"), str):
                data = doc["data"].encode("utf-8")
            elif isinstance(doc.get("data_b64"), str):
                data = base64.b64decode(doc["data_b64"])
            else:
                return None
            (self.stdout if name == "stdout" else self.stderr).extend(data)
            return ProcessEvent(name, data=data)
        if name == "missed":
            out, err = int(doc.get("stdout") or 0), int(doc.get("stderr") or 0)
            self.missed[0] += out
            self.missed[1] += err
            return ProcessEvent("missed", missed_stdout=out, missed_stderr=err)
        if name == "exit":
            self.exit = ProcessExit.from_json(doc)
            return ProcessEvent("exit", exit=self.exit)
        if name == "error":
            raise errors.from_event(doc)
        return None

    def result(self) -> ExecResult:
        """What was collected, as an :class:`~hutch.ExecResult` (``*_truncated`` when the
        ring had dropped output before the attach)."""
        if self.exit is None:
            raise errors.HutchError("the process's output ended without an exit")

        def text(data: bytearray) -> str:
            return codecs.decode(bytes(data), "utf-8", "replace")

        return ExecResult(
            stdout=text(self.stdout),
            stderr=text(self.stderr),
            exit_code=self.exit.exit_code,
            timed_out=self.exit.timed_out,
            duration_ms=self.exit.duration_ms,
            stdout_truncated=self.missed[0] > 0,
            stderr_truncated=self.missed[1] > 0,
            stdout_bytes=bytes(self.stdout),
            stderr_bytes=bytes(self.stderr),
            raw=dict(self.exit.raw),
        )


def _ended() -> errors.HutchError:
    return errors.HutchError("the process's output stream ended without an exit")


def _deadline_passed(deadline: Optional[float], ref: ProcessRef) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise errors.TimeoutError(f"process {ref} did not exit in time")


# -- sync ------------------------------------------------------------------------------------


class Process:
    """A process handle in a sandbox (see the module docs).

    Iterating it attaches and yields its :class:`ProcessEvent` s, first what it wrote while
    nobody was attached, until its exit; :meth:`wait` collects them. Detaching (ending the
    iteration early) never kills it.
    """

    def __init__(self, sandbox: Sandbox, info: ProcessInfo) -> None:
        self._sandbox = sandbox
        self._info = info

    @property
    def pid(self) -> int:
        """Its pid inside the sandbox."""
        return self._info.pid

    @property
    def tag(self) -> Optional[str]:
        """Its tag, if it was started with one."""
        return self._info.tag

    @property
    def info(self) -> ProcessInfo:
        """Its description as last seen (see :meth:`refresh`)."""
        return self._info

    def __repr__(self) -> str:
        return f"Process(pid={self.pid}, tag={self.tag!r}, state={self._info.state!r})"

    def refresh(self) -> ProcessInfo:
        """Fetch its current description (running or exited, and how)."""
        self._info = self._sandbox._client._call(get_process(self._sandbox.id, self.pid))
        return self._info

    def events(self, *, replay: bool = True, timeout: Optional[float] = None) -> Iterator[ProcessEvent]:
        """Attach and yield its events until its exit (see :class:`ProcessEvent`).

        Args:
            replay: Start with what its ring still holds (a ``missed`` event first if the ring
                already dropped some); ``False``: only what it writes from now on.
            timeout: Longest wait for the next event, in seconds (``None``: forever).
        """
        client = self._sandbox._client
        req = process_output(self._sandbox.id, self.pid, replay, timeout)
        out = ProcessOutput()
        with client.stream(req) as resp, client._transport_errors():
            for line in resp.iter_lines():
                event = out.feed(line)
                if event is not None:
                    yield event
                    if event.kind == "exit":
                        return
        raise _ended()

    def __iter__(self) -> Iterator[ProcessEvent]:
        return self.events()

    def wait(self, timeout: Optional[float] = None) -> ExecResult:
        """Wait until it exits and return its output and exit like :meth:`Sandbox.exec`.

        The output is what its ring still held at the attach (1 MiB per stream) and all it
        wrote after; ``stdout_truncated`` says the ring had dropped some before.

        Raises:
            TimeoutError: It did not exit within ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        client = self._sandbox._client
        req = process_output(self._sandbox.id, self.pid, True, timeout)
        out = ProcessOutput()
        with client.stream(req) as resp, client._transport_errors():
            for line in resp.iter_lines():
                out.feed(line)
                if out.exit is not None:
                    self._info.state = "exited"
                    self._info.exit = out.exit
                    return out.result()
                _deadline_passed(deadline, self.pid)
        raise _ended()

    def send_stdin(self, data: Union[str, bytes]) -> None:
        """Write to its stdin (or type into its terminal); returns once it was all written.

        Raises:
            InvalidRequest: It was started without ``stdin`` (and without a terminal).
            ProcessExited: It has exited.
        """
        self._sandbox._client._call(send_stdin(self._sandbox.id, self.pid, data))

    def close_stdin(self) -> None:
        """End of file on its stdin (a terminal gets ``^D``)."""
        self._sandbox._client._call(close_stdin(self._sandbox.id, self.pid))

    def signal(self, signal: Signal) -> None:
        """Send a signal to its process group: ``"TERM"``, ``"INT"``, ``9``…"""
        self._sandbox._client._call(signal_process(self._sandbox.id, self.pid, signal))

    def kill(self) -> None:
        """``SIGKILL`` to its process group. Killing one that has exited is not an error."""
        try:
            self._sandbox._client._call(kill_process(self._sandbox.id, self.pid))
        except errors.ProcessExited:
            pass

    def resize(self, cols: int, rows: int) -> None:
        """Resize its terminal (it was started with ``pty``)."""
        self._sandbox._client._call(resize_process(self._sandbox.id, self.pid, cols, rows))


class Processes:
    """``sb.processes``: the sandbox's process handles."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox

    def start(
        self,
        cmd: p.Command,
        *,
        tag: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
        pty: Optional[Tuple[int, int]] = None,
        stdin: bool = False,
    ) -> Process:
        """Start a process handle; it runs on after this returns (and after this program).

        Args:
            cmd, env, cwd, user: As for :meth:`Sandbox.exec`.
            tag: A name to find it by, unique among the sandbox's running handles.
            timeout: Seconds before its process group is killed (default: no limit).
            pty: ``(cols, rows)``: run it on a terminal of this size.
            stdin: Give it a stdin pipe for :meth:`Process.send_stdin`.

        Raises:
            TagInUse: A running handle has this tag.
            InvalidRequest: A bad argument, or a program that cannot be found
                (``code == "command_not_found"``).
        """
        body = start_body(
            cmd, tag=tag, env=env, cwd=cwd, user=user, timeout=timeout, pty=pty, stdin=stdin
        )
        info = self._sandbox._client._call(start_process(self._sandbox.id, body))
        return Process(self._sandbox, info)

    def list(self) -> List[Process]:
        """Running handles, then the exited ones the sandbox still keeps (the last 64, for
        10 minutes), oldest first."""
        infos = self._sandbox._client._call(list_processes(self._sandbox.id))
        return [Process(self._sandbox, info) for info in infos]

    def connect(self, pid_or_tag: ProcessRef) -> Process:
        """The handle with this pid (``int``) or tag (``str``).

        Raises:
            ProcessNotFound: None has it (or it exited too long ago).
        """
        info = self._sandbox._client._call(get_process(self._sandbox.id, pid_or_tag))
        return Process(self._sandbox, info)


# -- async -----------------------------------------------------------------------------------


class AsyncProcess:
    """The asyncio twin of :class:`Process`: ``async for event in proc``, ``await proc.wait()``."""

    def __init__(self, sandbox: AsyncSandbox, info: ProcessInfo) -> None:
        self._sandbox = sandbox
        self._info = info

    @property
    def pid(self) -> int:
        """Its pid inside the sandbox."""
        return self._info.pid

    @property
    def tag(self) -> Optional[str]:
        """Its tag, if it was started with one."""
        return self._info.tag

    @property
    def info(self) -> ProcessInfo:
        """Its description as last seen (see :meth:`refresh`)."""
        return self._info

    def __repr__(self) -> str:
        return f"AsyncProcess(pid={self.pid}, tag={self.tag!r}, state={self._info.state!r})"

    async def refresh(self) -> ProcessInfo:
        """See :meth:`Process.refresh`."""
        self._info = await self._sandbox._client._call(get_process(self._sandbox.id, self.pid))
        return self._info

    async def events(
        self, *, replay: bool = True, timeout: Optional[float] = None
    ) -> AsyncIterator[ProcessEvent]:
        """See :meth:`Process.events`."""
        client = self._sandbox._client
        req = process_output(self._sandbox.id, self.pid, replay, timeout)
        out = ProcessOutput()
        async with client.stream(req) as resp:
            async for line in client._lines(resp):
                event = out.feed(line)
                if event is not None:
                    yield event
                    if event.kind == "exit":
                        return
        raise _ended()

    def __aiter__(self) -> AsyncIterator[ProcessEvent]:
        return self.events()

    async def wait(self, timeout: Optional[float] = None) -> ExecResult:
        """See :meth:`Process.wait`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        client = self._sandbox._client
        req = process_output(self._sandbox.id, self.pid, True, timeout)
        out = ProcessOutput()
        async with client.stream(req) as resp:
            async for line in client._lines(resp):
                out.feed(line)
                if out.exit is not None:
                    self._info.state = "exited"
                    self._info.exit = out.exit
                    return out.result()
                _deadline_passed(deadline, self.pid)
        raise _ended()

    async def send_stdin(self, data: Union[str, bytes]) -> None:
        """See :meth:`Process.send_stdin`."""
        await self._sandbox._client._call(send_stdin(self._sandbox.id, self.pid, data))

    async def close_stdin(self) -> None:
        """See :meth:`Process.close_stdin`."""
        await self._sandbox._client._call(close_stdin(self._sandbox.id, self.pid))

    async def signal(self, signal: Signal) -> None:
        """See :meth:`Process.signal`."""
        await self._sandbox._client._call(signal_process(self._sandbox.id, self.pid, signal))

    async def kill(self) -> None:
        """See :meth:`Process.kill`."""
        try:
            await self._sandbox._client._call(kill_process(self._sandbox.id, self.pid))
        except errors.ProcessExited:
            pass

    async def resize(self, cols: int, rows: int) -> None:
        """See :meth:`Process.resize`."""
        await self._sandbox._client._call(resize_process(self._sandbox.id, self.pid, cols, rows))


class AsyncProcesses:
    """``sb.processes`` of an :class:`~hutch.AsyncSandbox` (see :class:`Processes`)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    async def start(
        self,
        cmd: p.Command,
        *,
        tag: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[str] = None,
        timeout: Optional[float] = None,
        pty: Optional[Tuple[int, int]] = None,
        stdin: bool = False,
    ) -> AsyncProcess:
        """See :meth:`Processes.start`."""
        body = start_body(
            cmd, tag=tag, env=env, cwd=cwd, user=user, timeout=timeout, pty=pty, stdin=stdin
        )
        info = await self._sandbox._client._call(start_process(self._sandbox.id, body))
        return AsyncProcess(self._sandbox, info)

    async def list(self) -> List[AsyncProcess]:
        """See :meth:`Processes.list`."""
        infos = await self._sandbox._client._call(list_processes(self._sandbox.id))
        return [AsyncProcess(self._sandbox, info) for info in infos]

    async def connect(self, pid_or_tag: ProcessRef) -> AsyncProcess:
        """See :meth:`Processes.connect`."""
        info = await self._sandbox._client._call(get_process(self._sandbox.id, pid_or_tag))
        return AsyncProcess(self._sandbox, info)
