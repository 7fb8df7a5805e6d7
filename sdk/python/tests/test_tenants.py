"""Tenants and scoped keys against the real server: the admin makes a tenant with a quota
and an exec key; the exec key cannot create, the quota refuses a second sandbox with the
quota named, and a revoked key stops at once."""

from __future__ import annotations

import re
import time
import uuid

import pytest
from conftest import Server

import hutch
from hutch import AsyncClient, Client, Sandbox


def test_tenants_keys_and_quotas(server: Server) -> None:
    name = f"py-{uuid.uuid4().hex[:8]}"
    with Client() as admin:
        t = admin.create_tenant(name, quotas={"max_sandboxes": 1}, defaults={"ttl_seconds": 90})
        assert isinstance(t, hutch.Tenant)
        assert t.quotas["max_sandboxes"] == 1 and t.defaults["ttl_seconds"] == 90
        assert name in [x.name for x in admin.tenants()]
        key = admin.create_key(tenant=name, scope="exec", format="e2b", name="agent")
        assert key.secret is not None and re.fullmatch(r"e2b_[0-9a-f]{40}", key.secret)
        assert key.id in [k.id for k in admin.keys()]
        assert admin.get_key(key.id).secret is None, "shown only once"
        with Client(tenant=name) as for_tenant:
            sbx = Sandbox.create(client=for_tenant)
            try:
                assert sbx.info.metadata.get("tenant_id") == name
                assert sbx.info.ttl_seconds == 90, "the tenant's default"
                with pytest.raises(hutch.QuotaExceeded) as ei:
                    Sandbox.create(client=for_tenant)
                e = ei.value
                assert (e.status, e.code, e.quota, e.limit, e.used, e.tenant) == (
                    429,
                    "quota_exceeded",
                    "max_sandboxes",
                    1,
                    1,
                    name,
                )
                assert admin.get_tenant(name).usage == {
                    "sandboxes": 1,
                    "cpus": sbx.info.cpus,
                    "memory_mib": sbx.info.memory_mib,
                    "creates_last_hour": 1,
                }
                with Client(api_key=key.secret) as agent:
                    mine = Sandbox.connect(sbx.id, client=agent)
                    assert mine.exec("echo hi").stdout == "hi\n"
                    with pytest.raises(hutch.Forbidden) as fe:
                        Sandbox.create(client=agent)
                    assert fe.value.status == 403
                    admin.revoke_key(key.id)
                    with pytest.raises(hutch.AuthError):
                        mine.exec("true")
            finally:
                sbx.kill()
        with pytest.raises(hutch.ConflictError):
            admin.create_tenant(name)
        admin.update_tenant(name, quotas={"max_sandboxes": 2})
        assert admin.get_tenant(name).quotas["max_sandboxes"] == 2
        # The agent's exec is in the audit log (written in batches of a few seconds).
        deadline = time.monotonic() + 20
        execs: list = []
        while time.monotonic() < deadline and not execs:
            execs = [e for e in admin.audit(tenant=name) if e.route.endswith("/exec")]
            time.sleep(0.5)
        assert execs and execs[0].key_id == key.id and execs[0].argv == ["sh", "-c", "echo hi"]
        admin.delete_tenant(name)
        with pytest.raises(hutch.NotFoundError):
            admin.get_tenant(name)


@pytest.mark.asyncio
async def test_the_async_client_has_the_same_calls(server: Server) -> None:
    name = f"pya-{uuid.uuid4().hex[:8]}"
    async with AsyncClient() as admin:
        t = await admin.create_tenant(name, allowed_templates=["minimal"])
        assert t.allowed_templates == ["minimal"]
        key = await admin.create_key(tenant=name, scope="read-only")
        assert key.scope == "read-only" and key.secret and key.secret.startswith("hk_")
        assert [k.id for k in await admin.keys() if k.tenant == name] == [key.id]
        await admin.revoke_key(key.id)
        await admin.delete_tenant(name)
        assert name not in [x.name for x in await admin.tenants()]


def test_usage_is_metered_per_tenant_and_keys_carry_budgets(server: Server) -> None:
    name = f"pyu-{uuid.uuid4().hex[:8]}"
    with Client() as admin:
        admin.create_tenant(name, quotas={"daily_budget": 1000})
        key = admin.create_key(tenant=name, daily_budget=500)
        assert key.daily_budget == 500 and key.monthly_budget is None
        assert admin.set_key_budget(key.id, daily_budget=700).daily_budget == 700
        with Client(api_key=key.secret) as agent:
            with pytest.raises(hutch.Forbidden):
                agent.set_key_budget(key.id, daily_budget=10**9)
            sbx = Sandbox.create(client=agent)
            try:
                sbx.exec("i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done")
                deadline = time.monotonic() + 20
                report = agent.usage(group_by="tenant")
                while time.monotonic() < deadline and report.total.cpu_seconds <= 0:
                    time.sleep(0.5)
                    report = agent.usage(group_by="tenant")
                assert isinstance(report, hutch.UsageReport)
                assert [g.key for g in report.groups] == [name]
                assert report.total.cpu_seconds > 0 and report.total.memory_gib_seconds > 0
                assert report.total.cost_micros is None, "no rate card"
                mine = agent.usage(sandbox_id=sbx.id, group_by="sandbox")
                assert [(g.key, g.kind) for g in mine.groups] == [(sbx.id, "sandbox")]
                by_key = admin.usage(group_by="key", tenant=name)
                assert [g.key for g in by_key.groups] == [key.id]
            finally:
                sbx.kill()
        admin.revoke_key(key.id)
        admin.delete_tenant(name)

