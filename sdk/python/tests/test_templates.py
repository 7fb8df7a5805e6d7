"""Template builds through the SDK against a real server: from Dockerfiles (build, follow,
wait, cancel, get and delete, sync and async), from uploaded images, and changes to a
template. Dockerfiles start ``FROM minimal`` (busybox) and images are made here
(:mod:`oci_image`), so no build needs a network: no test names an image in a registry
the server would pull from. Every template is deleted at the end."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Iterator, List

import pytest
from conftest import Server
from oci_image import tar_layout, write_layout

import hutch
from hutch import AsyncClient, Client, Sandbox

TEMPLATES = Path(os.environ.get("HUTCH_TEST_TEMPLATES", "/var/cache/hutch-test/templates"))


@pytest.fixture
def name(server: Server) -> Iterator[str]:
    """A template name of the test's own, deleted afterwards (with the store's lock file)."""
    n = f"py-sdk-{uuid.uuid4().hex[:12]}"
    yield n
    with Client() as c:
        try:
            c.templates.delete(n)
        except hutch.NotFoundError:
            pass
    (TEMPLATES / f".lock-{n}").unlink(missing_ok=True)


def context(tmp_path: Path, dockerfile: str, **files: str) -> Path:
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(dockerfile)
    for rel, text in files.items():
        (ctx / rel).write_text(text)
    return ctx


def test_a_build_is_followed_waited_for_and_used(server: Server, name: str, tmp_path: Path) -> None:
    dockerfile = "FROM minimal\nRUN echo hi > /x && echo built\nCOPY a.txt /a\n"
    ctx = context(tmp_path, dockerfile, **{"a.txt": "alpha\n"})
    with Client() as c:
        build = c.templates.build(name, ctx)
        assert build.id.startswith("bld_") and build.template == name
        assert build.status in ("queued", "running")
        assert [s.instruction for s in build.info.steps] == [
            "RUN echo hi > /x && echo built",
            "COPY a.txt /a",
        ]
        seen: List[hutch.BuildLogLine] = []
        info = build.wait(on_line=seen.append)
        assert info.status == "succeeded" and info.done and build.status == "succeeded"
        assert [s.status for s in info.steps] == ["done", "done"]
        printed = [line for line in seen if line.stream == "stdout"]
        assert [(line.step, line.text) for line in printed] == [(1, "built")]
        assert [line.seq for line in seen] == sorted(line.seq for line in seen)
        # The log of an ended build is there whole, and ends by itself.
        assert [line.seq for line in build.logs()] == [line.seq for line in seen]
        assert [b.id for b in c.templates.builds(name)] == [build.id]
        assert c.templates.get_build(name, build.id).status == "succeeded"
        t = c.templates.get(name)
        assert t.name == name and t.ready
        assert name in [t.name for t in c.templates()]
        with Sandbox.create(name, client=c) as sb:
            assert sb.exec("cat /x /a").stdout == "hi\nalpha\n"
            # In use: the delete is refused naming the sandbox.
            with pytest.raises(hutch.ConflictError) as e:
                c.templates.delete(name)
            assert sb.id in e.value.message
        c.templates.delete(name)
        with pytest.raises(hutch.NotFoundError):
            c.templates.get(name)


def test_failed_cancelled_and_refused_builds(server: Server, name: str, tmp_path: Path) -> None:
    with Client() as c:
        bad = context(tmp_path, "FROM minimal\nFOO bar\n")
        with pytest.raises(hutch.InvalidRequest) as e:
            c.templates.build(name, bad)
        assert e.value.code == "invalid_dockerfile"
        assert e.value.message == 'Dockerfile line 2: unknown instruction "FOO"'

        (bad / "Dockerfile").write_text("FROM minimal\nRUN echo broken; exit 3\n")
        failing = c.templates.build(name, bad)
        with pytest.raises(hutch.BuildFailed) as failed:
            failing.wait()
        assert failed.value.build.status == "failed"
        assert failing.id in str(failed.value)
        with pytest.raises(hutch.NotFoundError):
            c.templates.get(name)

        (bad / "Dockerfile").write_text("FROM minimal\nRUN sleep 30\n")
        slow = c.templates.build(name, bad)
        deadline = time.monotonic() + 60
        while slow.refresh().steps[0].status != "running":
            assert time.monotonic() < deadline, slow.info
            time.sleep(0.05)
        asked = time.monotonic()
        slow.cancel()
        with pytest.raises(hutch.BuildFailed) as cancelled:
            slow.wait()
        assert cancelled.value.build.status == "cancelled"
        assert time.monotonic() - asked < 10


def test_a_dockerfile_outside_the_context_and_build_args(
    server: Server, name: str, tmp_path: Path
) -> None:
    ctx = context(tmp_path, "FROM minimal\n", **{"a.txt": "alpha\n"})
    outside = tmp_path / "web.Dockerfile"
    outside.write_text("FROM minimal\nARG WHO\nRUN echo hello $WHO > /greeting\n")
    with Client() as c:
        build = c.templates.build(name, ctx, dockerfile=outside, build_args={"WHO": "sdk"})
        build.wait()
        with Sandbox.create(name, client=c) as sb:
            assert sb.exec("cat /greeting").stdout == "hello sdk\n"


def test_build_secrets_reach_their_step_only(server: Server, name: str, tmp_path: Path) -> None:
    dockerfile = (
        "FROM minimal\n"
        "RUN --mount=type=secret,id=token --mount=type=secret,id=raw,env=RAW "
        "sh -c 'wc -c < /run/secrets/token > /seen && echo \"$RAW\" >> /seen'\n"
    )
    ctx = context(tmp_path, dockerfile)
    with Client() as c:
        build = c.templates.build(name, ctx, secrets={"token": "twelve chars", "raw": b"bytes-ok"})
        lines: List[hutch.BuildLogLine] = []
        assert build.wait(on_line=lines.append).status == "succeeded"
        assert not any("twelve chars" in line.text for line in lines)
        with Sandbox.create(name, client=c) as sb:
            assert sb.exec("cat /seen; test -e /run/secrets/token || echo gone").stdout.split() == [
                "12",
                "bytes-ok",
                "gone",
            ]
        with pytest.raises(ValueError):
            c.templates.build(name, ctx, secrets={"a,b": "x"})


@pytest.mark.asyncio
async def test_the_async_client_builds_too(server: Server, name: str, tmp_path: Path) -> None:
    ctx = context(tmp_path, "FROM minimal\nRUN echo async-built\n")
    async with AsyncClient() as c:
        build = await c.templates.build(name, ctx)
        texts = [line.text async for line in build.logs()]
        assert "async-built" in texts
        info = await build.wait()
        assert info.status == "succeeded"
        assert (await c.templates.get(name)).ready
        assert name in [t.name for t in await c.templates()]
        await c.templates.delete(name)
        with pytest.raises(hutch.NotFoundError):
            await c.templates.get(name)


def test_an_uploaded_image_makes_a_template_whose_start_can_change(
    server: Server, name: str, tmp_path: Path
) -> None:
    size, digest = write_layout(tmp_path / "layout", "uploaded by the python sdk")
    archive = tar_layout(tmp_path / "layout", tmp_path / "image.tar")
    with Client() as c:
        build = c.templates.upload_image(name, archive, image_tag="1", memory_mib=300)
        assert build.id.startswith("bld_") and build.template == name
        seen: List[hutch.BuildLogLine] = []
        info = build.wait(on_line=seen.append)
        assert info.status == "succeeded"
        # The layer's extraction is reported with its numbers, to its end.
        progress = [line.progress for line in seen if line.stream == "progress"]
        assert progress and all(p is not None for p in progress), seen
        last = progress[-1]
        assert last is not None
        assert (last.id, last.label, last.action) == (digest, "layer 1/1", "extract")
        assert last.current == last.total == size
        assert all(line.progress is None for line in seen if line.stream != "progress")

        t = c.templates.get(name)
        assert t.ready and t.start is None
        assert t.image is not None and t.image["reference"] == "upload:1"
        assert t.defaults["memory_mib"] == 300
        with Sandbox.create(name, isolation="ns", client=c) as sb:
            assert sb.exec("cat /from-image").stdout == "uploaded by the python sdk"
            assert sb.exec(["/bin/cat", "/from-image"]).exit_code == 0

        start = {"cmd": ["/bin/sh", "-c", "cat /from-image > /tmp/started"], "env": {"A": "1"}}
        changed = c.templates.update(name, start=start)
        assert changed.name == name and changed.start == start
        assert c.templates.get(name).start == start
        # Left out, the start command stays; the isolation changes alone.
        assert c.templates.update(name, isolation="ns").start == start
        assert c.templates.get(name).defaults.get("isolation") == "ns"
        assert "isolation" not in c.templates.update(name, isolation="auto").defaults
        # None removes it.
        assert c.templates.update(name, start=None).start is None
        assert c.templates.get(name).start is None

        with pytest.raises(hutch.InvalidRequest) as bad:
            c.templates.update(name, start={"cmd": "true", "ready": {"port": 0}})
        assert bad.value.status == 400 and "port" in bad.value.message
        with pytest.raises(ValueError):
            c.templates.update(name)
        try:
            with pytest.raises(hutch.NotFoundError):
                c.templates.update(f"{name}-none", isolation="ns")
        finally:
            (TEMPLATES / f".lock-{name}-none").unlink(missing_ok=True)


def test_an_image_naming_local_files_is_refused(server: Server, name: str, tmp_path: Path) -> None:
    with Client() as c:
        for reference in (f"oci:{tmp_path}:1", f"docker-archive:{tmp_path / 'image.tar'}"):
            with pytest.raises(hutch.InvalidRequest) as refused:
                c.templates.build_from_image(name, reference)
            assert refused.value.status == 400 and refused.value.code == "bad_request"
            assert "image_archive=true" in refused.value.message
        # Nothing to upload is refused before anything is sent.
        with pytest.raises(hutch.InvalidRequest) as missing:
            c.templates.upload_image(name, tmp_path / "nothing.tar")
        assert missing.value.status is None
        with pytest.raises(hutch.NotFoundError):
            c.templates.get(name)


@pytest.mark.asyncio
async def test_the_async_client_uploads_a_layout_directory(
    server: Server, name: str, tmp_path: Path
) -> None:
    write_layout(tmp_path / "layout", "uploaded as a directory")
    start = {"cmd": "exec cat /from-image", "ready": {"cmd": ["/bin/cat", "/from-image"]}}
    async with AsyncClient() as c:
        build = await c.templates.upload_image(name, tmp_path / "layout", start=start)
        lines = [line async for line in build.logs()]
        assert any(line.progress and line.progress.action == "extract" for line in lines)
        assert (await build.wait()).status == "succeeded"
        t = await c.templates.get(name)
        assert t.image is not None and t.image["reference"] == "upload"
        assert t.start is not None and t.start["cmd"] == "exec cat /from-image"
        assert t.start["ready"]["cmd"] == ["/bin/cat", "/from-image"]
        assert (await c.templates.update(name, start=None)).start is None
