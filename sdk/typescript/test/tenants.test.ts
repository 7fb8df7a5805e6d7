// Tenants and scoped keys against a real `hutch serve`: a tenant with a quota, an exec key of
// it in E2B format, the quota refusing a second sandbox with the quota named, a revoked key.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, test } from "node:test";

import { AuthError, Client, ConflictError, Forbidden, NotFoundError, QuotaExceeded, Sandbox } from "../src/index.js";
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

describe("tenants and keys", () => {
  test("a tenant's quota, an exec key in e2b format, revocation", async () => {
    const admin = new Client();
    const name = `ts-${randomBytes(4).toString("hex")}`;
    const t = await admin.createTenant(name, { quotas: { max_sandboxes: 1 }, defaults: { ttl_seconds: 90 } });
    assert.equal(t.quotas.max_sandboxes, 1);
    assert.ok((await admin.tenants()).some((x) => x.name === name));
    const key = await admin.createKey({ tenant: name, scope: "exec", format: "e2b" });
    assert.match(key.secret ?? "", /^e2b_[0-9a-f]{40}$/);
    assert.equal((await admin.getKey(key.id)).secret, undefined, "shown only once");
    const forTenant = new Client({ tenant: name });
    const sbx = await Sandbox.create({ client: forTenant });
    try {
      assert.equal(sbx.info.metadata.tenant_id, name);
      assert.equal(sbx.info.ttlSeconds, 90);
      await assert.rejects(Sandbox.create({ client: forTenant }), (e: unknown) => {
        assert.ok(e instanceof QuotaExceeded, String(e));
        assert.deepEqual([e.status, e.quota, e.limit, e.used, e.tenant], [429, "max_sandboxes", 1, 1, name]);
        return true;
      });
      assert.equal((await admin.getTenant(name)).usage?.sandboxes, 1);
      const agent = new Client({ apiKey: key.secret });
      const mine = await Sandbox.connect(sbx.id, { client: agent });
      assert.equal((await mine.exec(["echo", "hi"])).stdout, "hi\n");
      await assert.rejects(Sandbox.create({ client: agent }), (e: unknown) => e instanceof Forbidden && e.status === 403);
      await admin.revokeKey(key.id);
      await assert.rejects(mine.exec(["true"]), (e: unknown) => e instanceof AuthError);
    } finally {
      await sbx.kill();
    }
    await assert.rejects(admin.createTenant(name), (e: unknown) => e instanceof ConflictError);
    const changed = await admin.updateTenant(name, { quotas: { max_sandboxes: 2 }, allowedTemplates: ["minimal"] });
    assert.deepEqual(changed.allowedTemplates, ["minimal"]);
    // The agent's exec is in the audit log (written in batches of a few seconds).
    let execs: Awaited<ReturnType<Client["audit"]>> = [];
    for (let i = 0; i < 40 && execs.length === 0; i++) {
      execs = (await admin.audit({ tenant: name })).filter((e) => e.route.endsWith("/exec"));
      if (execs.length === 0) await new Promise((r) => setTimeout(r, 500));
    }
    assert.equal(execs[0]?.keyId, key.id);
    assert.deepEqual(execs[0]?.argv, ["echo", "hi"]);
    await admin.deleteTenant(name);
    await assert.rejects(admin.getTenant(name), (e: unknown) => e instanceof NotFoundError);
  });

  test("usage per tenant, sandbox and key; key budgets", async () => {
    const admin = new Client();
    const name = `tsu-${randomBytes(4).toString("hex")}`;
    await admin.createTenant(name, { quotas: { daily_budget: 1000 } });
    const key = await admin.createKey({ tenant: name, dailyBudget: 500 });
    assert.deepEqual([key.dailyBudget, key.monthlyBudget], [500, null]);
    assert.equal((await admin.setKeyBudget(key.id, { dailyBudget: 700 })).dailyBudget, 700);
    const agent = new Client({ apiKey: key.secret });
    await assert.rejects(agent.setKeyBudget(key.id, { dailyBudget: 1e9 }), (e: unknown) => e instanceof Forbidden);
    const sbx = await Sandbox.create({ client: agent });
    try {
      await sbx.exec("i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done");
      let report = await agent.usage({ groupBy: "tenant" });
      for (let i = 0; i < 40 && report.total.cpuSeconds <= 0; i++) {
        await new Promise((r) => setTimeout(r, 500));
        report = await agent.usage({ groupBy: "tenant" });
      }
      assert.deepEqual(
        report.groups.map((g) => g.key),
        [name],
      );
      assert.ok(report.total.cpuSeconds > 0 && report.total.memoryGibSeconds > 0, JSON.stringify(report.raw));
      assert.equal(report.total.costMicros, null, "no rate card");
      const mine = await agent.usage({ sandboxId: sbx.id, groupBy: "sandbox" });
      assert.deepEqual(
        mine.groups.map((g) => [g.key, g.kind]),
        [[sbx.id, "sandbox"]],
      );
      const byKey = await admin.usage({ groupBy: "key", tenant: name });
      assert.deepEqual(
        byKey.groups.map((g) => g.key),
        [key.id],
      );
    } finally {
      await sbx.kill();
    }
    await admin.revokeKey(key.id);
    await admin.deleteTenant(name);
  });
});
