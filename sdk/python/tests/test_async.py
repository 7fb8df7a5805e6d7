"""The asyncio SDK against a real server."""

from __future__ import annotations

import asyncio
from typing import List, Tuple

import pytest
from conftest import Server, sandbox_ids

import hutch
from hutch import AsyncClient, AsyncSandbox

pytestmark = pytest.mark.asyncio


async def test_health_templates(server: Server) -> None:
    async with AsyncClient() as c:
        assert (await c.health())["status"] == "ok"
        assert "minimal" in [t.name for t in await c.templates()]


async def test_create_await_and_lifecycle(server: Server) -> None:
    sb = await AsyncSandbox.create(ttl_seconds=90, metadata={"suite": "py-async", "case": "a"})
    try:
        assert sb.state == "running" and sb.info.ttl_seconds == 90
        other = await AsyncSandbox.connect(sb.id)
        assert other.id == sb.id
        await other.close()
        found = await AsyncSandbox.list(metadata={"case": "a", "suite": "py-async"})
        assert [s.id for s in found] == [sb.id]
        for s in found:
            await s.close()
        assert (await sb.set_ttl(200)).ttl_seconds == 200
        assert (await sb.set_persistent(True)).expires_at is None
        assert (await sb.set_persistent(False)).persistent is False
        assert (await sb.set_metadata({"k": "v"})).metadata == {"k": "v"}
        assert (await sb.refresh()).metadata == {"k": "v"}
        u = await sb.usage()
        assert u is not None and u.memory_limit_bytes > 0
    finally:
        await sb.kill()
        await sb.close()
    assert sb.id not in sandbox_ids(server)
    with pytest.raises(hutch.SandboxNotFound):
        await AsyncSandbox.connect(sb.id)


async def test_async_with_kills(server: Server) -> None:
    async with AsyncSandbox.create() as sb:
        sid = sb.id
        assert sid in sandbox_ids(server)
    assert sid not in sandbox_ids(server)

    # `async with await …` works too.
    async with await AsyncSandbox.create() as sb2:
        sid2 = sb2.id
    assert sid2 not in sandbox_ids(server)


async def test_async_with_kills_when_the_block_raises(server: Server) -> None:
    ids: List[str] = []
    with pytest.raises(KeyError):
        async with AsyncSandbox.create() as sb:
            ids.append(sb.id)
            await sb.exec("true")
            raise KeyError("boom")
    assert ids and ids[0] not in sandbox_ids(server)


async def test_exec_and_stream(server: Server) -> None:
    async with AsyncSandbox.create() as sb:
        r = await sb.exec(["printf", "%s|", "a b", "$(x)"], env={"X": "1"})
        assert r.stdout == "a b|$(x)|" and r.exit_code == 0
        r = await sb.exec("cat; exit 2", stdin=b"bytes-in", cwd="/tmp")
        assert (r.stdout, r.exit_code) == ("bytes-in", 2)
        assert (await sb.exec("sleep 3", timeout=0.3)).timed_out

        events: List[Tuple[str, str]] = []

        async def on_out(s: str) -> None:
            await asyncio.sleep(0)
            events.append(("out", s))

        code = await sb.exec_stream(
            "for i in 1 2 3; do echo n$i; sleep 0.05; done; echo e >&2; exit 9",
            on_stdout=on_out,
            on_stderr=lambda s: events.append(("err", s)),
        )
        events.append(("exit", str(code)))
        assert code == 9
        assert "".join(v for k, v in events if k == "out") == "n1\nn2\nn3\n"
        assert events[-1] == ("exit", "9")
        kinds = [k for k, _ in events]
        assert max(i for i, k in enumerate(kinds) if k == "out") < kinds.index("err")


async def test_files(server: Server) -> None:
    async with AsyncSandbox.create() as sb:
        f = sb.files
        await f.write("/srv/x/a.txt", "alpha", mode=0o640)
        assert await f.read("/srv/x/a.txt") == "alpha"
        assert (await f.stat("/srv/x/a.txt")).mode == 0o640
        await f.write("/srv/x/b.bin", b"\x00\xff")
        assert await f.read_bytes("/srv/x/b.bin") == b"\x00\xff"
        await f.mkdir("/srv/x/d")
        assert [e.name for e in await f.list("/srv/x")] == ["a.txt", "b.bin", "d"]
        await f.move("/srv/x/a.txt", "/srv/y/a.txt")
        assert await f.exists("/srv/y/a.txt") and not await f.exists("/srv/x/a.txt")
        with pytest.raises(hutch.ConflictError):
            await f.remove("/srv/x")
        await f.remove("/srv/x", recursive=True)
        with pytest.raises(hutch.FileNotFound):
            await f.read("/srv/x/b.bin")


async def test_pty(server: Server) -> None:
    async with AsyncSandbox.create() as sb:
        term = await sb.pty(cols=90, rows=20)
        async with term:
            await term.send("echo hi-$((1+1))\n")
            assert b"hi-2" in await term.read_until("hi-2", timeout=10)
            await term.resize(120, 40)
            await term.send("stty size\n")
            await term.read_until("40 120", timeout=10)
            await term.send("exit 3\n")
            assert await term.wait(timeout=10) == 3
        with pytest.raises(hutch.TimeoutError):
            async with await sb.pty("sleep 5") as t2:
                await t2.read_until("never", timeout=0.3)


async def test_errors(server: Server) -> None:
    with pytest.raises(hutch.SandboxNotFound):
        await AsyncSandbox.connect("sbx_doesnotexist")
    with pytest.raises(hutch.AuthError):
        await AsyncSandbox.create(api_key="wrong-key")
    with pytest.raises(hutch.InvalidRequest):
        await AsyncSandbox.list(state="bogus")
    async with AsyncSandbox.create() as sb:
        with pytest.raises(hutch.InvalidRequest) as ei:
            await sb.exec("true", timeout=-1)
        assert ei.value.status == 422
        async with AsyncClient(api_key="wrong-key") as bad:
            s = AsyncSandbox(sb.info, bad)
            with pytest.raises(hutch.AuthError):
                await s.pty()
            with pytest.raises(hutch.AuthError):
                await s.files.read("/etc/hostname")


async def test_events(server: Server) -> None:
    async with AsyncClient() as c:
        async with c.events(timeout=20) as events:
            sb = await AsyncSandbox.create(client=c)
            await sb.kill()
            seen: List[str] = []
            async for ev in events:
                if ev.sandbox_id == sb.id:
                    seen.append(ev.type)
                if "sandbox.killed" in seen:
                    break
            assert seen == ["sandbox.created", "sandbox.killed"]
            await sb.close()


async def test_logs_and_follow(server: Server) -> None:
    async with AsyncClient() as c:
        sb = await AsyncSandbox.create(client=c)
        lines = await sb.logs(source="agent")
        assert [line.source for line in lines if "starting as pid 1" in line.text] == ["agent"]
        async with sb.follow_logs(timeout=20) as follow:
            await sb.hibernate()
            await sb.wake()
            async for line in follow:
                if "starting as pid 1" in line.text:
                    break
        assert len([line for line in await sb.logs() if "starting as pid 1" in line.text]) == 2
        await sb.kill()
        await sb.close()


async def test_gather(server: Server) -> None:
    async with AsyncClient() as c:
        sandboxes = await asyncio.gather(*(AsyncSandbox.create(client=c) for _ in range(3)))
        try:
            outs = await asyncio.gather(*(s.exec(f"echo {i}") for i, s in enumerate(sandboxes)))
            assert [o.stdout for o in outs] == ["0\n", "1\n", "2\n"]
        finally:
            for s in sandboxes:
                await s.__aexit__(None, None, None)
        assert not set(s.id for s in sandboxes) & set(sandbox_ids(server))
