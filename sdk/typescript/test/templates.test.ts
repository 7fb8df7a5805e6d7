// Template builds through the SDK against a real `hutch serve`: from Dockerfiles (build,
// follow, wait, cancel, get and delete), from uploaded images, and changes to a template.
// Dockerfiles start `FROM minimal` (busybox) and images are made here (`oci.ts`), so no build
// needs a network: no test names an image in a registry the server would pull from. Every
// template is deleted at the end.
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
  type ServiceSpec,
} from "../src/index.js";
import { startServer, type TestServer } from "./harness.js";
import { tarOf, writeLayout } from "./oci.js";

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

  test("build secrets reach their step only", async () => {
    const c = new Client();
    const name = templateName();
    const ctx = context(
      "FROM minimal\nRUN --mount=type=secret,id=token --mount=type=secret,id=raw,env=RAW " +
        "sh -c 'wc -c < /run/secrets/token > /seen && echo \"$RAW\" >> /seen'\n",
    );
    const build = await c.templates.build(name, ctx, {
      secrets: { token: "twelve chars", raw: new TextEncoder().encode("bytes-ok") },
    });
    const lines: BuildLogLine[] = [];
    assert.equal((await build.wait({ onLine: (l) => void lines.push(l) })).status, "succeeded");
    assert.ok(!lines.some((l) => l.text.includes("twelve chars")));
    const sb = await Sandbox.create({ template: name, client: c });
    try {
      const out = await sb.exec("cat /seen; test -e /run/secrets/token || echo gone");
      assert.deepEqual(out.stdout.split(/\s+/).filter(Boolean), ["12", "bytes-ok", "gone"]);
    } finally {
      await sb.kill();
    }
    await assert.rejects(c.templates.build(name, ctx, { secrets: { "a,b": "x" } }), TypeError);
  });

  test("an uploaded image makes a template whose start can change", async () => {
    const c = new Client();
    const name = templateName();
    const work = mkdtempSync("/tmp/hutch-ts-image-");
    dirs.push(work);
    const { size, digest } = await writeLayout(join(work, "layout"), "uploaded by the typescript sdk");
    const archive = join(work, "image.tar");
    writeFileSync(archive, await tarOf(join(work, "layout")));
    const build = await c.templates.uploadImage(name, archive, { imageTag: "1", memoryMib: 300 });
    assert.match(build.id, /^bld_/);
    const seen: BuildLogLine[] = [];
    assert.equal((await build.wait({ onLine: (l) => void seen.push(l) })).status, "succeeded");
    // The layer's extraction is reported with its numbers, to its end.
    const progress = seen.filter((l) => l.stream === "progress").map((l) => l.progress);
    assert.ok(progress.length > 0 && progress.every((p) => p !== undefined), JSON.stringify(seen));
    const last = progress[progress.length - 1]!;
    assert.deepEqual([last.id, last.label, last.action, last.current, last.total], [digest, "layer 1/1", "extract", size, size]);
    assert.ok(seen.filter((l) => l.stream !== "progress").every((l) => l.progress === undefined));

    const t = await c.templates.get(name);
    assert.ok(t.ready);
    assert.equal(t.start, undefined);
    assert.equal(t.image?.reference, "upload:1");
    assert.equal(t.defaults.memory_mib, 300);
    const sb = await Sandbox.create({ template: name, isolation: "ns", client: c });
    try {
      assert.equal((await sb.exec("cat /from-image")).stdout, "uploaded by the typescript sdk");
    } finally {
      await sb.kill();
    }

    const start: ServiceSpec = { cmd: ["/bin/sh", "-c", "cat /from-image > /tmp/started"], env: { A: "1" } };
    const changed = await c.templates.update(name, { start });
    assert.equal(changed.name, name);
    assert.deepEqual(changed.start, start);
    assert.deepEqual((await c.templates.get(name)).start, start);
    // Left out, the start command stays; the isolation changes alone.
    assert.deepEqual((await c.templates.update(name, { isolation: "ns" })).start, start);
    assert.equal((await c.templates.get(name)).defaults.isolation, "ns");
    assert.equal((await c.templates.update(name, { isolation: "auto" })).defaults.isolation, undefined);
    // null removes it.
    assert.equal((await c.templates.update(name, { start: null })).start, undefined);
    assert.equal((await c.templates.get(name)).start, undefined);

    await assert.rejects(
      c.templates.update(name, { start: { cmd: "true", ready: { port: 0 } } }),
      (e) => e instanceof InvalidRequest && e.status === 400 && e.message.includes("port"),
    );
    await assert.rejects(c.templates.update(name, {}), TypeError);
    try {
      await assert.rejects(c.templates.update(`${name}-none`, { isolation: "ns" }), NotFoundError);
    } finally {
      rmSync(join(TEMPLATES, `.lock-${name}-none`), { force: true });
    }
  });

  test("a layout directory uploads, and an image naming local files is refused", async () => {
    const c = new Client();
    const name = templateName();
    const work = mkdtempSync("/tmp/hutch-ts-image-");
    dirs.push(work);
    const layout = join(work, "layout");
    await writeLayout(layout, "uploaded as a directory");
    for (const reference of [`oci:${layout}:1`, `docker-archive:${join(work, "image.tar")}`]) {
      await assert.rejects(
        c.templates.buildFromImage(name, reference),
        (e) => e instanceof InvalidRequest && e.status === 400 && e.code === "bad_request" && e.message.includes("image_archive=true"),
      );
    }
    // Nothing to upload is refused before anything is sent.
    await assert.rejects(
      c.templates.uploadImage(name, join(work, "nothing.tar")),
      (e) => e instanceof InvalidRequest && e.status === undefined,
    );
    await assert.rejects(c.templates.get(name), NotFoundError);

    const start: ServiceSpec = { cmd: "exec cat /from-image", ready: { cmd: ["/bin/cat", "/from-image"] } };
    const build = await c.templates.uploadImage(name, layout, { start });
    const lines: BuildLogLine[] = [];
    for await (const l of build.logs()) lines.push(l);
    assert.ok(lines.some((l) => l.progress?.action === "extract"), JSON.stringify(lines));
    assert.equal((await build.wait()).status, "succeeded");
    const t = await c.templates.get(name);
    assert.equal(t.image?.reference, "upload");
    assert.equal(t.start?.cmd, "exec cat /from-image");
    assert.deepEqual(t.start?.ready?.cmd, ["/bin/cat", "/from-image"]);
    assert.equal((await c.templates.update(name, { start: null })).start, undefined);
  });
});
