"""The synchronous SDK against a real server."""

from __future__ import annotations

import threading
from typing import List, Tuple

import pytest
from conftest import Server, sandbox_ids

import hutch
from hutch import Client, Sandbox


@pytest.fixture
def sb(server: Server):
    with Sandbox.create(metadata={"suite": "py-sync"}) as s:
        yield s


def test_health_and_templates(server: Server) -> None:
    with Client() as c:
        assert c.health()["status"] == "ok"
        names = {t.name: t for t in c.templates()}
        assert "minimal" in names and names["minimal"].ready
        assert "ns" in names["minimal"].isolations


def test_create_connect_list_update_kill(server: Server) -> None:
    sb = Sandbox.create(
        "minimal",
        isolation="auto",
        ttl_seconds=120,
        metadata={"suite": "py-sync", "case": "lifecycle"},
        env={"GREETING": "hello"},
        cpus=0.5,
        memory_mib=128,
        network={"egress": "none"},
    )
    try:
        assert sb.id.startswith("sbx_")
        assert sb.state == "running"
        assert sb.info.template == "minimal"
        assert sb.info.ttl_seconds == 120
        assert sb.info.cpus == 0.5 and sb.info.memory_mib == 128
        assert sb.info.metadata["case"] == "lifecycle"
        assert sb.exec("echo $GREETING").stdout == "hello\n"

        other = Sandbox.connect(sb.id)
        assert other.id == sb.id and other.state == "running"
        other.close()

        found = Sandbox.list(metadata={"case": "lifecycle"})
        assert [s.id for s in found] == [sb.id]
        for s in found:
            s.close()
        assert sb.id in [s.id for s in Sandbox.list(state="running")]
        assert Sandbox.list(metadata={"case": "no-such-value"}) == []

        assert sb.set_ttl(600).ttl_seconds == 600
        info = sb.set_persistent(True)
        assert info.persistent and info.expires_at is None
        assert sb.set_persistent(False).expires_at is not None
        assert sb.set_metadata({"case": "renamed"}).metadata == {"case": "renamed"}
        info = sb.update(ttl_seconds=300, metadata={"case": "both"})
        assert info.ttl_seconds == 300 and info.metadata == {"case": "both"}
        assert sb.refresh().metadata == {"case": "both"}
    finally:
        sb.kill()
    with pytest.raises(hutch.SandboxNotFound):
        sb.refresh()
    sb.kill()  # idempotent
    sb.close()
    assert sb.id not in sandbox_ids(server)


def test_context_manager_kills_ephemeral_sandbox(server: Server) -> None:
    with Sandbox.create() as sb:
        sid = sb.id
        assert sid in sandbox_ids(server)
    assert sid not in sandbox_ids(server)
    with pytest.raises(hutch.SandboxNotFound):
        Sandbox.connect(sid)


def test_context_manager_kills_even_when_the_block_raises(server: Server) -> None:
    ids: List[str] = []
    with pytest.raises(RuntimeError, match="boom"):
        with Sandbox.create() as sb:
            ids.append(sb.id)
            sb.exec("true")
            raise RuntimeError("boom")
    assert ids and ids[0] not in sandbox_ids(server)


def test_context_manager_keeps_persistent_sandbox(server: Server) -> None:
    with Sandbox.create(persistent=True) as sb:
        sid = sb.id
    try:
        assert sid in sandbox_ids(server)
    finally:
        s = Sandbox.connect(sid)
        s.kill()
        s.close()
    assert sid not in sandbox_ids(server)


def test_shared_client(server: Server) -> None:
    with Client() as c:
        with Sandbox.create(client=c) as a, Sandbox.create(client=c) as b:
            assert a.exec("echo a").stdout == "a\n"
            assert b.exec("echo b").stdout == "b\n"
        # The sandboxes are gone but an explicit client stays usable.
        assert c.health()["status"] == "ok"


def test_exec(sb: Sandbox) -> None:
    r = sb.exec(["echo", "a; rm -rf /", "$HOME"])
    assert r.stdout == "a; rm -rf / $HOME\n", "argv must not go through a shell"
    assert r.exit_code == 0 and r.ok and not r.timed_out and r.duration_ms >= 0

    r = sb.exec("echo out; echo err >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code, r.ok) == ("out\n", "err\n", 3, False)

    assert sb.exec("echo $A-$B", env={"A": "1", "B": "2"}).stdout == "1-2\n"
    assert sb.exec("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert sb.exec("id -u", user="root").stdout == "0\n"
    assert sb.exec("cat", stdin="from stdin").stdout == "from stdin"
    assert sb.exec(["wc", "-c"], stdin=b"\x00\x01\x02").stdout.strip() == "3"

    r = sb.exec("sleep 5", timeout=0.5)
    assert r.timed_out and r.exit_code == 124

    assert sb.exec(["no-such-program"]).exit_code == 127
    assert sb.exec("kill -9 $$").exit_code == 137

    r = sb.exec("printf 'ok\\377'")
    assert r.stdout_bytes == b"ok\xff"
    assert r.stdout == "ok\ufffd"


def test_exec_stream_callbacks_in_order(sb: Sandbox) -> None:
    events: List[Tuple[str, object]] = []
    code = sb.exec_stream(
        "for i in 1 2 3 4 5; do echo line$i; sleep 0.05; done; echo warn >&2; exit 7",
        on_start=lambda pid: events.append(("start", pid)),
        on_stdout=lambda s: events.append(("out", s)),
        on_stderr=lambda s: events.append(("err", s)),
    )
    events.append(("exit", code))
    assert code == 7
    assert events[0][0] == "start" and isinstance(events[0][1], int)
    assert events[-1] == ("exit", 7)
    out = "".join(str(v) for k, v in events if k == "out")
    assert out == "".join(f"line{i}\n" for i in range(1, 6))
    assert "".join(str(v) for k, v in events if k == "err") == "warn\n"
    # Every stdout chunk came before the stderr line written after them.
    kinds = [k for k, _ in events]
    assert max(i for i, k in enumerate(kinds) if k == "out") < kinds.index("err")


def test_exec_stream_stdin_env_and_binary(sb: Sandbox) -> None:
    chunks: List[str] = []
    code = sb.exec_stream(
        "cat; printf '\\377'; echo $X", stdin="in\n", env={"X": "y"}, on_stdout=chunks.append
    )
    assert code == 0
    assert "".join(chunks) == "in\n\ufffdy\n"


def test_exec_stream_timeout_and_callback_error(sb: Sandbox) -> None:
    assert sb.exec_stream("sleep 5", timeout=0.5) == 124

    def boom(_: str) -> None:
        raise ValueError("stop")

    with pytest.raises(ValueError, match="stop"):
        sb.exec_stream("echo x; sleep 5", on_stdout=boom)


def test_files(sb: Sandbox) -> None:
    f = sb.files
    f.write("/root/app/main.py", "print('hi')\n", mode=0o600)
    assert f.read("/root/app/main.py") == "print('hi')\n"
    st = f.stat("/root/app/main.py")
    assert st.is_file and st.size == 12 and st.mode == 0o600 and st.name == "main.py"
    assert sb.exec(["python3", "-V"]).exit_code == 127  # busybox: proves the file stayed a file

    blob = bytes(range(256)) * 64
    f.write("/root/app/blob.bin", blob, mode="0644")
    assert f.read_bytes("/root/app/blob.bin") == blob
    assert f.stat("/root/app/blob.bin").mode == 0o644
    assert f.stat("/root/app/blob.bin").metadata == {}
    f.write("/root/app/tagged.txt", "t", metadata={"Owner": "agent-7", "step": "3"})
    assert f.stat("/root/app/tagged.txt").metadata == {"owner": "agent-7", "step": "3"}
    with pytest.raises(hutch.InvalidRequest):
        f.write("/root/app/bad.txt", "b", metadata={"k": "v" * 5000})
    f.remove("/root/app/tagged.txt")

    f.mkdir("/root/app/data/nested")
    assert f.stat("/root/app/data").is_dir
    names = [e.path for e in f.list("/root/app")]
    assert names == sorted(["/root/app/blob.bin", "/root/app/data", "/root/app/main.py"])
    deep = [e.path for e in f.list("/root/app", depth=2)]
    assert "/root/app/data/nested" in deep

    f.move("/root/app/main.py", "/root/app/src/main.py")
    assert not f.exists("/root/app/main.py")
    assert f.exists("/root/app/src/main.py")
    assert sb.exec("cat /root/app/src/main.py").stdout == "print('hi')\n"

    f.remove("/root/app/blob.bin")
    assert not f.exists("/root/app/blob.bin")
    with pytest.raises(hutch.ConflictError) as ei:
        f.remove("/root/app/data")
    assert ei.value.status == 409 and ei.value.code == "not_empty"
    f.remove("/root/app/data", recursive=True)
    assert not f.exists("/root/app/data")

    with pytest.raises(hutch.FileNotFound):
        f.read("/root/nope.txt")
    with pytest.raises(hutch.FileNotFound):
        f.stat("/root/nope.txt")
    with pytest.raises(hutch.InvalidRequest) as ei:
        f.read_bytes("/root/app")
    assert ei.value.status == 400
    with pytest.raises(hutch.InvalidRequest):
        f.write("relative/path", "x")


def test_usage(sb: Sandbox) -> None:
    u = sb.usage()
    assert u is not None
    assert u.memory_limit_bytes > 0 and u.pids >= 1 and u.oom_kills == 0


def test_pty_echo_resize_and_exit(sb: Sandbox) -> None:
    with sb.pty(cols=80, rows=24) as term:
        term.send("echo hi-$((1+1))\n")
        assert b"hi-2" in term.read_until("hi-2", timeout=10)
        term.resize(100, 30)
        term.send("stty size\n")
        term.read_until("30 100", timeout=10)
        term.send("exit 5\n")
        assert term.wait(timeout=10) == 5
        assert term.closed and term.read(timeout=1) == b""


def test_pty_command(sb: Sandbox) -> None:
    with sb.pty("sh -c 'echo from-pty; exit 4'") as term:
        assert b"from-pty" in term.read_until("from-pty")
        assert term.wait(timeout=10) == 4


def test_pty_read_timeout(sb: Sandbox) -> None:
    with sb.pty("sleep 5") as term:
        with pytest.raises(hutch.TimeoutError):
            term.read_until("never", timeout=0.3)


def test_error_mapping(server: Server, sb: Sandbox) -> None:
    with pytest.raises(hutch.SandboxNotFound) as ei:
        Sandbox.connect("sbx_doesnotexist")
    assert ei.value.status == 404 and ei.value.code == "not_found"
    assert isinstance(ei.value, hutch.NotFoundError) and isinstance(ei.value, hutch.HutchError)

    with pytest.raises(hutch.AuthError) as ei:
        Sandbox.create(api_key="wrong-key")
    assert ei.value.status == 401
    with pytest.raises(hutch.AuthError):
        Sandbox.connect(sb.id, api_key="wrong-key")
    with Client(api_key="wrong-key") as bad:
        s = Sandbox(sb.info, bad)
        with pytest.raises(hutch.AuthError):
            s.pty()
        s.close()

    with pytest.raises(hutch.InvalidRequest) as ei:
        sb.exec("pwd", cwd="relative")
    assert ei.value.status == 422
    with pytest.raises(hutch.InvalidRequest) as ei:
        sb.exec([])
    assert ei.value.status == 422
    with pytest.raises(hutch.InvalidRequest) as ei:
        Sandbox.list(state="bogus")
    assert ei.value.status == 400
    with pytest.raises(hutch.InvalidRequest) as ei:
        Sandbox.create(metadata={"": "empty key"})
    assert ei.value.status == 422

    with pytest.raises(hutch.ConflictError) as ei:
        sb.files.mkdir("/root/d")
        sb.files.write("/root/d/f", "x")
        sb.files.remove("/root/d")
    assert ei.value.status == 409

    gone = Sandbox.create()
    gone.kill()
    with pytest.raises(hutch.SandboxNotFound):
        gone.exec("true")
    with pytest.raises(hutch.SandboxNotFound):
        gone.files.read("/etc/passwd")
    with pytest.raises(hutch.SandboxNotFound):
        gone.pty()
    gone.close()

    with pytest.raises(hutch.ConnectionError):
        Sandbox.list(url="http://127.0.0.1:9")


def test_events(server: Server) -> None:
    with Client() as c, c.events(timeout=20) as events:
        sb = Sandbox.create(client=c)
        sb.kill()
        seen: List[str] = []
        for ev in events:
            if ev.sandbox_id == sb.id:
                seen.append(ev.type)
                assert ev.at
            if "sandbox.killed" in seen:
                break
        assert seen[:1] == ["sandbox.created"] and seen[-1] == "sandbox.killed"
        sb.close()


def test_logs_tail_since_and_follow(server: Server) -> None:
    with Client() as c:
        sb = Sandbox.create(client=c)
        lines = sb.logs()
        starts = [line for line in lines if "starting as pid 1" in line.text]
        assert len(starts) == 1, lines
        assert starts[0].source == "agent" and starts[0].time
        assert sb.logs(tail=1) == lines[-1:]
        with sb.follow_logs(timeout=20) as follow:
            sb.hibernate()
            sb.wake()
            new = next(line for line in follow if "starting as pid 1" in line.text)
        assert new.time and new.time > starts[0].time
        since = sb.logs(since=new.time)
        assert [line.text for line in since if "starting as pid 1" in line.text] == [new.text]
        assert len([line for line in sb.logs(since="1h") if "starting as pid 1" in line.text]) == 2
        with pytest.raises(hutch.InvalidRequest, match="no console log"):
            sb.logs(source="console")
        with pytest.raises(ValueError):
            sb.logs(tail=-1)
        # A followed log ends with its sandbox.
        with sb.follow_logs(timeout=20) as follow:
            sb.kill()
            assert [line for line in follow if "starting as pid 1" in line.text] == []
        sb.close()


def test_concurrent_execs(sb: Sandbox) -> None:
    results: List[str] = []

    def run(i: int) -> None:
        results.append(sb.exec(f"sleep 0.2; echo {i}").stdout.strip())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["0", "1", "2", "3"]
