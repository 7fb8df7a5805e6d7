"""The code interpreter: stateful contexts and ``run_code`` (``docs/code-interpreter.md``).

The result objects (:class:`Execution`, :class:`Result`, :class:`ExecutionError`,
:class:`Logs`, :class:`CodeContext`), the calls (built without I/O, like :mod:`hutch._ops`),
and :class:`CodeRun`, which turns the events of ``POST /v1/sandboxes/{id}/code`` into
callback calls and an :class:`Execution`, shared by the sync and async clients.
"""

from __future__ import annotations

import base64
import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from . import errors
from ._ops import Call, _listed, _nothing, _one
from ._protocol import Request, SSEParser, drop_none, sandbox_path

#: MIME types and the :class:`Result` attribute that reads each.
FORMATS = {
    "text": "text/plain",
    "html": "text/html",
    "markdown": "text/markdown",
    "svg": "image/svg+xml",
    "png": "image/png",
    "jpeg": "image/jpeg",
    "pdf": "application/pdf",
    "latex": "text/latex",
    "json": "application/json",
    "javascript": "application/javascript",
}


def _text(v: Any) -> Optional[str]:
    if isinstance(v, list):  # Jupyter may split text into lines
        return "".join(str(x) for x in v)
    return v if isinstance(v, str) else None


@dataclass
class Result:
    """One rich output: the cell's value (``is_main_result``) or something it displayed (a
    chart, a table), with every MIME type the kernel sent."""

    data: Dict[str, Any]
    """MIME type → content as the server sent it (images base64)."""
    is_main_result: bool = False
    """The value of the cell's last expression."""
    metadata: Dict[str, Any] = field(default_factory=dict)
    display_id: Optional[str] = None

    @property
    def text(self) -> Optional[str]:
        """``text/plain``: the value's repr."""
        return _text(self.data.get("text/plain"))

    @property
    def html(self) -> Optional[str]:
        return _text(self.data.get("text/html"))

    @property
    def markdown(self) -> Optional[str]:
        return _text(self.data.get("text/markdown"))

    @property
    def svg(self) -> Optional[str]:
        return _text(self.data.get("image/svg+xml"))

    @property
    def latex(self) -> Optional[str]:
        return _text(self.data.get("text/latex"))

    @property
    def javascript(self) -> Optional[str]:
        return _text(self.data.get("application/javascript"))

    @property
    def json(self) -> Any:
        """``application/json``, decoded."""
        return self.data.get("application/json")

    def _binary(self, mime: str) -> Optional[bytes]:
        v = _text(self.data.get(mime))
        return base64.b64decode(v) if v is not None else None

    @property
    def png(self) -> Optional[bytes]:
        """``image/png`` as bytes."""
        return self._binary("image/png")

    @property
    def jpeg(self) -> Optional[bytes]:
        """``image/jpeg`` as bytes."""
        return self._binary("image/jpeg")

    @property
    def pdf(self) -> Optional[bytes]:
        """``application/pdf`` as bytes."""
        return self._binary("application/pdf")

    def formats(self) -> List[str]:
        """The short names of the formats present (``["text", "png"]``)."""
        by_mime = {mime: name for name, mime in FORMATS.items()}
        return [by_mime.get(mime, mime) for mime in self.data]

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> Result:
        data = d.get("data")
        metadata = d.get("metadata")
        display_id = d.get("display_id")
        return cls(
            data=dict(data) if isinstance(data, dict) else {},
            is_main_result=bool(d.get("is_main_result", False)),
            metadata=dict(metadata) if isinstance(metadata, dict) else {},
            display_id=display_id if isinstance(display_id, str) else None,
        )


@dataclass
class ExecutionError:
    """What the code raised, or why it stopped: ``TimeoutError`` (interrupted at its timeout,
    state kept), ``KernelDied`` (the kernel exited; the next call starts a new one),
    ``ExitStatus`` (a Bash cell whose last command failed)."""

    name: str
    value: str
    traceback: List[str] = field(default_factory=list)
    timed_out: bool = False

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> ExecutionError:
        tb = d.get("traceback")
        return cls(
            name=str(d.get("name", "")),
            value=str(d.get("value", "")),
            traceback=[str(x) for x in tb] if isinstance(tb, list) else [],
            timed_out=bool(d.get("timed_out", False)),
        )


@dataclass
class Logs:
    """What the code printed, chunk by chunk."""

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class Execution:
    """A finished run of a cell."""

    results: List[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None
    duration_ms: int = 0
    context_id: str = ""
    context_restarted: bool = False
    """The context's kernel was started afresh for this run: earlier state is gone."""
    truncated: bool = False
    """Output was cut at the server's output cap."""

    @property
    def text(self) -> Optional[str]:
        """The main result's ``text/plain``, if the cell ended in a value."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> Execution:
        logs = d.get("logs") or {}
        error = d.get("error")
        return cls(
            results=[Result.from_json(r) for r in d.get("results") or []],
            logs=Logs(
                stdout=[str(x) for x in logs.get("stdout") or []],
                stderr=[str(x) for x in logs.get("stderr") or []],
            ),
            error=ExecutionError.from_json(error) if isinstance(error, dict) else None,
            execution_count=d.get("execution_count"),
            duration_ms=int(d.get("duration_ms") or 0),
            context_id=str(d.get("context_id", "")),
            context_restarted=bool(d.get("context_restarted", False)),
            truncated=bool(d.get("truncated", False)),
        )


@dataclass
class CodeContext:
    """A stateful context: one kernel of one language."""

    id: str
    language: str
    cwd: Optional[str] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> CodeContext:
        cwd = d.get("cwd")
        return cls(
            id=str(d.get("id", "")),
            language=str(d.get("language", "")),
            cwd=cwd if isinstance(cwd, str) else None,
        )


ContextRef = Any
"""A context given to :meth:`~hutch.Sandbox.run_code`: a :class:`CodeContext` or its id."""


def context_id(context: ContextRef) -> Optional[str]:
    if context is None:
        return None
    if isinstance(context, CodeContext):
        return context.id
    if isinstance(context, str) and context:
        return context
    raise errors.InvalidRequest("context must be a CodeContext or a context id")


# -- calls -------------------------------------------------------------------------------------


def create_context(
    sandbox_id: str,
    language: Optional[str],
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
) -> Call[CodeContext]:
    body = drop_none(
        {"language": language, "cwd": cwd, "env": dict(env) if env is not None else None}
    )
    req = Request("POST", sandbox_path(sandbox_id, "/contexts"), json=body, timeout=None)
    return Call(req, _one(CodeContext.from_json))


def list_contexts(sandbox_id: str) -> Call[List[CodeContext]]:
    req = Request("GET", sandbox_path(sandbox_id, "/contexts"), timeout=None)
    return Call(req, _listed("contexts", CodeContext.from_json))


def restart_context(sandbox_id: str, context: ContextRef) -> Call[CodeContext]:
    path = sandbox_path(sandbox_id, f"/contexts/{context_id(context)}/restart")
    return Call(Request("POST", path, timeout=None), _one(CodeContext.from_json))


def delete_context(sandbox_id: str, context: ContextRef) -> Call[None]:
    path = sandbox_path(sandbox_id, f"/contexts/{context_id(context)}")
    return Call(Request("DELETE", path, timeout=None), _nothing)


def run_code(
    sandbox_id: str,
    code: str,
    *,
    language: Optional[str],
    context: ContextRef,
    timeout: Optional[float],
    env: Optional[Mapping[str, str]],
) -> Request:
    """``POST /v1/sandboxes/{id}/code``, read as server-sent events."""
    if not isinstance(code, str):
        raise errors.InvalidRequest("code must be a string")
    body = drop_none(
        {
            "code": code,
            "language": language,
            "context_id": context_id(context),
            "timeout_seconds": timeout,
            "env": dict(env) if env is not None else None,
        }
    )
    # The events flow while the cell runs: wait for them as long as it may run.
    read_timeout = float(timeout) + 60.0 if timeout else None
    return Request(
        "POST",
        sandbox_path(sandbox_id, "/code"),
        json=body,
        timeout=read_timeout,
        accept="text/event-stream",
    )


Callback = Optional[Callable[[Any], Any]]


class CodeRun:
    """Turns the lines of a ``/code`` event stream into callback calls and an
    :class:`Execution` (complete once :attr:`execution` is set)."""

    def __init__(self, on_stdout: Callback, on_stderr: Callback, on_result: Callback,
                 on_error: Callback = None) -> None:
        self._sse = SSEParser()
        self._callbacks = {
            "stdout": on_stdout,
            "stderr": on_stderr,
            "result": on_result,
            "error": on_error,
        }
        self._results: List[Result] = []
        self._logs = Logs()
        self._error: Optional[ExecutionError] = None
        self.execution: Optional[Execution] = None

    def feed(self, line: str) -> List[Tuple[Callable[[Any], Any], Any]]:
        """Feed one line; returns the ``(callback, value)`` calls to make, in order.

        Raises a :class:`~hutch.errors.HutchError` on a ``failed`` event (the interpreter
        itself failed mid-run).
        """
        ev = self._sse.feed(line)
        if ev is None:
            return []
        name, raw = ev
        try:
            data = json.loads(raw)
        except ValueError:
            return []
        if name == "failed":
            raise errors.from_event(data)
        value: Any = None
        kind = name
        if name in ("stdout", "stderr"):
            value = str(data.get("text", ""))
            (self._logs.stdout if name == "stdout" else self._logs.stderr).append(value)
        elif name in ("result", "display"):
            value = Result.from_json(data)
            self._results.append(value)
            kind = "result"
        elif name == "error":
            value = self._error = ExecutionError.from_json(data)
        elif name == "end":
            self.execution = Execution(
                results=self._results,
                logs=self._logs,
                error=self._error,
                execution_count=data.get("execution_count"),
                duration_ms=int(data.get("duration_ms") or 0),
                context_id=str(data.get("context_id", "")),
                context_restarted=bool(data.get("context_restarted", False)),
                truncated=bool(data.get("truncated", False)),
            )
            return []
        cb = self._callbacks.get(kind)
        return [(cb, value)] if cb is not None else []

    @staticmethod
    def ended() -> errors.HutchError:
        """The error for a stream that ended before its ``end`` event."""
        return errors.HutchError("the code stream ended before the cell finished")


# -- the Sandbox methods ---------------------------------------------------------------------


async def _maybe_await(value: Any) -> None:
    if inspect.isawaitable(value):
        await value


class CodeMethods:
    """The code interpreter's methods of :class:`hutch.Sandbox` (a mixin: it uses the
    sandbox's ``id`` and ``_client``)."""

    id: str
    _client: Any

    def run_code(
        self,
        code: str,
        *,
        language: Optional[str] = None,
        context: Optional[Union[CodeContext, str]] = None,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
        on_result: Optional[Callable[[Result], Any]] = None,
        on_error: Optional[Callable[[ExecutionError], Any]] = None,
    ) -> Execution:
        """Run a cell in a stateful context (variables, imports and state stay between
        calls), calling back with its output as it comes.

        Needs a sandbox of the ``code-interpreter`` template. Without ``context`` the cell
        runs in the default context of ``language`` (``python``, ``r``, ``bash`` or
        ``javascript``; default ``python``), made on first use.

        Args:
            code: The cell.
            language: The default context's language (not with ``context``).
            context: A :class:`CodeContext` (or its id) from :meth:`create_code_context`.
            timeout: Seconds before the cell is interrupted (its context keeps its state;
                ``error.name`` is ``TimeoutError``); ``0`` no limit; default the server's.
            env: Environment variables for this cell only.
            on_stdout, on_stderr: Called with each chunk printed.
            on_result: Called with each :class:`Result` (the cell's value, charts, tables).
            on_error: Called with the :class:`ExecutionError`, if any.

        Returns:
            The :class:`Execution`: ``results`` (``.text``, ``.html``, ``.png`` bytes, ...),
            ``logs``, ``error`` (an exception in the code is not raised), ``execution_count``
            and ``context_restarted`` (the kernel was started afresh: state lost).

        Raises:
            NoInterpreter: The sandbox's template cannot run code (use ``code-interpreter``).
            ContextNotFound: No such context.
        """
        req = run_code(
            self.id, code, language=language, context=context, timeout=timeout, env=env
        )
        run = CodeRun(on_stdout, on_stderr, on_result, on_error)
        with self._client.stream(req) as resp, self._client._transport_errors():
            for line in resp.iter_lines():
                for cb, value in run.feed(line):
                    cb(value)
                if run.execution is not None:
                    return run.execution
        raise run.ended()

    def create_code_context(
        self,
        language: Optional[str] = None,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> CodeContext:
        """A new stateful context (its own kernel) of ``language`` (default ``python``)."""
        return self._client._call(create_context(self.id, language, cwd, env))

    def list_code_contexts(self) -> List[CodeContext]:
        """The sandbox's contexts (defaults included once used)."""
        return self._client._call(list_contexts(self.id))

    def restart_code_context(self, context: Union[CodeContext, str]) -> CodeContext:
        """Start the context's kernel afresh (its state is gone)."""
        return self._client._call(restart_context(self.id, context))

    def delete_code_context(self, context: Union[CodeContext, str]) -> None:
        """Stop the context's kernel and forget it."""
        self._client._call(delete_context(self.id, context))


class AsyncCodeMethods:
    """The code interpreter's methods of :class:`hutch.AsyncSandbox`."""

    id: str
    _client: Any

    async def run_code(
        self,
        code: str,
        *,
        language: Optional[str] = None,
        context: Optional[Union[CodeContext, str]] = None,
        timeout: Optional[float] = None,
        env: Optional[Mapping[str, str]] = None,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
        on_result: Optional[Callable[[Result], Any]] = None,
        on_error: Optional[Callable[[ExecutionError], Any]] = None,
    ) -> Execution:
        """Run a cell in a stateful context (see :meth:`hutch.Sandbox.run_code`). Callbacks
        may be plain functions or coroutine functions (awaited in order)."""
        req = run_code(
            self.id, code, language=language, context=context, timeout=timeout, env=env
        )
        run = CodeRun(on_stdout, on_stderr, on_result, on_error)
        async with self._client.stream(req) as resp:
            async for line in self._client._lines(resp):
                for cb, value in run.feed(line):
                    await _maybe_await(cb(value))
                if run.execution is not None:
                    return run.execution
        raise run.ended()

    async def create_code_context(
        self,
        language: Optional[str] = None,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> CodeContext:
        """See :meth:`hutch.Sandbox.create_code_context`."""
        return await self._client._call(create_context(self.id, language, cwd, env))

    async def list_code_contexts(self) -> List[CodeContext]:
        """See :meth:`hutch.Sandbox.list_code_contexts`."""
        return await self._client._call(list_contexts(self.id))

    async def restart_code_context(self, context: Union[CodeContext, str]) -> CodeContext:
        """See :meth:`hutch.Sandbox.restart_code_context`."""
        return await self._client._call(restart_context(self.id, context))

    async def delete_code_context(self, context: Union[CodeContext, str]) -> None:
        """See :meth:`hutch.Sandbox.delete_code_context`."""
        await self._client._call(delete_context(self.id, context))
