"""Template builds from Dockerfiles through the SDK against a real server: build, follow,
wait, cancel, get and delete, sync and async. Dockerfiles start ``FROM minimal`` (busybox),
so no build needs a network; every template is deleted at the end."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Iterator, List

import pytest
from conftest import Server

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
