// Template builds from Dockerfiles through the SDK against a real `hutch serve`: build,
// follow, wait, cancel, get and delete. Dockerfiles start `FROM minimal` (busybox), so no
// build needs a network; every template is deleted at the end.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, afterEach, before, describe, test } from "node:test";

import {
  BuildFailed,
  Client,
  ConflictError,
  InvalidRequest,
  NotFoundError,
  Sandbox,
  type BuildLogLine,
} from "../src/index.js";
import { startServer, type TestServer } from "./harness.js";

let server: TestServer;
const TEMPLATES = process.env.HUTCH_TEST_TEMPLATES ?? "/var/cache/hutch-test/templates";
const made: string[] = [];
const dirs: string[] = [];

before(async () => {
  server = await startServer();
  process.env.HUTCH_URL = server.url;
  process.env.HUTCH_API_KEY = server.key;
});

afterEach(async () => {
  const c = new Client();
  for (const name of made.splice(0)) {
    await c.templates.delete(name).catch((e) => {
      if (!(e instanceof NotFoundError)) throw e;
    });
    rmSync(join(TEMPLATES, `.lock-${name}`), { force: true });
  }
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

after(async () => {
  delete process.env.HUTCH_URL;
  delete process.env.HUTCH_API_KEY;
  await server?.stop();
});

/** A template name of the test's own, deleted after it. */
function templateName(): string {
  const name = `ts-sdk-${randomBytes(6).toString("hex")}`;
  made.push(name);
  return name;
}

function context(dockerfile: string, files: Record<string, string> = {}): string {
  const dir = mkdtempSync("/tmp/hutch-ts-ctx-");
  dirs.push(dir);
  writeFileSync(join(dir, "Dockerfile"), dockerfile);
  for (const [rel, text] of Object.entries(files)) writeFileSync(join(dir, rel), text);
  return dir;
}

describe("template builds", () => {
  test("a build is followed, waited for and used", async () => {
    const c = new Client();
    const name = templateName();
    const ctx = context("FROM minimal\nRUN echo hi > /x && echo built\nCOPY a.txt /a\n", { "a.txt": "alpha\n" });
    const build = await c.templates.build(name, ctx);
    assert.match(build.id, /^bld_/);
    assert.equal(build.template, name);
    assert.ok(["queued", "running"].includes(build.status), build.status);
    assert.deepEqual(
      build.info.steps.map((s) => s.instruction),
      ["RUN echo hi > /x && echo built", "COPY a.txt /a"],
    );
    const seen: BuildLogLine[] = [];
    const info = await build.wait({ onLine: (l) => void seen.push(l) });
    assert.equal(info.status, "succeeded");
    assert.ok(info.done);
    assert.deepEqual(info.steps.map((s) => s.status), ["done", "done"]);
    assert.deepEqual(
      seen.filter((l) => l.stream === "stdout").map((l) => [l.step, l.text]),
      [[1, "built"]],
    );
    // The log of an ended build is there whole, and ends by itself.
    const again: number[] = [];
    for await (const l of build.logs()) again.push(l.seq);
    assert.deepEqual(again, seen.map((l) => l.seq));
    assert.deepEqual((await c.templates.builds(name)).map((b) => b.id), [build.id]);
    assert.equal((await c.templates.getBuild(name, build.id)).status, "succeeded");
    assert.ok((await c.templates.get(name)).ready);
    assert.ok((await c.templates()).some((t) => t.name === name));
    const sb = await Sandbox.create({ template: name, client: c });
    try {
      assert.equal((await sb.exec("cat /x /a")).stdout, "hi\nalpha\n");
      await assert.rejects(c.templates.delete(name), (e) => e instanceof ConflictError && e.message.includes(sb.id));
    } finally {
      await sb.kill();
    }
    await c.templates.delete(name);
    await assert.rejects(c.templates.get(name), NotFoundError);
  });

  test("failed, cancelled and refused builds", async () => {
    const c = new Client();
    const name = templateName();
    await assert.rejects(
      c.templates.build(name, context("FROM minimal\nFOO bar\n")),
      (e) =>
        e instanceof InvalidRequest &&
        e.code === "invalid_dockerfile" &&
        e.message === 'Dockerfile line 2: unknown instruction "FOO"',
    );
    const failing = await c.templates.build(name, context("FROM minimal\nRUN echo broken; exit 3\n"));
    await assert.rejects(failing.wait(), (e) => e instanceof BuildFailed && e.build.status === "failed");
    await assert.rejects(c.templates.get(name), NotFoundError);

    const slow = await c.templates.build(name, context("FROM minimal\nRUN sleep 30\n"));
    const deadline = Date.now() + 60_000;
    while ((await slow.refresh()).steps[0]?.status !== "running") {
      assert.ok(Date.now() < deadline, JSON.stringify(slow.info));
      await new Promise((r) => setTimeout(r, 50));
    }
    const asked = Date.now();
    await slow.cancel();
    await assert.rejects(slow.wait(), (e) => e instanceof BuildFailed && e.build.status === "cancelled");
    assert.ok(Date.now() - asked < 10_000, `the cancel took ${Date.now() - asked} ms`);
  });

  test("a Dockerfile outside the context, build args and .dockerignore", async () => {
    const c = new Client();
    const name = templateName();
    const ctx = context("FROM minimal\n", { "a.txt": "alpha\n", "secret.env": "x", ".dockerignore": "*.env\n" });
    mkdirSync(join(ctx, "sub"));
    writeFileSync(join(ctx, "sub", "b.txt"), "beta\n");
    const outside = join(mkdtempSync("/tmp/hutch-ts-df-"), "web.Dockerfile");
    dirs.push(join(outside, ".."));
    writeFileSync(outside, "FROM minimal\nARG WHO\nRUN echo hello $WHO > /greeting\nCOPY . /ctx\n");
    const build = await c.templates.build(name, ctx, { dockerfile: outside, buildArgs: { WHO: "ts" } });
    await build.wait();
    const sb = await Sandbox.create({ template: name, client: c });
    try {
      assert.equal((await sb.exec("cat /greeting /ctx/a.txt /ctx/sub/b.txt")).stdout, "hello ts\nalpha\nbeta\n");
      assert.notEqual((await sb.exec("test -e /ctx/secret.env")).exitCode, 0);
    } finally {
      await sb.kill();
    }
  });
});
