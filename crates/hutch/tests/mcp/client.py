"""A real MCP client (the `mcp` package from PyPI) driving `hutch mcp` over stdio.

Run by tests/mcp.rs with HUTCH_BIN, HUTCH_URL and HUTCH_STATE_DIR set. Prints one JSON
object with what it saw; the Rust test asserts on it.
"""
import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def attr(obj, snake, camel):
    """mcp 2.x uses snake_case attributes, 1.x camelCase."""
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, camel)


def text_of(result):
    return "".join(getattr(c, "text", "") for c in result.content)


async def main():
    params = StdioServerParameters(
        command=os.environ["HUTCH_BIN"],
        args=["mcp"],
        env={k: os.environ[k] for k in ("HUTCH_URL", "HUTCH_STATE_DIR", "PATH") if k in os.environ},
    )
    seen = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            seen["server_name"] = attr(init, "server_info", "serverInfo").name
            tools = await session.list_tools()
            seen["tools"] = sorted(t.name for t in tools.tools)
            
            created = await session.call_tool("create_sandbox", {"template": "minimal"})
            sandbox = json.loads(text_of(created))
            seen["sandbox_id"] = sandbox["id"]

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
    print(json.dumps(seen))


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
