"""Port forwarding from the SDK: busybox httpd inside a `minimal` sandbox, reached through
the server's port proxy with `port_request` and `port_url`."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from conftest import Server

import hutch
from hutch import AsyncSandbox, Sandbox


def _start_httpd(sb: Sandbox) -> None:
    sb.files.write("/srv/www/hello.txt", "hi from the sandbox\n")
    # Without -f busybox httpd daemonizes, so the exec returns while it keeps serving.
    assert sb.exec(["httpd", "-p", "8080", "-h", "/srv/www"]).exit_code == 0


def test_port_request_and_url(server: Server) -> None:
    with Sandbox.create(metadata={"suite": "py-ports"}) as sb:
        _start_httpd(sb)
        deadline = time.monotonic() + 20
        while True:
            try:
                resp = sb.port_request(8080, "/hello.txt")
                break
            except hutch.PortUnreachable:
                assert time.monotonic() < deadline, "httpd never came up"
                time.sleep(0.05)
        assert resp.status_code == 200
        assert resp.text == "hi from the sandbox\n"
        assert resp.headers["via"] == "1.1 hutch"

        # The service's own errors are answers, not exceptions.
        assert sb.port_request(8080, "missing.txt").status_code == 404

        # Hutch's own errors raise.
        with pytest.raises(hutch.PortUnreachable) as e:
            sb.port_request(9)
        assert e.value.status == 502 and "port 9" in e.value.message

        url = sb.port_url(8080, "/hello.txt")
        assert url == f"{server.url}/v1/sandboxes/{sb.id}/ports/8080/hello.txt"
        assert httpx.get(url).status_code == 401
        # A browser link: a signed token for this port, never the key.
        browser_url = sb.browser_url(8080, "/hello.txt")
        assert server.key not in browser_url
        assert "/hello.txt?hutch_token=hst1." in browser_url
        assert httpx.get(browser_url, follow_redirects=True).text == "hi from the sandbox\n"
        assert httpx.get(f"{url}?hutch_token={server.key}").status_code == 401

        with pytest.raises(ValueError):
            sb.port_url(0)
        with pytest.raises(ValueError):
            sb.port_url(65536)


def test_async_port_request(server: Server) -> None:
    async def run() -> None:
        async with await AsyncSandbox.create(metadata={"suite": "py-ports"}) as sb:
            await sb.files.write("/srv/www/hello.txt", "async hi\n")
            assert (await sb.exec(["httpd", "-p", "8081", "-h", "/srv/www"])).exit_code == 0
            deadline = time.monotonic() + 20
            while True:
                try:
                    resp = await sb.port_request(8081, "/hello.txt")
                    break
                except hutch.PortUnreachable:
                    assert time.monotonic() < deadline, "httpd never came up"
                    await asyncio.sleep(0.05)
            assert resp.text == "async hi\n"
            assert sb.port_url(8081) == f"{server.url}/v1/sandboxes/{sb.id}/ports/8081/"

    asyncio.run(run())
