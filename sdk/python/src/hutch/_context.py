"""A Dockerfile build's context, packed for ``POST /v1/templates``: the context directory as
a tar stream, without what its ``.dockerignore`` excludes (the server applies the same rules
again), the Dockerfile and ``.dockerignore`` always in it, and a Dockerfile from outside the
context as the extra entry :data:`OUTSIDE_DOCKERFILE`. Symlinks are packed as links, never
followed; FIFOs, sockets and devices are left out. No I/O beyond the local files."""

from __future__ import annotations

import io
import os
import posixpath
import re
import tarfile
import tempfile
from dataclasses import dataclass
from typing import IO, Iterator, List, Optional, Tuple, Union

from . import errors

PathLike = Union[str, "os.PathLike[str]"]

OUTSIDE_DOCKERFILE = ".hutch-dockerfile"
"""The context entry a Dockerfile from outside the context is sent as."""

CHUNK = 256 * 1024
"""Bytes of the packed context sent at once."""

_MAX_DOCKERFILE = 1 << 20


def _glob_regex(pattern: str) -> "re.Pattern[str]":
    """Go's ``filepath.Match`` syntax plus ``**`` (any number of path components), as
    Docker's ``.dockerignore`` matcher reads it."""
    out = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if i + 1 < n and pattern[i + 1] == "*":
                i += 2
                if i < n and pattern[i] == "/":
                    i += 1
                    out.append("(?:.*/)?")
                else:
                    out.append(".*")
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "^") else i + 1)
            if end < 0:
                raise ValueError(f"bad pattern {pattern!r}: unterminated [")
            body = pattern[i + 1 : end]
            if body[:1] in ("!", "^"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("^" + "".join(out) + "$")


@dataclass
class _Rule:
    pattern: str
    exception: bool
    regex: "re.Pattern[str]"


class DockerIgnore:
    """The rules of a ``.dockerignore`` file: a path is excluded when the last rule matching
    it (or one of its parent directories) is not an exception (``!pattern``)."""

    def __init__(self, rules: Optional[List[_Rule]] = None) -> None:
        self._rules = rules or []

    @classmethod
    def parse(cls, text: str) -> DockerIgnore:
        """Read a ``.dockerignore`` file's text (``#`` comments, blank lines, ``!`` exceptions)."""
        if text.startswith("\ufeff"):
            text = text[1:]
        rules = []
        for number, raw in enumerate(text.splitlines(), 1):
            if raw.startswith("#"):
                continue
            pattern = raw.strip()
            if not pattern:
                continue
            exception = pattern.startswith("!")
            if exception:
                pattern = pattern[1:].strip()
                if not pattern:
                    raise errors.InvalidRequest(
                        f".dockerignore line {number}: `!` needs a pattern after it"
                    )
            cleaned = posixpath.normpath(pattern)
            if len(cleaned) > 1 and cleaned.startswith("/"):
                cleaned = cleaned.lstrip("/")
            try:
                regex = _glob_regex(cleaned)
            except ValueError as e:
                raise errors.InvalidRequest(f".dockerignore line {number}: {e}") from e
            rules.append(_Rule(cleaned, exception, regex))
        return cls(rules)

    def excludes(self, path: str) -> bool:
        """Whether ``path`` (relative to the context, ``/``-separated) is left out."""
        path = posixpath.normpath(path)
        if path == "." or not self._rules:
            return False
        parts = path.split("/")
        candidates = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
        excluded = False
        for rule in self._rules:
            if rule.exception != excluded:
                continue
            if any(rule.regex.match(c) for c in candidates):
                excluded = not rule.exception
        return excluded

    def may_include_below(self, directory: str) -> bool:
        """Whether an exception could bring back something below the excluded ``directory``
        (so it must be walked); errs on the side of walking."""
        prefix = posixpath.normpath(directory) + "/"
        for rule in self._rules:
            if not rule.exception:
                continue
            literal = re.split(r"[*?\[\\]", rule.pattern, maxsplit=1)[0]
            if literal.startswith(prefix) or prefix.startswith(literal) or literal == "":
                return True
        return False


def _choose(path: str, is_dir: bool, dockerfile: str, outside: bool, ignore: DockerIgnore) -> str:
    """``"include"``, ``"skip"`` or ``"enter"`` (walk a directory without packing it)."""
    if outside and path == OUTSIDE_DOCKERFILE:
        return "skip"
    if path in (dockerfile, ".dockerignore") or not ignore.excludes(path):
        return "include"
    holds_dockerfile = dockerfile.startswith(path + "/")
    if is_dir and (holds_dockerfile or ignore.may_include_below(path)):
        return "enter"
    return "skip"


@dataclass
class PackedContext:
    """A packed build context: a temporary file (deleted when closed) and the Dockerfile's
    path in it (empty for a directory packed whole, :func:`pack_directory`)."""

    file: IO[bytes]
    size: int
    dockerfile: str

    def chunks(self) -> Iterator[bytes]:
        """The tar stream, from the start, in pieces."""
        self.file.seek(0)
        while True:
            piece = self.file.read(CHUNK)
            if not piece:
                return
            yield piece

    def close(self) -> None:
        self.file.close()


def _dockerfile_in(root: str, dockerfile: Optional[PathLike]) -> Tuple[str, Optional[bytes]]:
    """The Dockerfile's path in the context, and its bytes when it is outside it. A relative
    ``dockerfile`` is a path in the context (like the API's ``dockerfile=``); an absolute one
    may be anywhere."""
    given = os.path.join(root, os.fspath(dockerfile if dockerfile is not None else "Dockerfile"))
    real = os.path.realpath(given)
    if not os.path.isfile(real):
        raise errors.InvalidRequest(f"no Dockerfile at {given}")
    rel = os.path.relpath(real, root)
    if rel != os.pardir and not rel.startswith(os.pardir + os.sep):
        return rel.replace(os.sep, "/"), None
    if os.path.getsize(real) > _MAX_DOCKERFILE:
        raise errors.InvalidRequest(
            f"the Dockerfile {given} is larger than {_MAX_DOCKERFILE} bytes"
        )
    with open(real, "rb") as f:
        return OUTSIDE_DOCKERFILE, f.read()


def pack_context(context_dir: PathLike, dockerfile: Optional[PathLike] = None) -> PackedContext:
    """Pack ``context_dir`` (see the module's docs). ``dockerfile``: a path in the context
    (default ``Dockerfile``) or an absolute path anywhere."""
    root = os.path.realpath(os.fspath(context_dir))
    if not os.path.isdir(root):
        raise errors.InvalidRequest(
            f"the build context {os.fspath(context_dir)} is not a directory"
        )
    in_context, outside = _dockerfile_in(root, dockerfile)
    ignore = DockerIgnore()
    try:
        with open(os.path.join(root, ".dockerignore"), encoding="utf-8") as f:
            ignore = DockerIgnore.parse(f.read())
    except FileNotFoundError:
        pass
    out = tempfile.TemporaryFile()
    try:
        with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
            if outside is not None:
                info = tarfile.TarInfo(OUTSIDE_DOCKERFILE)
                info.size = len(outside)
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(outside))
            _walk(tar, root, "", in_context, outside is not None, ignore)
        size = out.tell()
    except BaseException:
        out.close()
        raise
    return PackedContext(out, size, in_context)


def pack_directory(directory: PathLike) -> PackedContext:
    """Pack all of ``directory`` (an OCI image layout to upload, say) as a build context is
    packed, without a Dockerfile or ``.dockerignore`` rules: links as links, FIFOs, sockets
    and devices left out."""
    root = os.path.realpath(os.fspath(directory))
    if not os.path.isdir(root):
        raise errors.InvalidRequest(f"{os.fspath(directory)} is not a directory")
    out = tempfile.TemporaryFile()
    try:
        with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
            _walk(tar, root, "", "", False, DockerIgnore())
        size = out.tell()
    except BaseException:
        out.close()
        raise
    return PackedContext(out, size, "")


def _walk(
    tar: tarfile.TarFile,
    root: str,
    prefix: str,
    dockerfile: str,
    outside: bool,
    ignore: DockerIgnore,
) -> None:
    with os.scandir(os.path.join(root, prefix) if prefix else root) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            rel = f"{prefix}/{entry.name}" if prefix else entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            choice = _choose(rel, is_dir, dockerfile, outside, ignore)
            if choice == "skip":
                continue
            if is_dir:
                if choice == "include":
                    tar.add(entry.path, arcname=rel, recursive=False)
                _walk(tar, root, rel, dockerfile, outside, ignore)
            elif choice == "include" and (
                entry.is_symlink() or entry.is_file(follow_symlinks=False)
            ):
                # Links as links; FIFOs, sockets and devices are left out.
                tar.add(entry.path, arcname=rel, recursive=False)
