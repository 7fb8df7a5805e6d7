"""Durable volumes against the real server (`ns` backend, template `minimal`)."""

from __future__ import annotations

import uuid

import pytest
from conftest import Server

import hutch
from hutch import AsyncClient, AsyncSandbox, Client, Sandbox, Volume, VolumeMount


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_volume_outlives_sandboxes_and_is_read_only_when_asked(server: Server) -> None:
    with Client() as c:
        name = _name("py-data")
        vol = c.create_volume(name, size_mib=16)
        assert isinstance(vol, Volume)
        assert vol.id.startswith("vol_") and vol.name == name and vol.size_mib == 16
        assert vol.created_at and vol.attached == [] and vol.used_bytes is None
        assert vol.raw["id"] == vol.id
        assert vol.id in [v.id for v in c.volumes()]
        assert c.get_volume(name).id == vol.id  # by name as well as by id

        # Write from a first sandbox (mounted by name, read-write).
        writer = Sandbox.create(
            client=c, volumes=[{"volume": name, "path": "/data"}], metadata={"suite": "py-vol"}
        )
        try:
            assert writer.info.volumes == [VolumeMount(vol.id, "/data", False)]
            r = writer.exec("echo persisted > /data/hello.txt && sync && cat /data/hello.txt")
            assert r.ok, r.stderr
            assert r.stdout == "persisted\n"

            got = c.get_volume(vol.id)
            assert [(a.sandbox, a.path, a.read_only) for a in got.attached] == [
                (writer.id, "/data", False)
            ]
            assert got.used_bytes is not None and got.used_bytes > 0

            # Attached read-write: no other sandbox may mount it, and it cannot be deleted.
            with pytest.raises(hutch.ConflictError) as ei:
                Sandbox.create(client=c, volumes=[{"volume": vol.id, "path": "/d"}])
            assert ei.value.status == 409
            with pytest.raises(hutch.ConflictError) as ei:
                c.delete_volume(vol.id)
            assert ei.value.status == 409 and writer.id in ei.value.message
        finally:
            writer.kill()
            writer.close()
        assert c.get_volume(vol.id).attached == []

        # Read it from a second sandbox, mounted read-only (a VolumeMount works too).
        with Sandbox.create(
            client=c, volumes=[VolumeMount(vol.id, "/mnt/ro", read_only=True)]
        ) as reader:
            assert reader.info.volumes == [VolumeMount(vol.id, "/mnt/ro", True)]
            assert reader.exec("cat /mnt/ro/hello.txt").stdout == "persisted\n"
            assert reader.files.read("/mnt/ro/hello.txt") == "persisted\n"
            w = reader.exec("echo nope > /mnt/ro/new.txt")
            assert not w.ok
            assert "read-only" in w.stderr.lower(), w.stderr
            assert not reader.files.exists("/mnt/ro/new.txt")

            # Read-only elsewhere: another read-only mount is fine, a read-write one is not.
            with Sandbox.create(
                client=c, volumes=[{"volume": vol.id, "path": "/ro2", "read_only": True}]
            ) as second:
                assert second.exec("cat /ro2/hello.txt").stdout == "persisted\n"
                assert len(c.get_volume(vol.id).attached) == 2
            with pytest.raises(hutch.ConflictError):
                Sandbox.create(client=c, volumes=[{"volume": vol.id, "path": "/rw"}])
            with pytest.raises(hutch.ConflictError):
                c.delete_volume(name)

        c.delete_volume(name)  # 204 now (by name)
        assert vol.id not in [v.id for v in c.volumes()]
        with pytest.raises(hutch.NotFoundError) as nf:
            c.get_volume(vol.id)
        assert nf.value.status == 404
        with pytest.raises(hutch.NotFoundError):
            c.delete_volume(vol.id)
        with pytest.raises(hutch.NotFoundError):
            Sandbox.create(client=c, volumes=[{"volume": vol.id, "path": "/data"}])


def test_volume_size_is_a_hard_limit(server: Server) -> None:
    with Client() as c:
        vol = c.create_volume(_name("py-small"), size_mib=4)
        try:
            with Sandbox.create(client=c, volumes=[{"volume": vol.id, "path": "/v"}]) as sb:
                r = sb.exec("dd if=/dev/zero of=/v/big bs=1048576 count=16")
                assert not r.ok
                assert "no space left" in r.stderr.lower(), r.stderr
        finally:
            c.delete_volume(vol.id)


def test_forks_get_only_read_only_volumes(server: Server) -> None:
    with Client() as c:
        rw = c.create_volume(_name("py-rw"), size_mib=8)
        ro = c.create_volume(_name("py-ro"), size_mib=8)
        try:
            with Sandbox.create(
                client=c,
                volumes=[
                    {"volume": rw.id, "path": "/rw"},
                    {"volume": ro.id, "path": "/ro", "read_only": True},
                ],
            ) as parent:
                assert {m.volume for m in parent.info.volumes} == {rw.id, ro.id}
                (child,) = parent.fork()
                with child:
                    assert child.info.volumes == [VolumeMount(ro.id, "/ro", True)]
                    assert child.exec("test -d /ro").ok
        finally:
            c.delete_volume(rw.id)
            c.delete_volume(ro.id)


def test_volume_validation(server: Server) -> None:
    with Client() as c:
        for bad in ("", ".hidden", "vol_x", "has space", "x" * 65):
            with pytest.raises(hutch.InvalidRequest) as ei:
                c.create_volume(bad, size_mib=8)
            assert ei.value.status == 422, bad
        for size in (3, 1048577):
            with pytest.raises(hutch.InvalidRequest) as ei:
                c.create_volume(_name("py-size"), size_mib=size)
            assert ei.value.status == 422
        with pytest.raises(hutch.InvalidRequest) as ei:
            c.create_volume(_name("py-type"), size_mib="big")  # type: ignore[arg-type]
        assert ei.value.status == 400

        name = _name("py-dup")
        vol = c.create_volume(name, size_mib=8)
        try:
            with pytest.raises(hutch.ConflictError) as dup:
                c.create_volume(name, size_mib=8)
            assert dup.value.status == 409
            for path in ("/proc/x", "relative"):
                with pytest.raises(hutch.InvalidRequest) as ei:
                    Sandbox.create(client=c, volumes=[{"volume": vol.id, "path": path}])
                assert ei.value.status == 422, path
            with pytest.raises(hutch.InvalidRequest) as ei:
                Sandbox.create(client=c, volumes=[{"volume": vol.id, "path": "/d", "bogus": 1}])
            assert ei.value.status == 400
            with pytest.raises(hutch.NotFoundError):
                Sandbox.create(client=c, volumes=[{"volume": _name("nosuch"), "path": "/d"}])
            assert c.get_volume(vol.id).attached == []
        finally:
            c.delete_volume(vol.id)
        with pytest.raises(hutch.NotFoundError):
            c.get_volume(name)


@pytest.mark.asyncio
async def test_async_volumes(server: Server) -> None:
    async with AsyncClient() as c:
        name = _name("py-async")
        vol = await c.create_volume(name, size_mib=8)
        assert vol.id.startswith("vol_") and vol.size_mib == 8
        assert vol.id in [v.id for v in await c.volumes()]

        async with AsyncSandbox.create(
            client=c, volumes=[{"volume": vol.id, "path": "/data"}]
        ) as sb:
            assert sb.info.volumes == [VolumeMount(vol.id, "/data", False)]
            assert (await sb.exec("echo async > /data/a.txt")).ok
            assert [a.sandbox for a in (await c.get_volume(name)).attached] == [sb.id]
            with pytest.raises(hutch.ConflictError):
                await c.delete_volume(vol.id)

        async with AsyncSandbox.create(
            client=c, volumes=[{"volume": name, "path": "/data", "read_only": True}]
        ) as sb2:
            assert (await sb2.exec("cat /data/a.txt")).stdout == "async\n"
            assert not (await sb2.exec("touch /data/b.txt")).ok

        await c.delete_volume(vol.id)
        with pytest.raises(hutch.NotFoundError):
            await c.get_volume(vol.id)
