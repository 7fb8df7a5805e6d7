// The TypeScript SDK against a real `hutch serve` (started by ./harness.ts).
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { after, before, describe, test } from "node:test";

import {
  AuthError,
  Client,
  ConflictError,
  ConnectionError,
  FileNotFound,
  HutchError,
  InvalidRequest,
  NotFoundError,
  Sandbox,
  SandboxNotFound,
  TimeoutError,
} from "../src/index.js";
import { startServer, type TestServer } from "./harness.js";

let server: TestServer;
const text = (b: Uint8Array) => Buffer.from(b).toString("utf8");

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

async function freePort(): Promise<number> {
  return new Promise((res) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => res(port));
    });
  });
}

describe("sandboxes", () => {
  test("health and templates", async () => {
    const c = new Client();
    assert.equal((await c.health()).status, "ok");
    const minimal = (await c.templates()).find((t) => t.name === "minimal");
    assert.ok(minimal?.ready);
    assert.ok(minimal.isolations.includes("ns"));
  });

  test("create, connect, list, update, usage, kill", async () => {
    const sb = await Sandbox.create({
      template: "minimal",
      isolation: "auto",
      ttlSeconds: 120,
      metadata: { suite: "ts", case: "lifecycle" },
      env: { GREETING: "hello" },
      cpus: 0.5,
      memoryMib: 128,
      network: { egress: "none" },
    });
    try {
      assert.match(sb.id, /^sbx_/);
      assert.equal(sb.state, "running");
      assert.equal(sb.info.ttlSeconds, 120);
      assert.equal(sb.info.cpus, 0.5);
      assert.equal(sb.info.memoryMib, 128);
      assert.equal((await sb.exec("echo $GREETING")).stdout, "hello\n");

      const other = await Sandbox.connect(sb.id);
      assert.equal(other.id, sb.id);
      assert.deepEqual(
        (await Sandbox.list({ metadata: { case: "lifecycle" } })).map((s) => s.id),
        [sb.id],
      );
      assert.ok((await Sandbox.list({ state: "running" })).some((s) => s.id === sb.id));
      assert.deepEqual(await Sandbox.list({ metadata: { case: "nothing-like-this" } }), []);

      assert.equal((await sb.setTtl(600)).ttlSeconds, 600);
      const info = await sb.setPersistent(true);
      assert.equal(info.persistent, true);
      assert.equal(info.expiresAt, null);
      assert.notEqual((await sb.setPersistent(false)).expiresAt, null);
      assert.deepEqual((await sb.setMetadata({ case: "renamed" })).metadata, { case: "renamed" });
      const both = await sb.update({ ttlSeconds: 300, metadata: { case: "both" } });
      assert.equal(both.ttlSeconds, 300);
      assert.deepEqual((await sb.refresh()).metadata, { case: "both" });

      const u = await sb.usage();
      assert.ok(u && u.memoryLimitBytes > 0 && u.pids >= 1);
    } finally {
      await sb.kill();
    }
    await assert.rejects(sb.refresh(), SandboxNotFound);
    await sb.kill(); // idempotent
    assert.ok(!(await server.sandboxIds()).includes(sb.id));
  });

  test("await using kills the sandbox at the end of the scope", async () => {
    let id = "";
    {
      await using sb = await Sandbox.create();
      id = sb.id;
      assert.ok((await server.sandboxIds()).includes(id));
    }
    assert.ok(!(await server.sandboxIds()).includes(id));
    await assert.rejects(Sandbox.connect(id), SandboxNotFound);
  });

  test("await using kills the sandbox even when the block throws", async () => {
    let id = "";
    await assert.rejects(async () => {
      await using sb = await Sandbox.create();
      id = sb.id;
      await sb.exec("true");
      throw new Error("boom");
    }, /boom/);
    assert.ok(id);
    assert.ok(!(await server.sandboxIds()).includes(id));
  });

  test("await using keeps a persistent sandbox", async () => {
    let id = "";
    {
      await using sb = await Sandbox.create({ persistent: true });
      id = sb.id;
    }
    try {
      assert.ok((await server.sandboxIds()).includes(id));
    } finally {
      await (await Sandbox.connect(id)).kill();
    }
  });

  test("events", async () => {
    const client = new Client();
    await using events = await client.events({ idleTimeoutMs: 20_000 });
    const sb = await Sandbox.create({ client });
    await sb.kill();
    const seen: string[] = [];
    for await (const ev of events) {
      if (ev.sandboxId === sb.id) {
        seen.push(ev.type);
        assert.ok(ev.at);
      }
      if (seen.includes("sandbox.killed")) break;
    }
    assert.deepEqual(seen, ["sandbox.created", "sandbox.killed"]);
  });
});

describe("exec", () => {
  let sb: Sandbox;
  before(async () => {
    sb = await Sandbox.create({ metadata: { suite: "ts-exec" } });
  });
  after(async () => {
    await sb?.kill();
  });

  test("collected", async () => {
    let r = await sb.exec(["echo", "a; rm -rf /", "$HOME"]);
    assert.equal(r.stdout, "a; rm -rf / $HOME\n", "argv must not go through a shell");
    assert.equal(r.exitCode, 0);
    assert.ok(r.ok && !r.timedOut && r.durationMs >= 0);

    r = await sb.exec("echo out; echo err >&2; exit 3");
    assert.deepEqual([r.stdout, r.stderr, r.exitCode, r.ok], ["out\n", "err\n", 3, false]);

    assert.equal((await sb.exec("echo $A-$B", { env: { A: "1", B: "2" } })).stdout, "1-2\n");
    assert.equal((await sb.exec("pwd", { cwd: "/tmp" })).stdout, "/tmp\n");
    assert.equal((await sb.exec("id -u", { user: "root" })).stdout, "0\n");
    assert.equal((await sb.exec("cat", { stdin: "from stdin" })).stdout, "from stdin");
    assert.equal((await sb.exec(["wc", "-c"], { stdin: new Uint8Array([0, 1, 2]) })).stdout.trim(), "3");

    r = await sb.exec("sleep 5", { timeoutSeconds: 0.5 });
    assert.ok(r.timedOut);
    assert.equal(r.exitCode, 124);
    assert.equal((await sb.exec(["no-such-program"])).exitCode, 127);
    assert.equal((await sb.exec("kill -9 $$")).exitCode, 137);

    r = await sb.exec("printf 'ok\\377'");
    assert.deepEqual([...r.stdoutBytes], [111, 107, 255]);
    assert.equal(r.stdout, "ok\ufffd");
  });

  test("stream: callbacks in order, all before the exit code", async () => {
    const events: Array<[string, string | number]> = [];
    const code = await sb.execStream(
      "for i in 1 2 3 4 5; do echo line$i; sleep 0.05; done; echo warn >&2; exit 7",
      {
        onStart: (pid) => events.push(["start", pid]),
        onStdout: async (s) => {
          await new Promise((r) => setTimeout(r, 1));
          events.push(["out", s]);
        },
        onStderr: (s) => events.push(["err", s]),
      },
    );
    events.push(["exit", code]);
    assert.equal(code, 7);
    assert.equal(events[0]![0], "start");
    assert.equal(typeof events[0]![1], "number");
    assert.deepEqual(events.at(-1), ["exit", 7]);
    const out = events.filter(([k]) => k === "out").map(([, v]) => v).join("");
    assert.equal(out, "line1\nline2\nline3\nline4\nline5\n");
    const kinds = events.map(([k]) => k);
    assert.ok(kinds.lastIndexOf("out") < kinds.indexOf("err"));
  });

  test("stream: stdin, env, binary output, timeout, throwing callback", async () => {
    const chunks: string[] = [];
    const code = await sb.execStream("cat; printf '\\377'; echo $X", {
      stdin: "in\n",
      env: { X: "y" },
      onStdout: (s) => chunks.push(s),
    });
    assert.equal(code, 0);
    assert.equal(chunks.join(""), "in\n\ufffdy\n");
    assert.equal(await sb.execStream("sleep 5", { timeoutSeconds: 0.5 }), 124);
    await assert.rejects(
      sb.execStream("echo x; sleep 5", {
        onStdout: () => {
          throw new Error("stop");
        },
      }),
      /stop/,
    );
  });

  test("stream: aborting with a signal", async () => {
    const ac = new AbortController();
    const started = Date.now();
    await assert.rejects(
      sb.execStream("echo go; sleep 5", { signal: ac.signal, onStdout: () => ac.abort() }),
      (e: unknown) => (e as Error).name === "AbortError",
    );
    assert.ok(Date.now() - started < 4000);
  });

  test("concurrent execs", async () => {
    const outs = await Promise.all([0, 1, 2, 3].map((i) => sb.exec(`sleep 0.2; echo ${i}`)));
    assert.deepEqual(outs.map((o) => o.stdout), ["0\n", "1\n", "2\n", "3\n"]);
  });
});

describe("files and terminal", () => {
  let sb: Sandbox;
  before(async () => {
    sb = await Sandbox.create({ metadata: { suite: "ts-files" } });
  });
  after(async () => {
    await sb?.kill();
  });

  test("files", async () => {
    const f = sb.files;
    await f.write("/root/app/main.py", "print('hi')\n", { mode: 0o600 });
    assert.equal(await f.read("/root/app/main.py"), "print('hi')\n");
    const st = await f.stat("/root/app/main.py");
    assert.deepEqual([st.type, st.size, st.mode, st.name], ["file", 12, 0o600, "main.py"]);

    const blob = new Uint8Array(256 * 64).map((_, i) => i % 256);
    await f.write("/root/app/blob.bin", blob, { mode: "0644" });
    assert.deepEqual(await f.readBytes("/root/app/blob.bin"), blob);
    assert.equal((await f.stat("/root/app/blob.bin")).mode, 0o644);
    assert.deepEqual((await f.stat("/root/app/blob.bin")).metadata, {});
    await f.write("/root/app/tagged.txt", "t", { metadata: { Owner: "agent-7", step: "3" } });
    assert.deepEqual((await f.stat("/root/app/tagged.txt")).metadata, { owner: "agent-7", step: "3" });
    await f.remove("/root/app/tagged.txt");

    await f.mkdir("/root/app/data/nested");
    assert.equal((await f.stat("/root/app/data")).type, "dir");
    assert.deepEqual(
      (await f.list("/root/app")).map((e) => e.path),
      ["/root/app/blob.bin", "/root/app/data", "/root/app/main.py"],
    );
    assert.ok((await f.list("/root/app", { depth: 2 })).some((e) => e.path === "/root/app/data/nested"));

    await f.move("/root/app/main.py", "/root/app/src/main.py");
    assert.equal(await f.exists("/root/app/main.py"), false);
    assert.equal(await f.exists("/root/app/src/main.py"), true);
    assert.equal((await sb.exec("cat /root/app/src/main.py")).stdout, "print('hi')\n");

    await f.remove("/root/app/blob.bin");
    assert.equal(await f.exists("/root/app/blob.bin"), false);
    await assert.rejects(f.remove("/root/app/data"), (e: unknown) => {
      assert.ok(e instanceof ConflictError);
      assert.equal(e.status, 409);
      assert.equal(e.code, "not_empty");
      return true;
    });
    await f.remove("/root/app/data", { recursive: true });
    assert.equal(await f.exists("/root/app/data"), false);

    await assert.rejects(f.read("/root/nope.txt"), FileNotFound);
    await assert.rejects(f.stat("/root/nope.txt"), FileNotFound);
    await assert.rejects(f.readBytes("/root/app"), (e: unknown) => e instanceof InvalidRequest && e.status === 400);
    await assert.rejects(f.write("relative/path", "x"), InvalidRequest);
  });

  test("pty: echo, resize, exit code", async () => {
    await using term = await sb.pty({ cols: 80, rows: 24 });
    term.send("echo hi-$((1+1))\n");
    assert.match(text(await term.readUntil("hi-2", 10_000)), /hi-2$/);
    term.resize(100, 30);
    term.send("stty size\n");
    await term.readUntil("30 100", 10_000);
    term.send("exit 5\n");
    assert.equal(await term.wait(10_000), 5);
    assert.ok(term.closed);
    assert.equal((await term.read(1000)).length, 0);
  });

  test("pty: a command, and a read timeout", async () => {
    {
      await using term = await sb.pty({ cmd: "sh -c 'echo from-pty; exit 4'" });
      assert.match(text(await term.readUntil("from-pty")), /from-pty/);
      assert.equal(await term.wait(10_000), 4);
    }
    {
      await using term = await sb.pty({ cmd: "sleep 5" });
      await assert.rejects(term.readUntil("never", 300), TimeoutError);
    }
  });
});

describe("errors", () => {
  test("404, 401, 400/422, 409, connection", async () => {
    await assert.rejects(Sandbox.connect("sbx_doesnotexist"), (e: unknown) => {
      assert.ok(e instanceof SandboxNotFound && e instanceof NotFoundError && e instanceof HutchError);
      assert.equal(e.status, 404);
      assert.equal(e.code, "not_found");
      return true;
    });
    await assert.rejects(Sandbox.create({ apiKey: "wrong-key" }), (e: unknown) => e instanceof AuthError && e.status === 401);

    await using sb = await Sandbox.create();
    await assert.rejects(Sandbox.connect(sb.id, { apiKey: "wrong-key" }), AuthError);
    const bad = new Sandbox(sb.info, new Client({ apiKey: "wrong-key" }));
    await assert.rejects(bad.pty(), AuthError);
    await assert.rejects(bad.files.read("/etc/hostname"), AuthError);

    await assert.rejects(sb.exec("pwd", { cwd: "relative" }), (e: unknown) => e instanceof InvalidRequest && e.status === 422);
    await assert.rejects(sb.exec([]), (e: unknown) => e instanceof InvalidRequest && e.status === 422);
    await assert.rejects(sb.exec("true", { timeoutSeconds: -1 }), InvalidRequest);
    await assert.rejects(Sandbox.list({ state: "bogus" }), (e: unknown) => e instanceof InvalidRequest && e.status === 400);
    await assert.rejects(Sandbox.create({ metadata: { "": "empty key" } }), (e: unknown) => e instanceof InvalidRequest && e.status === 422);

    await sb.files.write("/root/d/f", "x");
    await assert.rejects(sb.files.remove("/root/d"), (e: unknown) => e instanceof ConflictError && e.status === 409);

    const gone = await Sandbox.create();
    await gone.kill();
    await assert.rejects(gone.exec("true"), SandboxNotFound);
    await assert.rejects(gone.execStream("true"), SandboxNotFound);
    await assert.rejects(gone.files.read("/etc/passwd"), SandboxNotFound);
    await assert.rejects(gone.pty(), SandboxNotFound);

    const port = await freePort();
    await assert.rejects(Sandbox.list({ url: `http://127.0.0.1:${port}` }), ConnectionError);
  });

  test("key from <state dir>/admin.key", async () => {
    const saved = process.env.HUTCH_API_KEY;
    const savedDir = process.env.HUTCH_STATE_DIR;
    delete process.env.HUTCH_API_KEY;
    try {
      process.env.HUTCH_STATE_DIR = server.stateDir;
      {
        await using sb = await Sandbox.create();
        assert.equal((await sb.exec("echo ok")).stdout, "ok\n");
      }
      process.env.HUTCH_STATE_DIR = "/nonexistent-hutch-dir";
      await assert.rejects(Sandbox.list(), (e: unknown) => e instanceof AuthError && /unreadable/.test(e.message));
    } finally {
      process.env.HUTCH_API_KEY = saved;
      if (savedDir === undefined) delete process.env.HUTCH_STATE_DIR;
      else process.env.HUTCH_STATE_DIR = savedDir;
    }
  });
});
