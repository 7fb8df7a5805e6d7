"""A real MCP client (the `mcp` package from PyPI) driving `hutch mcp`.

Run by tests/mcp.rs with HUTCH_BIN, HUTCH_URL and HUTCH_STATE_DIR set, as
`client.py [stdio|network|http URL KEY] [hutch mcp flags...]`. Prints one JSON object with
what it saw; the Rust test asserts on it.
"""
import asyncio
import copy
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

SEQ = "seq 1 2000000"
SEQ_BYTES = sum(len(f"{i}\n") for i in range(1, 2000001))


def attr(obj, snake, camel):
    """mcp 2.x uses snake_case attributes, 1.x camelCase."""
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, camel)


def text_of(result):
    return "".join(getattr(c, "text", "") for c in result.content)


def is_error(result):
    return bool(attr(result, "is_error", "isError"))


def strict_check(tools):
    """Convert every tool's input schema as the OpenAI Agents SDK does for MCP tools
    (agents/mcp/util.py: ensure_strict_json_schema, open objects rejected unless the schema
    is empty). Returns {tool: error} for the ones it refuses and the names of the ones it
    had to change (a strict schema passes through unchanged)."""
    from agents.strict_schema import ensure_strict_json_schema

    failures, changed = {}, []
    for t in tools:
        schema = copy.deepcopy(attr(t, "input_schema", "inputSchema"))
        empty = schema == {}
        schema.setdefault("properties", {})
        try:
            strict = ensure_strict_json_schema(copy.deepcopy(schema), _reject_open_objects=not empty)
        except Exception as e:  # the SDK falls back to non-strict here
            failures[t.name] = str(e)
            continue
        if strict != schema:
            changed.append(t.name)
    return failures, changed


def nulls(tool, given):
    """Arguments as a strict-mode model sends them: every property, null unless given."""
    props = attr(tool, "input_schema", "inputSchema").get("properties", {})
    return {k: given.get(k) for k in props}


async def stdio_main(flags):
    params = StdioServerParameters(
        command=os.environ["HUTCH_BIN"],
        args=["mcp", *flags],
        env={k: os.environ[k] for k in ("HUTCH_URL", "HUTCH_STATE_DIR", "PATH") if k in os.environ},
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            return await drive(session)


async def drive(session):
    seen = {}
    init = await session.initialize()
    seen["server_name"] = attr(init, "server_info", "serverInfo").name
    tools = await session.list_tools()
    seen["tools"] = sorted(t.name for t in tools.tools)
    by_name = {t.name: t for t in tools.tools}
    seen["strict_failures"], seen["strict_changed"] = strict_check(tools.tools)
    seen["create_description"] = by_name["create_sandbox"].description

    wider = await session.call_tool("create_sandbox", {"template": "minimal", "egress": "allow"})
    seen["wider_is_error"] = is_error(wider)
    seen["wider_text"] = text_of(wider)

    created = await session.call_tool(
        "create_sandbox",
        nulls(by_name["create_sandbox"], {"template": "minimal", "env": [{"name": "FOO", "value": "bar baz"}]}),
    )
    seen["create_is_error"] = is_error(created)
    sandbox = json.loads(text_of(created))
    seen["sandbox_id"] = sandbox["id"]
    seen["network"] = sandbox.get("network")

    env = await session.call_tool("run_command", nulls(by_name["run_command"], {"command": "echo \"$FOO\""}))
    seen["env_stdout"] = json.loads(text_of(env))["stdout"]

    big = await session.call_tool("run_command", {"command": SEQ})
    big_text = text_of(big)
    seen["big_len"] = len(big_text.encode())
    big_out = json.loads(big_text)
    seen["big_exit"] = big_out["exit_code"]
    stdout = big_out["stdout"]
    seen["big_head"] = stdout[:12]
    seen["big_tail"] = stdout[-16:]
    marker = stdout[stdout.index("[… hutch cut"):stdout.index("…]") + 2]
    seen["big_marker"] = marker
    seen["seq_bytes"] = SEQ_BYTES
    # Follow the marker: read the cut part's first bytes back from the saved file.
    path = marker.split("read_file path=")[1].split()[0]
    offset = int(marker.split("offset=")[1].split()[0])
    part = await session.call_tool("read_file", {"path": path, "offset": offset, "length": 40})
    expected = "".join(f"{i}\n" for i in range(1, 2000001))
    seen["range_matches"] = text_of(part) == expected[offset:offset + 40]
    size = await session.call_tool("run_command", {"argv": ["wc", "-c", path]})
    seen["saved_size"] = int(json.loads(text_of(size))["stdout"].split()[0])
    whole = await session.call_tool("read_file", {"path": path})
    seen["read_big_len"] = len(text_of(whole).encode())
    seen["read_big_marker"] = "hutch cut" in text_of(whole)

    ran = await session.call_tool("run_command", {"command": "echo hello-$((6*7)); echo err >&2; exit 3"})
    seen["run_command"] = json.loads(text_of(ran))

    argv = await session.call_tool("run_command", {"argv": ["echo", "$HOME;x"]})
    seen["run_argv"] = json.loads(text_of(argv))

    wrote = await session.call_tool("write_file", {"path": "/root/note.txt", "content": "from mcp\n"})
    seen["write_is_error"] = bool(attr(wrote, "is_error", "isError"))
    read_back = await session.call_tool("read_file", {"path": "/root/note.txt"})
    seen["read_file"] = text_of(read_back)

    listed = await session.call_tool("list_files", {"path": "/root"})
    seen["list_names"] = [e["name"] for e in json.loads(text_of(listed))["entries"]]

    bad = await session.call_tool("read_file", {"path": "/does/not/exist"})
    seen["missing_is_error"] = bool(attr(bad, "is_error", "isError"))
    seen["missing_text"] = text_of(bad)

    snap = await session.call_tool("snapshot_sandbox", {"sandbox_id": sandbox["id"], "name": "mcp-snap"})
    seen["snapshot"] = json.loads(text_of(snap))
    forked = await session.call_tool("fork_sandbox", {"sandbox_id": sandbox["id"], "count": 2})
    children = [c["id"] for c in json.loads(text_of(forked))["sandboxes"]]
    seen["fork_children"] = children
    child_read = await session.call_tool("read_file", {"sandbox_id": children[0], "path": "/root/note.txt"})
    seen["child_read"] = text_of(child_read)
    killed = await session.call_tool("kill_sandbox", {"sandbox_id": children[1]})
    seen["kill_is_error"] = bool(attr(killed, "is_error", "isError"))

    mine = await session.call_tool("list_sandboxes", {})
    seen["session_sandboxes"] = [s["id"] for s in json.loads(text_of(mine))["sandboxes"]]
    return seen


async def network_main(flags):
    """`hutch mcp` on a server that gives sandboxes a network: what a model gets."""
    params = StdioServerParameters(
        command=os.environ["HUTCH_BIN"],
        args=["mcp", *flags],
        env={k: os.environ[k] for k in ("HUTCH_URL", "HUTCH_STATE_DIR", "PATH") if k in os.environ},
    )
    seen = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            # No sandbox yet: run_command creates one with the default policy.
            ran = await session.call_tool("run_command", {"command": "echo hi"})
            auto = json.loads(text_of(ran))["sandbox_id"]
            mine = await session.call_tool("list_sandboxes", {})
            seen["auto_network"] = next(
                s["network"] for s in json.loads(text_of(mine))["sandboxes"] if s["id"] == auto
            )
            created = await session.call_tool("create_sandbox", {})
            seen["created"] = json.loads(text_of(created))
            narrowed = await session.call_tool("create_sandbox", {"egress": "none"})
            seen["narrowed"] = json.loads(text_of(narrowed)).get("network")
            wider = await session.call_tool("create_sandbox", {"allow": ["evil.test"]})
            seen["foreign_allow_is_error"] = is_error(wider)
            seen["foreign_allow_text"] = text_of(wider)
    return seen


async def http_main(url, key):
    """`hutch mcp --http`: refused without a valid key, a whole session with one."""
    import httpx2 as httpx
    from mcp.client.streamable_http import streamable_http_client

    seen = {}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "probe", "version": "0"}}}
    hdrs = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx.AsyncClient() as c:
        seen["no_key_status"] = (await c.post(url, json=init, headers=hdrs)).status_code
        bad = {**hdrs, "Authorization": "Bearer hk_not_a_key"}
        seen["bad_key_status"] = (await c.post(url, json=init, headers=bad)).status_code
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as client:
        async with streamable_http_client(url, http_client=client) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                seen["server_name"] = attr(init, "server_info", "serverInfo").name
                tools = await session.list_tools()
                seen["tools"] = sorted(t.name for t in tools.tools)
                created = await session.call_tool("create_sandbox", {"template": "minimal"})
                seen["create_text"] = text_of(created)
                seen["sandbox_id"] = json.loads(text_of(created))["id"]
                ran = await session.call_tool("run_command", {"command": "echo over-http"})
                seen["run"] = json.loads(text_of(ran))
    return seen


async def code_main(flags):
    """The `run_code` tool: state across calls, a chart as image content, cut output."""
    params = StdioServerParameters(
        command=os.environ["HUTCH_BIN"],
        args=["mcp", *flags],
        env={k: os.environ[k] for k in ("HUTCH_URL", "HUTCH_STATE_DIR", "PATH") if k in os.environ},
    )
    seen = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            first = await session.call_tool("run_code", nulls(tools["run_code"], {"code": "x = 20"}))
            seen["first_is_error"] = is_error(first)
            first = json.loads(text_of(first))
            seen["first_error"] = first["error"]
            seen["sandbox_id"] = first["sandbox_id"]
            mine = json.loads(text_of(await session.call_tool("list_sandboxes", {})))["sandboxes"]
            seen["template"] = next(
                (sb["template"] for sb in mine if sb["id"] == first["sandbox_id"]), None)
            second = json.loads(text_of(await session.call_tool("run_code", {"code": "x + 22"})))
            seen["second_results"] = second["results"]
            chart = await session.call_tool(
                "run_code",
                {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [2, 3, 1])\nplt.show()"},
            )
            images = [c for c in chart.content if getattr(c, "type", "") == "image"]
            seen["images"] = [attr(c, "mime_type", "mimeType") for c in images]
            if images:
                import base64
                seen["image_head"] = base64.b64decode(images[0].data)[:8].hex()
            big = await session.call_tool("run_code", {"code": "print('y' * 100000)"})
            big_text = text_of(big)
            seen["big_len"] = len(big_text.encode())
            seen["big_cut"] = "hutch cut" in json.loads(big_text)["stdout"]
            bash = json.loads(text_of(await session.call_tool(
                "run_code", {"code": "echo $((x + 1))", "language": "bash"})))
            seen["bash_stdout"] = bash["stdout"]
    return seen


async def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "code":
        seen = await code_main(sys.argv[2:])
    elif mode == "http":
        seen = await http_main(sys.argv[2], sys.argv[3])
    elif mode == "network":
        seen = await network_main(sys.argv[2:])
    else:
        seen = await stdio_main(sys.argv[2:])
    print(json.dumps(seen))


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
