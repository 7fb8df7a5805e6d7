// Port forwarding from the TypeScript SDK: busybox httpd inside a `minimal` sandbox, reached
// through the server's port proxy with `portFetch` and `portUrl` (real server, no mocks).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { PortUnreachable, Sandbox } from "../src/index.js";
import { startServer, type TestServer } from "./harness.js";

let server: TestServer;

before(async () => {
  server = await startServer();
  process.env.HUTCH_URL = server.url;
  process.env.HUTCH_API_KEY = server.key;
});

after(async () => {
  delete process.env.HUTCH_URL;
  delete process.env.HUTCH_API_KEY;
  await server?.stop();
});

test("portFetch and portUrl reach a service inside the sandbox", async () => {
  const sb = await Sandbox.create({ metadata: { suite: "ts-ports" } });
  try {
    await sb.files.write("/srv/www/hello.txt", "hi from the sandbox\n");
    // Without -f busybox httpd daemonizes, so the exec returns while it keeps serving.
    assert.equal((await sb.exec(["httpd", "-p", "8080", "-h", "/srv/www"])).exitCode, 0);
    const deadline = Date.now() + 20_000;
    let resp: Response;
    for (;;) {
      try {
        resp = await sb.portFetch(8080, "/hello.txt");
        break;
      } catch (e) {
        assert.ok(e instanceof PortUnreachable, String(e));
        assert.ok(Date.now() < deadline, "httpd never came up");
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    assert.equal(resp.status, 200);
    assert.equal(await resp.text(), "hi from the sandbox\n");
    assert.equal(resp.headers.get("via"), "1.1 hutch");

    // The service's own errors are answers; Hutch's throw.
    const missing = await sb.portFetch(8080, "missing.txt");
    assert.equal(missing.status, 404);
    await missing.arrayBuffer();
    await assert.rejects(sb.portFetch(9), (e: unknown) => {
      assert.ok(e instanceof PortUnreachable);
      assert.equal(e.status, 502);
      assert.match(e.message, /port 9/);
      return true;
    });

    const url = sb.portUrl(8080, "/hello.txt");
    assert.equal(url, `${server.url}/v1/sandboxes/${sb.id}/ports/8080/hello.txt`);
    assert.equal((await fetch(url)).status, 401);
    // A browser link: a signed token for this port, never the key.
    const browserUrl = await sb.browserUrl(8080, "/hello.txt");
    assert.ok(!browserUrl.includes(server.key), browserUrl);
    assert.match(browserUrl, /\/hello\.txt\?hutch_token=hst1\./);
    const first = await fetch(browserUrl, { redirect: "manual" });
    assert.equal(first.status, 303);
    const cookie = (first.headers.get("set-cookie") ?? "").split(";")[0];
    const page = await fetch(new URL(first.headers.get("location") ?? "/", browserUrl), {
      headers: { cookie },
    });
    assert.equal(await page.text(), "hi from the sandbox\n");
    assert.equal((await fetch(`${url}?hutch_token=${server.key}`)).status, 401);
    assert.throws(() => sb.portUrl(0), RangeError);
  } finally {
    await sb.kill();
  }
});
