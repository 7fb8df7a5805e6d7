"""File operations inside a sandbox: :class:`Files` (``Sandbox.files``) and
:class:`AsyncFiles` (``AsyncSandbox.files``); each operation is built by :mod:`hutch._ops`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, TypeVar, Union

from . import _ops as ops
from . import errors
from ._watch import AsyncFileWatch, FileWatch
from .models import FileEntry

if TYPE_CHECKING:
    from .aio import AsyncSandbox
    from .sandbox import Sandbox

T = TypeVar("T")


class Files:
    """File operations inside a sandbox (``sb.files``). Every path is absolute."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _call(self, call: ops.Call[T]) -> T:
        return self._sb._client._call(call)

    def read_bytes(self, path: str) -> bytes:
        """Read a whole file as bytes.

        Raises:
            FileNotFound: No such file.
            InvalidRequest: ``path`` is a directory or not absolute.
        """
        return self._call(ops.read_file(self._sb.id, path))

    def read(self, path: str, *, encoding: str = "utf-8", errors: str = "strict") -> str:
        """Read a whole file as text."""
        return self.read_bytes(path).decode(encoding, errors)

    def write(
        self,
        path: str,
        data: Union[str, bytes, bytearray, memoryview],
        *,
        mode: Union[int, str, None] = None,
        metadata: Optional[Dict[str, str]] = None,
    ) -> None:
        """Create or replace a file; parent directories are created.

        Args:
            path: Absolute path.
            data: Text (written as UTF-8) or bytes.
            mode: Permission bits, e.g. ``0o755`` or ``"0755"``.
            metadata: Pairs kept with the file as its ``user.<key>`` extended attributes
                (keys lowercased; values printable ASCII); read back in
                :attr:`FileEntry.metadata`.
        """
        self._call(ops.write_file(self._sb.id, path, data, mode, metadata))

    def list(self, path: str = "/", *, depth: int = 1) -> List[FileEntry]:
        """List a directory, depth-first and sorted by path.

        Args:
            path: Absolute directory path.
            depth: How many levels to descend (1–32).
        """
        return self._call(ops.list_files(self._sb.id, path, depth))

    def stat(self, path: str) -> FileEntry:
        """Describe one path (symlinks are not followed).

        Raises:
            FileNotFound: No such path.
        """
        return self._call(ops.stat_file(self._sb.id, path))

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        try:
            self.stat(path)
        except errors.FileNotFound:
            return False
        return True

    def mkdir(self, path: str) -> None:
        """Create a directory and its parents (like ``mkdir -p``)."""
        self._call(ops.make_dir(self._sb.id, path))

    def move(self, src: str, dst: str) -> None:
        """Move or rename ``src`` to ``dst`` (the destination's parents are created)."""
        self._call(ops.move_file(self._sb.id, src, dst))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, or a directory (non-empty ones need ``recursive=True``).

        Raises:
            FileNotFound: No such path.
            ConflictError: A non-empty directory without ``recursive``.
        """
        self._call(ops.remove_file(self._sb.id, path, recursive))

    def watch(
        self, path: str, *, recursive: bool = False, include_entry: bool = False
    ) -> FileWatch:
        """Watch the directory ``path``: armed when this returns, so every change made after
        it is reported. Iterate the watch for :class:`~hutch.models.FileEvent` s
        (``create``, ``write``, ``remove``, ``rename``, ``chmod``); use it as a context
        manager, or call ``stop()``, to end it::

            with sb.files.watch("/work", recursive=True) as watch:
                sb.exec("touch /work/a")
                for event in watch:
                    print(event.event, event.name)
                    break

        Args:
            path: Absolute directory path.
            recursive: Watch subdirectories too, also those made later.
            include_entry: Give each event its :class:`~hutch.models.FileEntry`.

        Raises:
            FileNotFound: No such directory.
            InvalidRequest: ``path`` is a file, or not absolute.
        """
        return FileWatch(self._sb._client, self._sb.id, path, recursive, include_entry)

    def download_url(
        self, path: str, *, expires_in: float = 300, user: Optional[str] = None
    ) -> str:
        """A URL that reads the file ``path`` with a plain ``GET``, without the API key,
        for ``expires_in`` seconds (at most 7 days); as ``user`` of the sandbox if given.
        Anyone holding the URL can read the file until then."""
        return self._call(ops.file_url(self._sb.id, path, "read", expires_in, user))

    def upload_url(
        self, path: str, *, expires_in: float = 300, user: Optional[str] = None
    ) -> str:
        """A URL that writes the file ``path`` with a ``PUT`` of its bytes, without the API
        key, for ``expires_in`` seconds (at most 7 days); as ``user`` of the sandbox if
        given (the file is then the user's)."""
        return self._call(ops.file_url(self._sb.id, path, "write", expires_in, user))


class AsyncFiles:
    """File operations inside a sandbox (``sb.files``); see :class:`hutch.Files`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def _call(self, call: ops.Call[T]) -> T:
        return await self._sb._client._call(call)

    async def read_bytes(self, path: str) -> bytes:
        """Read a whole file as bytes."""
        return await self._call(ops.read_file(self._sb.id, path))

    async def read(self, path: str, *, encoding: str = "utf-8", errors: str = "strict") -> str:
        """Read a whole file as text."""
        return (await self.read_bytes(path)).decode(encoding, errors)

    async def write(
        self,
        path: str,
        data: Union[str, bytes, bytearray, memoryview],
        *,
        mode: Union[int, str, None] = None,
        metadata: Optional[Dict[str, str]] = None,
    ) -> None:
        """Create or replace a file; parent directories are created (``metadata`` as in the
        sync client)."""
        await self._call(ops.write_file(self._sb.id, path, data, mode, metadata))

    async def list(self, path: str = "/", *, depth: int = 1) -> List[FileEntry]:
        """List a directory (depth 1–32)."""
        return await self._call(ops.list_files(self._sb.id, path, depth))

    async def stat(self, path: str) -> FileEntry:
        """Describe one path."""
        return await self._call(ops.stat_file(self._sb.id, path))

    async def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        try:
            await self.stat(path)
        except errors.FileNotFound:
            return False
        return True

    async def mkdir(self, path: str) -> None:
        """Create a directory and its parents."""
        await self._call(ops.make_dir(self._sb.id, path))

    async def move(self, src: str, dst: str) -> None:
        """Move or rename ``src`` to ``dst``."""
        await self._call(ops.move_file(self._sb.id, src, dst))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file or directory (non-empty ones need ``recursive=True``)."""
        await self._call(ops.remove_file(self._sb.id, path, recursive))

    async def watch(
        self, path: str, *, recursive: bool = False, include_entry: bool = False
    ) -> AsyncFileWatch:
        """Watch the directory ``path`` (armed when this returns); see
        :meth:`hutch.Files.watch`. ``async for`` over the watch yields events; ``async
        with`` or ``await watch.stop()`` ends it."""
        request = ops.watch_files(self._sb.id, path, recursive, include_entry)
        return await AsyncFileWatch(self._sb._client, request)._open()

    async def download_url(
        self, path: str, *, expires_in: float = 300, user: Optional[str] = None
    ) -> str:
        """A URL that reads ``path`` without the key; see :meth:`hutch.Files.download_url`."""
        return await self._call(ops.file_url(self._sb.id, path, "read", expires_in, user))

    async def upload_url(
        self, path: str, *, expires_in: float = 300, user: Optional[str] = None
    ) -> str:
        """A URL that writes ``path`` without the key; see :meth:`hutch.Files.upload_url`."""
        return await self._call(ops.file_url(self._sb.id, path, "write", expires_in, user))
