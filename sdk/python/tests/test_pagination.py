"""Listings follow the server's cursors: ``Sandbox.list``, ``Client.snapshots`` and
``Client.volumes`` (sync and async) return every record across pages, asking for pages with
``limit`` and passing each ``next_cursor`` back as it came."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Tuple

import httpx

import hutch
from hutch import _ops as ops

SANDBOX = {
    "id": "sbx_1",
    "template": "minimal",
    "isolation": "ns",
    "state": "running",
    "metadata": {},
    "created_at": "2025-01-01T00:00:00.000Z",
}

#: Seven records per collection, served three a page.
RECORDS = 7
PER_PAGE = 3


def record(collection: str, i: int) -> Dict[str, Any]:
    if collection == "sandboxes":
        return dict(SANDBOX, id=f"sbx_{i}")
    prefix = "snap" if collection == "snapshots" else "vol"
    return {"id": f"{prefix}_{i}", "name": f"n{i}"}


def paging_transport(seen: List[Tuple[str, List[Tuple[str, str]]]]) -> httpx.MockTransport:
    def handler(req: httpx.Request) -> httpx.Response:
        collection = req.url.path.rsplit("/", 1)[-1]
        params = list(req.url.params.multi_items())
        seen.append((req.url.path, params))
        start = int(req.url.params.get("cursor", "c0")[1:])
        end = min(start + PER_PAGE, RECORDS)
        doc: Dict[str, Any] = {collection: [record(collection, i) for i in range(start, end)]}
        if end < RECORDS:
            doc["next_cursor"] = f"c{end}"
        return httpx.Response(200, json=doc)

    return httpx.MockTransport(handler)


def clients(transport: httpx.MockTransport) -> Tuple[hutch.Client, hutch.AsyncClient]:
    client = hutch.Client("http://fake:1", "key")
    aclient = hutch.AsyncClient("http://fake:1", "key")
    client._http.close()
    client._http = httpx.Client(base_url=client.url, transport=transport)
    aclient._http = httpx.AsyncClient(base_url=client.url, transport=transport)
    return client, aclient


def expected(collection: str) -> List[str]:
    return [record(collection, i)["id"] for i in range(RECORDS)]


def check_pages(seen: List[Tuple[str, List[Tuple[str, str]]]], path: str) -> None:
    pages = [params for p, params in seen if p == path]
    assert len(pages) == 3, pages
    assert all(("limit", str(ops.PAGE_LIMIT)) in params for params in pages), pages
    assert [dict(params).get("cursor") for params in pages] == [None, "c3", "c6"]


def test_sync_listings_return_every_record_across_pages() -> None:
    seen: List[Tuple[str, List[Tuple[str, str]]]] = []
    client, _ = clients(paging_transport(seen))
    with client:
        sandboxes = hutch.Sandbox.list(client=client, state="running")
        assert [s.id for s in sandboxes] == expected("sandboxes")
        assert [s.id for s in client.snapshots()] == expected("snapshots")
        assert [v.id for v in client.volumes()] == expected("volumes")
    check_pages(seen, "/v1/sandboxes")
    check_pages(seen, "/v1/snapshots")
    check_pages(seen, "/v1/volumes")
    first = [params for p, params in seen if p == "/v1/sandboxes"][0]
    assert ("state", "running") in first, "filters go with every page"


def test_async_listings_return_every_record_across_pages() -> None:
    seen: List[Tuple[str, List[Tuple[str, str]]]] = []
    _, aclient = clients(paging_transport(seen))

    async def run() -> Tuple[List[str], List[str], List[str]]:
        sandboxes = await hutch.AsyncSandbox.list(client=aclient)
        snaps = await aclient.snapshots()
        vols = await aclient.volumes()
        await aclient.aclose()
        return [s.id for s in sandboxes], [s.id for s in snaps], [v.id for v in vols]

    sandboxes, snaps, vols = asyncio.run(run())
    assert sandboxes == expected("sandboxes")
    assert snaps == expected("snapshots")
    assert vols == expected("volumes")
    check_pages(seen, "/v1/sandboxes")
    check_pages(seen, "/v1/volumes")
