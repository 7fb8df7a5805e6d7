"""Scenarios of E2B's published Python SDKs (`e2b`, `e2b-code-interpreter`), unmodified,
against Hutch's E2B-compatible API. `tests/e2b_python.rs` runs one per test:

    python scenarios.py NAME

with E2B_API_URL and E2B_SANDBOX_URL set to the server's `--e2b-listen` address and
E2B_API_KEY to a Hutch key. Each scenario asserts what the SDK must see and kills what it
made; a failed assertion exits non-zero with the traceback.
"""

import base64
import os
import struct
import sys
import time
import zlib

import httpx
from e2b import (
    CommandExitException,
    FileType,
    PtySize,
    Sandbox,
    SandboxQuery,
    SandboxState,
)

API = os.environ["E2B_API_URL"]
KEY = os.environ["E2B_API_KEY"]


def made(*sandboxes):
    """Kill the sandboxes a scenario made, whatever happened."""

    class Guard:
        def __enter__(self):
            return sandboxes

        def __exit__(self, *exc):
            for s in sandboxes:
                try:
                    s.kill()
                except Exception:
                    pass

    return Guard()


def commands():
    sb = Sandbox.create(template="base", timeout=120, metadata={"scenario": "commands"}, envs={"GREETING": "hello"})
    with made(sb):
        info = sb.get_info()
        assert info.metadata == {"scenario": "commands"}, info.metadata
        assert info.template_id == "base", info.template_id
        r = sb.commands.run('echo "$GREETING $EXTRA"; echo oops >&2; pwd', envs={"EXTRA": "world"}, cwd="/tmp")
        assert r.exit_code == 0
        assert r.stdout == "hello world\n/tmp\n", repr(r.stdout)
        assert r.stderr == "oops\n", repr(r.stderr)
        seen = []
        sb.commands.run("for i in 1 2 3; do echo line$i; done", on_stdout=lambda s: seen.append(s))
        assert "".join(seen) == "line1\nline2\nline3\n", seen
        try:
            sb.commands.run("echo before; exit 7")
            raise AssertionError("a failing command must raise")
        except CommandExitException as e:
            assert e.exit_code == 7, e.exit_code
            assert e.stdout == "before\n", repr(e.stdout)
        sb.commands.run("useradd -m alice")
        assert sb.commands.run("whoami", user="alice").stdout == "alice\n"
        assert sb.commands.run("whoami").stdout == "root\n"
        # stdin: a background command fed and closed.
        h = sb.commands.run("cat", background=True, stdin=True)
        sb.commands.send_stdin(h.pid, "typed in\n")
        sb.commands.close_stdin(h.pid)
        r = h.wait()
        assert r.stdout == "typed in\n", repr(r.stdout)
        # background: a handle outlives its stream; connect re-attaches by pid, and a late
        # connect still gets the exit code.
        talker = sb.commands.run("for i in 1 2 3 4 5; do echo tick$i; sleep 0.3; done; exit 4", background=True)
        talker.disconnect()
        again = sb.commands.connect(talker.pid)
        try:
            again.wait()
            raise AssertionError("exit 4 must raise")
        except CommandExitException as e:
            assert e.exit_code == 4, e.exit_code
            assert "tick5" in e.stdout, repr(e.stdout)
        late = sb.commands.connect(talker.pid)
        try:
            late.wait()
            raise AssertionError("a late connect must see exit 4")
        except CommandExitException as e:
            assert e.exit_code == 4, e.exit_code
        # background: listed, killed by pid.
        bg = sb.commands.run("sleep 60", background=True)
        assert bg.pid in [p.pid for p in sb.commands.list()]
        assert sb.commands.kill(bg.pid) is True
        try:
            bg.wait()
            raise AssertionError("a killed command must not succeed")
        except CommandExitException as e:
            assert e.exit_code != 0
        assert sb.commands.kill(999999) is False
        # a command's timeout kills it.
        t0 = time.time()
        try:
            sb.commands.run("sleep 30", timeout=2)
            raise AssertionError("the timeout must end the command")
        except Exception as e:
            assert time.time() - t0 < 15, time.time() - t0
            assert "timeout" in type(e).__name__.lower() or "timed out" in str(e).lower() or isinstance(e, CommandExitException), repr(e)


def files():
    sb = Sandbox.create(template="base", timeout=120)
    with made(sb):
        info = sb.files.write("/tmp/t/a.txt", "text one")
        assert info.path == "/tmp/t/a.txt", info
        assert sb.files.read("/tmp/t/a.txt") == "text one"
        blob = bytes(range(256)) * 100
        sb.files.write("/tmp/t/b.bin", blob)
        assert bytes(sb.files.read("/tmp/t/b.bin", format="bytes")) == blob
        streamed = b"".join(sb.files.read("/tmp/t/b.bin", format="stream"))
        assert streamed == blob
        sb.files.write("/tmp/t/c.bin", blob, use_octet_stream=True)
        assert bytes(sb.files.read("/tmp/t/c.bin", format="bytes")) == blob
        sb.files.write("/tmp/t/g.txt", "zipped", gzip=True)
        assert sb.files.read("/tmp/t/g.txt") == "zipped"
        # A gzip download (the SDK sends Accept-Encoding: gzip; httpx inflates it).
        assert bytes(sb.files.read("/tmp/t/b.bin", format="bytes", gzip=True)) == blob
        assert sb.files.read("/tmp/t/g.txt", gzip=True) == "zipped"
        many = sb.files.write_files([{"path": "/tmp/m/1.txt", "data": "one"}, {"path": "/tmp/m/2.txt", "data": "two"}])
        assert sorted(w.path for w in many) == ["/tmp/m/1.txt", "/tmp/m/2.txt"], many
        assert sb.files.read("/tmp/m/2.txt") == "two"
        # File metadata (envd 0.6.2): the file's user.e2b.* attributes, keys lowercased.
        pairs = {"owner": "agent-7", "run": "42"}
        meta = sb.files.write("/tmp/meta/f.txt", "m", metadata={"Owner": "agent-7", "run": "42"})
        assert meta.metadata == pairs, meta
        assert sb.files.get_info("/tmp/meta/f.txt").metadata == pairs
        got = sb.commands.run("python3 -c \"import os; print(os.getxattr('/tmp/meta/f.txt', 'user.e2b.owner').decode())\"")
        assert got.stdout == "agent-7\n", got
        sb.commands.run("python3 -c \"import os; os.setxattr('/tmp/meta/f.txt', 'user.e2b.inside', b'yes')\"")
        listed = {e.name: e for e in sb.files.list("/tmp/meta")}
        assert listed["f.txt"].metadata == {**pairs, "inside": "yes"}, listed["f.txt"]
        assert sb.files.get_info("/tmp/m/1.txt").metadata is None
        # As a user: the file is theirs, and their permissions apply.
        sb.commands.run("useradd -m bob")
        sb.files.write("/home/bob/own.txt", "bob's", user="bob")
        assert sb.commands.run("stat -c %U /home/bob/own.txt").stdout == "bob\n"
        assert sb.files.get_info("/home/bob/own.txt").owner == "bob"
        try:
            sb.files.write("/root/not-bobs.txt", "no", user="bob")
            raise AssertionError("bob must not write into /root")
        except Exception as e:
            assert "Exception" in type(e).__name__, repr(e)
        sb.files.write("relative.txt", "in home")
        assert sb.commands.run("cat /root/relative.txt").stdout == "in home"
        assert sb.files.make_dir("/tmp/t/sub/deeper") is True
        assert sb.files.make_dir("/tmp/t/sub/deeper") is False
        sb.files.write("/tmp/t/sub/deeper/x.txt", "x")
        top = {e.name: e for e in sb.files.list("/tmp/t")}
        assert set(top) == {"a.txt", "b.bin", "c.bin", "g.txt", "sub"}, set(top)
        assert top["sub"].type == FileType.DIR and top["b.bin"].type == FileType.FILE
        assert top["b.bin"].size == len(blob), top["b.bin"].size
        deep = {e.path for e in sb.files.list("/tmp/t", depth=3)}
        assert "/tmp/t/sub/deeper/x.txt" in deep, deep
        assert sb.files.exists("/tmp/t/a.txt") and not sb.files.exists("/tmp/t/none")
        sb.files.rename("/tmp/t/a.txt", "/tmp/t/renamed.txt")
        assert not sb.files.exists("/tmp/t/a.txt") and sb.files.read("/tmp/t/renamed.txt") == "text one"
        assert sb.files.get_info("/tmp/t/renamed.txt").size == len("text one")
        sb.files.remove("/tmp/t/sub")
        assert not sb.files.exists("/tmp/t/sub")
        try:
            sb.files.read("/tmp/t/none")
            raise AssertionError("reading a missing file must raise")
        except Exception as e:
            assert "NotFound" in type(e).__name__, repr(e)
        # Signed URLs: through the one gateway URL, with no header naming the sandbox.
        url = sb.download_url("/tmp/t/renamed.txt", use_signature_expiration=60)
        assert httpx.get(url).text == "text one"
        up = sb.upload_url("/tmp/t/uploaded.txt", use_signature_expiration=60)
        r = httpx.post(up, files={"file": ("uploaded.txt", b"via url")})
        assert r.status_code == 200, (r.status_code, r.text)
        assert sb.files.read("/tmp/t/uploaded.txt") == "via url"
        # A read URL does not write, a tampered path does not read, an expired URL is refused.
        assert httpx.post(url, files={"file": ("x", b"no")}).status_code >= 400
        assert httpx.get(url.replace("renamed.txt", "b.bin")).status_code >= 400
        expired = sb.download_url("/tmp/t/renamed.txt", use_signature_expiration=-10)
        assert httpx.get(expired, headers={"E2b-Sandbox-Id": sb.sandbox_id}).status_code == 401


def pty():
    sb = Sandbox.create(template="base", timeout=120)
    with made(sb):
        out = []
        h = sb.pty.create(PtySize(rows=24, cols=80), timeout=60)
        sb.pty.resize(h.pid, PtySize(rows=30, cols=100))
        sb.pty.send_stdin(h.pid, b"stty size; echo $TERM; exit 3\n")
        try:
            h.wait(on_pty=lambda d: out.append(bytes(d)))
            raise AssertionError("exit 3 must raise")
        except CommandExitException as e:
            assert e.exit_code == 3, e.exit_code
        text = b"".join(out).decode(errors="replace")
        assert "30 100" in text, text
        assert "xterm-256color" in text, text
        h = sb.pty.create(PtySize(rows=24, cols=80), timeout=60)
        assert sb.pty.kill(h.pid) is True


def lifecycle():
    sb = Sandbox.create(template="base", timeout=120)
    with made(sb):
        sb.files.write("/root/keep.txt", "kept across pause")
        assert sb.pause() is True
        assert sb.get_info().state.value == "paused"
        assert Sandbox.pause(sb.sandbox_id) is False  # already paused: 409
        again = Sandbox.connect(sb.sandbox_id, timeout=200)
        assert again.get_info().state.value == "running"
        assert again.files.read("/root/keep.txt") == "kept across pause"
        before = again.get_info().end_at
        again.set_timeout(30)
        after = again.get_info().end_at
        assert after < before, (before, after)
        assert 20 < (after.timestamp() - time.time()) <= 31, after
        assert again.is_running()
        assert again.get_metrics()[0].mem_total > 0
        # envd's own /metrics: the same measured sample (disk used inside the sandbox).
        envd = {"E2b-Sandbox-Id": again.sandbox_id, "X-Access-Token": again._envd_access_token}
        m = httpx.get(API + "/metrics", headers=envd, timeout=30).json()
        assert m["disk_used"] > 0 and m["disk_total"] >= m["disk_used"], m
        assert m["mem_total"] > 0 and 0 <= m["cpu_used_pct"] <= 100, m
        assert again.kill() is True
        assert Sandbox.kill(sb.sandbox_id) is False
        assert not again.is_running()
        try:
            again.commands.run("true")
            raise AssertionError("a command in a killed sandbox must raise")
        except Exception as e:
            assert "NotFound" in type(e).__name__ or "not found" in str(e).lower(), repr(e)


def listing():
    tag = f"list-{os.getpid()}"
    made_ = [Sandbox.create(template="minimal", timeout=60, metadata={"suite": tag, "n": str(i)}) for i in range(5)]
    other = Sandbox.create(template="minimal", timeout=60, metadata={"suite": "elsewhere"})
    with made(*made_, other):
        pages = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}), limit=2)
        seen, count = [], 0
        while pages.has_next:
            items = pages.next_items()
            count += 1
            assert len(items) <= 2
            seen += [s.sandbox_id for s in items]
        assert sorted(seen) == sorted(s.sandbox_id for s in made_), (seen, count)
        assert count >= 3, count
        made_[0].pause()
        paused = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}, state=[SandboxState.PAUSED])).next_items()
        assert [s.sandbox_id for s in paused] == [made_[0].sandbox_id], paused


def fork_and_snapshots():
    sb = Sandbox.create(template="base", timeout=120)
    with made(sb):
        sb.files.write("/root/state.txt", "parent")
        kids = sb.fork(count=2)
        with made(*kids):
            assert len(kids) == 2 and all(isinstance(k, Sandbox) for k in kids), kids
            kids[0].files.write("/root/state.txt", "child0")
            assert kids[1].files.read("/root/state.txt") == "parent"
            assert sb.files.read("/root/state.txt") == "parent"
        snap = sb.create_snapshot()
        assert snap.snapshot_id.startswith("snap_"), snap
        listed = [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]
        assert snap.snapshot_id in listed, listed
        child = Sandbox.create(template=snap.snapshot_id, timeout=60)
        with made(child):
            assert child.files.read("/root/state.txt") == "parent"
        Sandbox.delete_snapshot(snap.snapshot_id)
        assert snap.snapshot_id not in [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]


def host():
    sb = Sandbox.create(template="base", timeout=120)
    with made(sb):
        sb.files.write("/srv/index.html", "served from the sandbox")
        sb.commands.run("cd /srv && python3 -m http.server 8080", background=True)
        name = sb.get_host(8080)
        assert name.startswith(f"8080-{sb.sandbox_id}."), name
        body = None
        for _ in range(100):
            r = httpx.get(API + "/index.html", headers={"Host": name})
            if r.status_code == 200:
                body = r.text
                break
            time.sleep(0.1)
        assert body == "served from the sandbox", body
        closed = httpx.get(API + "/", headers={"Host": sb.get_host(8099)})
        assert closed.status_code == 502 and "port is not open" in closed.text, (closed.status_code, closed.text)


def code_interpreter():
    from e2b_code_interpreter import Sandbox as CodeSandbox

    sb = CodeSandbox.create(timeout=180)
    with made(sb):
        assert sb.run_code("x = 41").error is None
        assert sb.run_code("x + 1").text == "42"
        e = sb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.show()")
        pngs = [r.png for r in e.results if r.png]
        assert len(pngs) == 1, [r.formats() for r in e.results]
        raw = base64.b64decode(pngs[0])
        assert raw[:8] == b"\x89PNG\r\n\x1a\n", raw[:8]
        width, height = struct.unpack(">II", raw[16:24])
        assert width > 100 and height > 100, (width, height)
        zlib.crc32(raw)
        e = sb.run_code("1 / 0")
        assert e.error is not None and e.error.name == "ZeroDivisionError", e.error
        assert sb.run_code("x").text == "41", "state survives an error"
        out = []
        e = sb.run_code("print('to stdout')", on_stdout=lambda m: out.append(m.line))
        assert out == ["to stdout\n"], out
        ctx = sb.create_code_context(language="python")
        assert sb.run_code("x", context=ctx).error.name == "NameError"
        ids = [c.id for c in sb.list_code_contexts()]
        assert ctx.id in ids, ids
        sb.remove_code_context(ctx)
        assert ctx.id not in [c.id for c in sb.list_code_contexts()]
        assert sb.run_code("console.log(6 * 7)", language="js").logs.stdout == ["42\n"]
        # R (IRkernel in the code-interpreter template): its value is the main result.
        assert sb.run_code("y <- 6 * 7", language="r").error is None
        assert sb.run_code("y", language="r").text == "[1] 42"


def refused():
    sb = Sandbox.create(template="minimal", timeout=60)
    other = Sandbox.create(template="minimal", timeout=60)
    with made(sb, other):
        headers = {"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983", "Content-Type": "application/json"}
        rpc = API + "/filesystem.Filesystem/Stat"
        body = '{"path": "/"}'
        assert httpx.post(rpc, headers=headers, content=body).status_code == 401
        wrong = {**headers, "X-Access-Token": other._envd_access_token}
        assert httpx.post(rpc, headers=wrong, content=body).status_code == 401
        right = {**headers, "X-Access-Token": sb._envd_access_token}
        assert httpx.post(rpc, headers=right, content=body).status_code == 200
        assert httpx.get(API + "/v2/sandboxes").status_code == 401
        assert httpx.get(API + "/v2/sandboxes", headers={"X-API-Key": "e2b_0000"}).status_code == 401
        gone = {**right, "E2b-Sandbox-Id": "sbx_aaaaaaaaaaaaaaaa"}
        r = httpx.post(rpc, headers=gone, content=body)
        assert r.status_code == 502 and "sandbox was not found" in r.text.lower(), (r.status_code, r.text)


def template_build():
    """E2B's Template builder: a context file copied in, a RUN, ENV, a start command, built
    by Hutch's Dockerfile builder and then used by a create."""
    import tempfile

    from e2b import Template

    name = f"e2b-built-{os.getpid()}"
    logs = []
    with tempfile.TemporaryDirectory() as ctx:
        os.makedirs(os.path.join(ctx, "app"))
        with open(os.path.join(ctx, "app", "hello.txt"), "w") as f:
            f.write("from the context")
        t = (
            Template(file_context_path=ctx)
            .from_template("base")
            .copy("app/hello.txt", "/srv/")
            .run_cmd("echo built > /srv/built.txt")
            .set_envs({"GREETING": "hi there"})
            .set_workdir("/srv")
            .set_user("nobody")
            .set_start_cmd("cd /srv && python3 -m http.server 8000", "curl -sf http://127.0.0.1:8000/ >/dev/null || python3 -c 'import urllib.request; urllib.request.urlopen(\"http://127.0.0.1:8000/\")'")
        )
        try:
            info = Template.build(t, name, cpu_count=2, memory_mb=768, on_build_logs=lambda entry: logs.append(entry.message))
            assert info.template_id == name, info
            assert any("RUN echo built" in m for m in logs), logs
            sb = Sandbox.create(template=name, timeout=60)
            with made(sb):
                # cpuCount and memoryMB are the template's sandboxes' defaults.
                got = sb.get_info()
                assert (got.cpu_count, got.memory_mb) == (2, 768), got
                r = sb.commands.run("cat /srv/hello.txt; cat /srv/built.txt; echo $GREETING")
                assert r.stdout == "from the contextbuilt\nhi there\n", repr(r.stdout)
                # The template's WORKDIR and USER are where and as whom commands run.
                r = sb.commands.run("pwd; id -un")
                assert r.stdout == "/srv\nnobody\n", repr(r.stdout)
                r = sb.commands.run("pwd; id -un", cwd="/tmp", user="root")
                assert r.stdout == "/tmp\nroot\n", repr(r.stdout)
                page = httpx.get(API + "/hello.txt", headers={"Host": sb.get_host(8000)}, timeout=30)
                assert page.text == "from the context", (page.status_code, page.text)
            # A failing step fails the build with its message.
            bad = Template().from_template("base").run_cmd("exit 3")
            try:
                Template.build(bad, name + "-bad")
                raise AssertionError("a failing RUN must fail the build")
            except Exception as e:
                assert "Build" in type(e).__name__ or "exit" in str(e).lower(), repr(e)
        finally:
            for n in (name, name + "-bad"):
                httpx.delete(f"{API}/templates/{n}", headers={"X-API-Key": KEY}, timeout=120)


def watch():
    """`files.watch_dir`: the sync SDK polls a watcher; the async SDK streams WatchDir."""
    import asyncio

    from e2b import AsyncSandbox, FilesystemEventType

    sb = Sandbox.create(template="base", timeout=120)
    with made(sb):
        sb.files.make_dir("/tmp/w")
        handle = sb.files.watch_dir("/tmp/w", recursive=True)
        sb.files.write("/tmp/w/a.txt", "one")
        sb.commands.run("mkdir /tmp/w/sub && echo x > /tmp/w/sub/b.txt && mv /tmp/w/a.txt /tmp/w/c.txt && rm /tmp/w/c.txt")
        seen = []
        for _ in range(50):
            seen += [(e.type, e.name) for e in handle.get_new_events()]
            if (FilesystemEventType.REMOVE, "c.txt") in seen:
                break
            time.sleep(0.1)
        handle.stop()
        names = [n for _, n in seen]
        assert (FilesystemEventType.CREATE, "a.txt") in seen, seen
        assert (FilesystemEventType.CREATE, "sub/b.txt") in seen or (FilesystemEventType.WRITE, "sub/b.txt") in seen, seen
        assert (FilesystemEventType.RENAME, "a.txt") in seen and (FilesystemEventType.CREATE, "c.txt") in seen, seen

    async def streamed():
        asb = await AsyncSandbox.create(template="base", timeout=120)
        try:
            await asb.files.make_dir("/tmp/s")
            events = []
            done = asyncio.Event()

            def on_event(e):
                events.append((e.type, e.name, e.entry.size if e.entry else None))
                if e.name == "last.txt":
                    done.set()

            h = await asb.files.watch_dir("/tmp/s", on_event=on_event, include_entry=True)
            await asb.files.write("/tmp/s/first.txt", "12345")
            await asb.files.write("/tmp/s/last.txt", "x")
            await asyncio.wait_for(done.wait(), 20)
            await h.stop()
            assert any(t == FilesystemEventType.CREATE and n == "first.txt" for t, n, _ in events), events
            assert any(n == "first.txt" and size == 5 for _, n, size in events), events
        finally:
            await asb.kill()

    asyncio.run(streamed())


def network():
    """E2B's egress settings, inside tests/network.rs's world of namespaces (every address
    here is a test host of ours): deny-all with an allow list, a deny list, no internet,
    and a live update."""
    from e2b import ALL_TRAFFIC

    probe = (
        "python3 -c \"import socket,sys\n"
        "try:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), 3).close(); print('open')\n"
        "except OSError: print('blocked')\" "
    )

    def reach(sb, host, port):
        return sb.commands.run(probe + f"{host} {port}").stdout.strip()

    only = Sandbox.create(template="base", timeout=120, network={"deny_out": [ALL_TRAFFIC], "allow_out": ["203.0.113.10"]})
    deny = Sandbox.create(template="base", timeout=120, network={"deny_out": ["203.0.113.20"]})
    none = Sandbox.create(template="base", timeout=120, allow_internet_access=False)
    with made(only, deny, none):
        assert reach(only, "203.0.113.10", 80) == "open"
        assert reach(only, "203.0.113.20", 80) == "blocked"
        assert reach(deny, "203.0.113.10", 80) == "open"
        assert reach(deny, "203.0.113.20", 80) == "blocked"
        assert reach(none, "203.0.113.10", 80) == "blocked"
        assert none.get_info().allow_internet_access is False
        info = only.get_info()
        assert info.network["allow_out"] == ["203.0.113.10"], info.network
        only.update_network({"deny_out": [ALL_TRAFFIC], "allow_out": ["203.0.113.20"]})
        assert reach(only, "203.0.113.20", 80) == "open"
        assert reach(only, "203.0.113.10", 80) == "blocked"


def h2c():
    """HTTP/2 with prior knowledge on the same listener: the control plane, a unary envd
    RPC and a server-streaming one (Connect envelopes), as a client forcing h2c sends them."""
    import json as _json
    import struct as _struct

    sb = Sandbox.create(template="minimal", timeout=60)
    with made(sb):
        with httpx.Client(http1=False, http2=True, timeout=30) as c:
            r = c.get(API + "/v2/sandboxes", headers={"X-API-Key": KEY})
            assert r.http_version == "HTTP/2" and r.status_code == 200, (r.http_version, r.status_code)
            envd = {"E2b-Sandbox-Id": sb.sandbox_id, "X-Access-Token": sb._envd_access_token}
            r = c.post(API + "/filesystem.Filesystem/Stat", headers={**envd, "Content-Type": "application/json"}, content='{"path": "/etc"}')
            assert r.http_version == "HTTP/2" and r.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY", r.text
            msg = _json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", "echo over-h2"]}}).encode()
            r = c.post(
                API + "/process.Process/Start",
                headers={**envd, "Content-Type": "application/connect+json"},
                content=b"\x00" + _struct.pack(">I", len(msg)) + msg,
            )
            assert r.http_version == "HTTP/2", r.http_version
            body, frames = r.content, []
            while body:
                flags, n = body[0], _struct.unpack(">I", body[1:5])[0]
                frames.append((flags, _json.loads(body[5 : 5 + n])))
                body = body[5 + n :]
            out = b"".join(
                base64.b64decode(f["event"]["data"]["stdout"])
                for flags, f in frames
                if flags == 0 and "data" in f.get("event", {})
            )
            assert out == b"over-h2\n", frames
            assert frames[-1][0] == 2 and "error" not in frames[-1][1], frames[-1]


def counted(sb, at_least, within=60):
    """The number in the sandbox's /tmp/count once it reaches `at_least` (a guest under TCG
    on a loaded machine is slow to start counting)."""
    deadline = time.time() + within
    while True:
        n = int(sb.files.read("/tmp/count")) if sb.files.exists("/tmp/count") else 0
        if n >= at_least:
            return n
        assert time.time() < deadline, f"/tmp/count is {n}, waited for {at_least}"
        time.sleep(0.2)


def vm_pause():
    """A vm sandbox (the key's tenant defaults to vm): pause keeps memory and processes, so
    after connect a background process is still the same one, a shell variable of a
    terminal session still holds, and a counter kept counting from where it was."""
    hutch_url, hutch_key = os.environ["HUTCH_URL"], os.environ["HUTCH_ADMIN_KEY"]
    sb = Sandbox.create(template="base", timeout=300)
    with made(sb):
        record = httpx.get(f"{hutch_url}/v1/sandboxes/{sb.sandbox_id}", headers={"Authorization": f"Bearer {hutch_key}"}, timeout=30).json()
        assert record["isolation"] == "vm", record
        bg = sb.commands.run("i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done", background=True)
        before = counted(sb, 1)
        assert sb.pause() is True
        assert sb.get_info().state.value == "paused"
        again = Sandbox.connect(sb.sandbox_id, timeout=300)
        assert again.get_info().state.value == "running"
        assert bg.pid in [p.pid for p in again.commands.list()], "the background process is gone"
        counted(again, before + 1)
        again.commands.kill(bg.pid)


def tls():
    """Over https (the server's --tls-cert, its CA in SSL_CERT_FILE): the SDK's own transport
    negotiates HTTP/2 by ALPN, and commands (Connect server streams), background processes,
    files, a terminal and run_code all work over it."""
    from e2b.api.client_sync import get_pyqwest_transport
    from e2b_code_interpreter import Sandbox as CodeSandbox
    from pyqwest import Headers, HTTPVersion, SyncRequest

    assert API.startswith("https://"), API
    # The pool every control-plane and envd call of the SDK goes through.
    request = SyncRequest("GET", API + "/v2/sandboxes", headers=Headers({"X-API-Key": KEY}))
    with get_pyqwest_transport(None).execute_sync(request) as r:
        assert r.status == 200, r.status
        assert r.http_version == HTTPVersion.HTTP2, r.http_version
    basics()
    cs = CodeSandbox.create(timeout=120)
    with made(cs):
        cs.run_code("t = 40")
        assert cs.run_code("t + 2").text == "42"


def basics():
    """What every supported SDK has, down to the oldest (e2b 2.7.0, the first with
    E2B_SANDBOX_URL): create, commands, background, files, a terminal, `get_host`."""
    sb = Sandbox.create(template="base", timeout=120, metadata={"scenario": "basics"}, envs={"V": "1"})
    with made(sb):
        assert sb.get_info().metadata == {"scenario": "basics"}
        r = sb.commands.run("echo $V; echo e >&2")
        assert (r.stdout, r.stderr, r.exit_code) == ("1\n", "e\n", 0), r
        try:
            sb.commands.run("exit 5")
            raise AssertionError("a failing command must raise")
        except CommandExitException as e:
            assert e.exit_code == 5
        bg = sb.commands.run("sleep 60", background=True)
        assert bg.pid in [p.pid for p in sb.commands.list()]
        assert sb.commands.kill(bg.pid) is True
        sb.files.write("/tmp/b/one.txt", "one")
        assert sb.files.read("/tmp/b/one.txt") == "one"
        assert [e.name for e in sb.files.list("/tmp/b")] == ["one.txt"]
        assert sb.files.make_dir("/tmp/b/d") is True
        sb.files.rename("/tmp/b/one.txt", "/tmp/b/d/two.txt")
        assert sb.files.exists("/tmp/b/d/two.txt") and not sb.files.exists("/tmp/b/one.txt")
        sb.files.remove("/tmp/b")
        assert not sb.files.exists("/tmp/b")
        out = []
        h = sb.pty.create(PtySize(rows=24, cols=80))
        sb.pty.send_stdin(h.pid, b"echo $((6*7)); exit\n")
        h.wait(on_pty=lambda d: out.append(bytes(d)))
        assert b"42" in b"".join(out)
    assert not sb.is_running()


def cluster_create():
    """Through one node of a cluster: a sandbox that lands on another (the test checks),
    used through the data plane and left running; its id on stdout."""
    sb = Sandbox.create(template="base", timeout=300, metadata={"scenario": "cluster"})
    r = sb.commands.run("echo hi from $(hostname)")
    assert r.exit_code == 0 and r.stdout.startswith("hi from "), r
    sb.files.write("/tmp/cluster.txt", "written through another node")
    assert sb.files.read("/tmp/cluster.txt") == "written through another node"
    assert sb.get_info().metadata == {"scenario": "cluster"}
    sb.set_timeout(240)
    ids = [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"scenario": "cluster"})).next_items()]
    assert sb.sandbox_id in ids, ids
    print("SANDBOX", sb.sandbox_id)


def cluster_finish():
    """Through a third node: connect to the sandbox `cluster_create` made, read its file,
    run a command, and kill it."""
    sb = Sandbox.connect(os.environ["SANDBOX_ID"])
    assert sb.files.read("/tmp/cluster.txt") == "written through another node"
    assert sb.commands.run("cat /tmp/cluster.txt").stdout == "written through another node"
    sb.kill()
    assert not sb.is_running()


if __name__ == "__main__":
    globals()[sys.argv[1]]()
    print("ok")
