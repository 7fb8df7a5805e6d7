"""Plain data objects returned by the SDK.

Each keeps the server's JSON in ``raw`` so fields added by newer servers stay reachable.
Times are RFC 3339 UTC strings, exactly as the server sends them.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


def _str_map(v: Any) -> Dict[str, str]:
    return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else {}


@dataclass
class SandboxInfo:
    """A sandbox as the server last described it."""

    id: str
    template: str
    isolation: str
    """``ns`` or ``vm``."""
    state: str
    """``starting``, ``running``, ``paused``, ``hibernated``, ``stopped`` or ``failed``."""
    metadata: Dict[str, str]
    cpus: float
    memory_mib: int
    disk_mib: Optional[int]
    pids_max: Optional[int]
    created_at: str
    expires_at: Optional[str]
    """When the sandbox will be reaped unless used again; ``None`` when persistent."""
    ttl_seconds: Optional[int]
    persistent: bool
    network: Dict[str, Any]
    error: Optional[str] = None
    """Why the sandbox failed; only when ``state == "failed"``."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> SandboxInfo:
        return cls(
            id=str(d["id"]),
            template=str(d.get("template", "")),
            isolation=str(d.get("isolation", "")),
            state=str(d.get("state", "")),
            metadata=_str_map(d.get("metadata")),
            cpus=float(d.get("cpus") or 0),
            memory_mib=int(d.get("memory_mib") or 0),
            disk_mib=d.get("disk_mib"),
            pids_max=d.get("pids_max"),
            created_at=str(d.get("created_at", "")),
            expires_at=d.get("expires_at"),
            ttl_seconds=d.get("ttl_seconds"),
            persistent=bool(d.get("persistent", False)),
            network=dict(d.get("network") or {}),
            error=d.get("error"),
            raw=dict(d),
        )


@dataclass
class ExecResult:
    """The collected result of a command. A non-zero exit code is not an error."""

    stdout: str
    """Standard output as text (invalid UTF-8 replaced by U+FFFD; see :attr:`stdout_bytes`)."""
    stderr: str
    """Standard error as text (invalid UTF-8 replaced by U+FFFD; see :attr:`stderr_bytes`)."""
    exit_code: int
    """The program's status; ``128+N`` if killed by signal N; 124 on timeout; 127 if not found."""
    timed_out: bool
    """The command's own ``timeout`` killed it."""
    duration_ms: int
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    oom_killed: bool = False
    stdout_bytes: bytes = field(default=b"", repr=False)
    """The exact bytes of stdout."""
    stderr_bytes: bytes = field(default=b"", repr=False)
    """The exact bytes of stderr."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """``True`` when the command exited with status 0."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> ExecResult:
        def exact(name: str) -> bytes:
            b64 = d.get(f"{name}_b64")
            if isinstance(b64, str):
                return base64.b64decode(b64)
            return str(d.get(name, "")).encode("utf-8")

        return cls(
            stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")),
            exit_code=int(d.get("exit_code", -1)),
            timed_out=bool(d.get("timed_out", False)),
            duration_ms=int(d.get("duration_ms") or 0),
            stdout_truncated=bool(d.get("stdout_truncated", False)),
            stderr_truncated=bool(d.get("stderr_truncated", False)),
            oom_killed=bool(d.get("oom_killed", False)),
            stdout_bytes=exact("stdout"),
            stderr_bytes=exact("stderr"),
            raw=dict(d),
        )


@dataclass
class FileEntry:
    """A file, directory or symlink inside a sandbox."""

    name: str
    path: str
    type: str
    """``file``, ``dir``, ``symlink`` or ``other``."""
    size: int
    mode: int
    """Permission bits as a number (``0o644 == 420``)."""
    modified_at: str
    symlink_target: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> FileEntry:
        return cls(
            name=str(d.get("name", "")),
            path=str(d.get("path", "")),
            type=str(d.get("type", "")),
            size=int(d.get("size") or 0),
            mode=int(d.get("mode") or 0),
            modified_at=str(d.get("modified_at", "")),
            symlink_target=d.get("symlink_target"),
            raw=dict(d),
        )


@dataclass
class Usage:
    """Resource usage of a sandbox right now."""

    memory_bytes: int
    memory_limit_bytes: int
    oom_kills: int
    cpu_usage_ns: int
    pids: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> Usage:
        return cls(
            memory_bytes=int(d.get("memory_bytes") or 0),
            memory_limit_bytes=int(d.get("memory_limit_bytes") or 0),
            oom_kills=int(d.get("oom_kills") or 0),
            cpu_usage_ns=int(d.get("cpu_usage_ns") or 0),
            pids=int(d.get("pids") or 0),
            raw=dict(d),
        )


@dataclass
class Template:
    """A root filesystem sandboxes can be created from."""

    name: str
    ready: bool
    isolations: List[str]
    size_bytes: int
    description: str = ""
    created_at: Optional[str] = None
    defaults: Dict[str, Any] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> Template:
        return cls(
            name=str(d.get("name", "")),
            ready=bool(d.get("ready", False)),
            isolations=[str(i) for i in d.get("isolations") or []],
            size_bytes=int(d.get("size_bytes") or 0),
            description=str(d.get("description") or ""),
            created_at=d.get("created_at"),
            defaults=dict(d.get("defaults") or {}),
            raw=dict(d),
        )


@dataclass
class LifecycleEvent:
    """One event from ``GET /v1/events`` (``sandbox.created``, ``sandbox.killed``, …)."""

    type: str
    sandbox_id: str
    tenant_id: Optional[str]
    at: str
    detail: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any], event: str = "") -> LifecycleEvent:
        return cls(
            type=str(d.get("type") or event),
            sandbox_id=str(d.get("sandbox_id", "")),
            tenant_id=d.get("tenant_id"),
            at=str(d.get("at", "")),
            detail=d.get("detail"),
            raw=dict(d),
        )


@dataclass
class Snapshot:
    """A saved sandbox state (memory or filesystem) that new sandboxes can start from."""

    id: str
    name: Optional[str]
    sandbox_id: str
    kind: str
    """``memory`` or ``filesystem``."""
    size_bytes: int
    created_at: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> Snapshot:
        return cls(
            id=str(d.get("id", "")),
            name=d.get("name"),
            sandbox_id=str(d.get("sandbox_id", "")),
            kind=str(d.get("kind", "")),
            size_bytes=int(d.get("size_bytes") or 0),
            created_at=str(d.get("created_at", "")),
            raw=dict(d),
        )


@dataclass
class ExploreOutcome:
    """How one command of an ``explore`` call did."""

    sandbox_id: Optional[str]
    index: int
    exit_code: int
    stdout: str
    stderr: str
    score: float
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> ExploreOutcome:
        return cls(
            sandbox_id=d.get("sandbox_id"),
            index=int(d.get("index") or 0),
            exit_code=int(d.get("exit_code", -1)),
            stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")),
            score=float(d.get("score") or 0.0),
            raw=dict(d),
        )


@dataclass
class ExploreResult:
    """The answer of ``explore``: the winning branch (kept alive) and every outcome."""

    winner: Optional[ExploreOutcome]
    outcomes: List[ExploreOutcome]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> ExploreResult:
        w = d.get("winner")
        return cls(
            winner=ExploreOutcome.from_json(w) if isinstance(w, dict) else None,
            outcomes=[ExploreOutcome.from_json(o) for o in d.get("outcomes") or []],
            raw=dict(d),
        )
