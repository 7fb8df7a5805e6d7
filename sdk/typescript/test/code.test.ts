// The code interpreter from the TypeScript SDK: `runCode` on real kernels in a
// `code-interpreter` sandbox (real server, no mocks).
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { ContextNotFound, NoInterpreter, Sandbox, type Result } from "../src/index.js";
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

test("runCode keeps state, streams output and returns a chart as PNG bytes", async () => {
  const sb = await Sandbox.create({ template: "code-interpreter", metadata: { suite: "ts-code" } });
  try {
    const first = await sb.runCode("x = 41");
    assert.equal(first.error, undefined);
    assert.deepEqual(first.results, []);
    const second = await sb.runCode("x + 1");
    assert.equal(second.text, "42");
    assert.equal(second.contextId, "default-python");

    const seen: string[] = [];
    const chart = await sb.runCode(
      "import matplotlib.pyplot as plt\nprint('drawing')\nplt.plot([1, 2], [2, 1])\nplt.show()",
      {
        onStdout: (t) => {
          seen.push(`stdout:${t}`);
        },
        onResult: (r: Result) => {
          seen.push(`result:${r.formats().join(",")}`);
        },
      },
    );
    assert.equal(seen[0], "stdout:drawing\n");
    assert.ok(seen[1]?.startsWith("result:") && seen[1].includes("png"), String(seen));
    const png = chart.results.find((r) => r.png)?.png;
    assert.ok(png, "a PNG");
    assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

    const failed = await sb.runCode("1 / 0");
    assert.equal(failed.error?.name, "ZeroDivisionError");
    const timed = await sb.runCode("while True:\n    pass", { timeout: 1 });
    assert.equal(timed.error?.name, "TimeoutError");
    assert.equal(timed.error?.timedOut, true);
    assert.equal((await sb.runCode("x")).text, "41");

    const ctx = await sb.createCodeContext({ language: "javascript" });
    await sb.runCode("var k = 6", { context: ctx });
    assert.equal((await sb.runCode("k * 7", { context: ctx })).text, "42");
    assert.ok((await sb.listCodeContexts()).some((c) => c.id === ctx.id));
    await sb.restartCodeContext(ctx);
    assert.equal((await sb.runCode("typeof k", { context: ctx })).text, "'undefined'");
    await sb.deleteCodeContext(ctx);
    await assert.rejects(sb.runCode("1", { context: ctx }), ContextNotFound);
  } finally {
    await sb.kill();
  }
});

test("a minimal sandbox has no interpreter", async () => {
  const sb = await Sandbox.create({ template: "minimal", metadata: { suite: "ts-code" } });
  try {
    await assert.rejects(sb.runCode("1"), (e: unknown) => e instanceof NoInterpreter && /code-interpreter/.test(String(e)));
  } finally {
    await sb.kill();
  }
});
