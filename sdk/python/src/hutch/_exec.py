"""``exec`` and ``processes`` of :class:`hutch.Sandbox` and :class:`hutch.AsyncSandbox`
(mixins: they use the sandbox's ``id`` and ``_client``). ``exec`` runs a command to
completion, or with ``background=True`` starts it as a process handle
(:mod:`hutch._process`)."""

from __future__ import annotations

from typing import Any, Dict, Literal, Mapping, Optional, Union, overload

from . import _ops as ops
from . import _protocol as p
from . import errors
from ._process import (
    AsyncProcess,
    AsyncProcesses,
    Process,
    Processes,
    exec_background,
)
from .models import ExecResult


def exec_request(
    cmd: p.Command,
    *,
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    stdin: Union[str, bytes, None],
    timeout: Optional[float],
    user: Optional[str],
    background: bool,
    tag: Optional[str],
) -> Dict[str, Any]:
    """The ``/exec`` body. A background command gets no time limit unless ``timeout`` says
    otherwise (the server's default of 60 s suits commands awaited, not processes left
    running)."""
    if tag is not None and not background:
        raise errors.InvalidRequest("tag names a process handle: it needs background=True")
    if background and timeout is None:
        timeout = 0
    body = p.exec_body(cmd, env=env, cwd=cwd, stdin=stdin, timeout=timeout, user=user)
    if background:
        body["background"] = True
        if tag is not None:
            body["tag"] = tag
    return body


class ExecMethods:
    """``exec`` and ``processes`` of :class:`hutch.Sandbox`."""

    id: str
    _client: Any

    @property
    def processes(self) -> Processes:
        """The sandbox's process handles: ``start``, ``list``, ``connect``."""
        return Processes(self)  # type: ignore[arg-type]

    @overload
    def exec(
        self,
        cmd: p.Command,
        *,
        env: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        stdin: Union[str, bytes, None] = ...,
        timeout: Optional[float] = ...,
        user: Optional[str] = ...,
        background: Literal[False] = ...,
        tag: None = ...,
    ) -> ExecResult: ...

    @overload
    def exec(
        self,
        cmd: p.Command,
        *,
        env: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        stdin: Union[str, bytes, None] = ...,
        timeout: Optional[float] = ...,
        user: Optional[str] = ...,
        background: Literal[True],
        tag: Optional[str] = ...,
    ) -> Process: ...

    def exec(
        self,
        cmd: p.Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Union[str, bytes, None] = None,
        timeout: Optional[float] = None,
        user: Optional[str] = None,
        background: bool = False,
        tag: Optional[str] = None,
    ) -> Union[ExecResult, Process]:
        """Run a command to completion and collect its output, or start it in the background.

        Args:
            cmd: A list runs that program directly with no shell, so arguments (even ones a
                model wrote) reach it verbatim; a string runs under ``/bin/sh -c``.
            env: Extra environment variables.
            cwd: Absolute working directory (default: the user's home, else ``/``).
            stdin: Text or bytes fed to the command's standard input (then closed).
            timeout: Seconds before the command is killed (``exit_code`` 124 and ``timed_out``
                set); ``0`` means no limit; default the server's (60 s), or no limit with
                ``background``.
            user: User to run as (default ``root``).
            background: Start it as a process handle and return a :class:`~hutch.Process`
                at once: it runs on after this call, keeps its output for later
                (:meth:`~hutch.Process.wait`, iteration), and takes stdin and signals.
            tag: With ``background``: a name to find it by (``sb.processes.connect(tag)``),
                unique among the sandbox's running handles.

        Returns:
            The :class:`ExecResult` (a non-zero exit is not an exception), or with
            ``background`` the :class:`~hutch.Process`.

        Raises:
            InvalidRequest: Empty ``cmd``, relative ``cwd``, bad ``env`` or ``timeout``; with
                ``background``, a program that cannot be found (``command_not_found``).
            TagInUse: A running handle already has ``tag``.
            SandboxNotFound: The sandbox is gone.
            ConflictError: The sandbox is not running.
        """
        body = exec_request(
            cmd,
            env=env,
            cwd=cwd,
            stdin=stdin,
            timeout=timeout,
            user=user,
            background=background,
            tag=tag,
        )
        if background:
            info = self._client._call(exec_background(self.id, body))
            return Process(self, info)  # type: ignore[arg-type]
        return self._client._call(ops.exec_command(self.id, body))


class AsyncExecMethods:
    """``exec`` and ``processes`` of :class:`hutch.AsyncSandbox`."""

    id: str
    _client: Any

    @property
    def processes(self) -> AsyncProcesses:
        """See :attr:`hutch.Sandbox.processes`."""
        return AsyncProcesses(self)  # type: ignore[arg-type]

    @overload
    async def exec(
        self,
        cmd: p.Command,
        *,
        env: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        stdin: Union[str, bytes, None] = ...,
        timeout: Optional[float] = ...,
        user: Optional[str] = ...,
        background: Literal[False] = ...,
        tag: None = ...,
    ) -> ExecResult: ...

    @overload
    async def exec(
        self,
        cmd: p.Command,
        *,
        env: Optional[Mapping[str, str]] = ...,
        cwd: Optional[str] = ...,
        stdin: Union[str, bytes, None] = ...,
        timeout: Optional[float] = ...,
        user: Optional[str] = ...,
        background: Literal[True],
        tag: Optional[str] = ...,
    ) -> AsyncProcess: ...

    async def exec(
        self,
        cmd: p.Command,
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        stdin: Union[str, bytes, None] = None,
        timeout: Optional[float] = None,
        user: Optional[str] = None,
        background: bool = False,
        tag: Optional[str] = None,
    ) -> Union[ExecResult, AsyncProcess]:
        """Run a command to completion, or start it in the background (see
        :meth:`hutch.Sandbox.exec`)."""
        body = exec_request(
            cmd,
            env=env,
            cwd=cwd,
            stdin=stdin,
            timeout=timeout,
            user=user,
            background=background,
            tag=tag,
        )
        if background:
            info = await self._client._call(exec_background(self.id, body))
            return AsyncProcess(self, info)  # type: ignore[arg-type]
        return await self._client._call(ops.exec_command(self.id, body))
