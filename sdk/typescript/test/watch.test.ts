// File watches and signed file URLs of the TypeScript SDK against a real `hutch serve`.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { FileNotFound, InvalidRequest, Sandbox, type FileEvent } from "../src/index.js";
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

describe("file watches", () => {
  test("events in order, with entries, until close", async () => {
    await using sb = await Sandbox.create();
    await sb.files.mkdir("/w/old");
    const watch = await sb.files.watch("/w", { recursive: true, includeEntry: true });
    assert.equal(watch.ready.path, "/w");
    assert.equal(watch.ready.watchedDirs, 2);
    // Entries are read when the event is handled: the file stays until the next exec.
    await sb.exec("printf 12345 > /w/old/a.txt");
    const seen: FileEvent[] = [];
    const it = watch[Symbol.asyncIterator]();
    while (seen.length < 2) seen.push((await it.next()).value as FileEvent);
    await sb.exec("mv /w/old/a.txt /w/b.txt && rm /w/b.txt");
    while (seen.length < 4) seen.push((await it.next()).value as FileEvent);
    await watch.close();
    assert.deepEqual(
      seen.map((e) => [e.event, e.name]),
      [
        ["create", "old/a.txt"],
        ["write", "old/a.txt"],
        ["rename", "b.txt"],
        ["remove", "b.txt"],
      ],
    );
    assert.equal(seen[1]?.entry?.size, 5);
    assert.equal(seen[2]?.oldName, "old/a.txt");
    assert.equal(seen[0]?.type, "file");
    await assert.rejects(sb.files.watch("/nope"), FileNotFound);
    await sb.files.write("/f", "x");
    await assert.rejects(sb.files.watch("/f"), InvalidRequest);
  });

  test("onEvent, and the end when the directory goes", async () => {
    await using sb = await Sandbox.create();
    await sb.files.mkdir("/gone");
    const names: string[] = [];
    const watch = await sb.files.watch("/gone", { onEvent: (e) => names.push(`${e.event} ${e.name} ${e.type}`) });
    await sb.exec("mkdir /gone/d && rmdir /gone/d && rmdir /gone");
    await watch.done;
    assert.deepEqual(names, ["create d dir", "remove d dir"]);
    assert.match(watch.endReason ?? "", /removed/);
  });
});

describe("signed file URLs", () => {
  test("download and upload without the key", async () => {
    await using sb = await Sandbox.create();
    await sb.files.write("/srv/data.txt", "signed bytes");
    const url = await sb.files.downloadUrl("/srv/data.txt", { expiresIn: 60 });
    const got = await fetch(url);
    assert.equal(got.status, 200);
    assert.equal(await got.text(), "signed bytes");
    assert.equal((await fetch(url, { method: "PUT", body: "nope" })).status, 403);
    const up = await sb.files.uploadUrl("/home/user/in.txt", { user: "user" });
    assert.equal((await fetch(up, { method: "PUT", body: "uploaded" })).status, 204);
    assert.equal(await sb.files.read("/home/user/in.txt"), "uploaded");
    assert.equal((await sb.exec("stat -c %U /home/user/in.txt")).stdout.trim(), "user");
    const entry = await sb.files.stat("/home/user/in.txt");
    assert.deepEqual([entry.owner, entry.group, entry.uid], ["user", "user", 1000]);
    await assert.rejects(sb.files.downloadUrl("/srv/data.txt", { expiresIn: 0 }), RangeError);
  });
});
