"""Templates from OCI images, and changes to a template: the requests of ``POST
/v1/templates`` with an image (a JSON body naming one in a registry, or an uploaded image
archive) and of ``PATCH /v1/templates/{name}``, used by :class:`hutch.Templates` and
:class:`hutch.AsyncTemplates`. Like :mod:`hutch._ops`, each function checks its arguments
and returns a :class:`~hutch._ops.Call` without any I/O, except :func:`open_archive`, which
opens the local files to upload.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import _ops as ops
from . import errors
from ._context import PackedContext, PathLike, pack_directory
from ._protocol import (
    _UNSET,
    Request,
    drop_none,
    registry_credentials,
    registry_hosts,
    template_path,
)
from .models import BuildInfo, Template

ISOLATIONS = ("auto", "ns", "vm")
"""What ``isolation`` of :func:`update_template` may be (``auto``: the server's choice)."""


def start_spec(start: Mapping[str, Any]) -> Dict[str, Any]:
    """A start command as the API takes it (a ``ServiceSpec``): a mapping with ``cmd`` (a
    shell string, or an argv list) and optionally ``env``, ``cwd``, ``user`` and ``ready``
    (``{"port": 8080}`` or ``{"cmd": …}``, with ``interval_ms``, ``attempt_timeout_ms`` and
    ``timeout_ms``). The server checks the rest."""
    if not isinstance(start, Mapping):
        raise errors.InvalidRequest(
            f"start must be a mapping such as {{'cmd': 'httpd -f', 'ready': {{'port': 80}}}},"
            f" got {type(start).__name__}"
        )
    spec = dict(start)
    cmd = spec.get("cmd")
    if isinstance(cmd, str):
        ok = bool(cmd.strip())
    elif isinstance(cmd, (list, tuple)):
        cmd = list(cmd)
        ok = bool(cmd) and all(isinstance(a, str) for a in cmd) and bool(cmd[0])
    else:
        ok = False
    if not ok:
        raise errors.InvalidRequest(
            f"start needs a cmd: a non-empty shell string or argv list, got {spec.get('cmd')!r}"
        )
    spec["cmd"] = cmd
    return spec


def _resources(
    cpus: Optional[float], memory_mib: Optional[int], disk_mib: Optional[int]
) -> Dict[str, Any]:
    return drop_none({"cpus": cpus, "memory_mib": memory_mib, "disk_mib": disk_mib})


def build_from_image(
    name: str,
    from_image: str,
    *,
    registry_auth: Optional[str],
    insecure_registries: Optional[Sequence[str]],
    start: Optional[Mapping[str, Any]],
    force: bool,
    cpus: Optional[float],
    memory_mib: Optional[int],
    disk_mib: Optional[int],
) -> ops.Call[BuildInfo]:
    """``POST /v1/templates`` with a JSON body: the server pulls ``from_image`` from its
    registry in the background."""
    hosts = registry_hosts(insecure_registries)
    body = drop_none(
        {
            "name": name,
            "from_image": from_image,
            "registry_auth": registry_credentials(registry_auth),
            "insecure_registries": hosts or None,
            "start": start_spec(start) if start is not None else None,
            "force": True if force else None,
            **_resources(cpus, memory_mib, disk_mib),
        }
    )
    request = Request("POST", "/v1/templates", json=body, timeout=None)
    return ops.Call(request, ops._one(BuildInfo.from_json))


def upload_params(
    name: str,
    *,
    image_tag: Optional[str],
    start: Optional[Mapping[str, Any]],
    cpus: Optional[float],
    memory_mib: Optional[int],
    disk_mib: Optional[int],
) -> List[Tuple[str, str]]:
    """The query of ``POST /v1/templates?image_archive=true``."""
    params = [("name", name), ("image_archive", "true")]
    if image_tag is not None:
        if not image_tag:
            raise errors.InvalidRequest("image_tag must not be empty")
        params.append(("image_tag", image_tag))
    if start is not None:
        params.append(("start", json.dumps(start_spec(start), separators=(",", ":"))))
    params.extend((k, str(v)) for k, v in _resources(cpus, memory_mib, disk_mib).items())
    return params


def upload_image(params: List[Tuple[str, str]], content: Any) -> ops.Call[BuildInfo]:
    """``POST /v1/templates?image_archive=true`` (``params`` from :func:`upload_params`)
    with the archive's bytes as an iterator, sync or async."""
    request = Request(
        "POST",
        "/v1/templates",
        params=params,
        content=content,
        content_type="application/x-tar",
        timeout=None,
    )
    return ops.Call(request, ops._one(BuildInfo.from_json))


def open_archive(archive: PathLike) -> PackedContext:
    """The image to upload: a tarball (``docker save``, or a tar of an OCI image layout,
    optionally gzip-compressed) as it is, or an OCI image layout directory packed here as a
    tar stream (links as links). Close it once sent."""
    path = os.fspath(archive)
    if os.path.isdir(path):
        return pack_directory(path)
    if not os.path.isfile(path):
        raise errors.InvalidRequest(
            f"{path} is neither an image archive file nor an OCI image layout directory"
        )
    f = open(path, "rb")
    return PackedContext(f, os.fstat(f.fileno()).st_size, "")


def update_template(
    name: str, *, start: Any = _UNSET, isolation: Optional[str] = None
) -> ops.Call[Template]:
    """``PATCH /v1/templates/{name}``: ``start`` left unset keeps the start command,
    ``None`` removes it; ``isolation`` ``None`` keeps the default isolation."""
    body: Dict[str, Any] = {}
    if start is not _UNSET:
        body["start"] = None if start is None else start_spec(start)
    if isolation is not None:
        if isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
        body["isolation"] = isolation
    if not body:
        raise ValueError("say what to change: start (None removes it) or isolation")
    request = Request("PATCH", template_path(name), json=body)
    return ops.Call(request, ops._one(Template.from_json))


__all__ = [
    "ISOLATIONS",
    "build_from_image",
    "open_archive",
    "start_spec",
    "update_template",
    "upload_image",
    "upload_params",
]
