"""Small OCI images made by the tests, offline: an image layout (``oci-layout``,
``index.json``, ``blobs/sha256/…``) with one gzip layer holding this host's static busybox
(``/bin/busybox``, Debian's ``busybox-static``) as ``/bin/busybox`` with ``sh`` and ``cat``
linking to it, and a marker file ``/from-image``; and a tarball of a layout, as uploads take
it."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any, Dict, Tuple

BUSYBOX = Path("/bin/busybox")


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _entry(tar: tarfile.TarFile, name: str, data: bytes = b"", mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def busybox_layer(marker: str) -> bytes:
    """The layer's uncompressed tar."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        folder = tarfile.TarInfo("bin")
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        _entry(tar, "bin/busybox", BUSYBOX.read_bytes(), 0o755)
        for applet in ("sh", "cat"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        _entry(tar, "from-image", marker.encode())
    return out.getvalue()


def write_layout(layout: Path, marker: str, tag: str = "1") -> Tuple[int, str]:
    """Write the image as an OCI layout at ``layout``, its index naming it ``tag``; returns
    the layer blob's size and digest (what the build's ``progress`` lines count)."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> Dict[str, Any]:
        digest = _digest(data)
        (blobs / digest.split(":", 1)[1]).write_bytes(data)
        return {"digest": digest, "size": len(data)}

    layer = busybox_layer(marker)
    blob = gzip.compress(layer, mtime=0)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
    }
    layer_descriptor = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **put(blob)}
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            **put(json.dumps(config).encode()),
        },
        "layers": [layer_descriptor],
    }
    top = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        **put(json.dumps(manifest).encode()),
        "annotations": {"org.opencontainers.image.ref.name": tag},
    }
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    return layer_descriptor["size"], layer_descriptor["digest"]


def tar_layout(layout: Path, out: Path) -> Path:
    """A tarball of the layout directory (``tar -cf out -C layout .``)."""
    with tarfile.open(out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in sorted(layout.rglob("*")):
            tar.add(path, arcname=path.relative_to(layout).as_posix(), recursive=False)
    return out
