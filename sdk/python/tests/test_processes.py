"""Process handles: ``exec(background=True)``, ``sb.processes``, :class:`hutch.Process` and
its async twin, against a real server; and request parity of the two flavours."""

from __future__ import annotations

import asyncio
import json
from typing import Any, List, Tuple

import httpx
import pytest
from conftest import Server, wait_for

import hutch
from hutch import AsyncSandbox, Sandbox


@pytest.fixture
def sb(server: Server):
    with Sandbox.create(metadata={"suite": "py-processes"}) as s:
        yield s


def test_background_exec_is_listed_connected_and_waited_for(sb: Sandbox) -> None:
    proc = sb.exec(
        "echo before; echo err >&2; touch /tmp/ready; "
        "while [ ! -e /tmp/go ]; do sleep 0.05; done; echo after",
        background=True,
        tag="worker",
    )
    assert isinstance(proc, hutch.Process)
    assert proc.tag == "worker" and proc.pid > 1 and proc.info.running
    assert proc.pid in [p.pid for p in sb.processes.list()]
    assert sb.processes.connect("worker").pid == proc.pid
    assert sb.processes.connect(proc.pid).tag == "worker"
    assert wait_for(lambda: sb.files.exists("/tmp/ready"))
    sb.files.write("/tmp/go", "")
    result = proc.wait(timeout=30)
    assert isinstance(result, hutch.ExecResult)
    assert (result.stdout, result.stderr, result.exit_code) == ("before\nafter\n", "err\n", 0)
    assert not result.stdout_truncated
    assert proc.refresh().state == "exited"
    assert proc.info.exit is not None and proc.info.exit.exit_code == 0


def test_events_stdin_close_stdin_and_signals(sb: Sandbox) -> None:
    cat = sb.processes.start(["cat"], stdin=True, tag="cat")
    cat.send_stdin("hello ")
    cat.send_stdin(b"world\n")
    assert cat.refresh().running
    cat.close_stdin()
    kinds: List[str] = []
    out = b""
    for event in cat:
        kinds.append(event.kind)
        if event.kind == "stdout":
            out += event.data
        if event.kind == "exit":
            assert event.exit is not None and event.exit.exit_code == 0
    assert out == b"hello world\n" and kinds[-1] == "exit"

    sleeper = sb.exec(["sleep", "100"], background=True)
    sleeper.signal("TERM")
    result = sleeper.wait(timeout=30)
    assert result.exit_code == 143
    assert sleeper.info.exit is not None and sleeper.info.exit.signal == 15
    with pytest.raises(hutch.ProcessExited):
        sleeper.signal(9)
    sleeper.kill()  # an exited process: not an error

    other = sb.exec(["sleep", "100"], background=True)
    other.kill()
    assert other.wait(timeout=30).exit_code == 137


def test_a_terminal_is_resized(sb: Sandbox) -> None:
    term = sb.processes.start("stty size; read x; stty size", pty=(80, 24))
    assert term.info.pty == {"cols": 80, "rows": 24} and term.info.stdin
    for event in term.events():
        if "24 80" in event.text:
            break
    term.resize(132, 43)
    term.send_stdin("\n")
    assert "43 132" in term.wait(timeout=30).stdout


def test_late_waits_missed_output_and_errors(sb: Sandbox) -> None:
    quick = sb.exec("seq 1 300000; exit 4", background=True)
    assert wait_for(lambda: not quick.refresh().running, timeout=20)
    result = quick.wait()
    assert result.exit_code == 4 and result.stdout_truncated
    assert result.stdout.endswith("299999\n300000\n") and len(result.stdout_bytes) == 1 << 20
    missed = [e for e in quick.events() if e.kind == "missed"]
    assert len(missed) == 1 and missed[0].missed_stdout > 0

    sb.exec(["sleep", "100"], background=True, tag="only")
    with pytest.raises(hutch.TagInUse):
        sb.exec(["sleep", "1"], background=True, tag="only")
    with pytest.raises(hutch.ProcessNotFound):
        sb.processes.connect("nobody")
    with pytest.raises(hutch.ProcessNotFound):
        sb.processes.connect(999999)
    with pytest.raises(hutch.InvalidRequest):
        sb.exec(["true"], tag="no-background")
    with pytest.raises(hutch.InvalidRequest) as not_found:
        sb.processes.start(["no-such-program-xyz"])
    assert not_found.value.code == "command_not_found"
    with pytest.raises(hutch.InvalidRequest):
        sb.processes.connect("only").resize(10, 10)  # no terminal


def test_the_async_twin(server: Server) -> None:
    async def main() -> None:
        async with await AsyncSandbox.create(metadata={"suite": "py-processes"}) as sb:
            proc = await sb.exec("echo one; sleep 100; echo two", background=True, tag="a")
            assert isinstance(proc, hutch.AsyncProcess)
            assert [p.tag for p in await sb.processes.list()] == ["a"]
            seen = ""
            async for event in proc.events():
                seen += event.text
                if "one" in seen:
                    break
            again = await sb.processes.connect("a")
            # Started by exec: its stdin is a pipe only when exec was given stdin.
            assert again.pid == proc.pid and not again.info.stdin
            await again.kill()
            result = await proc.wait(timeout=30)
            assert result.stdout == "one\n" and result.exit_code == 137
            cat = await sb.processes.start(["cat"], stdin=True)
            await cat.send_stdin("x")
            await cat.close_stdin()
            assert (await cat.wait(timeout=30)).stdout == "x"
            with pytest.raises(hutch.ProcessExited):
                await cat.signal("TERM")

    asyncio.run(main())


# -- the two flavours send the same requests --------------------------------------------------

INFO = {"pid": 7, "tag": "t", "cmd": ["sleep", "9"], "state": "running", "stdin": True}
OUTPUT = (
    '{"event":"start","pid":7}\n{"event":"missed","stdout":3,"stderr":0}\n'
    '{"event":"stdout","data":"h\\u00e9"}\n{"event":"stderr","data_b64":"/w=="}\n'
    '{"event":"exit","exit_code":3,"signal":null,"timed_out":false,"duration_ms":5}\n'
)
SANDBOX = {"id": "sbx_1", "template": "minimal", "state": "running"}


def recorder() -> Tuple[List[Tuple[str, str, Any]], httpx.MockTransport]:
    seen: List[Tuple[str, str, Any]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        body = req.content
        try:
            body = json.loads(body) if body else body
        except ValueError:
            pass
        seen.append((req.method, req.url.raw_path.decode(), body))
        path = req.url.path
        if path.endswith("/output"):
            return httpx.Response(200, text=OUTPUT)
        if path.endswith("/processes") and req.method == "GET":
            return httpx.Response(200, json={"processes": [INFO]})
        if path.endswith(("/processes", "/exec")):
            return httpx.Response(201, json=INFO)
        if req.method == "GET":
            return httpx.Response(200, json=INFO)
        return httpx.Response(204)

    return seen, httpx.MockTransport(handler)


def test_sync_and_async_processes_send_the_same_requests() -> None:
    def clients(transport: httpx.MockTransport) -> Tuple[hutch.Client, hutch.AsyncClient]:
        client = hutch.Client("http://fake:1", "key")
        aclient = hutch.AsyncClient("http://fake:1", "key")
        client._http.close()
        client._http = httpx.Client(base_url=client.url, transport=transport)
        aclient._http = httpx.AsyncClient(base_url=aclient.url, transport=transport)
        return client, aclient

    info = hutch.SandboxInfo.from_json(SANDBOX)
    sync_seen, transport = recorder()
    sb = Sandbox(info, clients(transport)[0])
    sync_results: List[Any] = []
    proc = sb.exec("x", background=True, tag="t")
    started = sb.processes.start(["sleep", "9"], tag="t", pty=(80, 24), stdin=True, timeout=5)
    sync_results += [proc.pid, started.pid, [p.pid for p in sb.processes.list()]]
    found = sb.processes.connect("t a/b")
    sync_results.append([(e.kind, e.data, e.missed_stdout) for e in found.events(replay=False)])
    sync_results.append(found.wait().stderr_bytes)
    found.send_stdin("in")
    found.close_stdin()
    found.signal("TERM")
    found.resize(100, 30)
    found.kill()

    async def run_async() -> Tuple[List[Any], List[Tuple[str, str, Any]]]:
        seen, transport = recorder()
        asb = AsyncSandbox(info, clients(transport)[1])
        results: List[Any] = []
        aproc = await asb.exec("x", background=True, tag="t")
        astarted = await asb.processes.start(
            ["sleep", "9"], tag="t", pty=(80, 24), stdin=True, timeout=5
        )
        results += [aproc.pid, astarted.pid, [p.pid for p in await asb.processes.list()]]
        afound = await asb.processes.connect("t a/b")
        results.append([(e.kind, e.data, e.missed_stdout) async for e in afound.events(replay=False)])
        results.append((await afound.wait()).stderr_bytes)
        await afound.send_stdin("in")
        await afound.close_stdin()
        await afound.signal("TERM")
        await afound.resize(100, 30)
        await afound.kill()
        return results, seen

    async_results, async_seen = asyncio.run(run_async())
    assert sync_seen == async_seen
    assert sync_results == async_results
    assert sync_results[3] == [
        ("missed", b"", 3),
        ("stdout", "hé".encode(), 0),
        ("stderr", b"\xff", 0),
        ("exit", b"", 0),
    ]
    assert sync_results[4] == b"\xff"
    assert ("GET", "/v1/sandboxes/sbx_1/processes/tag:t%20a%2Fb", b"") in sync_seen
    assert (
        "POST",
        "/v1/sandboxes/sbx_1/exec",
        {"cmd": "x", "timeout_seconds": 0, "background": True, "tag": "t"},
    ) in sync_seen
    assert (
        "POST",
        "/v1/sandboxes/sbx_1/processes",
        {"cmd": ["sleep", "9"], "timeout_seconds": 5, "tag": "t", "pty": {"cols": 80, "rows": 24}, "stdin": True},
    ) in sync_seen
    assert ("POST", "/v1/sandboxes/sbx_1/processes/7/signal", {"signal": "TERM"}) in sync_seen
    assert ("GET", "/v1/sandboxes/sbx_1/processes/7/output?replay=false", b"") in sync_seen
