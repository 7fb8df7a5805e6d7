// Durable volumes against a real `hutch serve` (`ns` backend, template `minimal`).
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";

import { Client, ConflictError, InvalidRequest, NotFoundError, Sandbox } from "../src/index.js";
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

const uniq = (prefix: string) => `${prefix}-${randomBytes(4).toString("hex")}`;
const status = (cls: typeof ConflictError | typeof InvalidRequest | typeof NotFoundError, code: number) =>
  (e: unknown) => e instanceof cls && e.status === code;

describe("volumes", () => {
  test("data outlives the sandbox; read-only mounts refuse writes; delete is 409 while attached", async () => {
    const client = new Client();
    const name = uniq("ts-data");
    const vol = await client.createVolume(name, 16);
    assert.match(vol.id, /^vol_/);
    assert.equal(vol.name, name);
    assert.equal(vol.sizeMib, 16);
    assert.ok(vol.createdAt);
    assert.deepEqual(vol.attached, []);
    assert.equal(vol.usedBytes, undefined);
    assert.equal(vol.raw.id, vol.id);
    assert.ok((await client.volumes()).some((v) => v.id === vol.id));
    assert.equal((await client.getVolume(name)).id, vol.id); // by name as well as by id

    {
      // Mounted by name, read-write.
      await using writer = await Sandbox.create({ client, volumes: [{ volume: name, path: "/data" }] });
      assert.deepEqual(writer.info.volumes, [{ volume: vol.id, path: "/data", readOnly: false }]);
      const r = await writer.exec("echo persisted > /data/hello.txt && sync && cat /data/hello.txt");
      assert.ok(r.ok, r.stderr);
      assert.equal(r.stdout, "persisted\n");

      const got = await client.getVolume(vol.id);
      assert.deepEqual(got.attached, [{ sandbox: writer.id, path: "/data", readOnly: false }]);
      assert.ok(got.usedBytes !== undefined && got.usedBytes > 0);

      await assert.rejects(
        Sandbox.create({ client, volumes: [{ volume: vol.id, path: "/d", readOnly: true }] }),
        status(ConflictError, 409),
      );
      await assert.rejects(client.deleteVolume(vol.id), (e: unknown) => {
        assert.ok(e instanceof ConflictError);
        assert.equal(e.status, 409);
        assert.ok(e.message.includes(writer.id));
        return true;
      });
    }
    assert.deepEqual((await client.getVolume(vol.id)).attached, []);

    {
      await using reader = await Sandbox.create({
        client,
        volumes: [{ volume: vol.id, path: "/mnt/ro", readOnly: true }],
      });
      assert.deepEqual(reader.info.volumes, [{ volume: vol.id, path: "/mnt/ro", readOnly: true }]);
      assert.equal((await reader.exec("cat /mnt/ro/hello.txt")).stdout, "persisted\n");
      assert.equal(await reader.files.read("/mnt/ro/hello.txt"), "persisted\n");
      const w = await reader.exec("echo nope > /mnt/ro/new.txt");
      assert.equal(w.ok, false);
      assert.match(w.stderr, /read-only/i);
      assert.equal(await reader.files.exists("/mnt/ro/new.txt"), false);
      // Read-only elsewhere: a read-write mount is refused.
      await assert.rejects(
        Sandbox.create({ client, volumes: [{ volume: vol.id, path: "/rw" }] }),
        status(ConflictError, 409),
      );
      await assert.rejects(client.deleteVolume(name), status(ConflictError, 409));
    }

    await client.deleteVolume(name); // 204 now (by name)
    assert.ok(!(await client.volumes()).some((v) => v.id === vol.id));
    await assert.rejects(client.getVolume(vol.id), status(NotFoundError, 404));
    await assert.rejects(client.deleteVolume(vol.id), status(NotFoundError, 404));
    await assert.rejects(
      Sandbox.create({ client, volumes: [{ volume: vol.id, path: "/data" }] }),
      status(NotFoundError, 404),
    );
  });

  test("forks get only the read-only volumes", async () => {
    const client = new Client();
    const rw = await client.createVolume(uniq("ts-rw"), 8);
    const ro = await client.createVolume(uniq("ts-ro"), 8);
    try {
      await using parent = await Sandbox.create({
        client,
        volumes: [
          { volume: rw.id, path: "/rw" },
          { volume: ro.id, path: "/ro", readOnly: true },
        ],
      });
      assert.deepEqual(new Set(parent.info.volumes.map((m) => m.volume)), new Set([rw.id, ro.id]));
      const children = await parent.fork();
      assert.equal(children.length, 1);
      await using child = children[0]!;
      assert.deepEqual(child.info.volumes, [{ volume: ro.id, path: "/ro", readOnly: true }]);
      assert.ok((await child.exec("test -d /ro")).ok);
    } finally {
      // The sandboxes (`await using` in the try block) are gone by now.
      await client.deleteVolume(rw.id);
      await client.deleteVolume(ro.id);
    }
  });

  test("validation: 422 for bad names, sizes and paths; 409 for a duplicate name", async () => {
    const client = new Client();
    for (const bad of ["", ".hidden", "vol_x", "has space", "x".repeat(65)]) {
      await assert.rejects(client.createVolume(bad, 8), status(InvalidRequest, 422), bad);
    }
    for (const size of [3, 1048577]) {
      await assert.rejects(client.createVolume(uniq("ts-size"), size), status(InvalidRequest, 422));
    }
    const name = uniq("ts-dup");
    const vol = await client.createVolume(name); // default size
    assert.equal(vol.sizeMib, 1024);
    try {
      await assert.rejects(client.createVolume(name, 8), status(ConflictError, 409));
      for (const path of ["/proc/x", "relative"]) {
        await assert.rejects(
          Sandbox.create({ client, volumes: [{ volume: vol.id, path }] }),
          status(InvalidRequest, 422),
          path,
        );
      }
      await assert.rejects(
        Sandbox.create({ client, volumes: [{ volume: uniq("nosuch"), path: "/d" }] }),
        NotFoundError,
      );
    } finally {
      await client.deleteVolume(vol.id);
    }
  });
});
