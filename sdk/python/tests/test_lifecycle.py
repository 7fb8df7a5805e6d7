"""Pause, hibernate, snapshots, fork and explore against the real server (`ns` backend)."""

from __future__ import annotations

import pytest
from conftest import Server, sandbox_ids

import hutch
from hutch import AsyncSandbox, Client, Sandbox


def test_pause_refuses_exec_until_resume(server: Server) -> None:
    with Sandbox.create(metadata={"suite": "py-lifecycle"}) as sb:
        info = sb.pause()
        assert info.state == "paused" and sb.state == "paused"
        assert sb.refresh().state == "paused"  # get is allowed while paused

        with pytest.raises(hutch.ConflictError) as ei:
            sb.exec("echo hi")
        assert ei.value.status == 409 and ei.value.code == "conflict"
        assert "resume" in ei.value.message
        with pytest.raises(hutch.ConflictError):
            sb.files.read("/etc/hostname")
        with pytest.raises(hutch.ConflictError):
            sb.pause()  # already paused
        with pytest.raises(hutch.ConflictError):
            sb.hibernate()

        assert sb.resume().state == "running"
        assert sb.exec("echo back").stdout == "back\n"
        with pytest.raises(hutch.ConflictError):
            sb.resume()  # not paused any more


def test_hibernate_keeps_files_not_processes(server: Server) -> None:
    with Sandbox.create(metadata={"suite": "py-lifecycle"}) as sb:
        sb.files.write("/root/kept.txt", "still here\n")
        sb.exec("sleep 1000 >/dev/null 2>&1 &")
        assert sb.exec("pidof sleep").ok

        info = sb.hibernate()
        assert info.state == "hibernated" and info.woke_in_ms is None
        assert sb.refresh().state == "hibernated"  # get does not wake it
        with pytest.raises(hutch.ConflictError):
            sb.hibernate()

        # The next exec wakes it transparently: the files are there, the processes are not.
        r = sb.exec("cat /root/kept.txt; pidof sleep || echo no-sleep")
        assert r.stdout == "still here\nno-sleep\n"
        assert sb.refresh().state == "running"
        with pytest.raises(hutch.ConflictError):
            sb.wake()  # running: nothing to wake

        # And explicitly, with the time it took.
        sb.hibernate()
        woken = sb.wake()
        assert woken.state == "running"
        assert isinstance(woken.woke_in_ms, int) and woken.woke_in_ms >= 0
        assert woken.raw["woke_in_ms"] == woken.woke_in_ms
        assert sb.files.read("/root/kept.txt") == "still here\n"
        assert sb.refresh().woke_in_ms is None


def test_idle_hibernate_seconds_on_create_and_update(server: Server) -> None:
    with Sandbox.create(idle_hibernate_seconds=600) as sb:
        assert sb.info.idle_hibernate_seconds == 600
        assert sb.update(idle_hibernate_seconds=0).idle_hibernate_seconds is None


def test_snapshot_create_from_it_and_delete(server: Server) -> None:
    with Client() as c:
        with Sandbox.create(client=c, metadata={"suite": "py-lifecycle"}) as parent:
            parent.files.write("/root/snap.txt", "from the snapshot\n")
            parent.exec("echo in-tmp > /tmp/not-kept")
            snap = parent.snapshot("py-warm")
            assert snap.id.startswith("snap_") and snap.name == "py-warm"
            assert snap.sandbox_id == parent.id
            assert snap.kind == "filesystem" and snap.isolation == "ns"
            assert snap.template == parent.info.template
            assert snap.size_bytes > 0 and snap.created_at and snap.used_by == []
            assert parent.exec("cat /root/snap.txt").ok  # the parent keeps running
        assert snap.id in [s.id for s in c.snapshots()]

        # The source sandbox is gone; the snapshot does not depend on it.
        child = Sandbox.create(snapshot=snap.id, client=c, metadata={"suite": "py-lifecycle"})
        try:
            assert child.info.snapshot == snap.id
            assert child.info.template == snap.template
            assert child.files.read("/root/snap.txt") == "from the snapshot\n"
            assert not child.files.exists("/tmp/not-kept")  # tmpfs is not in a snapshot
            child.files.write("/root/snap.txt", "changed in the child\n")

            assert c.get_snapshot(snap.id).used_by == [child.id]
            with pytest.raises(hutch.ConflictError) as ei:
                c.delete_snapshot(snap.id)
            assert ei.value.status == 409 and child.id in ei.value.message

            # A second sandbox from the same snapshot sees the snapshot, not the child's write.
            with Sandbox.create(snapshot=snap.id, client=c) as other:
                assert other.files.read("/root/snap.txt") == "from the snapshot\n"
        finally:
            child.kill()
            child.close()

        assert c.get_snapshot(snap.id).used_by == []
        c.delete_snapshot(snap.id)  # 204 now
        assert snap.id not in [s.id for s in c.snapshots()]
        with pytest.raises(hutch.NotFoundError):
            c.get_snapshot(snap.id)
        with pytest.raises(hutch.NotFoundError):
            Sandbox.create(snapshot=snap.id, client=c)


def test_snapshot_without_a_name_and_create_by_a_unique_name(server: Server) -> None:
    with Client() as c:
        with Sandbox.create(client=c, metadata={"suite": "py-lifecycle"}) as parent:
            parent.files.write("/root/mark", "by name\n")
            unnamed = parent.snapshot()
            assert unnamed.name == unnamed.id
            first = parent.snapshot("py-by-name")
            with Sandbox.create(snapshot="py-by-name", client=c) as child:
                assert child.info.snapshot == first.id
                assert child.files.read("/root/mark") == "by name\n"
            second = parent.snapshot("py-by-name")
            with pytest.raises(hutch.ConflictError) as ei:
                Sandbox.create(snapshot="py-by-name", client=c)
            assert first.id in ei.value.message and second.id in ei.value.message
        for snap in (unnamed, first, second):
            c.delete_snapshot(snap.id)


def test_fork_children_start_from_the_parent_and_are_independent(server: Server) -> None:
    with Sandbox.create(metadata={"suite": "py-lifecycle", "case": "fork"}) as parent:
        parent.files.write("/root/shared.txt", "parent\n")
        children = parent.fork(count=2)
        try:
            assert len(children) == 2
            a, b = children
            assert len({parent.id, a.id, b.id}) == 3
            for ch in children:
                assert ch.state == "running"
                assert ch.info.forked_from == parent.id
                assert ch.info.metadata["case"] == "fork"
                assert ch.files.read("/root/shared.txt") == "parent\n"

            a.files.write("/root/shared.txt", "a\n")
            b.exec("echo b > /root/only-b")
            parent.files.write("/root/shared.txt", "parent again\n")
            assert a.files.read("/root/shared.txt") == "a\n"
            assert b.files.read("/root/shared.txt") == "parent\n"
            assert parent.files.read("/root/shared.txt") == "parent again\n"
            assert not a.files.exists("/root/only-b")
            assert not parent.files.exists("/root/only-b")
        finally:
            for ch in children:
                ch.kill()
                ch.close()
        assert parent.exec("cat /root/shared.txt").stdout == "parent again\n"


def test_fork_of_a_hibernated_sandbox(server: Server) -> None:
    with Sandbox.create(metadata={"suite": "py-lifecycle"}) as parent:
        parent.files.write("/root/f", "x")
        parent.hibernate()
        (child,) = parent.fork()
        with child:
            assert child.files.read("/root/f") == "x"
        assert parent.refresh().state == "hibernated"  # forked from disk, not woken


def test_live_fork_is_refused_on_ns(server: Server) -> None:
    with Sandbox.create(metadata={"suite": "py-lifecycle"}) as sb:
        before = set(sandbox_ids(server))
        with pytest.raises(hutch.InvalidRequest) as ei:
            sb.fork(count=1, mode="live")
        assert ei.value.status == 422 and ei.value.code == "invalid_argument"
        assert "vm" in ei.value.message
        with pytest.raises(hutch.InvalidRequest):
            sb.fork(count=0)
        assert set(sandbox_ids(server)) == before


def test_explore_keeps_only_the_winner(server: Server) -> None:
    with Sandbox.create(metadata={"suite": "py-lifecycle"}) as parent:
        parent.files.write("/root/base.txt", "base\n")
        before = set(sandbox_ids(server))
        result = parent.explore(["exit 1", "echo ok", "exit 2"], timeout=30)
        assert [o.index for o in result.outcomes] == [0, 1, 2]
        assert [o.exit_code for o in result.outcomes] == [1, 0, 2]
        assert [o.score for o in result.outcomes] == [0.0, 1.0, 0.0]
        assert [o.kept for o in result.outcomes] == [False, True, False]
        w = result.winner
        assert w.index == 1 and w.kept and w.ok and not w.timed_out
        assert w.stdout == "ok\n" and w.stderr == "" and w.error is None
        assert w.sandbox_id == result.outcomes[1].sandbox_id

        # Only the winner's child is left, and it is a sandbox of its own.
        assert set(sandbox_ids(server)) == before | {w.sandbox_id}
        with Sandbox.connect(w.sandbox_id) as kept:
            assert kept.info.forked_from == parent.id
            assert kept.files.read("/root/base.txt") == "base\n"
        assert w.sandbox_id not in sandbox_ids(server)
        assert parent.exec("cat /root/base.txt").stdout == "base\n"  # the parent is unchanged


def test_explore_score_regex_and_timeout(server: Server) -> None:
    with Sandbox.create(metadata={"suite": "py-lifecycle"}) as parent:
        result = parent.explore(
            ["echo score=3", ["sh", "-c", "echo score=7; exit 1"], "sleep 30"],
            timeout=1,
            score_regex=r"score=([0-9]+)",
        )
        with Sandbox.connect(result.winner.sandbox_id):
            assert result.winner.index == 1 and result.winner.score == 7.0
            assert not result.winner.ok
            slow = result.outcomes[2]
            assert slow.timed_out and slow.exit_code == 124 and slow.score == 0.0
        with pytest.raises(hutch.InvalidRequest):
            parent.explore(["true"], score_regex="no group")
        with pytest.raises(hutch.InvalidRequest):
            parent.explore([])
        with pytest.raises(TypeError):
            parent.explore("echo one string")


@pytest.mark.asyncio
async def test_async_lifecycle(server: Server) -> None:
    async with AsyncSandbox.create(metadata={"suite": "py-lifecycle-async"}) as sb:
        await sb.files.write("/root/a.txt", "async\n")
        assert (await sb.pause()).state == "paused"
        with pytest.raises(hutch.ConflictError):
            await sb.exec("true")
        assert (await sb.resume()).state == "running"

        assert (await sb.hibernate()).state == "hibernated"
        woken = await sb.wake()
        assert woken.state == "running" and woken.woke_in_ms is not None

        snap = await sb.snapshot("py-async")
        async with AsyncSandbox.create(snapshot=snap.id) as child:
            assert await child.files.read("/root/a.txt") == "async\n"
            with pytest.raises(hutch.ConflictError):
                await sb.client.delete_snapshot(snap.id)
            assert (await sb.client.get_snapshot(snap.id)).used_by == [child.id]
        await sb.client.delete_snapshot(snap.id)
        assert snap.id not in [s.id for s in await sb.client.snapshots()]

        forks = await sb.fork(count=2)
        try:
            for f in forks:
                assert f.info.forked_from == sb.id
                assert await f.files.read("/root/a.txt") == "async\n"
        finally:
            for f in forks:
                await f.kill()
                await f.close()
        with pytest.raises(hutch.InvalidRequest):
            await sb.fork(mode="live")

        result = await sb.explore(["exit 1", "echo ok", "exit 2"])
        assert result.winner.index == 1 and result.winner.stdout == "ok\n"
        kept = await AsyncSandbox.connect(result.winner.sandbox_id, client=sb.client)
        await kept.kill()
        await kept.close()
