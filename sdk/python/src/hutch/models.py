"""Plain data objects returned by the SDK.

Each keeps the server's JSON in ``raw`` so fields added by newer servers stay reachable.
Times are RFC 3339 UTC strings, exactly as the server sends them.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .errors import HutchError


def _str_map(v: Any) -> Dict[str, str]:
    return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else {}


def _opt_int(v: Any) -> Optional[int]:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


@dataclass
class VolumeMount:
    """A volume mounted in a sandbox (an entry of :attr:`SandboxInfo.volumes`)."""

    volume: str
    """The volume's id (``vol_…``), even when it was named by its name on create."""
    path: str
    """Absolute path inside the sandbox."""
    read_only: bool = False

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> VolumeMount:
        return cls(
            volume=str(d.get("volume", "")),
            path=str(d.get("path", "")),
            read_only=bool(d.get("read_only", False)),
        )

    def to_json(self) -> Dict[str, Any]:
        """The mount as ``Sandbox.create(volumes=[…])`` sends it."""
        return {"volume": self.volume, "path": self.path, "read_only": self.read_only}


@dataclass
class SandboxInfo:
    """A sandbox as the server last described it."""

    id: str
    template: str
    isolation: str
    """``ns`` or ``vm``."""
    state: str
    """``starting``, ``running``, ``paused``, ``hibernated``, ``stopped``, ``failed`` or ``lost``
    (cluster mode: the node that ran it was declared dead; it never runs again)."""
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
    """Why the sandbox failed or was lost; only when ``state`` is ``"failed"`` or ``"lost"``."""
    snapshot: Optional[str] = None
    """The named snapshot (``snap_…``) this sandbox was created from, if any."""
    forked_from: Optional[str] = None
    """The sandbox this one was forked from (by ``fork`` or ``explore``), if any."""
    idle_hibernate_seconds: Optional[int] = None
    """Hibernate after this many idle seconds; ``None`` when idle hibernation is off."""
    woke_in_ms: Optional[int] = None
    """Only in the answer of :meth:`~hutch.Sandbox.wake`: milliseconds from the start of the
    wake until the sandbox's agent answered. ``None`` everywhere else."""
    volumes: List[VolumeMount] = field(default_factory=list)
    """The volumes mounted in the sandbox (empty when none)."""
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
            snapshot=d.get("snapshot"),
            forked_from=d.get("forked_from"),
            idle_hibernate_seconds=_opt_int(d.get("idle_hibernate_seconds")),
            woke_in_ms=_opt_int(d.get("woke_in_ms")),
            volumes=[
                VolumeMount.from_json(v) for v in d.get("volumes") or [] if isinstance(v, dict)
            ],
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
    uid: int = 0
    """Owner's user id, as the sandbox sees it."""
    gid: int = 0
    owner: Optional[str] = None
    """The owner's name in the sandbox's ``/etc/passwd``, when it has one."""
    group: Optional[str] = None
    """The group's name in the sandbox's ``/etc/group``, when it has one."""
    metadata: Dict[str, str] = field(default_factory=dict)
    """The file's metadata: its ``user.*`` extended attributes, keys without ``user.``."""
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
            uid=int(d.get("uid") or 0),
            gid=int(d.get("gid") or 0),
            owner=d.get("owner"),
            group=d.get("group"),
            metadata={str(k): str(v) for k, v in (d.get("metadata") or {}).items()},
            raw=dict(d),
        )


@dataclass
class FileEvent:
    """One change below a watched directory (:meth:`hutch.Files.watch`)."""

    event: str
    """``create``, ``write``, ``remove``, ``rename`` or ``chmod``."""
    name: str
    """The path relative to the watched directory (``sub/a.txt``)."""
    path: str
    """The absolute path."""
    type: str
    """``file``, ``dir``, ``symlink`` or ``other``."""
    old_name: Optional[str] = None
    """For a rename: the old path relative to the watched directory."""
    old_path: Optional[str] = None
    """For a rename: the old absolute path."""
    entry: Optional[FileEntry] = None
    """The entry when the event was read (watches with ``include_entry=True``)."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> FileEvent:
        entry = d.get("entry")
        return cls(
            event=str(d.get("event", "")),
            name=str(d.get("name", "")),
            path=str(d.get("path", "")),
            type=str(d.get("type", "")),
            old_name=d.get("old_name"),
            old_path=d.get("old_path"),
            entry=FileEntry.from_json(entry) if isinstance(entry, dict) else None,
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
    start: Optional[Dict[str, Any]] = None
    """The start command every sandbox of the template runs, and its ready check (the API's
    ``ServiceSpec``: ``{"cmd": …, "env": …, "ready": {"port": 8080}}``); ``None``: none."""
    image: Optional[Dict[str, Any]] = None
    """For a template made from an image: its ``reference`` (``upload`` or ``upload:TAG`` for
    an uploaded archive), ``digest`` and configuration."""
    tags: Dict[str, int] = field(default_factory=dict)
    """Its tags and the revision each names (``{"v2": 3}``): ``Sandbox.create("web:v2")``
    creates from that revision; a build of ``web:v2`` sets one."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> Template:
        start, image = d.get("start"), d.get("image")
        return cls(
            name=str(d.get("name", "")),
            ready=bool(d.get("ready", False)),
            isolations=[str(i) for i in d.get("isolations") or []],
            size_bytes=int(d.get("size_bytes") or 0),
            description=str(d.get("description") or ""),
            created_at=d.get("created_at"),
            defaults=dict(d.get("defaults") or {}),
            start=dict(start) if isinstance(start, dict) else None,
            image=dict(image) if isinstance(image, dict) else None,
            tags={
                str(k): int(v)
                for k, v in (d.get("tags") or {}).items()
                if _opt_int(v) is not None
            },
            raw=dict(d),
        )


@dataclass
class BuildStep:
    """One step of a template build (an entry of :attr:`BuildInfo.steps`)."""

    number: int
    """1-based over every step the build runs (log lines carry it as ``step``)."""
    stage: str
    """The stage it belongs to (its ``AS`` name, or ``stage N``)."""
    line: int
    """Its Dockerfile line."""
    instruction: str
    """The instruction as written."""
    status: str
    """``pending``, ``running``, ``cached``, ``done`` or ``failed``."""
    duration_ms: Optional[int] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> BuildStep:
        return cls(
            number=int(d.get("number") or 0),
            stage=str(d.get("stage") or ""),
            line=int(d.get("line") or 0),
            instruction=str(d.get("instruction") or ""),
            status=str(d.get("status") or ""),
            duration_ms=_opt_int(d.get("duration_ms")),
        )


@dataclass
class BuildInfo:
    """A template build as the server last described it
    (``GET /v1/templates/{name}/builds/{id}``)."""

    id: str
    """``bld_…``."""
    template: str
    status: str
    """``queued``, ``running``, ``succeeded``, ``failed`` or ``cancelled``."""
    steps: List[BuildStep]
    warnings: List[str] = field(default_factory=list)
    created_at: Optional[str] = None
    finished_at: Optional[str] = None
    duration_ms: Optional[int] = None
    error: Optional[str] = None
    """Why it failed, or that it was cancelled."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def done(self) -> bool:
        """Whether the build has ended."""
        return self.status in ("succeeded", "failed", "cancelled")

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> BuildInfo:
        return cls(
            id=str(d.get("id", "")),
            template=str(d.get("template", "")),
            status=str(d.get("status", "")),
            steps=[BuildStep.from_json(s) for s in d.get("steps") or [] if isinstance(s, dict)],
            warnings=[str(w) for w in d.get("warnings") or []],
            created_at=d.get("created_at"),
            finished_at=d.get("finished_at"),
            duration_ms=_opt_int(d.get("duration_ms")),
            error=d.get("error"),
            raw=dict(d),
        )


@dataclass
class BuildProgress:
    """How far one blob's transfer is: the numbers of a ``progress`` line of an image build's
    log (:attr:`BuildLogLine.progress`), to draw a progress bar from."""

    id: str
    """The blob (``sha256:…``)."""
    label: str
    """What it is (``layer 2/3``)."""
    action: str
    """``download`` (from the registry) or ``extract`` (applied to the root filesystem)."""
    current: int
    """Bytes done (of the compressed blob, also while extracting)."""
    total: int
    """Bytes in all."""

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> BuildProgress:
        return cls(
            id=str(d.get("id") or ""),
            label=str(d.get("label") or ""),
            action=str(d.get("action") or ""),
            current=_opt_int(d.get("current")) or 0,
            total=_opt_int(d.get("total")) or 0,
        )


@dataclass
class BuildLogLine:
    """One line of a build's log (:meth:`hutch.Build.logs`)."""

    seq: int
    """Its number in the build's log, from 1."""
    stream: str
    """``status`` (the builder's own account: ``step 2/5 : RUN make``, `` ---> CACHED``),
    ``stdout`` or ``stderr`` (what a step printed), or ``progress`` (how far a layer's
    download or extraction is: :attr:`progress`)."""
    text: str
    step: Optional[int] = None
    """The step that printed it (``None``: the build itself)."""
    time_ms: Optional[int] = None
    progress: Optional[BuildProgress] = None
    """A ``progress`` line's numbers (``None`` on other lines)."""

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> BuildLogLine:
        progress = d.get("progress")
        return cls(
            seq=int(d.get("seq") or 0),
            stream=str(d.get("stream") or ""),
            text=str(d.get("text") or ""),
            step=_opt_int(d.get("step")),
            time_ms=_opt_int(d.get("time_ms")),
            progress=BuildProgress.from_json(progress) if isinstance(progress, dict) else None,
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
class LogLine:
    """One line of a sandbox's logs (``Sandbox.logs``, ``Sandbox.follow_logs``)."""

    source: str
    """``agent`` (the sandbox's init, on ``ns``) or ``console`` (a ``vm`` guest's serial
    console)."""
    text: str
    """The line, without its time and newline."""
    time: Optional[str] = None
    """When it was written (RFC 3339), if the log records it."""

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> LogLine:
        return cls(source=str(d.get("source", "")), text=str(d.get("text", "")), time=d.get("time"))


@dataclass
class Snapshot:
    """A named snapshot that new sandboxes can start from (``Sandbox.create(snapshot=…)``).

    On ``ns`` a snapshot is ``kind == "filesystem"``: the sandbox's files (its writes, merged
    with the snapshot it was itself created from), not its processes, memory, ``/tmp`` or
    ``/dev/shm``. Sandboxes created from it use its files in place (copy-on-write), so it
    cannot be deleted while any of them exists: see :attr:`used_by`.
    """

    id: str
    """``snap_…``."""
    name: str
    """The name given when it was taken (names need not be unique; the id is)."""
    sandbox_id: str
    """The sandbox it was taken of (which may be gone since)."""
    kind: str
    """``filesystem`` (``ns``: files only) or ``memory`` (``vm``, later)."""
    isolation: str
    """``ns`` or ``vm``; sandboxes created from it use the same."""
    template: str
    """The template under its files; sandboxes created from it use it too."""
    size_bytes: int
    created_at: str
    used_by: List[str] = field(default_factory=list)
    """Sandboxes created from it that still exist; deleting it is a 409 while this is not
    empty."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> Snapshot:
        return cls(
            id=str(d.get("id", "")),
            name=str(d.get("name") or ""),
            sandbox_id=str(d.get("sandbox_id", "")),
            kind=str(d.get("kind", "")),
            isolation=str(d.get("isolation", "")),
            template=str(d.get("template", "")),
            size_bytes=int(d.get("size_bytes") or 0),
            created_at=str(d.get("created_at", "")),
            used_by=[str(x) for x in d.get("used_by") or []],
            raw=dict(d),
        )


@dataclass
class ExploreOutcome:
    """How one command of an ``explore`` call did, in the child sandbox it ran in."""

    index: int
    """Position of the command in the ``commands`` given to ``explore``."""
    sandbox_id: str
    """The child it ran in: destroyed unless :attr:`kept`."""
    exit_code: Optional[int]
    """Exit status (124 after the timeout, ``128+N`` for signal N); ``None`` when the command
    could not run at all (see :attr:`error`)."""
    timed_out: bool
    stdout: str
    """Its stdout (lossy UTF-8, at most 1 MiB; see :attr:`stdout_truncated`)."""
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int
    score: float
    """1.0 for exit status 0 and 0.0 otherwise, or the number ``score_regex`` captured."""
    kept: bool
    """Whether this is the winner, kept as an independent sandbox."""
    error: Optional[str] = None
    """Why the command could not run; only then."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """``True`` when the command exited with status 0."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> ExploreOutcome:
        return cls(
            index=int(d.get("index") or 0),
            sandbox_id=str(d.get("sandbox_id", "")),
            exit_code=_opt_int(d.get("exit_code")),
            timed_out=bool(d.get("timed_out", False)),
            stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")),
            stdout_truncated=bool(d.get("stdout_truncated", False)),
            stderr_truncated=bool(d.get("stderr_truncated", False)),
            duration_ms=int(d.get("duration_ms") or 0),
            score=float(d.get("score") or 0.0),
            kept=bool(d.get("kept", False)),
            error=d.get("error"),
            raw=dict(d),
        )


@dataclass
class ExploreResult:
    """The answer of ``explore``: the winner (kept as a sandbox) and every outcome.

    The best score wins, ties going to the lowest index, so there is always a winner, even
    when every command failed: check ``winner.score`` (or ``winner.ok``).
    """

    winner: ExploreOutcome
    """The winning outcome; ``winner.sandbox_id`` is the surviving child."""
    outcomes: List[ExploreOutcome]
    """Every outcome, in the order of the commands."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> ExploreResult:
        outcomes = [ExploreOutcome.from_json(o) for o in d.get("outcomes") or []]
        w = d.get("winner")
        if isinstance(w, dict):
            winner = ExploreOutcome.from_json(w)
        else:
            kept = [o for o in outcomes if o.kept]
            if not kept:
                raise HutchError("the explore answer names no winner")
            winner = kept[0]
        return cls(winner=winner, outcomes=outcomes, raw=dict(d))


@dataclass
class VolumeAttachment:
    """Where a volume is mounted now (an entry of :attr:`Volume.attached`)."""

    sandbox: str
    """The sandbox's id."""
    path: str
    """Absolute path inside that sandbox."""
    read_only: bool = False

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> VolumeAttachment:
        return cls(
            sandbox=str(d.get("sandbox", "")),
            path=str(d.get("path", "")),
            read_only=bool(d.get("read_only", False)),
        )


@dataclass
class Volume:
    """A durable volume: a fixed-size ext4 filesystem that outlives the sandboxes using it.

    Mount it with ``Sandbox.create(volumes=[{"volume": vol.id, "path": "/data"}])``. It can
    be attached read-write to one sandbox at a time, or read-only to any number; writes
    beyond :attr:`size_mib` fail inside the sandbox with ``ENOSPC``. Forks get only their
    parent's read-only volumes. It cannot be deleted while attached: see :attr:`attached`.
    """

    id: str
    """``vol_…``."""
    name: str
    """Unique per tenant; accepted wherever the id is."""
    size_mib: int
    """Size limit in MiB."""
    created_at: str
    used_bytes: Optional[int] = None
    """Bytes in use; only while the volume is mounted (else ``None``)."""
    attached: List[VolumeAttachment] = field(default_factory=list)
    """Sandboxes it is attached to (running, paused or hibernated); deleting it is a 409
    while this is not empty."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> Volume:
        return cls(
            id=str(d.get("id", "")),
            name=str(d.get("name") or ""),
            size_mib=int(d.get("size_mib") or 0),
            created_at=str(d.get("created_at", "")),
            used_bytes=_opt_int(d.get("used_bytes")),
            attached=[
                VolumeAttachment.from_json(a)
                for a in d.get("attached") or []
                if isinstance(a, dict)
            ],
            raw=dict(d),
        )


@dataclass
class ProcessExit:
    """How a process handle ended."""

    exit_code: int
    """Its status; ``128+N`` if killed by signal N; 124 when its timeout killed it."""
    signal: Optional[int]
    """The signal that ended it, if one did."""
    timed_out: bool
    """Its timeout killed its process group."""
    duration_ms: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> ProcessExit:
        return cls(
            exit_code=int(d.get("exit_code", -1)),
            signal=_opt_int(d.get("signal")),
            timed_out=bool(d.get("timed_out", False)),
            duration_ms=int(d.get("duration_ms") or 0),
            raw={k: v for k, v in d.items() if k != "event"},
        )


@dataclass
class ProcessInfo:
    """A process handle: a process that outlives the call that started it
    (:class:`~hutch.Process`)."""

    pid: int
    """Its pid inside the sandbox (also its process group)."""
    cmd: List[str]
    """The argv it runs (a shell string as ``["/bin/sh", "-c", STRING]``)."""
    state: str
    """``"running"`` or ``"exited"``."""
    tag: Optional[str] = None
    env: Dict[str, str] = field(default_factory=dict)
    """The environment the request added (not the whole environment)."""
    cwd: str = ""
    user: str = ""
    pty: Optional[Dict[str, int]] = None
    """Its terminal's current size ``{"cols", "rows"}``, or ``None`` without a terminal."""
    stdin: bool = False
    """It has a stdin to write to."""
    started_at: str = ""
    exit: Optional[ProcessExit] = None
    """How it ended, once it has."""
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def running(self) -> bool:
        return self.state == "running"

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> ProcessInfo:
        pty = d.get("pty")
        exit_ = d.get("exit")
        return cls(
            pid=int(d.get("pid") or 0),
            cmd=[str(a) for a in d.get("cmd") or []],
            state=str(d.get("state", "")),
            tag=d.get("tag") if isinstance(d.get("tag"), str) else None,
            env=_str_map(d.get("env")),
            cwd=str(d.get("cwd") or ""),
            user=str(d.get("user") or ""),
            pty={"cols": int(pty.get("cols", 0)), "rows": int(pty.get("rows", 0))}
            if isinstance(pty, dict)
            else None,
            stdin=bool(d.get("stdin", False)),
            started_at=str(d.get("started_at") or ""),
            exit=ProcessExit.from_json(exit_) if isinstance(exit_, dict) else None,
            raw=dict(d),
        )
