"""File watches and signed file URLs through both clients, against a real server."""

from __future__ import annotations

import asyncio
from typing import List

import httpx
import pytest
from conftest import Server

import hutch
from hutch import AsyncSandbox, FileEvent, Sandbox


def test_watch_reports_changes_and_stops(server: Server) -> None:
    with Sandbox.create() as sb:
        sb.files.mkdir("/w/old")
        with sb.files.watch("/w", recursive=True, include_entry=True) as watch:
            assert watch.ready["path"] == "/w" and watch.ready["watched_dirs"] == 2
            # Entries are read when the event is handled: the file stays until the next exec.
            sb.exec("printf 12345 > /w/old/a.txt")
            seen: List[FileEvent] = []
            for event in watch:
                seen.append(event)
                if event.event == "write":
                    break
            sb.exec("mv /w/old/a.txt /w/b.txt && rm /w/b.txt")
            for event in watch:
                seen.append(event)
                if event.event == "remove":
                    break
        assert [(e.event, e.name) for e in seen] == [
            ("create", "old/a.txt"),
            ("write", "old/a.txt"),
            ("rename", "b.txt"),
            ("remove", "b.txt"),
        ]
        assert seen[1].entry is not None and seen[1].entry.size == 5
        assert seen[2].old_name == "old/a.txt" and seen[2].old_path == "/w/old/a.txt"
        assert seen[0].type == "file" and seen[0].path == "/w/old/a.txt"
        with pytest.raises(hutch.FileNotFound):
            sb.files.watch("/nope")
        sb.files.write("/f", "x")
        with pytest.raises(hutch.InvalidRequest):
            sb.files.watch("/f")


def test_a_watch_ends_when_its_directory_goes(server: Server) -> None:
    with Sandbox.create() as sb:
        sb.files.mkdir("/gone")
        watch = sb.files.watch("/gone")
        sb.exec("rmdir /gone")
        assert list(watch) == []
        assert watch.end_reason is not None and "removed" in watch.end_reason
        watch.stop()


def test_signed_urls_read_and_write_without_the_key(server: Server) -> None:
    with Sandbox.create() as sb:
        sb.files.write("/srv/data.txt", "signed bytes")
        url = sb.files.download_url("/srv/data.txt", expires_in=60)
        plain = httpx.get(url)
        assert plain.status_code == 200 and plain.text == "signed bytes"
        assert httpx.put(url, content=b"nope").status_code == 403
        up = sb.files.upload_url("/home/user/in.txt", user="user")
        assert httpx.put(up, content=b"uploaded").status_code == 204
        assert sb.files.read("/home/user/in.txt") == "uploaded"
        owner = sb.exec("stat -c %U /home/user/in.txt").stdout.strip()
        assert owner == "user"
        entry = sb.files.stat("/home/user/in.txt")
        assert (entry.owner, entry.group, entry.uid) == ("user", "user", 1000)
        with pytest.raises(ValueError):
            sb.files.download_url("/srv/data.txt", expires_in=0)
        with pytest.raises(ValueError):
            sb.files.download_url("/srv/data.txt", expires_in=8 * 24 * 3600)


@pytest.mark.asyncio
async def test_async_watch_and_urls(server: Server) -> None:
    async with AsyncSandbox.create() as sb:
        await sb.files.mkdir("/aw")
        async with await sb.files.watch("/aw") as watch:
            assert watch.ready["recursive"] is False
            await sb.exec("touch /aw/x && mkdir /aw/d")
            seen = []

            async def collect() -> None:
                async for event in watch:
                    seen.append((event.event, event.name, event.type))
                    if event.name == "d":
                        return

            await asyncio.wait_for(collect(), timeout=20)
        assert seen[0] == ("create", "x", "file")
        assert seen[-1] == ("create", "d", "dir")
        await sb.files.write("/aw/r.txt", "async bytes")
        url = await sb.files.download_url("/aw/r.txt")
        async with httpx.AsyncClient() as http:
            got = await http.get(url)
        assert got.status_code == 200 and got.text == "async bytes"
        up = await sb.files.upload_url("/aw/w.txt", expires_in=30)
        async with httpx.AsyncClient() as http:
            assert (await http.put(up, content=b"w")).status_code == 204
        assert await sb.files.read("/aw/w.txt") == "w"
