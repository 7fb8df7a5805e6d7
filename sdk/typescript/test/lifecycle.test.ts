// Pause, hibernate, snapshots, fork and explore against a real `hutch serve` (`ns` backend).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Client, ConflictError, HutchError, InvalidRequest, NotFoundError, Sandbox, type LogLine } from "../src/index.js";
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

const conflict = (e: unknown) => e instanceof ConflictError && e.status === 409;

describe("pause and hibernate", () => {
  test("pause: exec is a 409 until resume", async () => {
    await using sb = await Sandbox.create({ metadata: { suite: "ts-lifecycle" } });
    const info = await sb.pause();
    assert.equal(info.state, "paused");
    assert.equal(sb.state, "paused");
    assert.equal((await sb.refresh()).state, "paused"); // get is allowed while paused

    await assert.rejects(sb.exec("echo hi"), (e: unknown) => {
      assert.ok(e instanceof ConflictError && e instanceof HutchError);
      assert.equal(e.status, 409);
      assert.equal(e.code, "conflict");
      assert.match(e.message, /resume/);
      return true;
    });
    await assert.rejects(sb.files.read("/etc/hostname"), conflict);
    await assert.rejects(sb.pause(), conflict);
    await assert.rejects(sb.hibernate(), conflict);

    assert.equal((await sb.resume()).state, "running");
    assert.equal((await sb.exec("echo back")).stdout, "back\n");
    await assert.rejects(sb.resume(), conflict);
  });

  test("hibernate: files survive, processes do not; exec and wake wake it", async () => {
    await using sb = await Sandbox.create({ metadata: { suite: "ts-lifecycle" } });
    await sb.files.write("/root/kept.txt", "still here\n");
    await sb.exec("sleep 1000 >/dev/null 2>&1 &");
    assert.ok((await sb.exec("pidof sleep")).ok);

    const info = await sb.hibernate();
    assert.equal(info.state, "hibernated");
    assert.equal(info.wokeInMs, undefined);
    assert.equal((await sb.refresh()).state, "hibernated"); // get does not wake it
    await assert.rejects(sb.hibernate(), conflict);

    const r = await sb.exec("cat /root/kept.txt; pidof sleep || echo no-sleep");
    assert.equal(r.stdout, "still here\nno-sleep\n");
    assert.equal((await sb.refresh()).state, "running");
    await assert.rejects(sb.wake(), conflict);

    await sb.hibernate();
    const woken = await sb.wake();
    assert.equal(woken.state, "running");
    assert.equal(typeof woken.wokeInMs, "number");
    assert.ok(woken.wokeInMs! >= 0);
    assert.equal(woken.raw.woke_in_ms, woken.wokeInMs);
    assert.equal(await sb.files.read("/root/kept.txt"), "still here\n");
    assert.equal((await sb.refresh()).wokeInMs, undefined);
  });

  test("idleHibernateSeconds on create and update", async () => {
    await using sb = await Sandbox.create({ idleHibernateSeconds: 600 });
    assert.equal(sb.info.idleHibernateSeconds, 600);
    assert.equal((await sb.update({ idleHibernateSeconds: 0 })).idleHibernateSeconds, undefined);
  });
});

describe("snapshots", () => {
  test("a snapshot needs no name; create finds one by a unique name, 409 when ambiguous", async () => {
    const client = new Client();
    const ids: string[] = [];
    {
      await using parent = await Sandbox.create({ client, metadata: { suite: "ts-lifecycle" } });
      await parent.files.write("/root/mark", "by name\n");
      const unnamed = await parent.snapshot();
      ids.push(unnamed.id);
      assert.equal(unnamed.name, unnamed.id);
      const first = await parent.snapshot("ts-by-name");
      ids.push(first.id);
      {
        await using child = await Sandbox.create({ client, snapshot: "ts-by-name" });
        assert.equal(child.info.snapshot, first.id);
        assert.equal(await child.files.read("/root/mark"), "by name\n");
      }
      const second = await parent.snapshot("ts-by-name");
      ids.push(second.id);
      await assert.rejects(Sandbox.create({ client, snapshot: "ts-by-name" }), (e: unknown) => {
        assert.ok(conflict(e));
        const message = (e as Error).message;
        assert.ok(message.includes(first.id) && message.includes(second.id), message);
        return true;
      });
    }
    for (const id of ids) await client.deleteSnapshot(id);
  });

  test("snapshot, create from it, delete is 409 while used and 204 after", async () => {
    const client = new Client();
    let snapId = "";
    {
      await using parent = await Sandbox.create({ client, metadata: { suite: "ts-lifecycle" } });
      await parent.files.write("/root/snap.txt", "from the snapshot\n");
      await parent.exec("echo in-tmp > /tmp/not-kept");
      const snap = await parent.snapshot("ts-warm");
      snapId = snap.id;
      assert.match(snap.id, /^snap_/);
      assert.equal(snap.name, "ts-warm");
      assert.equal(snap.sandboxId, parent.id);
      assert.equal(snap.kind, "filesystem");
      assert.equal(snap.isolation, "ns");
      assert.equal(snap.template, parent.info.template);
      assert.ok(snap.sizeBytes > 0 && snap.createdAt);
      assert.deepEqual(snap.usedBy, []);
      assert.ok((await parent.exec("cat /root/snap.txt")).ok); // the parent keeps running
    }
    assert.ok((await client.snapshots()).some((s) => s.id === snapId));

    // The source sandbox is gone; the snapshot does not depend on it.
    const child = await Sandbox.create({ client, snapshot: snapId });
    try {
      assert.equal(child.info.snapshot, snapId);
      assert.equal(await child.files.read("/root/snap.txt"), "from the snapshot\n");
      assert.equal(await child.files.exists("/tmp/not-kept"), false); // tmpfs is not in a snapshot
      await child.files.write("/root/snap.txt", "changed in the child\n");

      assert.deepEqual((await client.getSnapshot(snapId)).usedBy, [child.id]);
      await assert.rejects(client.deleteSnapshot(snapId), (e: unknown) => {
        assert.ok(conflict(e));
        assert.ok((e as Error).message.includes(child.id));
        return true;
      });
      {
        await using other = await Sandbox.create({ client, snapshot: snapId });
        assert.equal(await other.files.read("/root/snap.txt"), "from the snapshot\n");
      }
    } finally {
      await child.kill();
    }

    assert.deepEqual((await client.getSnapshot(snapId)).usedBy, []);
    await client.deleteSnapshot(snapId); // 204 now
    assert.ok(!(await client.snapshots()).some((s) => s.id === snapId));
    await assert.rejects(client.getSnapshot(snapId), NotFoundError);
    await assert.rejects(Sandbox.create({ client, snapshot: snapId }), NotFoundError);
    await assert.rejects(
      Sandbox.create({ client }).then(async (sb) => {
        try {
          await sb.snapshot("no spaces allowed");
        } finally {
          await sb.kill();
        }
      }),
      InvalidRequest,
    );
  });
});

describe("fork and explore", () => {
  test("fork: children see the parent's files and are independent", async () => {
    await using parent = await Sandbox.create({ metadata: { suite: "ts-lifecycle", case: "fork" } });
    await parent.files.write("/root/shared.txt", "parent\n");
    const children = await parent.fork({ count: 2 });
    try {
      assert.equal(children.length, 2);
      const [a, b] = children as [Sandbox, Sandbox];
      assert.equal(new Set([parent.id, a.id, b.id]).size, 3);
      for (const ch of children) {
        assert.equal(ch.state, "running");
        assert.equal(ch.info.forkedFrom, parent.id);
        assert.equal(ch.info.metadata.case, "fork");
        assert.equal(await ch.files.read("/root/shared.txt"), "parent\n");
      }
      await a.files.write("/root/shared.txt", "a\n");
      await b.exec("echo b > /root/only-b");
      await parent.files.write("/root/shared.txt", "parent again\n");
      assert.equal(await a.files.read("/root/shared.txt"), "a\n");
      assert.equal(await b.files.read("/root/shared.txt"), "parent\n");
      assert.equal(await parent.files.read("/root/shared.txt"), "parent again\n");
      assert.equal(await a.files.exists("/root/only-b"), false);
      assert.equal(await parent.files.exists("/root/only-b"), false);
    } finally {
      for (const ch of children) await ch.kill();
    }
  });

  test("live fork is InvalidRequest (422) on ns", async () => {
    await using sb = await Sandbox.create({ metadata: { suite: "ts-lifecycle" } });
    const before = new Set(await server.sandboxIds());
    await assert.rejects(sb.fork({ count: 1, mode: "live" }), (e: unknown) => {
      assert.ok(e instanceof InvalidRequest);
      assert.equal(e.status, 422);
      assert.equal(e.code, "invalid_argument");
      assert.match(e.message, /vm/);
      return true;
    });
    await assert.rejects(sb.fork({ count: 17 }), InvalidRequest);
    assert.deepEqual(new Set(await server.sandboxIds()), before);
  });

  test("explore keeps only the winner", async () => {
    await using parent = await Sandbox.create({ metadata: { suite: "ts-lifecycle" } });
    await parent.files.write("/root/base.txt", "base\n");
    const before = new Set(await server.sandboxIds());
    const result = await parent.explore(["exit 1", "echo ok", "exit 2"], { timeoutSeconds: 30 });
    assert.deepEqual(
      result.outcomes.map((o) => [o.index, o.exitCode, o.score, o.kept]),
      [
        [0, 1, 0, false],
        [1, 0, 1, true],
        [2, 2, 0, false],
      ],
    );
    const w = result.winner;
    assert.equal(w.index, 1);
    assert.ok(w.kept && w.ok && !w.timedOut);
    assert.equal(w.stdout, "ok\n");
    assert.equal(w.error, undefined);
    assert.equal(w.sandboxId, result.outcomes[1]!.sandboxId);

    // Only the winner's child is left, and it is a sandbox of its own.
    assert.deepEqual(new Set(await server.sandboxIds()), new Set([...before, w.sandboxId]));
    {
      await using kept = await Sandbox.connect(w.sandboxId);
      assert.equal(kept.info.forkedFrom, parent.id);
      assert.equal(await kept.files.read("/root/base.txt"), "base\n");
    }
    assert.ok(!(await server.sandboxIds()).includes(w.sandboxId));
    assert.equal((await parent.exec("cat /root/base.txt")).stdout, "base\n");
  });

  test("explore: scoreRegex, argv commands, timeout, bad input", async () => {
    await using parent = await Sandbox.create({ metadata: { suite: "ts-lifecycle" } });
    const result = await parent.explore(["echo score=3", ["sh", "-c", "echo score=7; exit 1"], "sleep 30"], {
      timeoutSeconds: 1,
      scoreRegex: "score=([0-9]+)",
    });
    {
      await using _kept = await Sandbox.connect(result.winner.sandboxId);
      assert.equal(result.winner.index, 1);
      assert.equal(result.winner.score, 7);
      assert.equal(result.winner.ok, false);
      const slow = result.outcomes[2]!;
      assert.ok(slow.timedOut);
      assert.equal(slow.exitCode, 124);
      assert.equal(slow.score, 0);
    }
    await assert.rejects(parent.explore(["true"], { scoreRegex: "no group" }), InvalidRequest);
    await assert.rejects(parent.explore([]), InvalidRequest);
  });
});

describe("logs", () => {
  const starts = <T extends { text: string }>(lines: T[]): T[] => lines.filter((l) => l.text.includes("starting as pid 1"));

  test("logs: tail, since, and a followed log that ends with its sandbox", async () => {
    const sb = await Sandbox.create({ metadata: { suite: "ts-lifecycle" } });
    const lines = await sb.logs();
    const first = starts(lines);
    assert.equal(first.length, 1, JSON.stringify(lines));
    assert.equal(first[0].source, "agent");
    assert.ok(first[0].time?.endsWith("Z"));
    assert.deepEqual(await sb.logs({ tail: 1 }), lines.slice(-1));

    const follow = await sb.followLogs({ idleTimeoutMs: 20_000 });
    await sb.hibernate();
    await sb.wake();
    let fresh: LogLine | undefined;
    for await (const line of follow) {
      if (line.text.includes("starting as pid 1")) {
        fresh = line;
        break;
      }
    }
    await follow.close();
    assert.ok(fresh?.time && fresh.time > (first[0].time ?? ""), JSON.stringify(fresh));
    assert.equal(starts(await sb.logs({ since: fresh.time })).length, 1);
    assert.equal(starts(await sb.logs({ since: "1h" })).length, 2);
    await assert.rejects(sb.logs({ source: "console" }), (e: unknown) => e instanceof InvalidRequest && /no console log/.test(e.message));
    await assert.rejects(sb.logs({ tail: -1 }), RangeError);

    const ending = await sb.followLogs({ idleTimeoutMs: 20_000 });
    await sb.kill();
    const after: string[] = [];
    for await (const line of ending) after.push(line.text);
    assert.equal(starts(after.map((text) => ({ text }))).length, 0);
  });
});
