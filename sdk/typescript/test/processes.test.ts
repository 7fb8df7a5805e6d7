// Process handles against a real `hutch serve`: exec({ background: true }), sb.processes,
// Process (events, wait, stdin, signals, resize) and their errors.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  InvalidRequest,
  Process,
  ProcessExited,
  ProcessNotFound,
  Sandbox,
  TagInUse,
  type ProcessEvent,
} from "../src/index.js";
import { processSegment } from "../src/process.js";
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

async function until(pred: () => Promise<boolean>, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await pred())) {
    if (Date.now() > deadline) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe("process handles", () => {
  test("paths name a pid or a tag", () => {
    assert.equal(processSegment(42), "42");
    assert.equal(processSegment("web a/b"), "tag:web%20a%2Fb");
    assert.equal(processSegment("tag:web"), "tag:web");
    assert.throws(() => processSegment(""), RangeError);
    assert.throws(() => processSegment(1.5), RangeError);
  });

  test("a background exec is listed, connected and waited for", async () => {
    await using sb = await Sandbox.create({ metadata: { suite: "ts-processes" } });
    const proc = await sb.exec(
      "echo before; echo err >&2; touch /tmp/ready; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo after",
      { background: true, tag: "worker" },
    );
    assert.ok(proc instanceof Process);
    assert.equal(proc.tag, "worker");
    assert.equal(proc.info.state, "running");
    assert.ok((await sb.processes.list()).some((p) => p.pid === proc.pid));
    assert.equal((await sb.processes.connect("worker")).pid, proc.pid);
    assert.equal((await sb.processes.connect(proc.pid)).tag, "worker");
    await until(() => sb.files.exists("/tmp/ready"));
    await sb.files.write("/tmp/go", "");
    const result = await proc.wait({ timeoutMs: 30_000 });
    assert.deepEqual([result.stdout, result.stderr, result.exitCode], ["before\nafter\n", "err\n", 0]);
    assert.equal(result.stdoutTruncated, false);
    assert.equal((await proc.refresh()).state, "exited");
    assert.equal(proc.info.exit?.exitCode, 0);
  });

  test("events, stdin, close-stdin and signals", async () => {
    await using sb = await Sandbox.create({ metadata: { suite: "ts-processes" } });
    const cat = await sb.processes.start(["cat"], { stdin: true, tag: "cat" });
    await cat.sendStdin("hello ");
    await cat.sendStdin(new TextEncoder().encode("world\n"));
    await cat.closeStdin();
    const kinds: string[] = [];
    let out = "";
    for await (const ev of cat) {
      kinds.push(ev.kind);
      if (ev.kind === "stdout") out += ev.text;
    }
    assert.equal(out, "hello world\n");
    assert.equal(kinds.at(-1), "exit");

    const sleeper = await sb.exec(["sleep", "100"], { background: true });
    await sleeper.signal("TERM");
    assert.equal((await sleeper.wait({ timeoutMs: 30_000 })).exitCode, 143);
    assert.equal(sleeper.info.exit?.signal, 15);
    await assert.rejects(sleeper.signal(9), ProcessExited);
    await sleeper.kill(); // exited already: not an error

    const term = await sb.processes.start("stty size; read x; stty size", { pty: { cols: 80, rows: 24 } });
    assert.deepEqual(term.info.pty, { cols: 80, rows: 24 });
    for await (const ev of term.events()) {
      if (ev.kind === "stdout" && ev.text.includes("24 80")) break;
    }
    await term.resize(132, 43);
    await term.sendStdin("\n");
    assert.match((await term.wait({ timeoutMs: 30_000 })).stdout, /43 132/);
  });

  test("late attaches, missed output and errors", async () => {
    await using sb = await Sandbox.create({ metadata: { suite: "ts-processes" } });
    const quick = await sb.exec("seq 1 300000; exit 4", { background: true });
    await until(async () => (await quick.refresh()).state === "exited", 20_000);
    const result = await quick.wait();
    assert.equal(result.exitCode, 4);
    assert.equal(result.stdoutTruncated, true);
    assert.ok(result.stdout.endsWith("299999\n300000\n"));
    const events: ProcessEvent[] = [];
    for await (const ev of quick.events()) events.push(ev);
    const missed = events.find((e) => e.kind === "missed");
    assert.ok(missed && missed.kind === "missed" && missed.stdout > 0);

    await sb.exec(["sleep", "100"], { background: true, tag: "only" });
    await assert.rejects(sb.exec(["sleep", "1"], { background: true, tag: "only" }), TagInUse);
    await assert.rejects(sb.processes.connect("nobody"), ProcessNotFound);
    await assert.rejects(sb.processes.connect(999999), ProcessNotFound);
    await assert.rejects(sb.exec(["true"], { tag: "x" } as never), InvalidRequest);
    await assert.rejects(sb.processes.start(["no-such-program-xyz"]), (e: unknown) => {
      assert.ok(e instanceof InvalidRequest);
      assert.equal(e.code, "command_not_found");
      return true;
    });
    await assert.rejects((await sb.processes.connect("only")).resize(10, 10), InvalidRequest);
  });
});
