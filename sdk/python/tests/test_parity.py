"""The sync and async clients send the same requests and return the same results.

No server: both clients talk to an in-process fake (``httpx.MockTransport``) that records
every request and answers by route, so every operation can be driven through both flavours
and compared request for request.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import httpx
import pytest

import hutch

SANDBOX = {"id": "sbx_1", "template": "minimal", "state": "running", "persistent": False}
OUTCOME = {"index": 0, "sandbox_id": "sbx_2", "exit_code": 0, "score": 1.0, "kept": True}
ENTRY = {"name": "a", "path": "/a", "type": "file", "size": 1}
EXEC_SSE = (
    'event: start\ndata: {"pid": 7}\n\n'
    'event: stdout\ndata: {"data": "h\\u00e9"}\n\n'
    'event: stderr\ndata: {"data": "e"}\n\n'
    'event: exit\ndata: {"exit_code": 3}\n\n'
)
CODE_SSE = (
    'event: stdout\ndata: {"type": "stdout", "text": "hi\\n"}\n\n'
    'event: result\ndata: {"type": "result", "data": {"text/plain": "2"}, "is_main_result": true}\n\n'
    'event: end\ndata: {"type": "end", "execution_count": 1, "duration_ms": 3, '
    '"context_id": "default-python", "context_restarted": false, "truncated": false}\n\n'
)
CONTEXT = {"id": "ctx_1", "language": "python", "cwd": None}
TENANT = {"name": "acme", "quotas": {"max_sandboxes": 5}, "defaults": {}, "allowed_templates": None}
KEY = {"id": "key_1", "tenant": "acme", "scope": "exec", "selector": {}, "prefix": "e2b_0123…"}
BUILD = {"id": "bld_1", "template": "web", "status": "queued", "steps": [], "warnings": []}
START = {"cmd": ["httpd", "-f"], "ready": {"port": 8080}}
EVENTS_SSE = 'event: sandbox.created\ndata: {"sandbox_id": "sbx_1", "at": "t"}\n\n'
WATCH_SSE = (
    'event: ready\ndata: {"path": "/w", "recursive": true, "watched_dirs": 1}\n\n'
    'event: event\ndata: {"event": "create", "name": "a", "path": "/w/a", "type": "file",'
    ' "entry": {"name": "a", "path": "/w/a", "type": "file", "size": 1}}\n\n'
    'event: warning\ndata: {"code": "overflow", "message": "lost"}\n\n'
    'event: event\ndata: {"event": "rename", "name": "b", "path": "/w/b", "type": "file",'
    ' "old_name": "a", "old_path": "/w/a"}\n\n'
    'event: end\ndata: {"reason": "the watched directory was removed"}\n\n'
)

Recorded = Tuple[str, str, List[Tuple[str, str]], Any, Any]


def answer(req: httpx.Request) -> httpx.Response:
    """The fake server's answers, by method and path."""
    path, method = req.url.path, req.method
    if method == "DELETE" or path.endswith(("/mkdir", "/move")) or method == "PUT":
        if path.endswith("/network"):
            return httpx.Response(200, json=dict(SANDBOX, network={"egress": "deny"}))
        return httpx.Response(204)
    if path.endswith("/code"):
        return httpx.Response(200, text=CODE_SSE, headers={"content-type": "text/event-stream"})
    if path.endswith("/contexts") and method == "GET":
        return httpx.Response(200, json={"contexts": [CONTEXT]})
    if path.endswith(("/contexts", "/restart")):
        return httpx.Response(200 if path.endswith("/restart") else 201, json=CONTEXT)
    if path == "/v1/events" or path.endswith("/exec/stream"):
        body = EVENTS_SSE if path == "/v1/events" else EXEC_SSE
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})
    if path.endswith("/files"):
        return httpx.Response(200, content=b"\x00data")
    if path.endswith("/files/watch"):
        return httpx.Response(200, text=WATCH_SSE, headers={"content-type": "text/event-stream"})
    if path.endswith("/files/url"):
        op = json.loads(req.content)["op"]
        return httpx.Response(201, json={"url": f"http://fake:1/signed?{op}", "method": "GET"})
    routes: Dict[str, Any] = {
        "/healthz": {"status": "ok"},
        "/v1/templates": {"templates": [{"name": "minimal", "ready": True}]}
        if method == "GET"
        else BUILD,
        "/v1/snapshots": {"snapshots": [{"id": "snap_1", "name": "s"}]},
        "/v1/volumes": {"volumes": [{"id": "vol_1", "name": "v"}]},
        "/v1/sandboxes": {"sandboxes": [SANDBOX]} if method == "GET" else SANDBOX,
        "/v1/tenants": {"tenants": [TENANT]} if method == "GET" else TENANT,
        "/v1/keys": {"keys": [KEY]} if method == "GET" else dict(KEY, secret="e2b_0123"),
        "/v1/audit": {"entries": [{"id": 1, "method": "POST", "route": "/v1/sandboxes", "status": 201}]},
        "/v1/usage": {
            "group_by": "tenant",
            "total": {"cpu_seconds": 3.0, "cost_micros": None, "intervals": 2},
            "groups": [{"tenant": "acme", "cpu_seconds": 3.0, "intervals": 2}],
        },
    }
    if path in routes:
        return httpx.Response(200, json=routes[path])
    suffix = path.rsplit("/", 1)[-1]
    docs: Dict[str, Any] = {
        "usage": {"usage": {"pids": 2}},
        "exec": {"stdout": "x", "exit_code": 0},
        "fork": {"sandboxes": [dict(SANDBOX, id="sbx_3"), dict(SANDBOX, id="sbx_4")]},
        "explore": {"winner": OUTCOME, "outcomes": [OUTCOME]},
        "snapshots": {"id": "snap_2", "name": "n"},
        "list": {"entries": [ENTRY]},
        "stat": ENTRY,
        "wake": dict(SANDBOX, woke_in_ms=5),
    }
    if path.startswith("/v1/snapshots/"):
        return httpx.Response(200, json={"id": suffix, "name": "s", "used_by": []})
    if path.startswith("/v1/tenants/"):
        return httpx.Response(200, json=TENANT)
    if path.startswith("/v1/keys/"):
        return httpx.Response(200, json=KEY)
    if path.startswith("/v1/templates/") and method == "PATCH":
        change = json.loads(req.content)
        return httpx.Response(200, json={"name": suffix, "ready": True, **change})
    if path.startswith("/v1/volumes/"):
        return httpx.Response(200, json={"id": "vol_1", "name": suffix})
    return httpx.Response(200, json=docs.get(suffix, SANDBOX))


def fake_clients(transport: httpx.MockTransport) -> Tuple[hutch.Client, hutch.AsyncClient]:
    """A sync and an async client whose requests go to ``transport``."""
    client = hutch.Client("http://fake:1", "key")
    aclient = hutch.AsyncClient("http://fake:1", "key")
    options: Dict[str, Any] = {
        "base_url": client.url,
        "transport": transport,
        "timeout": httpx.Timeout(30.0, connect=10.0),
    }
    client._http.close()
    client._http = httpx.Client(**options)
    aclient._http = httpx.AsyncClient(**options)
    return client, aclient


def recorder() -> Tuple[List[Recorded], httpx.MockTransport]:
    seen: List[Recorded] = []

    def handler(req: httpx.Request) -> httpx.Response:
        body = req.content
        seen.append(
            (
                req.method,
                req.url.raw_path.decode().split("?")[0],
                list(req.url.params.multi_items()),
                json.loads(body)
                if body and req.headers.get("content-type") == "application/json"
                else body,
                req.extensions.get("timeout", {}).get("read"),
            )
        )
        return answer(req)

    return seen, httpx.MockTransport(handler)


# Each step: (what to call it on, method name, args, kwargs). "client", "sandbox" and "files"
# are resolved against the flavour under test.
STEPS: List[Tuple[str, str, Tuple[Any, ...], Dict[str, Any]]] = [
    ("client", "health", (), {}),
    ("client", "templates", (), {}),
    ("client", "snapshots", (), {}),
    ("client", "get_snapshot", ("snap/1",), {}),
    ("client", "delete_snapshot", ("snap_1",), {}),
    ("client", "create_volume", ("v",), {"size_mib": 64}),
    ("client", "volumes", (), {}),
    ("client", "get_volume", ("my vol",), {}),
    ("client", "delete_volume", ("vol_1",), {}),
    ("client", "create_tenant", ("acme",), {"quotas": {"max_sandboxes": 5}}),
    ("client", "tenants", (), {}),
    ("client", "get_tenant", ("acme",), {}),
    ("client", "update_tenant", ("acme",), {"allow_any_template": True}),
    ("client", "delete_tenant", ("acme",), {}),
    ("client", "create_key", (), {"tenant": "acme", "scope": "exec", "format": "e2b"}),
    ("client", "keys", (), {}),
    ("client", "get_key", ("key_1",), {}),
    ("client", "revoke_key", ("key_1",), {}),
    ("client", "audit", (), {"tenant": "acme", "since": "2025-05-20T12:00:00Z"}),
    ("client", "usage", (), {"group_by": "tenant", "since": "2025-05-20T12:00:00Z"}),
    ("client", "set_key_budget", ("key_1",), {"daily_budget": 5}),
    ("templates", "list", (), {}),
    ("templates", "get", ("web/x",), {}),
    ("templates", "delete", ("web",), {}),
    ("templates", "builds", ("web",), {}),
    ("templates", "get_build", ("web", "bld_1"), {}),
    (
        "templates",
        "build_from_image",
        ("web", "127.0.0.1:5000/team/web:1"),
        {"registry_auth": "u:p", "insecure_registries": ["127.0.0.1:5000"], "start": START},
    ),
    ("templates", "build_from_image", ("web", "127.0.0.1:5000/web"), {"force": True, "cpus": 2}),
    ("templates", "update", ("web",), {"start": START, "isolation": "ns"}),
    ("templates", "update", ("web",), {"start": None}),
    ("templates", "update", ("web",), {"isolation": "auto"}),
    ("sandbox", "refresh", (), {}),
    ("sandbox", "update", (), {"ttl_seconds": 5, "metadata": {"k": "v"}}),
    ("sandbox", "set_ttl", (9,), {}),
    ("sandbox", "set_persistent", (), {}),
    ("sandbox", "set_metadata", ({"a": "b"},), {}),
    ("sandbox", "usage", (), {}),
    ("sandbox", "exec", (["echo", 1],), {"env": {"A": 1}, "stdin": b"\x01", "timeout": 5}),
    ("sandbox", "exec", ("true",), {"timeout": 0, "cwd": "/", "user": "u"}),
    ("sandbox", "pause", (), {}),
    ("sandbox", "resume", (), {}),
    ("sandbox", "hibernate", (), {}),
    ("sandbox", "wake", (), {}),
    ("sandbox", "snapshot", ("n",), {}),
    ("sandbox", "fork", (2,), {"mode": "live"}),
    ("sandbox", "explore", (["a", ["b", "c"]],), {"timeout": 10, "score_regex": "(\\d+)"}),
    ("sandbox", "update_network", ("deny",), {"allow": ("*.x.org",)}),
    ("sandbox", "port_url", (8080, "a?b=1"), {}),
    ("sandbox", "create_code_context", ("bash",), {"cwd": "/tmp", "env": {"A": "1"}}),
    ("sandbox", "list_code_contexts", (), {}),
    ("sandbox", "restart_code_context", ("ctx_1",), {}),
    ("sandbox", "run_code", ("1 + 1",), {"context": "ctx_1", "timeout": 5}),
    ("sandbox", "run_code", ("echo",), {"language": "bash", "env": {"A": "1"}}),
    ("sandbox", "delete_code_context", ("ctx_1",), {}),
    ("files", "read_bytes", ("/a",), {}),
    ("files", "read", ("/a",), {"errors": "replace"}),
    ("files", "write", ("/a", "text"), {"mode": 0o755}),
    ("files", "write", ("/b", b"\x00"), {"mode": "0600"}),
    ("files", "list", ("/",), {"depth": 2}),
    ("files", "stat", ("/a",), {}),
    ("files", "exists", ("/a",), {}),
    ("files", "mkdir", ("/d",), {}),
    ("files", "move", ("/a", "/b"), {}),
    ("files", "remove", ("/d",), {"recursive": True}),
    ("files", "download_url", ("/a",), {"expires_in": 60}),
    ("files", "upload_url", ("/b",), {"user": "user"}),
    ("sandbox", "kill", (), {}),
]


def comparable(value: Any) -> Any:
    """Results as plain data (sandboxes by id and state)."""
    if isinstance(value, (hutch.Sandbox, hutch.AsyncSandbox)):
        return ("sandbox", value.id, value.state)
    if isinstance(value, (hutch.Build, hutch.AsyncBuild)):
        return ("build", value.id, value.status)
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def run_sync(streamed: List[Any], archive: Path) -> Tuple[List[Recorded], List[Any]]:
    seen, transport = recorder()
    client = fake_clients(transport)[0]
    results: List[Any] = []
    sb = hutch.Sandbox.create(template="minimal", metadata={"a": "1"}, client=client)
    results.append(comparable(sb))
    results.append(comparable(hutch.Sandbox.connect("sbx_1", client=client)))
    results.append(comparable(hutch.Sandbox.list(metadata={"k": "v"}, client=client)))
    targets = {"client": client, "sandbox": sb, "files": sb.files, "templates": client.templates}
    for target, name, args, kwargs in STEPS:
        results.append(comparable(getattr(targets[target], name)(*args, **kwargs)))
        results.append(comparable(sb.info))
    upload = client.templates.upload_image("web", archive, image_tag="1", start=START)
    results.append(comparable(upload))
    code = sb.exec_stream(
        "x", on_stdout=streamed.append, on_stderr=streamed.append, on_start=streamed.append
    )
    results.append(code)
    with client.events() as events:
        results.append(next(iter(events)))
    with sb.files.watch("/w", recursive=True, include_entry=True) as watch:
        results.append(watch.ready)
        results.append(list(watch))
        results.append((watch.warnings, watch.end_reason))
    client.close()
    return seen, results


async def run_async(streamed: List[Any], archive: Path) -> Tuple[List[Recorded], List[Any]]:
    seen, transport = recorder()
    client = fake_clients(transport)[1]
    results: List[Any] = []
    sb = await hutch.AsyncSandbox.create(template="minimal", metadata={"a": "1"}, client=client)
    results.append(comparable(sb))
    results.append(comparable(await hutch.AsyncSandbox.connect("sbx_1", client=client)))
    results.append(comparable(await hutch.AsyncSandbox.list(metadata={"k": "v"}, client=client)))
    targets = {"client": client, "sandbox": sb, "files": sb.files, "templates": client.templates}
    for target, name, args, kwargs in STEPS:
        out = getattr(targets[target], name)(*args, **kwargs)
        results.append(comparable(await out if inspect.isawaitable(out) else out))
        results.append(comparable(sb.info))
    upload = await client.templates.upload_image("web", archive, image_tag="1", start=START)
    results.append(comparable(upload))

    async def on_stderr(text: str) -> None:
        streamed.append(text)

    code = await sb.exec_stream(
        "x", on_stdout=streamed.append, on_stderr=on_stderr, on_start=streamed.append
    )
    results.append(code)
    async with client.events() as events:
        async for ev in events:
            results.append(ev)
            break
    async with await sb.files.watch("/w", recursive=True, include_entry=True) as watch:
        results.append(watch.ready)
        results.append([e async for e in watch])
        results.append((watch.warnings, watch.end_reason))
    await client.aclose()
    return seen, results


def test_sync_and_async_send_the_same_requests(tmp_path: Path) -> None:
    sync_streamed: List[Any] = []
    async_streamed: List[Any] = []
    archive = tmp_path / "image.tar"
    archive.write_bytes(b"an image archive, as far as the client knows")
    sync_seen, sync_results = run_sync(sync_streamed, archive)
    async_seen, async_results = asyncio.run(run_async(async_streamed, archive))
    assert sync_seen == async_seen
    assert sync_results == async_results
    assert sync_streamed == async_streamed == [7, "hé", "e"]
    # A few of the requests, spelled out.
    assert sync_seen[0] == (
        "POST",
        "/v1/sandboxes",
        [],
        {"template": "minimal", "metadata": {"a": "1"}},
        None,
    )
    assert ("GET", "/v1/snapshots/snap%2F1", [], b"", 30.0) in sync_seen
    assert ("GET", "/v1/templates/web%2Fx", [], b"", 30.0) in sync_seen
    assert ("GET", "/v1/templates/web/builds/bld_1", [], b"", 30.0) in sync_seen
    assert (
        "POST",
        "/v1/templates",
        [],
        {
            "name": "web",
            "from_image": "127.0.0.1:5000/team/web:1",
            "registry_auth": "u:p",
            "insecure_registries": ["127.0.0.1:5000"],
            "start": START,
        },
        None,
    ) in sync_seen
    assert ("PATCH", "/v1/templates/web", [], {"start": None}, 30.0) in sync_seen
    assert (
        "PATCH",
        "/v1/templates/web",
        [],
        {"start": START, "isolation": "ns"},
        30.0,
    ) in sync_seen
    assert (
        "POST",
        "/v1/templates",
        [
            ("name", "web"),
            ("image_archive", "true"),
            ("image_tag", "1"),
            ("start", '{"cmd":["httpd","-f"],"ready":{"port":8080}}'),
        ],
        archive.read_bytes(),
        None,
    ) in sync_seen
    assert ("build", "bld_1", "queued") in sync_results
    assert (
        "POST",
        "/v1/sandboxes/sbx_1/code",
        [],
        {"code": "1 + 1", "context_id": "ctx_1", "timeout_seconds": 5},
        65.0,
    ) in sync_seen
    assert (
        "POST",
        "/v1/sandboxes/sbx_1/exec",
        [],
        {"cmd": ["echo", "1"], "env": {"A": "1"}, "stdin_b64": "AQ==", "timeout_seconds": 5},
        35.0,
    ) in sync_seen
    assert (
        "PUT",
        "/v1/sandboxes/sbx_1/files",
        [("path", "/a"), ("mode", "0755")],
        b"text",
        None,
    ) in sync_seen
    assert sync_results[-4].type == "sandbox.created"
    assert (
        "GET",
        "/v1/sandboxes/sbx_1/files/watch",
        [("path", "/w"), ("recursive", "true"), ("include_entry", "true")],
        b"",
        None,
    ) in sync_seen
    assert (
        "POST",
        "/v1/sandboxes/sbx_1/files/url",
        [],
        {"path": "/a", "op": "read", "expires_in_seconds": 60},
        30.0,
    ) in sync_seen
    events = sync_results[-2]
    assert [(e.event, e.name, e.old_name) for e in events] == [
        ("create", "a", None),
        ("rename", "b", "a"),
    ]
    assert events[0].entry is not None and events[0].entry.size == 1
    assert sync_results[-1] == (
        [{"code": "overflow", "message": "lost"}],
        "the watched directory was removed",
    )


def _first_error(fn: Callable[[], Any]) -> Optional[BaseException]:
    try:
        out = fn()
        if inspect.isawaitable(out):
            asyncio.run(out)  # type: ignore[arg-type]
    except BaseException as e:  # noqa: BLE001 - compared below
        return e
    return None


@pytest.mark.parametrize(
    "call",
    [
        lambda sb: sb.exec(b"ls"),
        lambda sb: sb.explore("true"),
        lambda sb: sb.explore([b"x"]),
        lambda sb: sb.port_url(0),
        lambda sb: sb.files.download_url("/a", expires_in=0),
        lambda sb: sb.files.upload_url("/a", expires_in=1.5),
    ],
)
def test_arguments_are_refused_alike_before_sending(call: Callable[[Any], Any]) -> None:
    seen, transport = recorder()
    client, aclient = fake_clients(transport)
    info = hutch.SandboxInfo.from_json(SANDBOX)
    sync_err = _first_error(lambda: call(hutch.Sandbox(info, client)))
    async_err = _first_error(lambda: call(hutch.AsyncSandbox(info, aclient)))
    assert sync_err is not None and async_err is not None
    assert (type(sync_err), str(sync_err)) == (type(async_err), str(async_err))
    assert seen == []


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.templates.update("web"),
        lambda c: c.templates.update("web", isolation="fast"),
        lambda c: c.templates.update("web", start={"cmd": []}),
        lambda c: c.templates.build_from_image("web", "x", registry_auth="no-colon"),
        lambda c: c.templates.build_from_image("web", "x", insecure_registries=["a/b"]),
        lambda c: c.templates.upload_image("web", "/nonexistent/image.tar", start="httpd"),
        lambda c: c.templates.upload_image("web", "/nonexistent/image.tar"),
    ],
)
def test_template_arguments_are_refused_alike_before_sending(call: Callable[[Any], Any]) -> None:
    seen, transport = recorder()
    client, aclient = fake_clients(transport)
    sync_err = _first_error(lambda: call(client))
    async_err = _first_error(lambda: call(aclient))
    assert sync_err is not None and async_err is not None
    assert (type(sync_err), str(sync_err)) == (type(async_err), str(async_err))
    assert seen == []


def test_errors_map_alike() -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        what = (
            "open /nope: No such file"
            if "/files" in req.url.path
            else "sandbox sbx_x does not exist"
        )
        body = {"error": {"code": "not_found", "message": what}}
        return httpx.Response(404, json=body)

    client, aclient = fake_clients(httpx.MockTransport(refuse))
    with pytest.raises(hutch.SandboxNotFound) as sync_err:
        hutch.Sandbox.connect("sbx_x", client=client)
    with pytest.raises(hutch.SandboxNotFound) as async_err:
        asyncio.run(hutch.AsyncSandbox.connect("sbx_x", client=aclient))
    assert str(sync_err.value) == str(async_err.value)
    info = hutch.SandboxInfo.from_json(SANDBOX)
    sb = hutch.Sandbox(info, client)
    sb.kill()  # a sandbox that is gone already is not an error
    assert sb.state == "stopped"
    with pytest.raises(hutch.FileNotFound):
        sb.files.read("/nope")
    assert not sb.files.exists("/nope")
