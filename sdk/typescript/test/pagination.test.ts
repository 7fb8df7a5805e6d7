// Listings follow the server's cursors: Sandbox.list, client.snapshots() and client.volumes()
// return every record across pages. The server is a fake on 127.0.0.1 serving three a page.
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { Client, PAGE_LIMIT, Sandbox } from "../src/index.js";

const RECORDS = 7;
const PER_PAGE = 3;

function record(collection: string, i: number): Record<string, unknown> {
  if (collection === "sandboxes") {
    return { id: `sbx_${i}`, template: "minimal", isolation: "ns", state: "running", metadata: {} };
  }
  return { id: `${collection === "snapshots" ? "snap" : "vol"}_${i}`, name: `n${i}` };
}

test("listings return every record across pages, passing each cursor back", async () => {
  const seen: Array<{ path: string; params: URLSearchParams }> = [];
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url ?? "/", "http://x");
    seen.push({ path: url.pathname, params: url.searchParams });
    const collection = url.pathname.split("/").pop() ?? "";
    const start = Number((url.searchParams.get("cursor") ?? "c0").slice(1));
    const end = Math.min(start + PER_PAGE, RECORDS);
    const doc: Record<string, unknown> = {
      [collection]: Array.from({ length: end - start }, (_, k) => record(collection, start + k)),
    };
    if (end < RECORDS) doc.next_cursor = `c${end}`;
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(doc));
  });
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok));
  const { port } = server.address() as AddressInfo;
  try {
    const client = new Client({ url: `http://127.0.0.1:${port}`, apiKey: "key" });
    const ids = (n: string) => Array.from({ length: RECORDS }, (_, i) => record(n, i).id);
    const sandboxes = await Sandbox.list({ client, state: "running" });
    assert.deepEqual(
      sandboxes.map((s) => s.id),
      ids("sandboxes"),
    );
    assert.deepEqual(
      (await client.snapshots()).map((s) => s.id),
      ids("snapshots"),
    );
    assert.deepEqual(
      (await client.volumes()).map((v) => v.id),
      ids("volumes"),
    );
    for (const path of ["/v1/sandboxes", "/v1/snapshots", "/v1/volumes"]) {
      const pages = seen.filter((s) => s.path === path);
      assert.deepEqual(
        pages.map((p) => p.params.get("cursor")),
        [null, "c3", "c6"],
        path,
      );
      assert.ok(pages.every((p) => p.params.get("limit") === String(PAGE_LIMIT)), path);
    }
    const first = seen.find((s) => s.path === "/v1/sandboxes");
    assert.equal(first?.params.get("state"), "running", "filters go with every page");
  } finally {
    await new Promise<void>((ok) => server.close(() => ok()));
  }
});
