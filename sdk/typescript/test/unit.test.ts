// Pure pieces: configuration, error mapping, SSE parsing (no server).
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  DEFAULT_URL,
  FileNotFound,
  HutchError,
  InvalidRequest,
  QuotaExceeded,
  SandboxFailed,
  SandboxNotFound,
  ServerError,
  Unsupported,
  defaultStateDir,
  errorFromResponse,
  resolveConfig,
  sseEvents,
} from "../src/index.js";
import { exploreResult, sandboxInfo, snapshot } from "../src/models.js";

function withEnv(vars: Record<string, string | undefined>, fn: () => void): void {
  const saved: Record<string, string | undefined> = {};
  for (const [k, v] of Object.entries(vars)) {
    saved[k] = process.env[k];
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
  try {
    fn();
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

test("config: arguments, then environment, then defaults", () => {
  withEnv({ HUTCH_URL: "http://10.1.2.3:99/", HUTCH_API_KEY: "env-key" }, () => {
    assert.deepEqual(
      [resolveConfig().url, resolveConfig().apiKey],
      ["http://10.1.2.3:99", "env-key"],
    );
    const c = resolveConfig({ url: "http://127.0.0.1:1", apiKey: "arg" });
    assert.deepEqual([c.url, c.apiKey], ["http://127.0.0.1:1", "arg"]);
  });
  withEnv({ HUTCH_URL: undefined, HUTCH_API_KEY: undefined, HUTCH_STATE_DIR: "/nonexistent-x" }, () => {
    const c = resolveConfig();
    assert.equal(c.url, DEFAULT_URL);
    assert.equal(c.apiKey, undefined);
    assert.equal(defaultStateDir(), "/nonexistent-x");
  });
  withEnv({ HUTCH_STATE_DIR: undefined }, () => {
    const euid = process.geteuid?.();
    if (euid === 0) assert.equal(defaultStateDir(), "/var/lib/hutch");
    else assert.match(defaultStateDir(), /hutch$/);
  });
});

test("error mapping", () => {
  const e = (status: number, code: string, message: string, kind = "") =>
    errorFromResponse(status, JSON.stringify({ error: { code, message } }), kind);
  assert.ok(e(404, "not_found", "sandbox sbx_1 does not exist", "files") instanceof SandboxNotFound);
  assert.ok(e(404, "not_found", "open /x: No such file", "files") instanceof FileNotFound);
  assert.ok(e(404, "not_found", "no such route; see GET /v1/openapi.json") instanceof Unsupported);
  assert.ok(e(409, "sandbox_failed", "gone") instanceof SandboxFailed);
  assert.ok(e(422, "invalid_argument", "no") instanceof InvalidRequest);
  assert.ok(errorFromResponse(429, "") instanceof QuotaExceeded);
  const s = errorFromResponse(502, "bad gateway");
  assert.ok(s instanceof ServerError);
  assert.equal(s.message, "bad gateway");
  assert.equal(s.name, "ServerError");
});

test("SSE parsing across chunk boundaries", async () => {
  const chunks = [": keep-alive\n\nevent: std", 'out\ndata: {"data":"a"}\n', "\ndata: x\ndata: y\r\n\r\n"];
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      for (const ch of chunks) c.enqueue(new TextEncoder().encode(ch));
      c.close();
    },
  });
  const out = [];
  for await (const ev of sseEvents(body)) out.push(ev);
  assert.deepEqual(out, [
    { event: "stdout", data: '{"data":"a"}' },
    { event: "message", data: "x\ny" },
  ]);
});

test("lifecycle models: explore outcomes, snapshots, wake", () => {
  const outcome = {
    index: 0,
    sandbox_id: "sbx_a",
    exit_code: null,
    timed_out: false,
    stdout: "",
    stderr: "",
    stdout_truncated: false,
    stderr_truncated: false,
    duration_ms: 3,
    score: 0,
    kept: true,
    error: "could not start",
  };
  const r = exploreResult({ winner: outcome, outcomes: [outcome] });
  assert.equal(r.winner.exitCode, null);
  assert.equal(r.winner.ok, false);
  assert.equal(r.winner.error, "could not start");
  assert.equal(r.outcomes[0]!.kept, true);
  // A winner missing from the answer is recovered from the kept outcome.
  assert.equal(exploreResult({ outcomes: [outcome] }).winner.sandboxId, "sbx_a");
  assert.throws(() => exploreResult({ outcomes: [] }), HutchError);

  const snap = snapshot({ id: "snap_x", name: "n", used_by: ["sbx_b"] });
  assert.deepEqual(snap.usedBy, ["sbx_b"]);
  const info = sandboxInfo({ id: "sbx_c", woke_in_ms: 6, forked_from: "sbx_p" });
  assert.equal(info.wokeInMs, 6);
  assert.equal(info.forkedFrom, "sbx_p");
  assert.equal(info.snapshot, undefined);
});

test("context: .dockerignore matches as docker's does", async () => {
  const { DockerIgnore } = await import("../src/index.js");
  const ig = DockerIgnore.parse("# c\n*.log\n/build/\nnode_modules\n!node_modules/keep\n**/*.env\ndocs/*/draft?.md\n");
  assert.ok(ig.excludes("a.log") && !ig.excludes("sub/a.log"));
  assert.ok(ig.excludes("build") && ig.excludes("build/out/x.o"));
  assert.ok(ig.excludes("node_modules/x") && !ig.excludes("node_modules/keep"));
  assert.ok(ig.excludes("deep/er/secret.env") && ig.excludes("top.env"));
  assert.ok(ig.excludes("docs/a/draft1.md") && !ig.excludes("docs/a/b/draft1.md"));
  assert.ok(!ig.excludes("src/main.py") && !ig.excludes("."));
  assert.ok(ig.mayIncludeBelow("node_modules") && !ig.mayIncludeBelow("build"));
  assert.throws(() => DockerIgnore.parse("!\n"), InvalidRequest);
});

test("context: the tar stream leaves out ignored and special files, links stay links", async () => {
  const { packContext, OUTSIDE_DOCKERFILE } = await import("../src/index.js");
  const { TarParserForTests } = await import("./tar.js");
  const fs = await import("node:fs");
  const { join } = await import("node:path");
  const ctx = fs.mkdtempSync("/tmp/hutch-ts-pack-");
  try {
    fs.mkdirSync(join(ctx, "node_modules", "keep"), { recursive: true });
    fs.writeFileSync(join(ctx, "Dockerfile"), "FROM minimal\n");
    fs.writeFileSync(join(ctx, "secret.env"), "TOKEN=x\n");
    fs.writeFileSync(join(ctx, "node_modules", "big.js"), "x");
    fs.writeFileSync(join(ctx, "node_modules", "keep", "k.js"), "k");
    const long = "n".repeat(150);
    fs.writeFileSync(join(ctx, long), "long\n");
    fs.writeFileSync(join(ctx, ".dockerignore"), "*.env\nnode_modules\n!node_modules/keep\nDockerfile\n");
    fs.symlinkSync("/etc/passwd", join(ctx, "passwd-link"));
    const packed = await packContext(ctx);
    assert.equal(packed.dockerfile, "Dockerfile");
    const chunks: Uint8Array[] = [];
    for await (const c of packed.stream()) chunks.push(c);
    const entries = TarParserForTests.parse(Buffer.concat(chunks));
    const names = entries.map((e) => e.name);
    for (const n of ["Dockerfile", ".dockerignore", "node_modules/keep/k.js", long]) assert.ok(names.includes(n), `${n} in ${names}`);
    for (const n of ["secret.env", "node_modules/big.js", "node_modules/"]) assert.ok(!names.includes(n), `${n} not in ${names}`);
    const link = entries.find((e) => e.name === "passwd-link");
    assert.deepEqual([link?.type, link?.link], ["2", "/etc/passwd"]);
    assert.equal(entries.find((e) => e.name === long)?.data, "long\n");
    // A Dockerfile from outside the context is one extra entry.
    const outside = join(fs.mkdtempSync("/tmp/hutch-ts-df-"), "x.Dockerfile");
    fs.writeFileSync(outside, "FROM minimal\n");
    const other = await packContext(ctx, outside);
    assert.equal(other.dockerfile, OUTSIDE_DOCKERFILE);
    const all: Uint8Array[] = [];
    for await (const c of other.stream()) all.push(c);
    assert.equal(TarParserForTests.parse(Buffer.concat(all))[0]?.data, "FROM minimal\n");
    fs.rmSync(join(outside, ".."), { recursive: true, force: true });
  } finally {
    fs.rmSync(ctx, { recursive: true, force: true });
  }
});

test("context: the build query", async () => {
  const { buildQuery } = await import("../src/templates.js");
  assert.deepEqual(buildQuery("web", "Dockerfile", { target: "run", noCache: true, buildArgs: { A: "1 2" } }), [
    ["name", "web"],
    ["dockerfile", "Dockerfile"],
    ["target", "run"],
    ["no_cache", "true"],
    ["build_arg", "A=1 2"],
  ]);
  assert.throws(() => buildQuery("web", "Dockerfile", { buildArgs: { "A=B": "x" } }), InvalidRequest);
});

test("images: the image build body, the upload query and the template patch", async () => {
  const { imageBuildBody, uploadQuery, templatePatch } = await import("../src/images.js");
  const { buildQuery } = await import("../src/templates.js");
  const start = { cmd: ["httpd", "-f"], ready: { port: 8080, timeout_ms: 30_000 } };
  assert.deepEqual(
    imageBuildBody("web", "127.0.0.1:5000/team/web:1", {
      registryAuth: "u:p:w",
      insecureRegistries: ["127.0.0.1:5000"],
      start,
      force: true,
      memoryMib: 256,
    }),
    {
      name: "web",
      from_image: "127.0.0.1:5000/team/web:1",
      registry_auth: "u:p:w",
      insecure_registries: ["127.0.0.1:5000"],
      start,
      force: true,
      memory_mib: 256,
    },
  );
  assert.deepEqual(imageBuildBody("web", "x", { force: false }), { name: "web", from_image: "x" });
  assert.throws(() => imageBuildBody("web", "x", { registryAuth: "nocolon" }), InvalidRequest);
  assert.throws(() => imageBuildBody("web", "x", { insecureRegistries: ["a/b"] }), InvalidRequest);
  assert.throws(() => imageBuildBody("web", "x", { start: { cmd: " " } }), InvalidRequest);
  assert.deepEqual(uploadQuery("web", { imageTag: "1", start: { cmd: "httpd" }, cpus: 1.5, diskMib: 1024 }), [
    ["name", "web"],
    ["image_archive", "true"],
    ["image_tag", "1"],
    ["start", '{"cmd":"httpd"}'],
    ["cpus", "1.5"],
    ["disk_mib", "1024"],
  ]);
  assert.throws(() => uploadQuery("web", { start: { cmd: [] } }), InvalidRequest);
  assert.deepEqual(templatePatch({ start: null }), { start: null });
  assert.deepEqual(templatePatch({ start, isolation: "vm" }), { start, isolation: "vm" });
  assert.deepEqual(templatePatch({ start: undefined, isolation: "auto" }), { isolation: "auto" });
  assert.throws(() => templatePatch({}), TypeError);
  assert.throws(() => templatePatch({ isolation: "fast" as "ns" }), RangeError);
  assert.deepEqual(buildQuery("web", "Dockerfile", { insecureRegistries: ["reg:5000", "other"] }).slice(2), [
    ["insecure_registry", "reg:5000"],
    ["insecure_registry", "other"],
  ]);
});

test("images: progress lines, a template's start and image, a packed directory", async () => {
  const { buildLogLine, template } = await import("../src/models.js");
  const { packDirectory } = await import("../src/index.js");
  const { TarParserForTests } = await import("./tar.js");
  const fs = await import("node:fs");
  const { join } = await import("node:path");
  const line = buildLogLine({
    seq: 4,
    stream: "progress",
    text: "layer 1/2 0123456789ab: download 1.5 KiB / 3.0 MiB",
    progress: { id: "sha256:0123", label: "layer 1/2", action: "download", current: 1536, total: 3 << 20 },
    time_ms: 1,
  });
  assert.deepEqual(line.progress, { id: "sha256:0123", label: "layer 1/2", action: "download", current: 1536, total: 3 << 20 });
  assert.equal(buildLogLine({ seq: 1, stream: "status", text: "x" }).progress, undefined);
  const t = template({ name: "web", start: { cmd: "httpd" }, image: { reference: "upload:1" } });
  assert.deepEqual([t.start, t.image?.reference], [{ cmd: "httpd" }, "upload:1"]);
  assert.deepEqual([template({ name: "web" }).start, template({ name: "web" }).image], [undefined, undefined]);
  assert.deepEqual(template({ name: "web", tags: { v2: 3, bad: "x" } }).tags, { v2: 3 });
  assert.deepEqual(template({ name: "web" }).tags, {});

  const dir = fs.mkdtempSync("/tmp/hutch-ts-layout-");
  try {
    fs.mkdirSync(join(dir, "blobs", "sha256"), { recursive: true });
    fs.writeFileSync(join(dir, "index.json"), "{}");
    fs.writeFileSync(join(dir, ".dockerignore"), "*.json\n"); // no rules apply to a directory packed whole
    fs.writeFileSync(join(dir, "blobs", "sha256", "ab"), "blob");
    fs.symlinkSync("ab", join(dir, "blobs", "sha256", "cd"));
    const packed = await packDirectory(dir);
    assert.equal(packed.dockerfile, "");
    const chunks: Uint8Array[] = [];
    for await (const c of packed.stream()) chunks.push(c);
    const entries = TarParserForTests.parse(Buffer.concat(chunks));
    assert.deepEqual(
      entries.map((e) => [e.name, e.type]),
      [
        [".dockerignore", "0"],
        ["blobs/", "5"],
        ["blobs/sha256/", "5"],
        ["blobs/sha256/ab", "0"],
        ["blobs/sha256/cd", "2"],
        ["index.json", "0"],
      ],
    );
    await assert.rejects(packDirectory(join(dir, "index.json")), InvalidRequest);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
